"""Timing that is honest about asynchrony.

On a GPU: warm up, then time with CUDA events through ``triton.testing.do_bench``
(median of many runs, L2 flushed between runs). On a CPU-only machine a wall-clock
fallback is provided, and every result says which clock it used, so CPU time is
never mistaken for GPU time.
"""
from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Timing:
    median_ms: float
    clock: str          # "cuda-events" or "cpu-wall"
    n: int

    def __str__(self) -> str:
        label = "" if self.clock == "cuda-events" else " (CPU wall time)"
        return f"{self.median_ms:.4f} ms{label}"


def geomean(ratios: list[float]) -> float:
    """Geometric mean of positive ratios (speedups, time ratios over several shapes): a 2x win on one
    shape and a 2x loss on another make 1x. NaN for none."""
    if any(not x > 0 for x in ratios):
        raise ValueError(f"ratios must be positive numbers, got {ratios}")
    return math.exp(sum(math.log(x) for x in ratios) / len(ratios)) if ratios else float("nan")


def fmt_ratio(x: float) -> str:
    """``1.23x``, or ``-`` for NaN (not timed)."""
    return f"{x:.2f}x" if x == x else "-"


#: How long, in milliseconds, the course's autotuners time each candidate config: warm-up, then runs
#: (Triton's default, four times as long, spends over a second per new shape on a handful of configs:
#: most of a cold test run went there). This is still hundreds of runs of a kernel of tens of
#: microseconds and ten or more of a millisecond-long one, enough to rank configs.
AUTOTUNE_WARMUP_MS, AUTOTUNE_REP_MS = 5, 25


def autotune_bench(kernel_call: Callable[[], object], quantiles) -> list[float]:
    """The timer for ``triton.autotune(..., do_bench=autotune_bench)``: CUDA events through
    ``triton.testing.do_bench`` (L2 flushed between runs), AUTOTUNE_WARMUP_MS + AUTOTUNE_REP_MS."""
    import triton
    return triton.testing.do_bench(kernel_call, warmup=AUTOTUNE_WARMUP_MS, rep=AUTOTUNE_REP_MS, quantiles=quantiles)


#: Threads that compile an autotuner's configs at once (precompile); 1 compiles them one by one, as
#: Triton's autotuner does by itself.
COMPILE_THREADS = int(os.environ.get("COURSE_COMPILE_THREADS", min(16, os.cpu_count() or 1)))


def _compile_in_threads(warmup: Callable[[], object]) -> None:
    """Run ``warmup()`` (kernel warmups: compiles, no launches) with Triton's async compile mode, so
    that its compiles run COMPILE_THREADS at a time, and wait for them. Errors are left to the
    launches that follow (they fail again there, with their own message). No-op under the Triton
    interpreter, with COMPILE_THREADS = 1 or a Triton without async compilation."""
    if os.environ.get("TRITON_INTERPRET", "0") == "1" or COMPILE_THREADS <= 1:
        return
    try:
        from triton.runtime._async_compile import AsyncCompileMode
    except ImportError:
        return
    from concurrent.futures import ThreadPoolExecutor
    try:
        with ThreadPoolExecutor(COMPILE_THREADS) as pool, AsyncCompileMode(pool, ignore_errors=True):
            warmup()
    except Exception:  # noqa: BLE001 - whatever fails here fails again, with its own message, in the launch
        return


def precompile(autotuner, grid, *args, **meta) -> None:
    """Compile every config ``autotuner`` (a ``triton.autotune``'d kernel) is about to time for
    this call, COMPILE_THREADS at a time, before it times them.

    Call it just before ``autotuner[grid](*args, **meta)``. Triton's autotuner compiles each
    candidate config when it first times it, one after the other: for a new shape that is most
    of the tuning on a fresh machine (a Hopper matmul config takes a second or more to compile,
    and a GPT-2 forward meets a dozen new GEMM keys). Compiling runs mostly outside the GIL
    (Triton's passes and ptxas), so threads overlap it. A key the autotuner has already tuned
    in this process returns at once; a compile error is left for the autotuner to raise, as
    without this call. No-op under the Triton interpreter.
    """
    if os.environ.get("TRITON_INTERPRET", "0") == "1" or COMPILE_THREADS <= 1:   # before the key: every call
        return
    named = {**dict(zip(autotuner.arg_names, args)), **meta}
    key = [named[k] for k in autotuner.keys if k in named]   # the key Autotuner.run builds (Triton 3.6)
    key += [str(v.dtype) for k, v in named.items() if k in autotuner.arg_names and hasattr(v, "dtype")]
    if tuple(key) not in autotuner.cache:
        _compile_in_threads(lambda: autotuner.warmup(*args, grid=grid, **meta))


def compile_together(launches) -> None:
    """Compile the kernels of several launches side by side, COMPILE_THREADS at a time, before they
    run one after the other. ``launches``: (jit function, grid, args, kwargs) as they will be
    launched, ``fn[grid](*args, **kwargs)``. For a caller that launches kernels no earlier one
    needs compiled (stage 7's backward: delta, dK/dV, dQ); call it once per new kind of call, not
    on every call (each warmup looks its kernel up: microseconds). Errors are left to the launches.
    No-op under the Triton interpreter."""
    def warmup():
        for fn, grid, args, kwargs in launches:
            fn.warmup(*args, grid=grid, **kwargs)
    _compile_in_threads(warmup)


def bench(fn: Callable[[], object], *, warmup_ms: float = 25, rep_ms: float = 100) -> Timing:
    """Median time of ``fn()`` in ms. GPU: CUDA events via do_bench; CPU: perf_counter."""
    if torch.cuda.is_available():
        import triton.testing
        # do_bench flushes L2 (writes a 256 MB buffer) before every timed run.
        ms = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")
        return Timing(float(ms), "cuda-events", -1)
    return bench_cpu(fn, warmup=3, rep=max(5, int(rep_ms / 20)))


def bench_graph(fn: Callable[[], object], *, rep_ms: float = 100,
                check: Callable[[object], None] | None = None) -> Timing:
    """Median GPU time of ``fn()`` captured once in a CUDA graph and replayed.

    For calls whose GPU work (microseconds) is shorter than the Python and launch work
    that issues it, eager timing measures the host. Replaying a graph measures the GPU
    alone (with L2 flushed between replays by do_bench), so the number does not depend
    on how busy the CPU is. ``check(out)``, if given, is called on the captured call's
    output after one replay into NaN-filled buffers: what is timed is what it checks
    (a call that does no work while being captured cannot pass).
    """
    import triton.testing
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    if check is not None:
        for t in (out if isinstance(out, (tuple, list)) else (out,)):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(out)
    ms = triton.testing.do_bench(graph.replay, warmup=25, rep=rep_ms, return_mode="median")
    return Timing(float(ms), "cuda-graph", -1)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bitwise equal, NaN equal to NaN (an output a kernel left NaN is the same NaN when read twice)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point() or a.is_complex():
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)


def unjoined_difference(early: list[torch.Tensor], final: list[torch.Tensor]) -> str | None:
    """What differs between outputs read on the caller's stream right after a call (``early``) and the same
    outputs once the whole device is synchronised (``final``), or None: any difference is work the call
    left running on another stream, never joined back to the caller's. Pure (CPU tensors do), so the
    verdict is testable without a GPU."""
    for i, (e, f) in enumerate(zip(early, final)):
        if not _same(e, f):
            n = int((~((e == f) | (e.isnan() & f.isnan()))).sum()) if e.shape == f.shape and e.is_floating_point() \
                else e.numel()
            return (f"output {i}: {n} of {f.numel()} elements read on the caller's stream right after the call differ "
                    "from the same output after torch.cuda.synchronize(): the call left work running on another "
                    "stream, never joined back (join it: torch.cuda.current_stream().wait_stream(side), and "
                    "out.record_stream(side) where side allocates)")
    return None


#: cycles the caller's stream is kept busy before a probed call (torch.cuda._sleep: milliseconds at a
#: GPU's clock, long against a launch), so that work the call puts on a stream that waits on the caller's starts
#: together with the read that follows the call
PROBE_BUSY_CYCLES = 3_000_000


def left_unjoined(call: Callable[[], object], *, busy: bool = True) -> str | None:
    """GPU: run ``call()`` and read its outputs as the caller's stream sees them right after it returns,
    then again after ``torch.cuda.synchronize()`` (which waits on every stream of the device): where
    they differ, the call left work unjoined (:func:`unjoined_difference`'s message), else None.

    The read is a copy on a stream of the highest priority that waits on the caller's stream at the
    point the call returned: it is ordered after everything the caller's stream holds, as a reader on
    that stream is, and its blocks are dispatched before any pending block of an ordinary stream, so an
    unjoined kernel still running or waiting loses the race. Twice: as is (work on a stream of its own
    starts at once) and, with ``busy``, behind :data:`PROBE_BUSY_CYCLES` of work on the caller's stream
    (work on a side stream that waits on the caller's becomes ready together with the read). At a size
    where the call's kernels take longer than a launch (tens of microseconds), unjoined work shows.
    ``call`` must compute on new values each time: the allocator may hand the call an output buffer that
    still holds an earlier call's answer, which an early read would take for the finished one."""
    caller = torch.cuda.current_stream()
    reader = torch.cuda.Stream(priority=-100)            # beyond the range: the highest priority there is
    for delay in ((False, True) if busy else (False,)):
        torch.cuda.synchronize()
        if delay:
            torch.cuda._sleep(PROBE_BUSY_CYCLES)
        outs = [o.detach() for o in _flat(call())]
        reader.wait_stream(caller)                       # what the caller's stream has, right after the call
        with torch.cuda.stream(reader):
            early = [o.clone() for o in outs]
        caller.wait_stream(reader)
        torch.cuda.synchronize()
        found = unjoined_difference(early, outs)
        if found:
            return found
    return None


@dataclass
class FreshTiming:
    """What :func:`bench_fresh` measured: per timed call, the submission's and the baseline's GPU time
    (ms) and the submission's relative error against the baseline on that call's inputs (NaN: not
    finite, inf: a shape differs). ``how``: "cuda-graph replay", or eager and why."""
    how: str
    ms: list[float]
    baseline_ms: list[float]
    errors: list[float]
    #: eager calls back to back, wall clock per call with the GPU's work included (median of 3 runs):
    #: what a user calling it in a notebook or a training step sees (reported, not scored)
    eager_ms: float = float("nan")
    baseline_eager_ms: float = float("nan")
    #: work the submission left running on another stream (:func:`left_unjoined`'s finding), or ""
    unjoined: str = ""


def eager_per_call(fn: Callable[[], object], *, calls: int = 20, runs: int = 3) -> float:
    """ms per call of ``fn()`` called eagerly back to back (host work, launches and GPU time,
    whichever dominates), synchronised before and after each run: the median of ``runs``."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3 / calls)
    return statistics.median(times)


def _flat(out) -> list[torch.Tensor]:
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)):
        return [t for x in out for t in _flat(x)]
    return []


def _rel_err_on_device(out, base, scratch: dict) -> torch.Tensor:
    """max over the outputs of ||out - base|| / ||base||, as a 0-dim fp32 tensor on the GPU (no sync):
    NaN where out is not finite, inf where the shapes or counts differ. The fp32 copies go into
    ``scratch`` (two buffers per output shape, made on first use): no large allocation per call
    (on the H100, fp32 temporaries of CUDA-graph outputs made every timed call were never given
    back: 768 MB a call at a [32, 1024, 3072] output, until the timing ran out of memory)."""
    outs, bases = _flat(out), _flat(base)
    if len(outs) != len(bases) or any(o.shape != b.shape for o, b in zip(outs, bases)):
        return torch.tensor(float("inf"), device="cuda")
    err = None
    for i, (o, b) in enumerate(zip(outs, bases)):
        key = (i, tuple(o.shape))
        if key not in scratch:
            scratch[key] = (torch.empty(o.shape, dtype=torch.float32, device="cuda"),
                            torch.empty(o.shape, dtype=torch.float32, device="cuda"))
        fo, fb = scratch[key]
        fo.copy_(o)
        fb.copy_(b)
        n = torch.linalg.vector_norm(fb).clamp_min(1e-30)
        e = torch.linalg.vector_norm(fo.sub_(fb)) / n     # NaN/inf anywhere in o makes the norm NaN/inf
        err = e if err is None else torch.maximum(err, e)
    return err if err is not None else torch.zeros((), device="cuda")


def bench_fresh(inputs: Callable[[torch.Generator], dict], submission: Callable[[dict], object],
                baseline: Callable[[dict], object], *, sets: int = 3, rep_ms: float = 100, min_calls: int = 30,
                max_calls: int = 600, seed: int = 0) -> FreshTiming:
    """GPU time of ``submission(inp)`` and ``baseline(inp)``, every timed call on fresh inputs, every
    timed output checked.

    ``sets`` input sets are drawn (``inputs(g)``: distinct storage, distinct values) and each is
    captured in a CUDA graph for the submission and for the baseline. Before every timed call the
    set's tensors get new values (drawn with the CUDA generator seeded ``seed``) and L2 is flushed;
    then the submission's replay and the baseline's replay are each timed with CUDA events, and the
    submission's output is compared with the baseline's on the GPU (no sync). A call that does its
    work only while being captured, memoises an output by the input's address, or returns what an
    earlier call computed, gives a wrong output on the next values: its error shows in ``errors``.
    If the submission cannot be captured, both are timed eagerly with the same refills and checks
    (``how`` says so), and each eager time ends after ``torch.cuda.synchronize()``, which waits on every
    stream of the device: work the call put on a stream of its own, never joined back to the caller's
    (what makes a capture fail with "unjoined work"), is counted as a graph replay would count it.
    Before timing, :func:`left_unjoined` reads the submission's output on the caller's stream right after
    a call (``unjoined``: what differed). The caller judges the errors and takes the medians.
    """
    g = torch.Generator(device="cuda").manual_seed(seed)
    pool = [inputs(g) for _ in range(sets)]

    def refill(inp: dict) -> None:
        for name, t in inputs(g).items():
            inp[name].copy_(t)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):                 # warm up: compile, tune, allocate
        for inp in pool:
            for _ in range(2):
                submission(inp)
                baseline(inp)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    def fresh_call():                  # new values each probe: a reused buffer may hold an earlier call's answer
        refill(pool[0])
        return submission(pool[0])
    unjoined = left_unjoined(fresh_call)
    if unjoined:                       # the stage fails on it: nothing to time
        return FreshTiming("not timed: work left unjoined", [], [], [], unjoined=unjoined)

    def capture(fn, inp):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fn(inp)
        return graph, out

    try:
        subs = [capture(submission, inp) for inp in pool]
        how = "cuda-graph replay"
    except Exception as e:  # noqa: BLE001 - a call that cannot be captured is timed eagerly
        why = f"graph capture failed: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        if "unjoined" in str(e):       # work forked onto another stream and never joined back
            return FreshTiming(f"not timed ({why})", [], [], [], unjoined=why)
        torch.cuda.synchronize()
        subs, how = None, f"eager ({why})"
    eager = subs is None
    if subs is not None:
        bases = [capture(baseline, inp) for inp in pool]
        run_sub = [lambda k=k: (subs[k][0].replay(), subs[k][1])[1] for k in range(sets)]
        run_base = [lambda k=k: (bases[k][0].replay(), bases[k][1])[1] for k in range(sets)]
    else:
        run_sub = [lambda k=k: submission(pool[k]) for k in range(sets)]
        run_base = [lambda k=k: baseline(pool[k]) for k in range(sets)]

    flush = torch.empty(int(256e6 // 4), dtype=torch.int, device="cuda")
    ev = lambda: torch.cuda.Event(enable_timing=True)  # noqa: E731

    scratch: dict = {}

    def rounds(n: int):
        marks, errs = [], torch.empty(n, device="cuda")
        for r in range(n):
            k = r % sets
            refill(pool[k])
            flush.zero_()
            s0, e0, s1, e1 = ev(), ev(), ev(), ev()
            s0.record()
            out = run_sub[k]()
            if eager:                    # every stream's work done before the end mark (a replay joins them)
                torch.cuda.synchronize()
            e0.record()
            flush.zero_()
            s1.record()
            base = run_base[k]()
            if eager:
                torch.cuda.synchronize()
            e1.record()
            errs[r] = _rel_err_on_device(out, base, scratch)
            marks.append((s0, e0, s1, e1))
        torch.cuda.synchronize()
        return ([s0.elapsed_time(e0) for s0, e0, _, _ in marks], [s1.elapsed_time(e1) for _, _, s1, e1 in marks],
                errs.tolist())

    est, _, _ = rounds(3)
    n = int(min(max_calls, max(min_calls, rep_ms / max(statistics.median(est), 1e-3))))
    ms, base_ms, errors = rounds(n)
    inp = pool[0]
    return FreshTiming(how, ms, base_ms, errors, eager_per_call(lambda: submission(inp)),
                       eager_per_call(lambda: baseline(inp)), unjoined)


def bench_cpu(fn: Callable[[], object], *, warmup: int = 3, rep: int = 10) -> Timing:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rep):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return Timing(statistics.median(times), "cpu-wall", rep)


def cuda_event_time(fn: Callable[[], object], *, warmup: int = 10, rep: int = 50) -> Timing:
    """Hand-rolled CUDA-event timing (what do_bench does, minus the L2 flush)."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return Timing(statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)), "cuda-events", rep)
