"""Impl switching: choose which implementation tree is graded or benchmarked.

An *impl* is a folder with the layout of ``assignments/`` (``a01_.../``,
``a02_.../``, ...): ``assignments`` (the default), ``solutions``, or a path to a
student's submission. Choose it with ``pytest --impl X``, ``make grade IMPL=X``
or the ``COURSE_IMPL`` environment variable.

    from common.impl import load
    gelu = load("a05_triton_gelu.gelu_triton")          # module of the current impl
    gelu = load("a05_triton_gelu.gelu_triton", "solutions")
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parent.parent
ENV_VAR = "COURSE_IMPL"
NAMED = ("assignments", "solutions")


def resolve(impl: str | os.PathLike | None = None) -> Path:
    """Folder of an impl given as 'assignments', 'solutions' or a path."""
    impl = impl if impl is not None else os.environ.get(ENV_VAR, "assignments")
    p = REPO / str(impl) if str(impl) in NAMED else Path(impl).expanduser().resolve()
    if not p.is_dir():
        raise FileNotFoundError(
            f"impl {str(impl)!r}: no such folder ({p}); expected 'assignments', 'solutions' "
            "or a path to a folder laid out like assignments/ (a01_roundtrip_linear/, ...)")
    return p


def package_name(root: Path) -> str:
    """Import name of an impl: 'assignments'/'solutions', or a unique name for a path."""
    if root.parent == REPO and root.name in NAMED:
        return root.name
    return "course_impl_" + hashlib.sha1(str(root).encode()).hexdigest()[:10]


def _register(root: Path) -> str:
    name = package_name(root)
    if name not in sys.modules:
        if name in NAMED:
            if str(REPO) not in sys.path:
                sys.path.insert(0, str(REPO))
            importlib.import_module(name)
        else:  # a submission folder: make it an importable package under a unique name
            spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
            spec.submodule_search_locations = [str(root)]
            mod = importlib.util.module_from_spec(spec)
            mod.__path__ = [str(root)]
            sys.modules[name] = mod
    return name


def load(module: str, impl: str | os.PathLike | None = None) -> ModuleType:
    """Import ``<impl>.<module>``, e.g. ``load("a03_fused_linear.fused_linear")``."""
    root = resolve(impl)
    return importlib.import_module(f"{_register(root)}.{module}")


def stage_dir(stage: str, impl: str | os.PathLike | None = None) -> Path:
    """Folder of one stage inside an impl, e.g. ``stage_dir("a01_roundtrip_linear")``."""
    return resolve(impl) / stage


def op_namespace(module_name: str) -> str:
    """Torch-operator namespace for the impl a module belongs to.

    ``op_namespace(__name__)`` in ``solutions.a05_triton_gelu.gelu_triton`` gives
    ``course_solutions``; in ``assignments...`` ``course_assignments``; in a
    submission ``course_impl_<hash>``. Each impl registers its ops under its own
    namespace, so assignments and solutions can be imported in one process.
    """
    return "course_" + module_name.split(".")[0]
