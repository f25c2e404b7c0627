"""Native autograd: a differentiable op whose forward and backward replay Triton launches from C++ (lecture 3, §7).

Past a few launches, what an eager training step spends on the host is the autograd glue: a Python
``autograd.Function`` pays ``Function.apply`` on the way in, and its backward runs Python on the autograd
engine's device thread (unpacking the saved tensors, the plan's key, allocations, each launch's Python).
PyTorch's own ops (SDPA) do all of that in C++. This module does the same for a plan of launches that a
course wrapper has already made and run once from Python:

* :func:`record` turns a :class:`common.launch.Prepared` launch and its arguments into what the C++ side
  needs: the compiled kernel's ``CUfunction``, grid, warps, shared memory, and each parameter as a tensor
  *slot* or a number fixed by the plan's key;
* :func:`add_plan` registers a forward (allocations + launches) and a backward (allocations + launches)
  with the extension, ``native_autograd.cpp``, and returns an id;
* ``ext().apply(id, a, b, c)`` runs the forward as a ``torch::autograd::Function``: its backward node is C++,
  so no Python runs in the backward pass. It returns None where the call is not the plan's (another
  device; an input's 16-byte alignment not the one the kernels were compiled for): the wrapper then takes
  its Python path.

What decides the path is the forward call (:func:`eager_ok` and the wrapper's options then): the backward
of a replayed forward replays too, even inside a block that would send a new forward to Python
(``native.disabled()``, stage 7's ``launch_options``), and a launch hook (a profiler such as proton) set
between the two does not see its launches (torch.profiler, which reads CUPTI, does).

The extension is built once per machine (about 30 s; cached like every course build, ``common.cuda_ext``),
in a background thread started by the first :func:`ext` call, so that no call waits for it: until it is
ready, :func:`ext` returns None and wrappers use their Python path. ``load(wait=True)`` waits (the tests,
the benches). ``COURSE_NATIVE=0`` turns it off. It needs a CUDA GPU, ``cuda.h`` (a CUDA toolkit) and
the Triton release :data:`common.launch.FAST_TRITON` (the parameter packing of its launcher).
"""
from __future__ import annotations

import contextlib
import os
import struct
import sys
import threading
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode

from common import launch as _launch

SOURCE = Path(__file__).resolve().with_name("native_autograd.cpp")
#: Why the extension is not loaded ("" while it is, or before the first ext() call), for reports.
reason = ""
_module = None
_thread: threading.Thread | None = None
_off = [os.environ.get("COURSE_NATIVE", "1") == "0"]   # a stack top: disabled() pushes True
#: At most this many plans per process (one per key a wrapper replays): past it, the Python paths.
MAX_PLANS = 256
_plans: list[int] = []   # the ids registered
_kept: list = []    # the compiled kernels the plans launch (their CUfunctions stay loaded while these live)


def _cuda_include() -> str | None:
    from common.cuda_ext import _cuda_include
    for d in [*_cuda_include(), os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "include")]:
        if os.path.exists(os.path.join(d, "cuda.h")):
            return d
    return None


def _build() -> None:
    global _module, reason
    t0 = time.time()
    try:
        from torch.utils.cpp_extension import load

        from common.cuda_ext import build_folder
        include = _cuda_include()
        if include is None:
            reason = "no cuda.h (a CUDA toolkit) to build it against"
            return
        flags = ["-O3", "-std=c++17", "-fvisibility=hidden"]
        name, build_dir, fresh = build_folder("course_native", [SOURCE], flags)
        if fresh:
            print(f"[course] building native autograd in the background (about 30 s, once; cached in {build_dir})",
                  file=sys.stderr, flush=True)
        _module = load(name=name, sources=[str(SOURCE)], extra_cflags=flags, extra_include_paths=[include],
                       extra_ldflags=["-ldl"], build_directory=str(build_dir), verbose=False)
        reason = ""
        if fresh:
            print(f"[course] native autograd ready ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    except Exception as e:  # noqa: BLE001 - any failure leaves the Python paths, which are always correct
        reason = f"build failed: {type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"
        print(f"[course] native autograd unavailable ({reason}); the Python paths are used", file=sys.stderr,
              flush=True)


def ext():
    """The loaded extension, or None (not built yet: the first call starts the build in the background;
    no GPU, no CUDA toolkit, another Triton release, or ``COURSE_NATIVE=0``)."""
    global _thread, reason
    if _module is not None or _thread is not None:
        return _module
    if _off[0]:
        reason = "turned off (COURSE_NATIVE=0)"
        return None
    if not (torch.cuda.is_available() and _launch._FAST):
        reason = "needs a CUDA GPU and Triton " + ".".join(map(str, _launch.FAST_TRITON))
        return None
    _thread = threading.Thread(target=_build, name="course-native-build", daemon=True)
    _thread.start()
    return None


def load(wait: bool = True):
    """:func:`ext`, waiting for the build when ``wait`` (tests, benches)."""
    m = ext()
    if m is None and wait and _thread is not None:
        _thread.join()
    return _module


@contextlib.contextmanager
def disabled():
    """Inside the block wrappers take their Python paths (tests compare the two)."""
    _off.insert(0, True)
    try:
        yield
    finally:
        _off.pop(0)


def eager_ok(*tensors: torch.Tensor) -> bool:
    """True when a call may replay a native plan: not turned off, plain tensors, nothing tracing (no
    torch.compile, dispatch mode or functorch transform), and Triton launching as the plan recorded (no
    launch hook such as a profiler's, no debug or instrumentation knob)."""
    if _off[0] or torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None \
            or torch._C._are_functorch_transforms_active() or _launch._hooked():
        return False
    rt, comp = _launch._RT, _launch._COMPILATION
    if rt.debug or comp.instrumentation_mode:
        return False
    return all(type(t) is torch.Tensor for t in tensors)


def replayed(out: torch.Tensor) -> bool:
    """True when ``out`` came from a native plan's forward: its autograd node is this extension's C++ one (named
    ``torch::autograd::CppNode<(anonymous namespace)::Native>``)."""
    fn = getattr(out, "grad_fn", None)
    return fn is not None and type(fn).__name__ == "CppFunction" and fn.name().rstrip(">").endswith("::Native")


def _f32_bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def record(prepared: _launch.Prepared, args: tuple, slots: list[torch.Tensor]) -> tuple | None:
    """The C++ description of ``prepared(*args)`` as last launched: (function, grid, warps, ctas, shared,
    pdl, cooperative, params), each tensor parameter as its index in ``slots`` (by identity), each number as
    its value; None where this cannot be replayed natively (a call the prepared launch has not made, a
    kernel needing scratch memory, a parameter of another kind)."""
    found = prepared.compiled(*args)
    if found is None:
        return None
    ck, grid = found
    _kept.append(ck)
    md = ck.metadata
    if getattr(md, "global_scratch_size", 1) or getattr(md, "profile_scratch_size", 1):
        return None
    sig = ck.src.signature
    names = list(getattr(ck.src.fn, "arg_names", sig.keys()))
    if list(sig.keys()) != names:
        return None
    params = []
    for i, ty in enumerate(sig.values()):
        if ty == "constexpr":
            continue
        if i >= len(args):
            return None
        a = args[i]
        if isinstance(ty, str) and ty.startswith("*") and isinstance(a, torch.Tensor):
            at = [j for j, t in enumerate(slots) if t is a]
            if len(at) != 1:           # not a slot, or one tensor in several (a plan must not alias them)
                return None
            params.append((0, at[0]))
        elif ty == "i32" and type(a) is int:
            params.append((1, a))
        elif ty == "i64" and type(a) is int:
            params.append((2, a))
        elif ty == "fp32" and isinstance(a, float):
            params.append((3, _f32_bits(a)))
        else:
            return None
    return (int(ck.function), tuple(grid), int(md.num_warps), int(getattr(md, "num_ctas", 1)), int(md.shared),
            bool(getattr(md, "launch_pdl", False)), bool(getattr(md, "launch_cooperative_grid", False)), tuple(params))


def alloc(t: torch.Tensor) -> tuple:
    """An allocation like ``t`` (its sizes, strides and dtype), for a plan's step."""
    return (list(t.shape), list(t.stride()), t.dtype)


def add_plan(fwd: tuple, out: int, saved: list[int], inputs: tuple, bwd: tuple, grad: torch.Tensor,
             grads: list[int], grad_like: int) -> int | None:
    """Register a plan; its id, or None (no extension). ``fwd``/``bwd``: (allocations, launches), as made by
    :func:`alloc` and :func:`record`; forward slots are the three ``inputs`` then fwd's allocations, the
    output is slot ``out``, the backward's slots are the ``saved`` ones, then the output's gradient (kept
    in ``grad``'s layout: another one is copied into it), then bwd's allocations; ``grads`` are the slots
    returned per input, ``grad_like`` the saved slot of the output."""
    m = _module
    if m is None or len(_plans) >= MAX_PLANS:
        return None
    aligned = [t.data_ptr() % 16 == 0 for t in inputs]
    _plans.append(m.add_plan(torch.cuda.current_device(), (list(fwd[0]), list(fwd[1])), out, saved, aligned,
                             (list(bwd[0]), list(bwd[1])), list(grad.shape), list(grad.stride()), grads, grad_like))
    return _plans[-1]
