"""The grader: one implementation, stage by stage, against PyTorch.

    python -m common.grade                         # grade assignments/ (make grade)
    python -m common.grade --impl solutions
    python -m common.grade --impl path/to/submission --results-json out/results.json
    python -m common.grade --submissions subs/ --out graded/     # many, one process per GPU

Every stage runs in its own subprocess with a time limit, so a submission that
raises, hangs or crashes fails that stage only. A stage's grade has two parts:

* correctness (10 points): the stage's pytest file (5 points, by the fraction of
  tests passed) and the grader's own trials (5 points: fresh random inputs with shapes
  drawn now, references computed beforehand from private copies, forbidden PyTorch
  ops and kernels checked). Calling the PyTorch op where a kernel was asked for, or
  patching torch or the harness, zeroes the stage.
* performance (5 points, GPU only): speed against the PyTorch baseline, full points at
  the stage's target ratio; also reported: time, speedup, roofline fraction (from the
  stage's bytes and FLOPs and ceilings measured on this GPU), kernels and host
  transfers per call. On a machine without a GPU the report says "needs a GPU": no
  numbers are made up, and the maximum score counts correctness only.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARK = "@@GRADE-RESULT@@"
CORRECT_POINTS, PERF_POINTS = 10.0, 5.0
SCORING = """\
How you are scored (per stage):
  correctness, 10 points:
    5 x (graded tests passed / tests run) of the stage's pytest file (skipped tests do not count)
  + 5 if every one of the grader's trials passes (fresh random inputs and shapes, float64
      references), else 0: one failed trial loses all 5.
    With --no-tests the trials carry all 10; a GPU-only stage graded on a CPU (trials "need
    a GPU") gets 10 x the fraction of its CPU tests.
  zero for the stage: a trial that calls the PyTorch op the stage replaces (aten ops and,
    where a composite such as F.linear would hide, torch functions are traced; on a GPU also
    the kernels that ran), or a submission that patches torch or the harness. Its numbers
    are right because PyTorch computed them, so no test it passes counts.
  speed, 5 points, GPU only: 5 x min(1, speedup / the stage's target) against the PyTorch
    baseline, and only with all 10 correctness points. On a CPU-only machine the maximum is
    10 per stage and the table has no timing columns.
  "correct" column: pass (all tests and trials), partial (trials passed, some test failed),
    fail, needs a GPU.
Examples:
  a weight copied per call failed 1 of 80 tests, every trial passed: 5 x 79/80 + 5 = 9.94/10,
    shown as "partial" (earlier versions said "pass").
  torch's add instead of the bias kernel failed 1 of 80 tests (the one that looks for torch
    arithmetic), and the trials saw aten.add where the kernel was asked for: 0/10.
"""


@dataclass
class StageResult:
    stage: str
    title: str
    tests_passed: int = 0
    tests_failed: int = 0
    tests_skipped: int = 0
    trials_passed: int = 0
    trials_total: int = 0
    worst_error: float | None = None
    tolerance: float | None = None
    violations: list[str] = field(default_factory=list)
    correctness: str = "fail"          # pass | partial (trials passed, a test failed) | fail | needs a GPU
    message: str = ""
    not_implemented: list[str] = field(default_factory=list)   # NotImplementedError / output never written
    ms: float | None = None
    baseline_ms: float | None = None
    baseline: str = ""
    perf_label: str = ""
    speedup: float | None = None
    bound: str | None = None
    roofline_fraction: float | None = None
    kernels_per_call: int | None = None
    host_transfers_per_call: int | None = None
    perf_note: str = ""
    timing: str = ""                   # how ms and baseline_ms were measured
    perf_target: float | None = None
    flops: float | None = None
    bytes: float | None = None
    ceilings: dict | None = None
    score: float = 0.0
    max_score: float = CORRECT_POINTS
    seconds: float = 0.0


# =============================================================================== worker
@contextlib.contextmanager
def _poison_empty():
    """torch.empty & co. return NaN (ints: their max) while this is on, so an output
    buffer the submission never writes is recognisable: see :func:`_unwritten`."""
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


def _unwritten(outs) -> bool:
    """Every element of some non-empty output is still the poison: NaN, or an integer's max."""
    import torch
    for o in outs:
        if not isinstance(o, torch.Tensor) or not o.numel():
            continue
        if o.is_floating_point() or o.is_complex():
            if bool(torch.isnan(o).all()):
                return True
        elif o.dtype != torch.bool and bool((o == torch.iinfo(o.dtype).max).all()):
            return True
    return False


def _worker(impl: str, stage_key: str) -> dict:
    """Runs in a subprocess: the grader's trials and (GPU) the performance case of one stage."""
    from common import HAS_CUDA, guard, kernel_check
    from common.impl import load as load_impl
    from common.profiling import profile
    from common.stages import NeedsGPU, by_key, tensors
    from common.testing import rel_error

    stage = by_key(stage_key)
    res = {"violations": [], "trials_passed": 0, "trials_total": 0, "worst_error": None, "tolerance": None,
           "not_implemented": []}
    before = guard.snapshot()

    def load(module):
        return load_impl(module, impl)

    rng = random.SystemRandom()
    try:
        trials = stage.trials(load, rng)
    except NeedsGPU as e:
        res["correctness"] = "needs a GPU"
        res["message"] = str(e)
        return res
    except NotImplementedError as e:
        res["correctness"] = "fail"
        res["not_implemented"].append(f"NotImplementedError: {e}")
        res["message"] = f"setting up trials failed: NotImplementedError: {e}"
        return res
    except Exception as e:  # noqa: BLE001 - a broken submission fails its stage with the message
        res["correctness"] = "fail"
        res["message"] = f"setting up trials failed: {type(e).__name__}: {e}"
        return res
    patched = guard.changed(before)
    if patched:
        res["violations"].append(f"the submission patched {', '.join(patched)} at import")
    res["trials_total"] = len(trials)
    worst_ratio, msgs = -1.0, []
    for tr in trials:
        try:
            with _poison_empty(), kernel_check.watch(tr.forbid) as t:
                out = tr.call()
            bad_ops = kernel_check.called(t, tr.forbid)
            if bad_ops:
                res["violations"].append(kernel_check.ops_message(tr.name, bad_ops))
                continue
            outs, refs = tensors(out), tensors(tr.ref)
            if len(outs) != len(refs):
                msgs.append(f"{tr.name}: returned {len(outs)} tensors, expected {len(refs)}")
                continue
            if not tr.exact and _unwritten(outs):
                note = f"{tr.name}: the output was never written (still NaN)"
                res["not_implemented"].append(note)
                msgs.append(note)
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
                worst_ratio, res["worst_error"], res["tolerance"] = ratio, err, tr.tol
            if ok:
                bad = kernel_check.launched(tr.call, tr.forbid)       # on a GPU: the profiler
                if bad:
                    res["violations"].append(kernel_check.kernels_message(tr.name, bad))
                    continue
            res["trials_passed"] += int(ok)
        except NeedsGPU as e:
            msgs.append(f"{tr.name}: needs a GPU ({e})")
        except NotImplementedError as e:
            note = f"NotImplementedError: {e}"
            if note not in res["not_implemented"]:
                res["not_implemented"].append(note)
            msgs.append(f"{tr.name}: {note}")
        except Exception as e:  # noqa: BLE001
            msgs.append(f"{tr.name}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    patched = guard.changed(before)
    if patched:
        res["violations"].append(f"the submission patched {', '.join(patched)}")
    res["correctness"] = "pass" if res["trials_passed"] == res["trials_total"] and not res["violations"] else "fail"
    res["message"] = "; ".join(msgs[:3])
    if res["worst_error"] is not None and res["worst_error"] == float("inf"):
        res["worst_error"] = None
    # ------------------------------------------------------------------ performance (GPU)
    if stage.perf is None:
        res["perf_note"] = "not timed (no performance case)"
        return res
    if not HAS_CUDA:
        res["perf_note"] = "needs a GPU"
        return res
    if res["correctness"] != "pass":
        res["perf_note"] = "not timed: correctness failed"
        return res
    try:
        from common.roofline import Point
        from common.timing import bench, bench_graph
        p = stage.perf(load)
        expected = p.baseline()
        err = rel_error(p.submission(), expected)
        if not err <= p.tol:
            res["correctness"] = "fail"
            res["message"] = f"{p.label}: differs from {p.baseline_name} by relative error {err:.2e} at the timed size"
            return res

        def check(out):
            e = rel_error(out, expected)
            if not e <= p.tol:
                raise _TimedCallWrong(f"{p.label}: the timed (graph-captured) call's output differs from "
                                      f"{p.baseline_name} by relative error {e:.2e}")
        # GPU time by CUDA-graph replay, for the submission and the baseline alike: launch
        # and Python overhead and a busy CPU (other grading processes) stay out of it.
        # Calls that cannot be captured are timed eagerly, and the report says so.
        try:
            ms = bench_graph(p.submission, check=check).median_ms
            base = bench_graph(p.baseline).median_ms
            res["timing"] = "cuda-graph replay"
        except _TimedCallWrong as e:
            res["correctness"] = "fail"
            res["message"] = str(e)
            return res
        except Exception as e:  # noqa: BLE001
            import torch
            torch.cuda.synchronize()
            ms, base = bench(p.submission).median_ms, bench(p.baseline).median_ms
            res["timing"] = f"eager (graph capture failed: {type(e).__name__})"
        rep = profile(p.submission, calls=3)
        ceil = _ceilings()
        from common.roofline import Ceilings
        point = Point(p.label, p.flops, p.bytes, ms)
        c = Ceilings(**ceil)
        res.update(ms=ms, baseline_ms=base, baseline=p.baseline_name, perf_label=p.label, speedup=base / ms,
                   bound=point.bound(c), roofline_fraction=point.fraction(c), kernels_per_call=rep.n_kernels,
                   host_transfers_per_call=rep.host_transfers, flops=p.flops, bytes=p.bytes, ceilings=ceil,
                   perf_target=stage.perf_target)
    except Exception as e:  # noqa: BLE001
        res["perf_note"] = f"timing failed: {type(e).__name__}: {e}"
    return res


class _TimedCallWrong(AssertionError):
    """The graph-captured performance call did not reproduce the checked output."""


def _ceilings() -> dict:
    """Measured copy bandwidth and bf16 matmul rate of this GPU, cached per device name."""
    import torch

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


# =============================================================================== parent
def junit_outcomes(xml: Path) -> dict:
    """Test ids by outcome from a pytest junit report, and the first failure's message."""
    out = {"passed": [], "failed": [], "skipped": [], "first_failure": ""}
    for case in ET.parse(xml).getroot().iter("testcase"):
        kinds = {c.tag: c for c in case}
        name = f"{case.get('classname')}::{case.get('name')}"
        if "failure" in kinds or "error" in kinds:
            out["failed"].append(name)
            if not out["first_failure"]:
                msg = (kinds.get("failure", kinds.get("error")).get("message") or "").splitlines()
                out["first_failure"] = f"{case.get('name')}: {msg[0][:200] if msg else ''}"
        elif "skipped" in kinds:
            out["skipped"].append(name)
        else:
            out["passed"].append(name)
    return out


def _run_tests(impl: Path, folder: str, timeout: float) -> tuple[int, int, int, str]:
    test = REPO / "tests" / f"test_{folder}.py"
    if not test.exists():
        return 0, 0, 0, f"no test file {test.name}"
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", str(test), "--impl", str(impl), "-q", "-p", "no:cacheprovider",
               "-m", "graded", "--tb=short", f"--junitxml={xml}"]
        running = Path(tmp) / "running"       # tests/autograder.py writes each test's id here as it starts
        env = dict(os.environ, COURSE_RUNNING_TEST_FILE=str(running))
        try:
            r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return 0, 1, 0, f"tests timed out after {timeout:.0f} s"
        if not xml.exists():
            test = running.read_text().strip() if running.exists() else ""
            return 0, 1, 0, f"tests {_died(r.returncode)}" + (f" while running {test}" if test else
                                                                 f": {(r.stdout + r.stderr)[-300:]}")
        out = junit_outcomes(xml)
        return len(out["passed"]), len(out["failed"]), len(out["skipped"]), out["first_failure"]


def _died(returncode: int) -> str:
    """'crashed with SIGABRT (signal 6)' for a process killed by a signal, else its exit code."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "a signal"
        return f"crashed with {name} (signal {-returncode})"
    return f"crashed (exit {returncode})"


def _run_worker(impl: Path, key: str, timeout: float) -> dict:
    cmd = [sys.executable, "-m", "common.grade", "--worker", key, "--impl", str(impl)]
    try:
        r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"correctness": "fail", "message": f"timed out after {timeout:.0f} s", "violations": []}
    for line in r.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    tail = [ln for ln in (r.stderr or r.stdout).strip().splitlines() if not ln.startswith("Extension modules:")][-3:]
    return {"correctness": "fail", "violations": [],
            "message": _died(r.returncode) + (f": {' | '.join(tail)[-400:]}" if tail else " in the grader's trials")}


def grade_stage(impl: Path, stage, timeout: float, run_tests: bool = True) -> StageResult:
    from common import HAS_CUDA
    t0 = time.time()
    res = StageResult(stage.folder, stage.title)
    if run_tests:
        res.tests_passed, res.tests_failed, res.tests_skipped, first = _run_tests(impl, stage.folder, timeout)
    else:
        first = ""
    w = _run_worker(impl, stage.key, timeout)
    for k, v in w.items():
        if hasattr(res, k):
            setattr(res, k, v)
    if first and res.tests_failed:
        res.message = "; ".join(x for x in (res.message, f"first failing test: {first}") if x)
        if "NotImplementedError" in first:
            note = first.split(": ", 1)[-1]
            if not any(note in n for n in res.not_implemented):
                res.not_implemented.append(note)
    # ---- score
    ran = res.tests_passed + res.tests_failed
    tests_frac = res.tests_passed / ran if ran else 0.0
    trials_ok = res.correctness == "pass"
    if not run_tests:        # trials only: they carry the whole correctness score
        correct = CORRECT_POINTS if trials_ok else 0.0
    elif res.correctness == "needs a GPU":   # CPU machine, GPU-only stage: its CPU tests only
        correct = CORRECT_POINTS * tests_frac
    else:
        correct = CORRECT_POINTS / 2 * tests_frac + (CORRECT_POINTS / 2 if trials_ok else 0.0)
    if res.violations:
        correct = 0.0
        res.correctness = "fail"
    elif trials_ok and res.tests_failed:     # the trials passed, a test did not: not a "pass"
        res.correctness = "partial"
    perf = 0.0
    if HAS_CUDA and stage.perf is not None:
        res.max_score = CORRECT_POINTS + PERF_POINTS
        if res.speedup is not None and correct == CORRECT_POINTS:
            perf = PERF_POINTS * min(1.0, res.speedup / stage.perf_target)
    res.score = round(correct + perf, 2)
    res.seconds = round(time.time() - t0, 1)
    return res


def _bar(i: int, n: int, label: str) -> None:
    width = 28
    done = int(width * i / n)
    line = f"[{'#' * done}{'.' * (width - done)}] {i}/{n} {label}"
    if sys.stderr.isatty():
        print("\r" + line.ljust(100), end="", file=sys.stderr, flush=True)
    else:
        print(line, file=sys.stderr, flush=True)


def _fmt(v, spec, none="-"):
    return none if v is None else format(v, spec)


TIMING_COLUMNS = ("ms", "baseline ms", "speedup", "achieved", "roofline", "kernels", "H<->D")
#: timing columns given up first when the table is wider than the terminal
DROP_ORDER = ("achieved", "H<->D", "kernels", "baseline ms")
NOT_IMPLEMENTED = "not implemented yet"


def _notes(r: StageResult, timed: bool) -> tuple[str, str]:
    """(short note for the table's notes column, the full note)."""
    if r.violations:
        full = "; ".join(r.violations + ([r.message] if r.message else []))
        return full, full
    if r.not_implemented and r.score == 0:
        return NOT_IMPLEMENTED, f"{NOT_IMPLEMENTED}: {'; '.join(r.not_implemented[:3])}"
    full = "; ".join(x for x in ([f"{NOT_IMPLEMENTED}: {r.not_implemented[0]}"] if r.not_implemented else [])
                     + [r.message, r.perf_note if timed and r.ms is None else ""] if x)
    return full, full


def table(results: list[StageResult], impl: str, gpu: str, width: int | None = None) -> str:
    """The grade as a table, as wide as the terminal allows. Without any timing (a CPU-only
    machine) the timing columns are left out and a line under the table says why."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    timed = any(r.ms is not None for r in results)
    head = ["stage", "correct", "tests p/f/s", "trials", "worst err (tol)", *TIMING_COLUMNS, "score", "notes"]
    rows, fulls = [], []
    for r in results:
        err = "-" if r.worst_error is None else f"{r.worst_error:.1e} ({r.tolerance:.0e})"
        if r.ms is None:
            perf = ["-"] * len(TIMING_COLUMNS)
        else:
            rate = (f"{r.bytes / r.ms / 1e6:.0f} GB/s" if r.bound == "memory" else f"{r.flops / r.ms / 1e9:.0f} TFLOP/s") \
                if r.flops and r.bytes else "-"
            perf = [f"{r.ms:.3f}", f"{r.baseline_ms:.3f}", f"{r.speedup:.2f}x", rate,
                    f"{100 * r.roofline_fraction:.0f}% {r.bound[:3]}", str(r.kernels_per_call),
                    str(r.host_transfers_per_call)]
        short, full = _notes(r, timed)
        rows.append([r.stage, r.correctness, f"{r.tests_passed}/{r.tests_failed}/{r.tests_skipped}",
                     f"{r.trials_passed}/{r.trials_total}", err, *perf, f"{r.score:g}/{r.max_score:g}", short])
        fulls.append(full)
    keep = [h for h in head if timed or h not in TIMING_COLUMNS]

    def widths(cols):
        return [max(len(h), *(len(row[head.index(h)]) for row in rows)) for h in cols]
    min_notes = len(NOT_IMPLEMENTED)
    for col in DROP_ORDER:       # too wide even with a short notes column: drop the least telling columns
        if sum(widths(keep[:-1])) + 2 * (len(keep) - 1) + min_notes <= width or col not in keep:
            continue
        keep.remove(col)
    ws = widths(keep)
    room = max(min_notes, width - sum(ws[:-1]) - 2 * (len(keep) - 1))
    ws[-1] = min(ws[-1], room)
    cut = []
    for row, full in zip(rows, fulls):
        n = row[-1]
        if len(n) > ws[-1]:
            row[-1] = n[:ws[-1] - 3] + "..."
        if full and full != row[-1]:
            cut.append(row[0])
    if not any(row[-1] for row in rows):     # nothing to note: no empty column
        keep, ws = keep[:-1], ws[:-1]
    pick = [head.index(h) for h in keep]
    out = [f"impl: {impl}    GPU: {gpu}", "  ".join(h.ljust(w) for h, w in zip(keep, ws)).rstrip(),
           "  ".join("-" * w for w in ws)]
    out += ["  ".join(row[i].ljust(w) for i, w in zip(pick, ws)).rstrip() for row in rows]
    total = sum(r.score for r in results)
    out.append(f"total {total:g} / {sum(r.max_score for r in results):g}")
    if not timed:
        out.append("timing needs a GPU: no times or speedups here; scores count correctness only" if not any(r.max_score > CORRECT_POINTS for r in results) else
                   "no stage was timed: see the notes")
    notes = [f"  {r.stage}: {full}" for r, full in zip(results, fulls) if r.stage in cut]
    if notes:
        out += ["", "notes:", *notes]
    return "\n".join(out)


def gradescope(results: list[StageResult], seconds: float) -> dict:
    """Gradescope autograder results.json (https://gradescope-autograders.readthedocs.io)."""
    tests = []
    for r in results:
        lines = [f"correctness: {r.correctness}", f"tests passed/failed/skipped: {r.tests_passed}/{r.tests_failed}/{r.tests_skipped}",
                 f"trials passed: {r.trials_passed}/{r.trials_total}"]
        if r.worst_error is not None:
            lines.append(f"worst relative error {r.worst_error:.2e} (tolerance {r.tolerance:.0e})")
        if r.ms is not None:
            lines.append(f"{r.perf_label}: {r.ms:.4f} ms vs {r.baseline} {r.baseline_ms:.4f} ms "
                         f"({r.speedup:.2f}x), {100 * r.roofline_fraction:.0f}% of the {r.bound} roofline")
        elif r.perf_note:
            lines.append(f"performance: {r.perf_note}")
        lines += r.violations + ([r.message] if r.message else [])
        tests.append({"name": f"{r.stage}: {r.title}", "score": r.score, "max_score": r.max_score,
                      "status": "passed" if r.score == r.max_score else "failed",
                      "output": "\n".join(lines), "visibility": "visible"})
    board = [{"name": f"{r.stage} speedup", "value": round(r.speedup, 3)} for r in results if r.speedup is not None]
    return {"score": round(sum(r.score for r in results), 2), "execution_time": round(seconds),
            "output": "Per-stage grade against PyTorch; see each test's output.", "visibility": "visible",
            "stdout_visibility": "visible", "tests": tests, "leaderboard": board}


def plots(results: list[StageResult], folder: Path) -> list[Path]:
    """speedup.png (per stage) and roofline.png (each stage's point), when GPU numbers exist."""
    timed = [r for r in results if r.ms is not None]
    if not timed:
        return []
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    folder.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([r.stage[:3] for r in timed], [r.speedup for r in timed], color="tab:blue")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("speed vs PyTorch baseline (x)")
    ax.set_title("Speedup per stage")
    fig.tight_layout()
    fig.savefig(folder / "speedup.png", dpi=120)
    plt.close(fig)
    import numpy as np
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ceil = next((r.ceilings for r in timed if r.ceilings), None)
    if ceil:
        gbps, tflops = ceil["gbps"], ceil["tflops"]
        x = np.logspace(-1, 4, 200)
        ax.loglog(x, np.minimum(tflops, x * gbps / 1e3), "k-", lw=1.5,
                  label=f"roofline ({gbps:.0f} GB/s, {tflops:.0f} TFLOP/s, measured)")
    for r in timed:
        ax.loglog([r.flops / r.bytes], [r.flops / r.ms / 1e9], "o", label=r.stage[:3])
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=8)
    ax.set_title("Each stage on the roofline")
    fig.tight_layout()
    fig.savefig(folder / "roofline.png", dpi=120)
    plt.close(fig)
    return [folder / "speedup.png", folder / "roofline.png"]


def grade(impl: str, stages: list[str] | None, timeout: float, run_tests: bool = True,
          quiet: bool = False) -> tuple[list[StageResult], float]:
    from common.impl import resolve
    from common.stages import STAGES
    root = resolve(impl)
    todo = [s for s in STAGES if not stages or s.key in stages or s.folder in stages]
    t0 = time.time()
    results = []
    for i, st in enumerate(todo):
        if not quiet:
            _bar(i, len(todo), f"{st.folder} ...")
        results.append(grade_stage(root, st, timeout, run_tests))
    if not quiet:
        _bar(len(todo), len(todo), "done")
        if sys.stderr.isatty():
            print(file=sys.stderr)
    return results, time.time() - t0


def _grade_many(folder: Path, out: Path, jobs: int, timeout: float, stages, run_tests: bool = True) -> int:
    """Grade every sub-folder of ``folder``, one process per GPU (or ``jobs`` on CPU)."""
    subs = sorted(p for p in folder.iterdir() if p.is_dir())
    import torch
    gpus = list(range(torch.cuda.device_count()))
    slots = gpus or list(range(max(1, jobs)))
    out.mkdir(parents=True, exist_ok=True)
    free = list(slots)
    import threading
    lock = threading.Lock()

    def one(sub: Path) -> str:
        with lock:
            slot = free.pop()
        try:
            env = dict(os.environ)
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = str(slot)
            dest = out / sub.name
            cmd = [sys.executable, "-m", "common.grade", "--impl", str(sub), "--quiet",
                   "--results-json", str(dest / "results.json"), "--json-out", str(dest / "report.json"),
                   "--timeout", str(timeout)] + (["--stages", ",".join(stages)] if stages else []) \
                + ([] if run_tests else ["--no-tests"])
            t0 = time.time()
            r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
            (out / f"{sub.name}.log").write_text(r.stdout + r.stderr)
            where = f"GPU {slot}" if gpus else f"worker {slot}"
            return f"{sub.name}: exit {r.returncode} on {where} in {time.time() - t0:.0f} s"
        finally:
            with lock:
                free.append(slot)

    with ThreadPoolExecutor(max_workers=len(slots)) as pool:
        for line in pool.map(one, subs):
            print(line, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    from common.impl import ENV_VAR as impl_env_var
    ap = argparse.ArgumentParser(prog="python -m common.grade", description=__doc__.split("\n\n")[0],
                                 epilog=SCORING, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impl", default=os.environ.get(impl_env_var, "assignments"),
                    help="assignments (default), solutions, or a folder laid out like assignments/")
    ap.add_argument("--stages", help="comma-separated stage keys, e.g. a01,a05 (default: all)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per stage (tests, then trials+timing)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    ap.add_argument("--json-out", type=Path, help="also write the JSON report here")
    ap.add_argument("--results-json", type=Path, help="write a Gradescope results.json here")
    ap.add_argument("--plots", type=Path, help="write speedup.png and roofline.png here (GPU runs)")
    ap.add_argument("--no-tests", action="store_true", help="skip the pytest part (trials and timing only)")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--submissions", type=Path, help="grade every sub-folder of this folder")
    ap.add_argument("--out", type=Path, default=Path("grade-results"), help="with --submissions: output folder")
    ap.add_argument("--jobs", type=int, default=1, help="with --submissions on CPU: processes at once")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    stages = args.stages.split(",") if args.stages else None
    if args.worker:
        try:
            res = _worker(args.impl, args.worker)
        except Exception as e:  # noqa: BLE001
            res = {"correctness": "fail", "violations": [],
                   "message": f"{type(e).__name__}: {e} | {traceback.format_exc().splitlines()[-2][:200]}"}
        print(MARK + json.dumps(res, default=float), flush=True)
        return 0
    if args.submissions:
        return _grade_many(args.submissions, args.out, args.jobs, args.timeout, stages, not args.no_tests)
    import torch
    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    results, secs = grade(args.impl, stages, args.timeout, not args.no_tests, args.quiet or args.json)
    report = {"impl": str(args.impl), "gpu": gpu, "seconds": round(secs, 1),
              "total": round(sum(r.score for r in results), 2), "max": sum(r.max_score for r in results),
              "stages": [asdict(r) for r in results]}
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        print(table(results, str(args.impl), gpu))
    if args.json_out:
        args.json_out.parent.mkdir(parents=True, exist_ok=True)
        args.json_out.write_text(json.dumps(report, indent=1))
    if args.results_json:
        args.results_json.parent.mkdir(parents=True, exist_ok=True)
        args.results_json.write_text(json.dumps(gradescope(results, secs), indent=1))
    if args.plots:
        for p in plots(results, args.plots):
            print(f"wrote {p}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
