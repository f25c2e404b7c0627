"""Detect a submission that patches torch, Python's builtins or the harness in its own process.

The grader's references, tolerances and verdicts live in a process that never imports the
submission (common/course/grade/judge.py). What must run beside the submission (the dispatch trace, the
profiler, the timing loop: common/course/grade/worker.py) is guarded here:

:func:`snapshot` is taken before the submission is imported. It keeps a *strong reference* to every
object it records, so an object cannot be freed and its id reused, and for each one it records what
could be swapped in place:

* every ``common`` module loaded (the whole harness) and the stages' grading specs
  (``solutions/aNN_name/stage.py``): each function with its code object, defaults, keyword defaults
  and closure cells; each class defined in the harness, member by member; each table (tolerances,
  forbidden ops) as a deep copy, compared by value; and ``sys.modules[name]``;
* torch's namespaces (``torch``, ``torch.Tensor`` and its C base, ``torch.nn.functional``,
  ``linalg``, ``special``, ``testing``, ``cuda``, ``library``, ``autograd``, ``profiler``,
  ``torch._C``), the dispatch/function-mode classes the trace is built on, CUDA graphs, events
  and streams, Python's ``builtins`` and ``json``.

:func:`changed` lists what differs: an object replaced (``common.kernel_check.called = ...``), a
``__code__`` swapped, defaults or closure cells changed, a table edited, a module replaced in
``sys.modules``, a name deleted. Names added later (lazy imports) and the harness's own run-time
state (:data:`RUNTIME_STATE`) are not patches; neither is torch wrapping one of its own functions
(dynamo wraps ``torch.manual_seed`` when torch.compile first runs).

What this cannot see, a determined cheater with arbitrary code in the process could still do: it
could, say, leave every object in place and lie in the worker's report. The grader's docs
(INSTRUCTORS.md, "Threat model") say what that leaves and what to do about it.
"""
from __future__ import annotations

import builtins
import copy
import json
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

#: Module-level harness state that legitimately changes while grading (caches, the interpreter's
#: launch stack, the host-cost bench's lazily made bare kernel): not compared.
RUNTIME_STATE = frozenset({"common.cuda_ext._LOADED", "common.interpreter_patch._current",
                           "common.interpreter_patch.LAUNCH_LISTENERS", "common.course.hostcost._BARE",
                           "common.course.native.reason", "common.course.native._module",
                           "common.course.native._thread", "common.course.native._plans", "common.course.native._kept",
                           "common.triton_helpers._COUNTERS"})

_TORCH_DIR = str(Path(torch.__file__).resolve().parent)
_DATA = (dict, list, tuple, set, frozenset, str, bytes, int, float, bool, complex, type(None), torch.dtype)
_MISSING = object()


def _torch_namespaces() -> dict[str, object]:
    from torch.overrides import TorchFunctionMode
    from torch.utils import _python_dispatch
    from torch.utils._python_dispatch import TorchDispatchMode
    spaces = {"torch": torch, "torch.Tensor": torch.Tensor, "torch._C.TensorBase": torch._C.TensorBase,
              "torch.nn.functional": F, "torch.linalg": torch.linalg, "torch.special": torch.special,
              "torch.testing": torch.testing, "torch.cuda": torch.cuda, "torch.library": torch.library,
              "torch.autograd": torch.autograd, "torch.profiler": torch.profiler, "torch._C": torch._C,
              "torch.utils._python_dispatch": _python_dispatch, "TorchDispatchMode": TorchDispatchMode,
              "TorchFunctionMode": TorchFunctionMode, "torch.cuda.CUDAGraph": torch.cuda.CUDAGraph,
              "torch.cuda.Event": torch.cuda.Event, "torch.cuda.Stream": torch.cuda.Stream,
              "torch.Generator": torch.Generator, "builtins": builtins, "json": json}
    try:
        from torch._library import custom_ops
        spaces["torch._library.custom_ops"] = custom_ops
    except ImportError:
        pass
    return spaces


def _is_harness(name: str) -> bool:
    """``common`` and its modules, and the stages' grading specs (``solutions.aNN_name.stage``)."""
    return name == "common" or name.startswith("common.") or (name.startswith("solutions.a") and name.endswith(".stage"))


def _harness_modules() -> dict[str, types.ModuleType]:
    return {name: mod for name, mod in list(sys.modules.items())
            if isinstance(mod, types.ModuleType) and _is_harness(name)}


@dataclass
class _Entry:
    """One recorded object: the object itself (a strong reference) and what can be changed in place."""
    obj: object
    code: object = None
    defaults: object = None
    kwdefaults: object = None
    cells: tuple = ()
    value: object = _MISSING        # a deep copy of a table, compared by value


def _entry(obj: object, data: bool) -> _Entry:
    e = _Entry(obj)
    fn = obj.__func__ if isinstance(obj, (classmethod, staticmethod, types.MethodType)) else obj
    if isinstance(fn, types.FunctionType):
        e.code, e.defaults, e.kwdefaults = fn.__code__, fn.__defaults__, copy.copy(fn.__kwdefaults__)
        e.cells = tuple(_cell(c) for c in fn.__closure__ or ())
    elif isinstance(obj, property):
        e.cells = (obj.fget, obj.fset, obj.fdel)
    elif data and isinstance(obj, _DATA) or _is_dataclass_instance(obj):
        try:
            e.value = copy.deepcopy(obj)
        except Exception:  # noqa: BLE001 - not copyable: identity only
            pass
    return e


def _cell(c) -> object:
    try:
        return c.cell_contents
    except ValueError:       # an empty cell
        return _MISSING


def _is_dataclass_instance(obj: object) -> bool:
    return hasattr(type(obj), "__dataclass_fields__") and not isinstance(obj, type)


def _equal(a: object, b: object, incomparable: bool) -> bool:
    """a == b, NaN equal to NaN (a float default of NaN is not an edit); ``incomparable`` where == raises."""
    try:
        return bool(a == b) or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)
    except Exception:  # noqa: BLE001
        return incomparable


def _differs(e: _Entry, now: object) -> str | None:
    """Why ``now`` is not the recorded object any more, or None."""
    if now is not e.obj:
        if e.value is not _MISSING and type(now) is type(e.obj) and _equal(now, e.value, False):
            return None                  # an equal table rebuilt (harmless)
        return "replaced"
    fn = now.__func__ if isinstance(now, (classmethod, staticmethod, types.MethodType)) else now
    if e.code is not None:
        if fn.__code__ is not e.code:
            return "its __code__ swapped"
        if fn.__defaults__ is not e.defaults or (fn.__kwdefaults__ or None) != (e.kwdefaults or None):
            return "its defaults changed"
        cells = tuple(_cell(c) for c in fn.__closure__ or ())
        if len(cells) != len(e.cells) or any(a is not b for a, b in zip(cells, e.cells)):
            return "its closure changed"
    elif isinstance(now, property) and (now.fget, now.fset, now.fdel) != e.cells:
        return "its accessors changed"
    if e.value is not _MISSING and not _equal(now, e.value, True):
        return "edited"
    return None


def _torch_wrapper(obj: object, original: object) -> bool:
    """True for torch's own lazy wrappers of its functions (dynamo wraps torch.manual_seed)."""
    code = getattr(obj, "__code__", None)
    return (getattr(obj, "__wrapped__", None) is original and code is not None
            and str(Path(code.co_filename).resolve()).startswith(_TORCH_DIR))


class Snapshot:
    """What :func:`snapshot` recorded: label -> entry, and the harness modules by name."""

    def __init__(self) -> None:
        self.entries: dict[str, _Entry] = {}
        self.modules: dict[str, types.ModuleType] = {}
        self.spaces: dict[str, object] = {}

    def _record(self, label: str, space: object, data: bool, harness: bool) -> None:
        self.spaces[label] = space
        for name, obj in list(vars(space).items()):
            key = f"{label}.{name}"
            if name.startswith("__") and name.endswith("__") and not callable(obj) or key in RUNTIME_STATE:
                continue
            if isinstance(obj, types.ModuleType) or not (harness or data or callable(obj)):
                continue             # a module: its own entry, if watched; torch's flags and state: not patches
            self.entries[key] = _entry(obj, data)
            if harness and isinstance(obj, type) and obj.__module__ == label:     # a harness class, member by member
                self._record(key, obj, data=True, harness=False)


def snapshot() -> Snapshot:
    """Record the harness and torch as they are now (call it before importing a submission)."""
    s = Snapshot()
    for label, space in _torch_namespaces().items():
        s._record(label, space, data=False, harness=False)
    for name, mod in _harness_modules().items():
        s.modules[name] = mod
        s._record(name, mod, data=True, harness=True)
    return s


def changed(before: Snapshot) -> list[str]:
    """What the submission patched since ``before``: 'common.testing.REL_TOL (edited)', ..."""
    out = []
    for name, mod in before.modules.items():
        if sys.modules.get(name) is not mod:
            out.append(f"sys.modules[{name!r}] (replaced)")
    for key, e in before.entries.items():
        label, _, name = key.rpartition(".")
        space = vars(before.spaces[label])
        now = space.get(name)
        why = _differs(e, now) if name in space else "removed"
        if why and not (why == "replaced" and _torch_wrapper(now, e.obj)):
            out.append(f"{key} ({why})")
    return sorted(out)
