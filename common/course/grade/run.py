"""One implementation, stage by stage: each stage's graded tests (pytest, a subprocess with a time
limit) and the grader's trials and timing (judge.py, whose worker is a subprocess with a time limit
too), so a submission that raises, hangs or crashes fails that stage only; the stage's
:class:`~.report.StageResult` made from both and scored (``score.py``).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import fields
from pathlib import Path
from . import judge
from .judge import progress, run_stage
from .report import StageResult
from .score import score

REPO = Path(__file__).resolve().parents[3]


def junit_outcomes(xml: Path) -> dict:
    """Test ids by outcome from a pytest junit report, and the first failure's message."""
    out = {"passed": [], "failed": [], "skipped": [], "skipped_gpu": [], "first_failure": ""}
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
            if "needs a CUDA GPU" in (kinds["skipped"].get("message") or ""):
                out["skipped_gpu"].append(name)
        else:
            out["passed"].append(name)
    return out


def _run_tests(impl: Path, folder: str, timeout: float) -> tuple[int, int, int, str, int]:
    """(passed, failed, skipped, the first failure's message, how many skipped for want of a GPU)."""
    test = REPO / "tests" / f"test_{folder}.py"
    if not test.exists():
        return 0, 0, 0, f"no test file {test.name}", 0
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", str(test), "--impl", str(impl), "-q", "-p", "no:cacheprovider",
               "-m", "graded", "--tb=short", f"--junitxml={xml}"]
        running = Path(tmp) / "running"       # tests/autograder.py writes each test's id here as it starts
        env = dict(os.environ, COURSE_RUNNING_TEST_FILE=str(running))
        try:
            r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            return 0, 1, 0, f"tests timed out after {timeout:.0f} s", 0
        if not xml.exists():
            test = running.read_text().strip() if running.exists() else ""
            return 0, 1, 0, f"tests {_died(r.returncode)}" + (f" while running {test}" if test else
                                                                 f": {(r.stdout + r.stderr)[-300:]}"), 0
        out = junit_outcomes(xml)
        return (len(out["passed"]), len(out["failed"]), len(out["skipped"]), out["first_failure"],
                len(out["skipped_gpu"]))


def _died(returncode: int) -> str:
    """'crashed with SIGABRT (signal 6)' for a process killed by a signal, else its exit code."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "a signal"
        return f"crashed with {name} (signal {-returncode})"
    return f"crashed (exit {returncode})"


def grade_stage(impl: Path, stage, timeout: float, run_tests: bool = True) -> StageResult:
    from common import HAS_CUDA
    t0 = time.time()
    if run_tests:
        progress(f"{stage.key}: graded tests (pytest tests/test_{stage.folder}.py)")
        passed, failed, skipped, first, gpu_only = _run_tests(impl, stage.folder, timeout)
    else:
        passed, failed, skipped, first, gpu_only = 0, 0, 0, "", 0
    w = run_stage(impl, stage, timeout)
    message, not_implemented = w.message, list(w.not_implemented)
    if first and failed:
        message = "; ".join(x for x in (message, f"first failing test: {first}") if x)
        if "NotImplementedError" in first:
            note = first.split(": ", 1)[-1]
            if not any(note in n for n in not_implemented):
                not_implemented.append(note)
    s = score(tests_passed=passed, tests_failed=failed, trials=w.correctness, violations=bool(w.violations),
              run_tests=run_tests, timed=HAS_CUDA and stage.perf is not None, speedup=w.speedup,
              perf_target=stage.perf_target, tests_gpu_only=0 if HAS_CUDA else gpu_only)
    note = cpu_note(s, passed, failed, gpu_only, run_tests)
    message = "; ".join(x for x in (note, message) if x)
    found = {f.name: getattr(w, f.name) for f in fields(w)}     # StageResult extends WorkerResult
    found.update(correctness=s.correctness, message=message, not_implemented=not_implemented)
    return StageResult(stage.folder, stage.title, tests_passed=passed, tests_failed=failed, tests_skipped=skipped,
                       score=s.score, max_score=s.max_score, seconds=round(time.time() - t0, 1), **found)


def cpu_note(s, passed: int, failed: int, gpu_only: int, run_tests: bool) -> str:
    """What a CPU checked of a stage and what it did not (empty when everything ran): "CPU checks
    pass; 47 GPU checks not run", and for an ungraded stage why it earns nothing."""
    if not s.ungraded and not gpu_only:
        return ""
    cpu = ("CPU checks pass" if not failed else f"CPU checks: {failed} of {passed + failed} fail") \
        if run_tests and passed + failed else ""
    gpu = f"{gpu_only} GPU checks not run" if gpu_only else ""
    if s.ungraded:
        return "; ".join(x for x in ("ungraded: its graded work runs on a GPU only, so no points here", cpu,
                                     gpu or "trials not run") if x)
    return "; ".join(x for x in (cpu, f"{gpu}: the score and its maximum count what this machine ran") if x)


def _bar(i: int, n: int, label: str) -> None:
    width = 28
    done = int(width * i / max(n, 1))
    line = f"[{'#' * done}{'.' * (width - done)}] {i}/{n} {label}"
    if sys.stderr.isatty():
        print("\r" + line.ljust(100), end="", file=sys.stderr, flush=True)
    else:
        print(line, file=sys.stderr, flush=True)


def grade(impl: str, stages: list[str] | None, timeout: float, run_tests: bool = True,
          quiet: bool = False, borrow: str | None = None) -> tuple[list[StageResult], float]:
    """Grade ``impl`` stage by stage. ``borrow`` ("a06,a07"): those stages are taken from solutions/
    where another stage imports them (stage 8 on the reference a06 and a07); each borrowed stage is
    still graded on the impl's own code, and the others' rows say what they ran on."""
    from common.impl import BORROW_VAR, borrowed, resolve, stage_list
    from common.course.stages import STAGES
    root = resolve(impl)
    keys = stage_list(",".join(stages), [s.key for s in STAGES]) if stages else None   # a name of no stage: its error
    todo = [s for s in STAGES if not keys or s.key in keys]
    saved = os.environ.get(BORROW_VAR)
    if borrow:
        os.environ[BORROW_VAR] = borrow
    lent = borrowed()
    judge.PROGRESS_TO_STDERR = not quiet
    t0 = time.time()
    results = []
    try:
        for i, st in enumerate(todo):
            if not quiet:
                _bar(i, len(todo), f"{st.folder} ...")
            if st.folder in lent:                       # a borrowed stage is graded on its own code
                os.environ.pop(BORROW_VAR, None)
            elif lent:
                os.environ[BORROW_VAR] = ",".join(f[:3] for f in lent)
            r = grade_stage(root, st, timeout, run_tests)
            if lent and st.folder not in lent:
                r.borrowed = [f[:3] for f in lent]
            results.append(r)
    finally:
        os.environ.pop(BORROW_VAR, None)
        if saved is not None:
            os.environ[BORROW_VAR] = saved
    if not quiet:
        _bar(len(todo), len(todo), "done")
        if sys.stderr.isatty():
            print(file=sys.stderr)
    return results, time.time() - t0

