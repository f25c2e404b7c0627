"""The judge: one stage's trials and timing, graded in a process that never imports the submission.

The judge draws the trials (common.course.stages: fresh random inputs, shapes drawn now), computes every
reference in float64 and every tolerance, and keeps them. It hands the worker (worker.py, a
subprocess with a time limit: the one process that imports the submission) only the inputs and
the name of each call, reads back the outputs and what the worker's trace, profiler and guard saw,
and decides: forbidden ops or kernels, outputs never written (wholly or in part), outputs sharing
memory they may not, the facts a call reported, the values against the references, and on a GPU
every timed call's output against the baseline's on the same fresh inputs. A submission can
therefore not see a reference, change a tolerance or a comparison, or patch the judge: patching
the worker's harness or torch is detected there (common.course.guard) and zeroes the stage.
"""
from __future__ import annotations

import contextlib
import json
import math
import random
import statistics
import subprocess
import sys
import tempfile
import threading
from dataclasses import replace
from pathlib import Path

import torch

from .result import WorkerResult
from .score import FAIL, NEEDS_GPU, PASS, combined_speedup
from .worker import OUTPUTS, PROGRESS, RESULT, TIMING, TRIALS

REPO = Path(__file__).resolve().parents[3]


def run_stage(impl: Path | str, stage, timeout: float, timed: bool | None = None) -> WorkerResult:
    """Grade one stage of ``impl``: trials, and on a GPU (``timed``, default: a GPU is present) the timing."""
    from common import HAS_CUDA
    from common.course.stages import NeedsGPU
    timed = HAS_CUDA if timed is None else timed
    rng = random.SystemRandom()
    res = WorkerResult()
    try:
        trials = stage.trials(rng)
    except NeedsGPU as e:
        res.correctness, res.message = NEEDS_GPU, str(e)
        return res
    except Exception as e:  # noqa: BLE001 - the harness's own fault: said, never a crash of the whole grade
        res.correctness, res.message = FAIL, f"the grader could not draw its trials ({type(e).__name__}: {e})"
        return res
    seed = rng.randrange(2**31)
    with tempfile.TemporaryDirectory(prefix="course-judge-") as tmp:
        io = Path(tmp)
        payload = {"stage": stage.key, "seed": seed, "time": bool(timed and stage.perf is not None),
                   "trials": [{"name": t.name, "call": t.call, "args": t.args,
                               "profile": bool(HAS_CUDA and t.forbid.kernels), "functions": bool(t.forbid.functions)}
                              for t in trials]}
        torch.save(payload, io / TRIALS)
        found, outputs, died = _run_worker(impl, stage.key, io, timeout)
        res.trials_total = len(trials)
        if died:
            res.correctness, res.message = FAIL, died
            return res
        res = _judge(stage, trials, found, outputs, res)
        if res.correctness == PASS and payload["time"]:
            timing, died = _run_timing(impl, stage.key, io, timeout)
            res.violations += timing.get("violations", [])
            if res.violations:
                res.correctness = FAIL
            timing = timing.get("timing") or ({"error": died} if died else None)
        else:
            timing = None
    return _judge_timing(stage, timing, res)


#: How the judge runs a worker (subprocess.run's signature). The course's mutation checks, which grade
#: dozens of submissions in one judge process, fork them from a process that made the imports once
#: (tests/mutants/zygote.py); the grader always starts a new process.
RUN_WORKER = subprocess.run


def _worker(impl, key: str, io: Path, timeout: float, *extra: str) -> tuple[object, str]:
    """Run the worker; (the process, '') or (None, why: a time-out)."""
    cmd = [sys.executable, "-m", "common.course.grade.worker", key, "--impl", str(impl), "--io", str(io), *extra]
    try:
        return RUN_WORKER(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout), ""
    except subprocess.TimeoutExpired:
        return None, f"timed out after {timeout:.0f} s"


def _read_json(path: Path) -> dict:
    try:
        found = json.loads(path.read_text()) if path.exists() else {}
    except ValueError:
        found = {}
    return found if isinstance(found, dict) else {}


def _run_timing(impl, key: str, io: Path, timeout: float) -> tuple[dict, str]:
    """The timing worker's findings, or '' and why there are none."""
    from .run import _died
    r, why = _worker(impl, key, io, timeout, "--time")
    if r is None:
        return {}, f"timing {why}"
    found = _read_json(io / TIMING)
    if "timing" not in found:
        return {}, found.get("fatal") or f"timing {_died(r.returncode)}: {(r.stderr or r.stdout)[-300:]}"
    return found, ""


#: Print the worker's progress (a line per group of trials) to stderr while it runs; False: silent.
PROGRESS_TO_STDERR = True


def progress(line: str) -> None:
    """One progress line on stderr (a terminal: in place of the last one), unless PROGRESS_TO_STDERR is off."""
    if not PROGRESS_TO_STDERR:
        return
    text = f"  {line} ..."
    if sys.stderr.isatty():
        print("\r" + text.ljust(100), end="", file=sys.stderr, flush=True)
    else:
        print(text, file=sys.stderr, flush=True)


@contextlib.contextmanager
def _echo_progress(path: Path, key: str):
    """While the worker runs, print each line it adds to ``path`` (a group of trials starting) to stderr."""
    if not PROGRESS_TO_STDERR:
        yield
        return
    stop, seen = threading.Event(), [0]

    def echo():
        try:
            lines = path.read_text().splitlines() if path.exists() else []
        except OSError:
            return
        for line in lines[seen[0]:]:
            progress(f"{key}: {line}")
        seen[0] = len(lines)

    def loop():
        while not stop.wait(0.5):
            echo()
    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        echo()


def _run_worker(impl, key: str, io: Path, timeout: float) -> tuple[dict, list, str]:
    """(what the worker found, the outputs, '' or why there is nothing: a crash, a time-out)."""
    from .run import _died
    with _echo_progress(io / PROGRESS, key):
        r, why = _worker(impl, key, io, timeout)
    if r is None:
        return {}, [], why
    found = _read_json(io / RESULT)
    if "trials" not in found:
        tail = [ln for ln in (r.stderr or r.stdout).strip().splitlines() if not ln.startswith("Extension modules:")][-3:]
        why = found.get("fatal")
        return {}, [], why or (_died(r.returncode) + (f": {' | '.join(tail)[-400:]}" if tail else " in the grader's trials"))
    try:                                     # tensors only: nothing in the file can run code here
        outputs = torch.load(io / OUTPUTS, weights_only=True) if (io / OUTPUTS).exists() else []
    except Exception as e:  # noqa: BLE001
        return {}, [], f"the worker's outputs could not be read ({type(e).__name__})"
    return found, outputs, ""


def _unwritten(outs) -> tuple[int, int]:
    """(poisoned elements, elements) over the outputs: NaN (integers: their max) is what the worker's
    torch.empty returns, so a buffer the kernel never wrote still holds it."""
    bad = total = 0
    for o in outs:
        if not o.numel() or o.dtype == torch.bool:
            continue
        total += o.numel()
        if o.is_floating_point() or o.is_complex():
            bad += int(torch.isnan(o).sum())
        else:
            bad += int((o == torch.iinfo(o.dtype).max).sum())
    return bad, total


def _judge(stage, trials, found: dict, outputs: list, res: WorkerResult) -> WorkerResult:
    from common.kernel_check import forbidden_kernels, forbidden_ops, kernels_message, ops_message
    from common.course.stages import tensors
    from common.testing import rel_error
    res.violations = list(found.get("violations", []))
    worst_ratio, msgs = -1.0, []
    recs = found.get("trials", [])
    for i, tr in enumerate(trials):
        if i >= len(recs):
            msgs.append(f"{tr.name}: not run (the worker stopped before it)")
            continue
        rec, outs = recs[i], (outputs[i] if i < len(outputs) else [])
        if rec.get("error"):
            note = rec["error"]
            if rec.get("needs_gpu"):
                msgs.append(f"{tr.name}: needs a GPU ({note})")
            else:
                if rec.get("not_implemented") and note not in res.not_implemented:
                    res.not_implemented.append(note)
                msgs.append(f"{tr.name}: {note}")
            continue
        bad = forbidden_ops(rec.get("ops", []), rec.get("functions", []), tr.forbid)
        if bad:
            res.violations.append(ops_message(tr.name, bad, tr.forbid.use))
            continue
        bad = forbidden_kernels(rec.get("gpu_kernels", []), tr.forbid)
        if bad:
            res.violations.append(kernels_message(tr.name, bad))
            continue
        refs = tensors(tr.ref)
        if len(outs) != len(refs):
            msgs.append(f"{tr.name}: returned {len(outs)} tensors, expected {len(refs)}")
            continue
        if tr.dtypes is not None:
            wrong = [f"output {j}: {o.dtype}, expected {d}" for j, (o, d) in enumerate(zip(outs, tr.dtypes))
                     if d is not None and o.dtype != d]
            if wrong:
                msgs.append(f"{tr.name}: wrong dtype ({'; '.join(wrong)})")
                continue
        if not tr.exact:
            poisoned, total = _unwritten(outs)
            if poisoned and poisoned == total:
                note = f"{tr.name}: the output was never written (still NaN)"
                res.not_implemented.append(note)
                msgs.append(note)
                continue
            if poisoned:
                msgs.append(f"{tr.name}: {poisoned} of {total} outputs never written (still NaN): check the grid "
                            "and the mask")
                continue
        aliases = [a for a in rec.get("aliases", []) if not any(f"input '{n}'" in a for n in tr.inplace)]
        if aliases:
            msgs.append(f"{tr.name}: outputs share memory where the contract asks for new tensors ({'; '.join(aliases[:3])})"
                        ": an output buffer reused across calls, or an input returned as the output")
            continue
        if tr.judge is not None:
            problem = tr.judge(rec.get("facts", {}))
            if problem:
                msgs.append(f"{tr.name}: {problem}")
                continue
        if tr.exact:
            ok = all(o.tolist() == r.tolist() for o, r in zip(outs, refs))
            err = 0.0 if ok else float("inf")
            if not ok:
                msgs.append(f"{tr.name}: got {[o.tolist() for o in outs]}, expected {[r.tolist() for r in refs]}")
        else:
            scales = tensors(tr.scale) if tr.scale is not None else [None] * len(refs)
            err = max(rel_error(o, r, sc) for o, r, sc in zip(outs, refs, scales))
            ok = err <= tr.tol
            if not ok:
                msgs.append(f"{tr.name}: relative error {err:.3e} > tolerance {tr.tol:.1e}")
        ratio = err / tr.tol if tr.tol else (0.0 if ok else float("inf"))
        if ratio > worst_ratio:
            worst_ratio, res.worst_error, res.tolerance = ratio, err, tr.tol
        res.trials_passed += int(ok)
    res.correctness = PASS if res.trials_passed == res.trials_total and not res.violations else FAIL
    res.message = "; ".join(msgs[:3] + (stage.not_here() if stage.not_here else []))
    if res.worst_error is not None and res.worst_error == float("inf"):
        res.worst_error = None
    return res


def _judge_timing(stage, timing: dict | None, res: WorkerResult) -> WorkerResult:
    from common import HAS_CUDA
    if stage.perf is None:
        res.perf_note = "not timed (no performance case)"
        return res
    if not HAS_CUDA:
        res.perf_note = "needs a GPU"
        return res
    if res.correctness != PASS:
        res.perf_note = "not timed: correctness failed"
        return res
    if not timing:
        res.perf_note = "not timed"
        return res
    for c in timing.get("cases", []):
        unjoined = c.get("unjoined") or ("unjoined" in c.get("how", "") and f"graph capture: {c['how']}")
        if unjoined:
            res.correctness = FAIL
            res.message = (f"{c['label']}: work left on another stream, never joined back to the caller's "
                           f"({unjoined}): a reader on the caller's stream can see the output before it is "
                           "written, and a timing on the caller's stream does not count that work. No speed points.")
            res.perf_note = "work left unjoined on another stream (no speed points)"
            return res
    if timing.get("error"):
        res.perf_note = f"timing failed: {timing['error']}"
        return res
    timed, eager = [], []
    for c in timing["cases"]:
        if c["how"].startswith("eager"):
            eager.append(c["how"])
        errors = [float(e) for e in c["errors"]]
        wrong = [e for e in errors if not e <= stage.perf_tol]        # NaN and inf fail too
        if wrong or not errors:
            worst = max(wrong, key=lambda e: e if e == e else math.inf) if wrong else float("nan")
            res.correctness = FAIL
            res.message = (f"{c['label']}: {len(wrong)} of {len(errors)} timed calls ({c['how']}) differ from "
                           f"{c['baseline_name']} on their own fresh inputs (relative error up to {worst:.2e} > "
                           f"{stage.perf_tol:.0e}): the timed call's output did not come from its inputs (an output "
                           "memoised or captured from an earlier call, or work skipped while timed). No speed points.")
            res.perf_note = "timing exploit: timed calls gave wrong outputs (no speed points)"
            return res
        timed.append(dict(label=c["label"], ms=statistics.median(c["ms"]), baseline_ms=statistics.median(c["baseline_ms"]),
                          flops=c["flops"], bytes=c["bytes"], timing=f"{c['how']}, {len(errors)} calls on fresh inputs",
                          kernels_per_call=c["kernels_per_call"], host_transfers_per_call=c["host_transfers_per_call"],
                          eager_ms=c.get("eager_ms"), baseline_eager_ms=c.get("baseline_eager_ms"),
                          baseline_name=c["baseline_name"]))
    if eager:           # said in the stage's row: why the times are eager ones, and what they count
        note = (f"timed eagerly, {eager[0][len('eager ('):].rstrip(')')}; each eager time ends after "
                "torch.cuda.synchronize() (every stream's work counted, as a graph replay would)")
        res.message = "; ".join(x for x in (res.message, note) if x)
    ceil = _ceilings()
    return replace(res, baseline=timed[0]["baseline_name"], ceilings=ceil, perf_target=stage.perf_target,
                   **summarize([{k: v for k, v in t.items() if k != "baseline_name"} for t in timed], ceil))


def summarize(cases: list[dict], ceilings: dict) -> dict:
    """The :class:`WorkerResult` performance fields from the timed cases (each a dict of label, ms,
    baseline_ms, flops, bytes, timing, kernels_per_call, host_transfers_per_call), pure: each case
    gets its speedup, bound and roofline fraction; over all of them ``speedup``, what is scored,
    is the geometric mean of the per-case speedups (score.combined_speedup); ms, baseline_ms,
    flops and bytes are sums (the achieved rate is all the work over all the time), the roofline
    point is that of the sums, kernels and host transfers per call the largest of any case."""
    from common.roofline import Ceilings, Point
    c = Ceilings(**ceilings)
    done = []
    for k in cases:
        pt = Point(k["label"], k["flops"], k["bytes"], k["ms"])
        done.append({**k, "speedup": k["baseline_ms"] / k["ms"], "bound": pt.bound(c),
                     "roofline_fraction": pt.fraction(c)})
    total = Point("all", sum(k["flops"] for k in done), sum(k["bytes"] for k in done), sum(k["ms"] for k in done))
    label = done[0]["label"] if len(done) == 1 else \
        f"geometric mean over {len(done)} shapes: " + "; ".join(k["label"] for k in done)
    eager = [k.get("eager_ms") for k in done]
    base_eager = [k.get("baseline_eager_ms") for k in done]
    both = all(isinstance(x, float) and x == x for x in eager + base_eager)
    return dict(ms=total.ms, baseline_ms=sum(k["baseline_ms"] for k in done), perf_label=label,
                eager_ms=sum(eager) if both else None, baseline_eager_ms=sum(base_eager) if both else None,
                speedup=combined_speedup([k["speedup"] for k in done]), bound=total.bound(c),
                roofline_fraction=total.fraction(c), flops=total.flops, bytes=total.bytes,
                kernels_per_call=max(k["kernels_per_call"] for k in done),
                host_transfers_per_call=max(k["host_transfers_per_call"] for k in done),
                timing="; ".join(dict.fromkeys(k["timing"] for k in done)), cases=done)


def _ceilings() -> dict:
    """Measured copy bandwidth and bf16 matmul rate of this GPU, cached per device name."""
    from common.cuda_ext import cache_dir
    from common.roofline import measure_ceilings
    name = torch.cuda.get_device_name()
    path = cache_dir() / "ceilings.json"
    cache = json.loads(path.read_text()) if path.exists() else {}
    if name not in cache:
        c = measure_ceilings()
        cache[name] = {"gbps": c.gbps, "tflops": c.tflops, "source": c.source}
        path.write_text(json.dumps(cache, indent=1))
    return cache[name]
