"""Seeing what a call really does.

Two tools, one question ("what does this call launch and move?"):

* :func:`trace_ops` / :func:`count_host_transfers` run a call under a
  ``TorchDispatchMode`` and record every aten op, including copies between the
  host and the device. With :func:`fake_cuda` they work on a machine without a
  GPU: tensors are *fake* CUDA tensors (shapes, dtypes and devices, no data), so
  the host round trips of a layer can be counted in CI.
* :func:`profile` wraps ``torch.profiler`` on a real GPU and reports the kernels
  a call launches and the host<->device memcpys with their share of GPU time.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_COPY_OPS = {"aten._to_copy.default", "aten.copy_.default", "aten._copy_from.default",
             "aten._copy_from_and_resize.default"}


def _devtype(t: object) -> str | None:
    return t.device.type if isinstance(t, torch.Tensor) else None


@dataclass
class OpTrace:
    """aten ops seen during a call, and the host<->device copies among them."""
    ops: list[str] = field(default_factory=list)
    #: torch-level functions called (``trace_ops(functions=True)``), e.g. "torch.nn.functional.linear",
    #: "torch.addmm", "Tensor.matmul": composite ops such as F.linear leave no aten op of their
    #: own (the dispatcher sees only the addmm they decompose into), but they show here.
    functions: list[str] = field(default_factory=list)
    htod: int = 0       # host -> device copies
    dtoh: int = 0       # device -> host copies

    @property
    def host_transfers(self) -> int:
        return self.htod + self.dtoh

    def counts(self) -> Counter:
        return Counter(self.ops)

    def count(self, *names: str) -> int:
        """How many ops whose name starts with any of ``names`` (e.g. 'aten.mm')."""
        return sum(1 for o in self.ops if o.startswith(names))


class _Tracer(TorchDispatchMode):
    def __init__(self, trace: OpTrace):
        super().__init__()
        self.trace = trace

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = str(func)
        if name.startswith("prim."):
            return out
        self.trace.ops.append(name)
        if name in _COPY_OPS:
            if name == "aten._to_copy.default":
                src, dst = _devtype(args[0]), _devtype(out)
            else:  # copy_(self=dst, src)
                dst, src = _devtype(args[0]), _devtype(args[1])
            if src and dst and src != dst:
                if src == "cpu":
                    self.trace.htod += 1
                elif dst == "cpu":
                    self.trace.dtoh += 1
        return out


def function_name(func) -> str:
    """'torch.nn.functional.linear', 'torch.addmm', 'Tensor.add': the name a student wrote."""
    name = getattr(func, "__name__", None) or str(func)
    owner = getattr(func, "__qualname__", name).rsplit(".", 1)[0] if "." in getattr(func, "__qualname__", "") else ""
    module = getattr(func, "__module__", None) or ""
    if module in ("torch._C._nn", "torch.nn.functional"):
        return f"torch.nn.functional.{name}"
    if owner in ("TensorBase", "_TensorBase", "Tensor"):
        return f"Tensor.{name}"
    if owner == "_VariableFunctionsClass" or module == "torch":
        return f"torch.{name}"
    return f"{module}.{getattr(func, '__qualname__', name)}" if module else name


class _FunctionTracer(TorchFunctionMode):
    def __init__(self, trace: OpTrace):
        super().__init__()
        self.trace = trace

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.trace.functions.append(function_name(func))
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def trace_ops(functions: bool = False) -> Iterator[OpTrace]:
    """``with trace_ops() as t: f(x)`` then ``t.ops``, ``t.htod``, ``t.dtoh``; with
    ``functions=True`` also ``t.functions``, the torch-level calls (F.linear, torch.matmul)."""
    t = OpTrace()
    with contextlib.ExitStack() as stack:
        if functions:
            stack.enter_context(_FunctionTracer(t))
        stack.enter_context(_Tracer(t))
        yield t


def _cuda0(d):
    """'cuda' / torch.device('cuda') -> cuda:0 (fake tensors cannot ask a driver for the current device)."""
    if isinstance(d, str) and d == "cuda":
        return torch.device("cuda", 0)
    if isinstance(d, torch.device) and d.type == "cuda" and d.index is None:
        return torch.device("cuda", 0)
    return d


def _is_int(v: object) -> bool:
    return isinstance(v, (int, torch.SymInt)) and not isinstance(v, bool)


def _index_ops(x: torch.Tensor, index):
    """``x[index]`` with the aten ops torch's own indexing dispatches to (``select`` for an
    int, ``slice``, ``unsqueeze`` for None, then ``index`` for integer tensors), or None for
    what this does not cover (bool masks, lists, float scalars: left to torch)."""
    idx = index if isinstance(index, tuple) else (index,)
    for i in idx:
        if not (i is None or i is Ellipsis or _is_int(i)
                or (isinstance(i, slice) and all(v is None or _is_int(v) for v in (i.start, i.stop, i.step)))
                or (isinstance(i, torch.Tensor) and not i.is_floating_point() and i.dtype != torch.bool)):
            return None
    n_dims = sum(i is not None and i is not Ellipsis for i in idx)
    ellipsis = [k for k, i in enumerate(idx) if i is Ellipsis]
    if len(ellipsis) > 1 or n_dims > x.dim():
        return None
    rest = (slice(None),) * (x.dim() - n_dims)
    idx = idx[:ellipsis[0]] + rest + idx[ellipsis[0] + 1:] if ellipsis else idx + rest
    out, d, tensors = x, 0, []
    for i in idx:
        if i is None:
            out, d = out.unsqueeze(d), d + 1
            tensors.append(None)
        elif _is_int(i):
            out = out.select(d, i)
        elif isinstance(i, slice):
            out = torch.ops.aten.slice.Tensor(out, d, i.start, i.stop, 1 if i.step is None else i.step)
            d += 1
            tensors.append(None)
        else:
            d += 1
            tensors.append(i)
    if any(t is not None for t in tensors):
        while tensors[-1] is None:
            tensors.pop()
        out = torch.ops.aten.index.Tensor(out, tensors)
    return out


@contextlib.contextmanager
def fake_cuda() -> Iterator[None]:
    """Run code on fake CUDA tensors (shapes, dtypes, devices; no data): works without a GPU.

    Create every tensor inside the block (``torch.randn(..., device="cuda")``; a model:
    ``with torch.device("cuda"): model = Model(...)``).
    On a CPU-only build a few Tensor methods ask the CUDA driver for a device
    guard or the CUDA generator; inside the block ``.contiguous()``, ``.cuda()``,
    ``.to("cuda")``, indexing ``x[...]`` (ints, slices, None, ..., integer tensors)
    and ``.uniform_()`` (``nn.Linear``'s init) are routed through ops the fake mode
    handles, with the same results (shapes, dtypes, devices).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    T = torch.Tensor
    saved = (T.contiguous, T.cuda, T.to, T.__getitem__, T.uniform_)

    def contiguous(self, memory_format=torch.contiguous_format):
        return self if self.is_contiguous(memory_format=memory_format) else self.clone(memory_format=memory_format)

    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        dev = torch.device("cuda", 0 if device is None else torch.device(device).index or 0)
        return saved[2](self, dev, non_blocking=non_blocking, memory_format=memory_format)

    def to(self, *args, **kwargs):
        if args:
            args = (_cuda0(args[0]), *args[1:])
        if "device" in kwargs:
            kwargs["device"] = _cuda0(kwargs["device"])
        return saved[2](self, *args, **kwargs)

    def getitem(self, index):
        out = _index_ops(self, index) if self.is_cuda else None
        return saved[3](self, index) if out is None else out

    def uniform_(self, a=0.0, b=1.0, *, generator=None):
        if not self.is_cuda:
            return saved[4](self, a, b, generator=generator)
        # a + (b - a)·Φ(z), z ~ N(0, 1): uniform on [a, b], from normal_ (which the fake mode runs)
        return self.normal_().div_(2 ** 0.5).erf_().add_(1.0).mul_(0.5 * (b - a)).add_(a)

    T.contiguous, T.cuda, T.to, T.__getitem__, T.uniform_ = contiguous, cuda, to, getitem, uniform_
    try:
        with FakeTensorMode(allow_non_fake_inputs=False):
            yield
    finally:
        T.contiguous, T.cuda, T.to, T.__getitem__, T.uniform_ = saved


def count_host_transfers(fn: Callable[[], object]) -> OpTrace:
    """Trace one call of ``fn()`` (tensors it uses must already exist)."""
    with trace_ops() as t:
        fn()
    return t


# --------------------------------------------------------------------------- GPU profiler
@dataclass
class ProfileReport:
    kernels: list[str]              # device kernel names, in launch order (one call)
    kernel_time_us: float           # total GPU kernel time per call
    htod: int                       # Memcpy HtoD per call
    dtoh: int                       # Memcpy DtoH per call
    memcpy_time_us: float           # host<->device memcpy time per call
    calls: int

    @property
    def n_kernels(self) -> int:
        return len(self.kernels)

    @property
    def host_transfers(self) -> int:
        return self.htod + self.dtoh

    @property
    def memcpy_share(self) -> float:
        """Fraction of GPU-side time spent in host<->device copies."""
        total = self.kernel_time_us + self.memcpy_time_us
        return self.memcpy_time_us / total if total > 0 else 0.0

    def table(self) -> str:
        rows = Counter(self.kernels)
        lines = [f"{n:>4} x {k[:100]}" for k, n in rows.most_common()]
        lines.append(f"kernels/call {self.n_kernels}, HtoD {self.htod}, DtoH {self.dtoh}, "
                     f"kernel {self.kernel_time_us:.1f} us, memcpy {self.memcpy_time_us:.1f} us "
                     f"({100 * self.memcpy_share:.1f}% of GPU time)")
        return "\n".join(lines)


def _is_memcpy(name: str) -> str | None:
    n = name.lower()
    if "memcpy" not in n:
        return None
    if "htod" in n or "host to device" in n:
        return "htod"
    if "dtoh" in n or "device to host" in n:
        return "dtoh"
    return "dtod"


def profile(fn: Callable[[], object], *, calls: int = 5, warmup: int = 3) -> ProfileReport:
    """Profile ``fn()`` on the GPU; counts are per call (averaged over ``calls``)."""
    if not torch.cuda.is_available():
        raise RuntimeError("profile() needs a CUDA GPU; use trace_ops()/fake_cuda() on a CPU-only machine")
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels, ktime, counts, mtime = [], 0.0, Counter(), 0.0
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        kind = _is_memcpy(ev.name)
        dur = ev.time_range.elapsed_us()
        if kind in ("htod", "dtoh"):
            counts[kind] += 1
            mtime += dur
        else:  # kernels, device-to-device copies and memsets all occupy the GPU
            kernels.append(ev.name)
            ktime += dur
    per = max(calls, 1)
    return ProfileReport(kernels[: len(kernels) // per], ktime / per, counts["htod"] // per,
                         counts["dtoh"] // per, mtime / per, calls)
