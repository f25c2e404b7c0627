"""Seeing what a call really does.

Two tools, one question ("what does this call launch and move?"):

* :func:`trace_ops` / :func:`count_host_transfers` run a call under a
  ``TorchDispatchMode`` and record every aten op, including copies between the
  host and the device. With :func:`fake_cuda` they work on a machine without a
  GPU: tensors are *fake* CUDA tensors (shapes, dtypes and devices, no data), so
  the host round trips of a layer can be counted in CI.
* :func:`profile` wraps ``torch.profiler`` on a real GPU and reports the kernels
  a call launches and the host<->device memcpys with their share of GPU time.
* :func:`export_trace` writes a call's timeline as a Chrome/Perfetto trace
  (``.json.gz``) to open in https://ui.perfetto.dev or ``chrome://tracing``: CPU ops
  anywhere, and on a GPU the CUDA API calls, kernels and memcpys on their own rows.
  :func:`trace_spans` reads such a file back into rows to plot.
"""
from __future__ import annotations

import contextlib
import gzip
import json
import os
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

_COPY_OPS = {"aten._to_copy.default", "aten.copy_.default", "aten._copy_from.default",
             "aten._copy_from_and_resize.default"}


def _devtype(t: object) -> str | None:
    return t.device.type if isinstance(t, torch.Tensor) else None


@dataclass
class OpTrace:
    """aten ops seen during a call, and the host<->device copies among them.

    The ops are those the call itself runs: a custom operator with a Python body
    (``torch.library.custom_op``) is traced *into*, so a body that calls the PyTorch op it
    stands for shows; under the Triton interpreter the copies the interpreter makes to run a
    kernel on the CPU are not the call's and are left out (the kernel shows in ``kernels``)."""
    ops: list[str] = field(default_factory=list)
    #: Triton kernels launched under the interpreter (CPU): their names, in launch order.
    kernels: list[str] = field(default_factory=list)
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


def _python_custom_op(func, args):
    """The Python body ``torch.library.custom_op`` registered for ``func`` (for the device of its first
    tensor argument), or None for an op without one (aten, a C++ kernel)."""
    try:
        from torch._library.custom_ops import OPDEFS
    except ImportError:      # an older torch
        return None
    schema = getattr(func, "_schema", None)
    opdef = OPDEFS.get(schema.name) if schema is not None else None
    if opdef is None:
        return None
    device = next((a.device.type for a in args if isinstance(a, torch.Tensor)), None)
    fns = opdef._backend_fns
    return fns.get(device) or fns.get(None)


def in_interpreted_kernel() -> bool:
    """True while the Triton interpreter runs a kernel (its argument copies are not the caller's ops)."""
    patch = sys.modules.get("common.interpreter_patch")
    if patch is None or not patch._current or patch._LAUNCH_CODE is None:
        return False
    f = sys._getframe(1)
    while f is not None:                 # the launch wrapper is on the stack: the stack entry is real
        if f.f_code is patch._LAUNCH_CODE:
            return True
        f = f.f_back
    return False


class _Tracer(TorchDispatchMode):
    def __init__(self, trace: OpTrace):
        super().__init__()
        self.trace = trace

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if in_interpreted_kernel():
            return func(*args, **kwargs)
        body = _python_custom_op(func, args)
        if body is not None:                 # trace into the op: its torch calls are the call's own
            self.trace.ops.append(str(func))
            with self:
                return body(*args, **kwargs)
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
        patch = sys.modules.get("common.interpreter_patch")
        if patch is not None:                # the interpreter's launches (CPU): kernel names
            listener = t.kernels.append
            patch.LAUNCH_LISTENERS.append(listener)
            stack.callback(patch.LAUNCH_LISTENERS.remove, listener)
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


# --------------------------------------------------------------------------- traces
def export_trace(fn: Callable[[], object], path: str | os.PathLike, *, calls: int = 1, warmup: int = 2,
                 label: str = "call") -> Path:
    """Run ``fn()`` ``calls`` times under ``torch.profiler`` and write a Chrome/Perfetto trace.

    ``path`` ending in ``.gz`` is gzip-compressed (Perfetto and ``chrome://tracing`` open
    ``.json.gz`` as is). CPU ops are always recorded; on a GPU also the CUDA runtime calls,
    the kernels and the host<->device memcpys. Each call is wrapped in a
    ``record_function(f"{label} {i}")`` range, so the calls are easy to find in the viewer.
    ``warmup`` calls run first, outside the trace (first-call costs are not the call's).
    Returns the path written.
    """
    from torch.profiler import ProfilerActivity, record_function
    from torch.profiler import profile as tprofile
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available()
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with tprofile(activities=acts) as prof:
        for i in range(calls):
            with record_function(f"{label} {i}"):
                fn()
        if cuda:
            torch.cuda.synchronize()
    fd, tmp = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        data = Path(tmp).read_bytes()
    finally:
        os.unlink(tmp)
    if path.name.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def load_trace(path: str | os.PathLike) -> list[dict]:
    """The events of a Chrome trace file (``.json`` or gzip-compressed ``.json.gz``)."""
    raw = Path(path).read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


@dataclass(frozen=True)
class Span:
    """One bar of a timeline: ``row`` ("calls": export_trace's ranges, "CPU ops", "CUDA API",
    "GPU kernels", "memcpy H<->D"),
    the op or kernel ``name``, start and duration in microseconds (start from the first bar)."""
    row: str
    name: str
    start_us: float
    dur_us: float


#: Trace event category -> timeline row (torch.profiler's Kineto categories).
TRACE_ROWS = {"user_annotation": "calls", "cpu_op": "CPU ops", "cuda_runtime": "CUDA API", "cuda_driver": "CUDA API",
              "kernel": "GPU kernels", "gpu_memset": "GPU kernels", "gpu_memcpy": "memcpy H<->D"}


def trace_spans(trace: str | os.PathLike | list[dict]) -> list[Span]:
    """A trace's complete events as timeline bars, one row per kind (:data:`TRACE_ROWS`).

    CPU ops keep only the outermost op on each thread (``aten::linear``, not the
    ``aten::addmm`` inside it), so the CPU row does not overdraw itself. Device-to-device
    memcpys go with the kernels (they run on the GPU); host<->device ones get their own row.
    """
    events = trace if isinstance(trace, list) else load_trace(trace)
    picked = []
    for e in events:
        row = TRACE_ROWS.get(e.get("cat", ""))
        if e.get("ph") != "X" or row is None or "dur" not in e:
            continue
        if row == "memcpy H<->D" and _is_memcpy(e.get("name", "")) == "dtod":
            row = "GPU kernels"
        picked.append((row, e))
    outer, ends = [], {}
    for row, e in sorted(picked, key=lambda p: (float(p[1]["ts"]), -float(p[1]["dur"]))):
        ts, dur = float(e["ts"]), float(e["dur"])
        if row == "CPU ops":
            key = (e.get("pid"), e.get("tid"))
            if ts < ends.get(key, float("-inf")):
                continue                     # inside an op already kept
            ends[key] = ts + dur
        outer.append((row, e.get("name", ""), ts, dur))
    if not outer:
        return []
    t0 = min(ts for _, _, ts, _ in outer)
    return [Span(row, name, ts - t0, dur) for row, name, ts, dur in outer]
