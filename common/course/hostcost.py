"""Host cost: what one eager call of each course op costs, against the PyTorch op it replaces.

    python -m common.course.hostcost --impl solutions          # GPU: lectures/results/hostcost.md / .csv
    python -m common.course.hostcost --stub                    # no GPU: the wrappers' Python alone, launches stubbed
    python -m common.course.hostcost --profile a05_gelu        # where one call's microseconds go (cProfile)
    python -m common.course.hostcost --compare before.csv after.csv   # the same cases measured twice

The grader and the benches time CUDA-graph replays: the GPU alone. A user calls the ops
eagerly (a notebook, a training step with autograd), and at small shapes such a call costs
what the *host* spends on it: the wrapper's checks and allocations, the custom-op dispatch,
Triton's launcher (it binds the arguments, specialises the integers, looks the compiled
kernel up) and the driver's launch. Here every stage's public entry point is called at a
launch-bound shape, beside the PyTorch op it replaces and a bare launch of a one-line Triton
kernel (Triton's own floor), and three numbers are taken per call:

* ``eager_us``: calls back to back, ``torch.cuda.synchronize()`` bracketing each batch, median
  of the batches: what a user sees;
* ``host_us``: the host's time to issue one call while the GPU is held busy
  (``torch.cuda._sleep``), so no launch waits for the GPU: the host cost alone;
* ``gpu_us``: the GPU's time for the calls queued that way, back to back (CUDA events): the
  kernels alone, with no host gap between them.

The floor: ``eager_us <= max(1.5 x the PyTorch op, 1.5 x a bare launch x kernels
launched)``, the three measured side by side in rounds (:func:`interleaved_us`). The training
cases time an autograd step (flash forward + backward against SDPA's) at GPT-2 training shapes,
with the inputs laid out as GPT-2's attention makes them (views of one fused qkv tensor); floor:
at least 0.8x SDPA. Speed claims are the GPU's; on a machine without one, ``--stub`` replaces
every Triton launch by a no-op (under the interpreter) and times what is left, the wrapper's
Python, beside the same PyTorch op run on the CPU.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from common import DEVICE, HAS_CUDA, TRITON_INTERPRET
from common.impl import Impl, add_impl_argument, command_line, results_dir

#: The course's floors: a course op may cost 1.5x the PyTorch op it replaces, or 1.5x a bare Triton
#: launch per kernel it launches, whichever is larger; a training step at least 0.8x SDPA's speed.
OP_FACTOR, LAUNCH_FACTOR, TRAINING_FLOOR = 1.5, 1.5, 0.8
FIELDS = ["kind", "key", "stage", "case", "kernels", "course_us", "torch_us", "bare_us", "ratio", "floor_us", "met",
          "course_host_us", "torch_host_us", "course_gpu_us", "torch_gpu_us", "clock", "course_1thread_us",
          "torch_1thread_us", "course_python_us", "native"]


# ----------------------------------------------------------------------------- the bare launch
def _bare_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def bare(X):
        tl.store(X, 1.0)
    return bare


_BARE = []


def bare_launch(x: torch.Tensor) -> None:
    """One launch of a one-line Triton kernel (one pointer argument, one program): Triton's floor."""
    if not _BARE:
        _BARE.append(_bare_kernel())
    _BARE[0][(1,)](x)


# ----------------------------------------------------------------------------- timing
def interleaved_us(fns: list[Callable[[], object]], *, rounds: int = 5, calls: int = 50, runs: int = 5) -> list[float]:
    """:func:`eager_us` of each of ``fns``, measured in turn ``rounds`` times, the median per function.
    A host's speed drifts (its clock, other work on the machine) by tens of percent within a minute;
    calls compared with each other are measured side by side, so a drift moves them together."""
    per = [[] for _ in fns]
    for _ in range(rounds):
        for times, fn in zip(per, fns):
            times.append(eager_us(fn, calls=calls, runs=runs))
    return [statistics.median(t) for t in per]


def eager_us(fn: Callable[[], object], *, calls: int = 50, runs: int = 15) -> float:
    """µs per call of ``fn()`` called back to back, synchronised before and after each batch of
    ``calls``; the median over ``runs`` batches (CPU: wall time, no GPU to wait for)."""
    sync = torch.cuda.synchronize if HAS_CUDA else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e6 / calls)
    return statistics.median(times)


_CYCLES_PER_MS: list[float] = []


def _sleep_ms(ms: float) -> None:
    """Keep the GPU busy for about ``ms`` (torch.cuda._sleep spins a kernel for a number of cycles)."""
    if not _CYCLES_PER_MS:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.cuda._sleep(10_000_000)
        e.record()
        torch.cuda.synchronize()
        _CYCLES_PER_MS.append(10_000_000 / s.elapsed_time(e))
    torch.cuda._sleep(int(ms * _CYCLES_PER_MS[0]))


def host_and_gpu_us(fn: Callable[[], object], *, calls: int = 30, runs: int = 5) -> tuple[float, float]:
    """(host µs, GPU µs) per call of ``fn()``: the calls are issued while a sleeping kernel holds the
    GPU, so the host never waits for it (host µs: issuing them), and then run on the GPU back to
    back (GPU µs: CUDA events around them). Medians over ``runs``; the sleep grows until it outlasts
    the issuing."""
    fn()
    torch.cuda.synchronize()
    hosts, gpus, sleep = [], [], 5.0
    while len(hosts) < runs:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        mark = torch.cuda.Event(enable_timing=True)
        mark.record()
        _sleep_ms(sleep)
        s.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        e.record()
        torch.cuda.synchronize()
        if (t1 - t0) * 1e3 > 0.8 * mark.elapsed_time(s):   # the GPU may have caught up: sleep longer
            sleep *= 2
            continue
        hosts.append((t1 - t0) * 1e6 / calls)
        gpus.append(s.elapsed_time(e) * 1e3 / calls)
    return statistics.median(hosts), statistics.median(gpus)


@contextlib.contextmanager
def stub_launches():
    """Every Triton launch becomes a no-op (the Triton interpreter only: ``TRITON_INTERPRET=1``, what
    ``import common`` sets without a GPU): what is left of a call is its wrapper's Python (checks,
    allocations, decisions, the custom-op dispatch) and the PyTorch ops it runs."""
    if not TRITON_INTERPRET:
        raise RuntimeError("stub_launches needs the Triton interpreter (a machine without a GPU, or TRITON_INTERPRET=1)")
    from triton.runtime.interpreter import InterpretedFunction
    run = InterpretedFunction.run
    InterpretedFunction.run = lambda self, *args, **kwargs: None
    try:
        yield
    finally:
        InterpretedFunction.run = run


# ----------------------------------------------------------------------------- the cases
@dataclass
class Case:
    """One course entry point at a launch-bound shape, beside the PyTorch op it replaces.
    ``make(load, device, dtype)`` builds the inputs and returns (course call, PyTorch call)."""
    key: str
    stage: str
    what: str
    kernels: int                 # launches of the course call (Triton kernels, the CUDA op, cuBLAS GEMMs)
    make: Callable
    cuda_only: bool = False      # a CUDA op: no interpreter path


def _randn(*shape, device, dtype, grad=False):
    return torch.randn(*shape, device=device, dtype=dtype).requires_grad_(grad)


# Each stage's cases are in its spec module (``hostcost_cases()`` in solutions/aNN_name/stage.py).
def cases() -> list[Case]:
    """Every stage's cases, in stage order: ``hostcost_cases()`` of each stage's spec module
    (``solutions/aNN_name/stage.py``, found by common.course.stages)."""
    from common.course.stages import STAGE_MODULES
    return [c for m in STAGE_MODULES if hasattr(m, "hostcost_cases") for c in m.hostcost_cases()]


def __getattr__(name: str):
    if name == "CASES":                        # the cases as a list, read where a tool asks for them
        return cases()
    if name == "TRAINING":                     # the training shapes (stage 7's)
        from common.course.stages import STAGE_MODULES
        return [t for m in STAGE_MODULES for t in getattr(m, "HOSTCOST_TRAINING", ())]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _gpt2_qkv(b, h, s, d, dev, dt):
    """q, k, v [B, H, S, d] as GPT-2's attention makes them: head views of one leaf qkv [B, S, 3·H·d]."""
    qkv = _randn(b, s, 3 * h * d, device=dev, dtype=dt, grad=True)

    def split():
        return [t.view(b, s, h, d).transpose(1, 2) for t in qkv.split(h * d, dim=-1)]
    return qkv, split


def training_step(attn, b, h, s, d=64, *, dev="cuda", dt=torch.bfloat16):
    """A training step's attention: split a fused qkv leaf into heads, ``attn(q, k, v)`` causal, backward."""
    qkv, split = _gpt2_qkv(b, h, s, d, dev, dt)
    do = torch.randn(b, h, s, d, device=dev, dtype=dt)

    def step():
        qkv.grad = None
        q, k, v = split()
        attn(q, k, v).backward(do)
    return step


# ----------------------------------------------------------------------------- running
def floor_us(torch_us: float, bare_us: float, kernels: int) -> float:
    return max(OP_FACTOR * torch_us, LAUNCH_FACTOR * bare_us * kernels)


def _row(kind, stage, case, kernels, course, torch_, bare, floor, met, ch, th, cg, tg, clock, key="") -> dict:
    return dict(kind=kind, key=key, stage=stage, case=case, kernels=kernels, course_us=course, torch_us=torch_, bare_us=bare,
                ratio=course / torch_ if torch_ else float("nan"), floor_us=floor, met=met, course_host_us=ch,
                torch_host_us=th, course_gpu_us=cg, torch_gpu_us=tg, clock=clock)


def run_cases(impl: Impl, keys: list[str] | None = None, *, stub: bool = False, log=print) -> list[dict]:
    """Measure the cases (those in ``keys``, default all) for ``impl``: on a GPU for real, or with ``stub``
    under the interpreter (the wrappers' Python; the PyTorch op on the CPU)."""
    dev, dt = DEVICE, (torch.bfloat16 if HAS_CUDA else torch.float32)
    clock = "cpu-stub" if stub else "cuda"
    rows = []
    with stub_launches() if stub else contextlib.nullcontext():
        bx = torch.zeros(1, device=dev)
        bare, tbare = interleaved_us([lambda: bare_launch(bx), lambda: bx.add_(0)])
        rows.append(_row("op", "-", "bare Triton launch (1-line kernel) vs x.add_(0)", 1, bare, tbare, bare,
                         float("nan"), "", *[float("nan")] * 4, clock, key="bare"))
        if not stub:
            h1, g1 = host_and_gpu_us(lambda: bare_launch(bx))
            h2, g2 = host_and_gpu_us(lambda: bx.add_(0))
            rows[-1].update(course_host_us=h1, torch_host_us=h2, course_gpu_us=g1, torch_gpu_us=g2)
        log(f"[hostcost] bare launch {bare:.1f} us, x.add_(0) {tbare:.1f} us ({clock})")
        for case in cases():
            if keys and case.key not in keys:
                continue
            if case.cuda_only and not HAS_CUDA:
                continue
            try:
                course, base = case.make(impl.load, dev, dt)
                for _ in range(3):          # compile, tune, build
                    course()
                    base()
                # the floor's bare launch is measured beside the case, in the same rounds
                c, t, bare = interleaved_us([course, base, lambda: bare_launch(bx)])
                hg = [float("nan")] * 4
                if not stub:
                    (ch, cg), (th, tg) = host_and_gpu_us(course), host_and_gpu_us(base)
                    hg = [ch, th, cg, tg]
            except Exception as e:  # noqa: BLE001 - one case that fails is reported, the others still run
                log(f"[hostcost] {case.key}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
                rows.append(_row("op", case.stage, case.what, case.kernels, float("nan"), float("nan"), bare,
                                 float("nan"), "failed", *[float("nan")] * 4, clock, key=case.key))
                continue
            fl = floor_us(t, bare, case.kernels)
            met = "" if stub else ("yes" if c <= fl else "no")
            rows.append(_row("op", case.stage, case.what, case.kernels, c, t, bare, fl, met, *hg, clock, key=case.key))
            log(f"[hostcost] {case.key}: {c:.1f} us vs {t:.1f} us ({c / t:.2f}x), floor {fl:.1f} us {met}")
    return rows


def run_training(impl: Impl, log=print) -> list[dict]:
    """The training cases: each stage's ``hostcost_training(impl, log)`` (stage 7's flash attention
    against SDPA in an autograd step, solutions/a07_flash_attention/stage.py), rows as run_cases'."""
    from common.course.stages import STAGE_MODULES
    return [row for m in STAGE_MODULES if hasattr(m, "hostcost_training") for row in m.hostcost_training(impl, log)]


def _fmt(v, spec=".1f") -> str:
    return "-" if isinstance(v, float) and v != v else (format(v, spec) if isinstance(v, float) else str(v))


def markdown(rows: list[dict], command: str, device: str) -> str:
    ops = [r for r in rows if r["kind"] == "op"]
    train = [r for r in rows if r["kind"] == "training"]
    out = [f"# Host cost of an eager call: {device}", "", f"`{command}`", "",
           "Launch-bound shapes, bf16 (fp32 on the CPU). µs per call: **eager** = calls back to back, synchronised "
           "around each batch (median); **host** = the host's time to issue a call while the GPU is held busy; "
           "**GPU** = the calls' kernels run back to back. Floor: eager ≤ max(1.5 × PyTorch, 1.5 × bare launch × "
           "kernels).", "",
           "| stage | call | kernels | eager µs | PyTorch µs | ratio | floor µs | met | host µs (PyTorch) | GPU µs (PyTorch) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in ops:
        out.append(f"| {r['stage']} | {r['case']} | {r['kernels']} | {_fmt(r['course_us'])} | {_fmt(r['torch_us'])} | "
                   f"{_fmt(r['ratio'], '.2f')}x | {_fmt(r['floor_us'])} | {r['met'] or '-'} | "
                   f"{_fmt(r['course_host_us'])} ({_fmt(r['torch_host_us'])}) | "
                   f"{_fmt(r['course_gpu_us'])} ({_fmt(r['torch_gpu_us'])}) |")
    if train:
        out += ["", "## Training step: flash attention forward + backward vs SDPA (eager, autograd)", "",
                "Speed = SDPA's time / flash's (≥ 0.8x at B·H 96-384). GPU alone: the same steps' kernels run back to "
                "back; host: issuing one step. Engine on one thread: the same eager steps under "
                "`torch.autograd.set_multithreading_enabled(False)`. By default the autograd engine runs a CUDA "
                "backward on its own device thread: the hand-off to it and back costs host time in every step, "
                "and a backward written in Python runs on a core that was idle. Flash's forward and backward replay "
                "from C++ once a shape's first backward has run (`common.course.native`; `native`: whether this step did); "
                "Python autograd: the same step with that turned off (`autograd.Function` in Python), in the same "
                "rounds.", "",
                "| case | flash ms | SDPA ms | speed | met | native | flash, Python autograd ms (speed) "
                "| GPU alone: flash / SDPA ms (speed) | host µs: flash / SDPA "
                "| engine on one thread: flash / SDPA ms (speed) |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in train:
            out.append(f"| {r['case']} | {r['course_us'] / 1e3:.3f} | {r['torch_us'] / 1e3:.3f} | {r['ratio']:.2f}x | "
                       f"{r['met'] or '-'} | {'yes' if r.get('native') else 'no'} | " + (
                           f"{r['course_python_us'] / 1e3:.3f} ({r['torch_us'] / r['course_python_us']:.2f}x)"
                           if r.get("course_python_us") else "-") + f" | {r['course_gpu_us'] / 1e3:.3f} / {r['torch_gpu_us'] / 1e3:.3f} "
                       f"({r['torch_gpu_us'] / r['course_gpu_us']:.2f}x) | {r['course_host_us']:.0f} / "
                       f"{r['torch_host_us']:.0f} | " + (
                           f"{r['course_1thread_us'] / 1e3:.3f} / {r['torch_1thread_us'] / 1e3:.3f} "
                           f"({r['torch_1thread_us'] / r['course_1thread_us']:.2f}x) |"
                           if r.get("course_1thread_us") else "- |"))
    return "\n".join(out) + "\n"


def write(rows: list[dict], out: Path, name: str, command: str, device: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()})
    (out / f"{name}.md").write_text(markdown(rows, command, device))


def compare(before: Path, after: Path, *, tolerance: float = 1.05) -> int:
    """Print after/before per case (eager and GPU time); 1 if a GPU time got worse by more than ``tolerance``."""
    def load(p):
        with open(p, newline="") as f:
            return {r["case"]: r for r in csv.DictReader(f)}
    b, a = load(before), load(after)
    worse = []
    print(f"{'case':<70} {'eager before':>12} {'after':>8} {'x':>6}   {'GPU before':>10} {'after':>8}")
    for case, ra in a.items():
        rb = b.get(case)
        if rb is None:
            continue
        eb, ea, gb, ga = (float(rb["course_us"]), float(ra["course_us"]), float(rb["course_gpu_us"]),
                          float(ra["course_gpu_us"]))
        print(f"{case[:70]:<70} {eb:>12.1f} {ea:>8.1f} {eb / ea:>5.2f}x   {gb:>10.1f} {ga:>8.1f}")
        if ga > tolerance * gb and ga - gb > 1.0:    # the timer's spread at these sizes, in µs
            worse.append(case)
    for case in worse:
        print(f"GPU time got worse: {case}")
    return 1 if worse else 0


def profile_case(impl: Impl, key: str, *, stub: bool, calls: int = 2000, top: int = 18) -> str:
    """cProfile of ``calls`` calls of one case's course call: where its host microseconds go."""
    import cProfile
    import io
    import pstats
    case = next((c for c in cases() if c.key == key), None)
    if case is None:
        raise SystemExit(f"--profile: no case {key!r}; cases: {', '.join(c.key for c in cases())}")
    with stub_launches() if stub else contextlib.nullcontext():
        course, _ = case.make(impl.load, DEVICE, torch.bfloat16 if HAS_CUDA else torch.float32)
        for _ in range(3):
            course()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            course()
        prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_impl_argument(ap)
    ap.add_argument("--stub", action="store_true", help="no GPU: stub the Triton launches, time the wrappers' Python")
    ap.add_argument("--cases", default="", help="comma-separated case keys (default: all), e.g. a05_gelu,a07_fwd")
    ap.add_argument("--no-training", action="store_true", help="skip the training-shape cases")
    ap.add_argument("--profile", metavar="CASE", help="cProfile one case's calls and print where the time goes")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE_CSV", "AFTER_CSV"), help="compare two runs")
    ap.add_argument("--out", type=Path, help="folder for hostcost.md/.csv (default: the impl's results folder)")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(Path(args.compare[0]), Path(args.compare[1]))
    impl = Impl.get(args.impl)
    stub = args.stub or not HAS_CUDA
    if args.profile:
        print(profile_case(impl, args.profile, stub=stub))
        return 0
    keys = [k for k in args.cases.split(",") if k] or None
    rows = run_cases(impl, keys, stub=stub)
    if not stub and not args.no_training:
        rows += run_training(impl)
    device = torch.cuda.get_device_name() if not stub else "CPU, Triton launches stubbed (the wrappers' Python)"
    name = "hostcost" if not stub else "hostcost_cpu_stub"
    out = args.out or results_dir(impl)
    write(rows, out, name, command_line("common.course.hostcost", argv), device)
    print(markdown(rows, command_line("common.course.hostcost", argv), device))
    print(f"[hostcost] wrote {out / name}.md and .csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
