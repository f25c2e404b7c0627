"""The grader's worker: the one process that imports the submission.

    python -m common.course.grade.worker a03 --impl solutions --io DIR           # the trials
    python -m common.course.grade.worker a03 --impl solutions --io DIR --time    # the timing (GPU), a second process

The judge (judge.py) writes ``DIR/trials.pt``: for each trial its name, the call to make
(``common.course.stages.CALLS``) and the inputs, never the reference or the tolerance. This process
records what torch and the harness look like (common.course.guard), imports the submission, runs every
call under the dispatch trace (and on a GPU the profiler, on a copy of the inputs), and writes back
what it saw: ``DIR/outputs.pt`` (each trial's outputs, all kept alive until the last trial ran, so
an output buffer a later call overwrote shows) and ``DIR/result.json`` (per trial: the traced ops,
torch functions and interpreted kernels, the GPU kernels, the facts the call reported, which
outputs share memory with what, the exception if any; the guard's findings). With ``--time``
(a second process, started once the trials passed) it times the performance cases instead and
writes ``DIR/timing.json``: every timed call's time and error (common.timing.bench_fresh). The
judge decides everything.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import traceback
from pathlib import Path

RESULT, OUTPUTS, TRIALS, TIMING = "result.json", "outputs.pt", "trials.pt", "timing.json"
#: One line per group of trials as the worker reaches it (the judge echoes them: the grader's progress).
PROGRESS = "progress.txt"


@contextlib.contextmanager
def _poison_empty():
    """torch.empty & co. return NaN (ints: their max) while this is on, so an output
    buffer the submission never writes is recognisable by the judge."""
    import warnings

    import torch
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)     # warn_only: no op is refused
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch.use_deterministic_algorithms(was, warn_only=warn_only)


def _span(t) -> tuple[int, int] | None:
    """The bytes [lo, hi) a tensor's elements occupy (None: no memory)."""
    if not t.numel() or t.is_meta:
        return None
    lo = t.data_ptr()
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0)
    return lo, lo + (last + 1) * t.element_size()


def _overlap(a, b) -> bool:
    return a is not None and b is not None and a[0] < b[1] and b[0] < a[1]


def _clone_args(args: dict) -> dict:
    """A copy of a trial's inputs with the same shapes and strides (the profiled second call runs on it,
    so the first call's in-place outputs stay as they were)."""
    import torch

    def clone(t):
        if not isinstance(t, torch.Tensor):
            return t
        c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        c.copy_(t)
        return c
    return {k: clone(v) for k, v in args.items()}


def _import_harness() -> None:
    """Import every harness module before the guard's snapshot, so that all of them are watched (a
    module the submission imports first would otherwise be recorded after it could patch it)."""
    import importlib
    import pkgutil

    import common
    import common.course
    import common.course.grade
    for pkg in (common, common.course, common.course.grade):
        for info in pkgutil.iter_modules(pkg.__path__):
            if info.name not in ("__main__", "make_stubs") and not info.ispkg:
                importlib.import_module(f"{pkg.__name__}.{info.name}")


def run_trials(impl: str, io: Path) -> dict:
    import torch

    _import_harness()
    from common import HAS_CUDA, profiling
    from common.course import guard
    from common.impl import load as load_impl
    from common.course.stages import CALLS, NeedsGPU, Run, by_key, tensors

    payload = torch.load(io / TRIALS, weights_only=True)
    by_key(payload["stage"])           # the stage modules, which fill CALLS, are imported on first use
    before = guard.snapshot()          # before the submission is imported
    result = {"trials": [], "violations": []}
    reported: set[str] = set()

    def load(module):
        return load_impl(module, impl)

    def patched(when: str) -> None:
        new = [f for f in guard.changed(before) if f not in reported]
        if new:
            reported.update(new)
            result["violations"].append(f"the submission patched the harness or torch {when}: {', '.join(new)}")

    outputs, kept = [], []             # kept: (trial index, output index, span) of every output so far
    for i, tr in enumerate(payload["trials"]):
        _progress(io, payload["trials"], i)
        rec = {"ops": [], "functions": [], "kernels": [], "gpu_kernels": [], "facts": {}, "error": None,
               "not_implemented": False, "needs_gpu": False, "aliases": []}
        result["trials"].append(rec)
        outs: list = []
        try:
            run = Run(load)
            args = tr["args"]
            with _poison_empty(), profiling.trace_ops(functions=bool(tr.get("functions"))) as t:
                out = CALLS[tr["call"]](run, **args)
            rec["ops"], rec["functions"], rec["kernels"] = t.ops, t.functions, t.kernels
            rec["facts"] = run.facts
            outs = tensors(out)
            # which outputs share memory with the trial's inputs, each other, or earlier trials' outputs
            arg_spans = {k: _span(v) for k, v in args.items() if isinstance(v, torch.Tensor)}
            spans = [_span(o) for o in outs]
            for j, sp in enumerate(spans):
                rec["aliases"] += [f"output {j} and input '{k}'" for k, a in arg_spans.items() if _overlap(sp, a)]
                rec["aliases"] += [f"outputs {j} and {m}" for m in range(j) if _overlap(sp, spans[m])]
                rec["aliases"] += [f"output {j} and output {m} of trial {ti + 1}" for ti, m, other in kept
                                   if _overlap(sp, other)]
            kept += [(i, j, sp) for j, sp in enumerate(spans)]
            if HAS_CUDA and tr.get("profile"):
                copy = _clone_args(args)
                rec["gpu_kernels"] = profiling.profile(lambda: CALLS[tr["call"]](Run(load), **copy), calls=1,
                                                       warmup=0).kernels
        except NeedsGPU as e:
            rec["needs_gpu"], rec["error"] = True, str(e)
        except NotImplementedError as e:
            rec["not_implemented"], rec["error"] = True, f"NotImplementedError: {e}"
        except Exception as e:  # noqa: BLE001 - a broken submission fails its trial with the message
            line = str(e).splitlines()[0] if str(e) else ""
            rec["error"] = f"{type(e).__name__}: {line}"[:1000]
        outputs.append([o.detach() for o in outs])
        if i == 0:
            patched("at import")
    patched("during the trials")
    torch.save([[o.to("cpu") for o in outs] for outs in outputs], io / OUTPUTS)
    return result


def run_timing(impl: str, io: Path) -> dict:
    """The performance cases, in a process of their own (the judge starts it once the trials passed):
    nothing the trials left behind (fake CUDA tensors, the profiler, poisoned allocations) touches
    the timing, and the guard watches this process too."""
    import torch

    _import_harness()
    from common.course import guard
    from common.impl import load as load_impl
    from common.course.stages import by_key

    payload = torch.load(io / TRIALS, weights_only=True, map_location="cpu")   # the stage and seed: no GPU memory
    stage = by_key(payload["stage"])       # every stage module imported (CALLS complete) before the guard looks
    before = guard.snapshot()
    result = {"timing": _time(stage, lambda m: load_impl(m, impl), payload["seed"]), "violations": []}
    found = guard.changed(before)
    if found:
        result["violations"].append(f"the submission patched the harness or torch while it was timed: {', '.join(found)}")
    return result


def _time(stage, load, seed: int) -> dict:
    """Every performance case: bench_fresh's raw numbers, and kernels and host transfers per call."""
    import torch

    from common.profiling import profile
    from common.course.stages import perf_cases
    from common.timing import bench_fresh
    cases = []
    try:
        for n, p in enumerate(perf_cases(stage, load)):
            t = bench_fresh(p.inputs, p.submission, p.baseline, seed=seed + n)
            if t.unjoined:             # the stage fails on it (the judge says why): nothing more to measure
                cases.append(dict(label=p.label, baseline_name=p.baseline_name, how=t.how, unjoined=t.unjoined))
                break
            inp = p.inputs(torch.Generator(device="cuda").manual_seed(seed))
            rep = profile(lambda: p.submission(inp), calls=3)
            cases.append(dict(label=p.label, baseline_name=p.baseline_name, flops=p.flops, bytes=p.bytes,
                              how=t.how, ms=t.ms, baseline_ms=t.baseline_ms, errors=t.errors,
                              eager_ms=t.eager_ms, baseline_eager_ms=t.baseline_eager_ms, unjoined=t.unjoined,
                              kernels_per_call=rep.n_kernels, host_transfers_per_call=rep.host_transfers))
    except Exception as e:  # noqa: BLE001
        return {"error": f"{type(e).__name__}: {e}"[:1000], "cases": cases}
    return {"error": None, "cases": cases}


def _progress(io: Path, trials: list, i: int) -> None:
    """Where trial ``i`` starts a group (a call other than the one before it), one line in ``io/PROGRESS``
    ("trials 4-9 of 25: add_layernorm"), which the judge prints as the trials run."""
    call = trials[i]["call"]
    if i and trials[i - 1]["call"] == call:
        return
    j = i
    while j + 1 < len(trials) and trials[j + 1]["call"] == call:
        j += 1
    span = f"trial {i + 1}" if i == j else f"trials {i + 1}-{j + 1}"
    with open(io / PROGRESS, "a") as f:
        f.write(f"{span} of {len(trials)}: {call.split('_', 1)[-1]}\n")


def main(argv: list[str] | None = None) -> int:
    from common.impl import add_impl_argument
    ap = argparse.ArgumentParser(prog="python -m common.course.grade.worker",
                                 description="One stage's trials and timing (the judge runs this; see judge.py).")
    ap.add_argument("stage", help="stage key, e.g. a03")
    add_impl_argument(ap, required=True)
    ap.add_argument("--io", type=Path, required=True, help="the folder the judge shares with this process")
    ap.add_argument("--time", action="store_true", help="time the performance cases (GPU) instead of running the trials")
    args = ap.parse_args(argv)
    try:
        res = run_timing(args.impl, args.io) if args.time else run_trials(args.impl, args.io)
    except Exception as e:  # noqa: BLE001
        res = {"fatal": f"{type(e).__name__}: {e} | {traceback.format_exc().splitlines()[-2][:200]}"}
    (args.io / (TIMING if args.time else RESULT)).write_text(json.dumps(res, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
