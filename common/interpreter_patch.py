"""Fixes to Triton's CPU interpreter (triton 3.6); no effect on a GPU, all idempotent.

* :func:`patch_bounds_check` (installed by ``import common`` whenever
  ``TRITON_INTERPRET=1``): the interpreter copies every tensor argument to host
  memory and then reads and writes raw addresses (``ptr + offsets``) with no check,
  so an off-by-one mask reads past the end of a NumPy buffer or writes into the
  allocator's bookkeeping, and the process dies later (``free(): invalid next
  size``, ``Fatal Python error: Aborted``), far from the bug. With the patch, each
  launch records the memory of its tensor arguments (a view's whole storage: any
  address inside it is legal, as on a GPU), and every lane of a load, store or
  atomic that is not masked off is checked against them: a lane outside all of them
  raises :class:`OutOfBoundsError`, naming the kernel, the argument, the offsets
  and the program. Vectorised (a min/max per access in the common case).
* :func:`patch_bf16_dot`: ``tl.dot`` on bfloat16 tiles. The interpreter keeps
  bfloat16 tensors as raw uint16 numpy arrays and its ``create_dot`` multiplies
  those integers, so a bf16 ``tl.dot`` returns garbage on the CPU (fp16, fp32 and
  fp8 are fine). The patch widens bf16 operands to fp32 first, which is what the
  tensor cores compute (exact products, fp32 accumulation).
* :func:`patch_bf16_round` (installed by ``import common`` with the bounds check): the
  interpreter casts float32 to bfloat16 by *truncating* the mantissa, where a GPU rounds to
  nearest even, so every bf16 result it stores was twice as far from the exact value as on
  a GPU (and an accumulator cast to bf16 drifted one way). With the patch the cast rounds to
  nearest even, as on a GPU: bf16 results match PyTorch's, whose own error the tests use as
  their yardstick (common.testing.calibrated_tol).
"""
from __future__ import annotations


def patch_bf16_dot() -> None:
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as it

    builder = it.InterpreterBuilder
    if getattr(builder.create_dot, "_course_bf16_fix", False):
        return
    original = builder.create_dot

    def widen(h):
        if h.dtype == tl.bfloat16:
            data = (np.ascontiguousarray(h.data).astype(np.uint32) << 16).view(np.float32)
            return it.TensorHandle(data, tl.float32)
        return h

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot._course_bf16_fix = True
    builder.create_dot = create_dot


def patch_bf16_round() -> None:
    """float32 -> bfloat16 casts round to nearest even (the interpreter truncates). Idempotent."""
    import numpy as np
    import torch
    import triton.language as tl
    from triton.runtime import interpreter as it

    builder = it.InterpreterBuilder
    if getattr(builder.cast_impl, "_course_bf16_round", False):
        return
    original = builder.cast_impl

    def cast_impl(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            data = np.asarray(src.data, dtype=np.float32)
            out = torch.from_numpy(np.ascontiguousarray(data)).to(torch.bfloat16).view(torch.int16).numpy()
            return it.TensorHandle(out.view(np.uint16).reshape(data.shape), tl.bfloat16)
        return original(self, src, dst_type)

    cast_impl._course_bf16_round = True
    builder.cast_impl = cast_impl


# =============================================================================== bounds check

try:
    from triton.runtime.errors import InterpreterError as _InterpreterError
except ImportError:          # no triton on this platform: the class still exists, nothing raises it
    _InterpreterError = RuntimeError


class OutOfBoundsError(_InterpreterError, IndexError):
    """A load/store under the Triton interpreter touched memory outside every tensor argument of the launch."""

    def __init__(self, message: str):
        super().__init__(message)
        self.args = (message,)


class _Arg:
    """One tensor argument of a launch: where its storage lies on the host."""
    __slots__ = ("name", "lo", "hi", "ptr", "numel", "itemsize", "shape", "stride", "whole")

    def __init__(self, name: str, t):
        storage = t.untyped_storage()
        self.name = name
        self.lo = storage.data_ptr()
        self.hi = self.lo + storage.nbytes()
        self.ptr = t.data_ptr()
        self.numel = t.numel()
        self.itemsize = t.element_size()
        self.shape = tuple(t.shape)
        self.stride = tuple(t.stride())
        # the tensor is its storage, element for element (the common case: a fresh contiguous tensor)
        self.whole = self.ptr == self.lo and self.numel * self.itemsize == self.hi - self.lo and t.is_contiguous()


class _Launch:
    __slots__ = ("kernel", "args", "lo", "hi", "unknown", "langs")

    def __init__(self, kernel: str):
        self.kernel = kernel
        self.args: list[_Arg] = []
        self.lo = self.hi = None
        self.unknown = False
        self.langs: frozenset[int] | None = None     # ids of the triton.language modules the launch patched

    def record(self, name: str, arg) -> None:
        from triton.runtime.interpreter import TensorDescriptor
        from triton.runtime.jit import TensorWrapper
        if isinstance(arg, tuple):
            for i, a in enumerate(arg):
                self.record(f"{name}[{i}]", a)
        elif isinstance(arg, TensorDescriptor):
            self.record(f"{name}.base", arg.base)
        elif hasattr(arg, "data_ptr"):
            t = arg.base if isinstance(arg, TensorWrapper) else arg      # triton.reinterpret(tensor, dtype)
            if hasattr(t, "untyped_storage"):
                self.args.append(_Arg(name, t))
            else:
                self.unknown = True      # memory we cannot bound (not a torch tensor): no check for this launch

    def freeze(self) -> None:
        import numpy as np
        self.lo = np.array([a.lo for a in self.args], dtype=np.uint64)
        self.hi = np.array([a.hi for a in self.args], dtype=np.uint64)


_current: list[_Launch] = []       # the launch being interpreted (a stack, to be safe)
#: Called with each interpreted kernel's name as it launches (common.profiling.trace_ops records them).
LAUNCH_LISTENERS: list = []


def _check(op: str, ptrs, mask) -> None:
    """Raise OutOfBoundsError if a live lane of ``ptrs`` (a TensorHandle of addresses) is outside every argument."""
    __tracebackhide__ = True
    import numpy as np
    if not _current:
        return
    launch = _current[-1]
    if launch.lo is None or not launch.args or launch.unknown:
        return              # no tensor arguments, or a pointer of unknown extent: nothing to check against
    p = ptrs.data
    if mask is None:
        live = p.reshape(-1)
    else:
        m = np.asarray(mask.data).astype(bool, copy=False)   # int1 can arrive as integers (e.g. scalar & tensor)
        if m.shape != p.shape:
            m = np.broadcast_to(m, p.shape)
        live = p[m]
        if not live.size:
            return
    size = max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
    first, last = live.min(), live.max() + np.uint64(size)
    # fast path: all live lanes inside one argument's storage
    if ((launch.lo <= first) & (last <= launch.hi)).any():
        return
    end = live + np.uint64(size)
    ok = ((live[:, None] >= launch.lo[None, :]) & (end[:, None] <= launch.hi[None, :])).any(axis=1)
    if ok.all():
        return          # e.g. tl.where choosing between two tensors' pointers
    raise OutOfBoundsError(_message(op, launch, p, mask, size))


def _message(op: str, launch: _Launch, p, mask, size: int) -> str:
    import numpy as np
    from triton.runtime.interpreter import interpreter_builder
    m = np.ones(p.shape, bool) if mask is None else np.broadcast_to(np.asarray(mask.data).astype(bool), p.shape)
    flat, mflat = p.reshape(-1), m.reshape(-1)
    lo, hi = launch.lo[None, :], launch.hi[None, :]
    inside = (flat[:, None] >= lo) & (flat[:, None] + np.uint64(size) <= hi)        # lanes x args
    bad = mflat & ~inside.any(axis=1)
    bad_idx = np.flatnonzero(bad)
    # Which argument was meant: the one holding most of the good lanes, else the nearest to the first bad one.
    good_counts = (inside & mflat[:, None]).sum(axis=0)
    a0 = int(flat[bad_idx[0]])
    dist = [max(a.lo - a0, a0 + size - a.hi, 0) for a in launch.args]
    if good_counts.max() > 0:
        owner = max(range(len(launch.args)), key=lambda i: (good_counts[i], -dist[i]))
    else:
        owner = min(range(len(launch.args)), key=lambda i: dist[i])
    arg = launch.args[owner]
    offs = (flat[bad_idx].astype(np.int64) - np.int64(arg.ptr))
    unit = "element" if size == arg.itemsize and not (offs % size).any() else "byte"
    if unit == "element":
        offs = offs // size
    shown = list(dict.fromkeys(int(o) for o in offs))
    listed = ", ".join(map(str, shown[:8])) + (", ..." if len(shown) > 8 else "")
    if arg.whole and unit == "element":
        where = f"the tensor's {arg.numel} elements (shape {arg.shape})"
    else:
        lo_off, hi_off = arg.lo - arg.ptr, arg.hi - arg.ptr
        if unit == "element":
            lo_off, hi_off = lo_off // size, hi_off // size
        where = (f"the tensor's memory (shape {arg.shape}, strides {arg.stride}; its storage spans {unit} offsets "
                 f"{lo_off} to {hi_off - 1} from its first element)")
    lane = np.unravel_index(bad_idx[0], p.shape) if p.ndim else ()
    lane_txt = f"lane {tuple(int(i) for i in lane)}, " if p.ndim > 1 else (f"lane {int(lane[0])}, " if p.ndim else "")
    masked = "no mask given" if mask is None else "mask was True"
    prep = {"tl.load": "from", "tl.store": "to"}.get(op, "on")
    pid = tuple(getattr(interpreter_builder, "grid_idx", ()))
    return (f"{launch.kernel}: {op} {prep} argument '{arg.name}' out of bounds: {unit} offsets [{listed}] lie "
            f"outside {where} ({len(bad_idx)} bad lane{'s' if len(bad_idx) != 1 else ''}; first bad lane: "
            f"{lane_txt}offset {shown[0]}, {masked}; program_id {pid}).\n"
            f"Every lane of a {op} that can fall outside the tensor must be masked off: check the mask "
            f"(`offs < n`, not `offs <= n`), the offsets and the strides. (Bounds check of the course's Triton "
            f"interpreter, common/interpreter_patch.py; on a GPU the same bug is undefined behaviour: "
            f"run `compute-sanitizer python ...` to find it there.)")


def _find_oob(e: BaseException | None):
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OutOfBoundsError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


#: Triton's modules whose frames a pytest traceback leaves out under the interpreter: the interpreter,
#: the launch and the language's own layers between a kernel's line and the course's message
#: (``pytest --fulltrace`` shows them).
TRITON_INTERNALS = ("triton.runtime.interpreter", "triton.runtime.jit", "triton.runtime.autotuner",
                    "triton.language.core", "triton.language.semantic", "triton.language.standard",
                    "triton.language.math")


def hide_triton_frames() -> None:
    """pytest reads ``__tracebackhide__`` in a frame's globals too: set it in Triton's modules, so a
    failing interpreted kernel shows the kernel's line and the error, not about a dozen frames of
    Triton's internals before it. Idempotent."""
    import importlib
    for name in TRITON_INTERNALS:
        try:
            importlib.import_module(name).__tracebackhide__ = True
        except ImportError:     # a Triton without the module: nothing to hide
            pass
    from triton.runtime import interpreter as it
    rewriter = getattr(it, "FunctionRewriter", None)
    if rewriter is None or getattr(rewriter._compile_and_exec, "_course_keeps_frames", False):
        return
    compile_and_exec = rewriter._compile_and_exec

    def _compile_and_exec(self, transformed_ast):
        # Triton copies the interpreter's globals into the kernel's module: not this one, or the
        # kernel's own frames (the line that failed) would be hidden too.
        had = "__tracebackhide__" in self.fn.__globals__
        try:
            return compile_and_exec(self, transformed_ast)
        finally:
            if not had:
                self.fn.__globals__.pop("__tracebackhide__", None)

    _compile_and_exec._course_keeps_frames = True
    rewriter._compile_and_exec = _compile_and_exec


def patch_bounds_check() -> None:
    """Bounds-check every interpreted load, store and atomic against the launch's tensor arguments. Idempotent."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as it

    hide_triton_frames()

    builder, executor = it.InterpreterBuilder, it.GridExecutor
    if getattr(executor.__call__, "_course_bounds_check", False):
        return
    masked_load, masked_store = builder.create_masked_load, builder.create_masked_store
    atomic_rmw, atomic_cas = builder.create_atomic_rmw, builder.create_atomic_cas
    init_args, call = executor._init_args_hst, executor.__call__

    def create_load(self, ptr, _0, _1, is_volatile):
        __tracebackhide__ = True
        _check("tl.load", ptr, None)
        mask = it.TensorHandle(np.ones_like(ptr.data, dtype=bool), tl.int1)
        return masked_load(self, ptr, mask, None, _0, _1, is_volatile)

    def create_store(self, ptr, val, _0, _1):
        __tracebackhide__ = True
        _check("tl.store", ptr, None)
        mask = it.TensorHandle(np.ones_like(ptr.data, dtype=bool), tl.int1)
        return masked_store(self, ptr, val, mask, None, None)

    def create_masked_load(self, ptrs, mask, other, cache_modifier, eviction_policy, is_volatile):
        __tracebackhide__ = True
        _check("tl.load", ptrs, mask)
        return masked_load(self, ptrs, mask, other, cache_modifier, eviction_policy, is_volatile)

    def create_masked_store(self, ptrs, value, mask, cache_modifier, eviction_policy):
        __tracebackhide__ = True
        _check("tl.store", ptrs, mask)
        return masked_store(self, ptrs, value, mask, cache_modifier, eviction_policy)

    def create_atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope):
        __tracebackhide__ = True
        _check("tl.atomic_rmw", ptr, mask)
        return atomic_rmw(self, rmwOp, ptr, val, mask, sem, scope)

    def create_atomic_cas(self, ptr, cmp, val, sem, scope):
        __tracebackhide__ = True
        _check("tl.atomic_cas", ptr, None)
        return atomic_cas(self, ptr, cmp, val, sem, scope)

    def _init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        if _current and _current[-1].lo is None:
            launch = _current[-1]
            for name, arg in zip(self.arg_names, args_hst):
                launch.record(name, arg)
            for name, arg in kwargs_hst.items():
                launch.record(name, arg)
            launch.freeze()
        return args_hst, kwargs_hst

    def __call__(self, *args_dev, **kwargs):
        __tracebackhide__ = True     # pytest: show the kernel line, not this wrapper
        name = getattr(self.fn, "__name__", "kernel")
        for listener in list(LAUNCH_LISTENERS):
            listener(name)
        _current.append(_Launch(name))
        try:
            return call(self, *args_dev, **kwargs)
        except it.InterpreterError as e:
            oob = _find_oob(e)
            if oob is None or oob is e:
                raise
            raise oob from None       # the clear message, not triton's repr() of it wrapped in InterpreterError
        finally:
            _current.pop()

    for name, fn in [("create_load", create_load), ("create_store", create_store),
                     ("create_masked_load", create_masked_load), ("create_masked_store", create_masked_store),
                     ("create_atomic_rmw", create_atomic_rmw), ("create_atomic_cas", create_atomic_cas)]:
        setattr(builder, name, fn)
    _init_args_hst._course_bounds_check = True
    executor._init_args_hst = _init_args_hst
    __call__._course_bounds_check = True
    executor.__call__ = __call__
    global _LAUNCH_CODE
    _LAUNCH_CODE = __call__.__code__
    _patch_device_calls()


class _KeptPatches:
    """What ``_patch_lang`` returns for a device-function call whose patches are already in place."""

    @staticmethod
    def restore() -> None:
        pass


def _patch_device_calls() -> None:
    """Speed only: a ``@triton.jit`` function called from a kernel (a device function: tl.sum, tl.zeros,
    tl.cdiv, a helper of the course's) re-patches ``triton.language`` on every call: triton 3.6's
    ``InterpretedFunction.__call__`` calls ``_patch_lang``, which walks every member of tl, tl.core,
    tl.tensor and tl.math, and never restores that scope. Where every module the function sees is
    already patched, that walk finds no builtin left to replace and sets fresh copies of the same
    wrappers: a no-op, which cost a quarter of the interpreter's time in stage 8's decode step (thousands
    of calls). A module is already patched when the running launch patched it
    (GridExecutor.__call__, restored when the launch ends, as Triton does), or when an earlier device
    call patched it: Triton never restores those, so they stay (tl.core, seen by triton.language.standard's
    functions, where the kernel's module imports only tl; the tensor and dtype classes those patches also
    touch are the launch's own, and every launch patches tl.reduce and tl.core.reduce). Such calls are
    skipped; any other call, and any call outside a launch, is patched as Triton does. Idempotent."""
    from triton.runtime import interpreter as it

    if getattr(it._patch_lang, "_course_device_calls", False):
        return
    original = it._patch_lang
    langs_of = (it.tl, it.tl.core)
    kept: set[int] = set()           # modules a device call patched for good (Triton never restores them)

    def _patch_lang(fn):
        launch = _current[-1] if _current else None
        langs = frozenset(id(v) for v in fn.__globals__.values() if isinstance(v, type(it)) and v in langs_of)
        if launch is not None and launch.langs is not None and langs and langs <= launch.langs | kept:
            return _KeptPatches
        scope = original(fn)
        if launch is not None:
            if launch.langs is None:         # the launch's own patch (GridExecutor.__call__), restored at its end
                launch.langs = langs
            else:                            # a device call's patch: Triton drops its scope unrestored
                kept.update(langs - launch.langs)
        return scope

    _patch_lang._course_device_calls = True
    it._patch_lang = _patch_lang


#: The code of the launch wrapper above: common.profiling finds it on the stack to know that the
#: interpreter, not the caller, runs the torch ops it sees (the interpreter's argument copies).
_LAUNCH_CODE = None
