"""How a stage is scored: pure functions of what the tests and the trials found, no I/O.

The rules are written once, in :data:`SCORING`: ``python -m common.course.grade --help`` prints it, and
the README and the grader's docs point here.
"""
from __future__ import annotations

from dataclasses import dataclass

from common.timing import geomean

#: correctness points per stage
CORRECT_POINTS = 10.0
#: speed points per stage (GPU only, and only with all the correctness points)
PERF_POINTS = 5.0
#: the share of the correctness points given by the fraction of graded tests passed ...
TESTS_POINTS = CORRECT_POINTS / 2
#: ... and the share given, all or nothing, when every one of the grader's trials passes
TRIALS_POINTS = CORRECT_POINTS / 2
#: the speed points are PERF_POINTS x min(PERF_CAP, speedup / the stage's perf_target), where a stage
#: timed at several shapes has for speedup the geometric mean of its per-shape speedups
PERF_CAP = 1.0
#: scores are rounded to this many decimals
SCORE_DECIMALS = 2

#: the worker's verdicts on the trials (``WorkerResult.correctness``) and, with PARTIAL, the
#: labels of the report's "correct" column
PASS, PARTIAL, FAIL, NEEDS_GPU = "pass", "partial", "fail", "needs a GPU"
#: the "correct" column of a stage whose graded work runs on a GPU only, graded on a CPU: no points,
#: none to earn (0 / 0), never a pass
UNGRADED = "ungraded"
#: the suffix of a pass (or partial) on a CPU where some graded tests need a GPU: "pass on CPU"
ON_CPU = " on CPU"

SCORING = """\
How you are scored (per stage):
  correctness, 10 points:
    5 x (graded tests passed / tests run) of the stage's pytest file (skipped tests do not count)
  + 5 if every one of the grader's trials passes (fresh random inputs and shapes, float64
      references), else 0: one failed trial loses all 5.
    With --no-tests the trials carry all 10.
  zero for the stage: a trial that calls the PyTorch op the stage replaces (aten ops and,
    where a composite such as F.linear would hide, torch functions are traced; on a GPU also
    the kernels that ran), or a submission that patches torch or the harness. Its numbers
    are right because PyTorch computed them, so no test it passes counts.
  speed, 5 points, GPU only: 5 x min(1, speedup / the stage's target) against the PyTorch
    baseline, and only with all 10 correctness points. Stages 4-7 are timed at a few shapes
    (real GPT-2 shapes, an odd or unaligned one): their speedup is the geometric mean of the
    per-shape speedups (baseline time / your time). Every timed call gets fresh inputs and its
    output is checked: a wrong one fails the stage's correctness (no speed points).
On a machine without a GPU no points are given for work that was not run:
  a stage whose graded tests include some that need a GPU counts for the share of them the CPU
    ran: its score and its maximum are that share of the points above ("pass on CPU": 48 of
    50 tests ran, all passed, trials passed: 9.6 / 9.6, the row says "2 GPU checks not run");
  a stage whose trials need a GPU (stage 4's CUDA op) is "ungraded": 0 / 0, whatever its CPU
    checks (compiling the CUDA source) say;
  the total says "of what a CPU can check" and names the ungraded stages; no speed points, and
    the table has no timing columns. Grade on a GPU for the full score.
  "correct" column: pass (all tests and trials), partial (trials passed, some test failed),
    fail, "pass on CPU" / "partial on CPU" (some graded tests need a GPU), ungraded.
Examples:
  a wrong number in a01's answers.toml fails 1 test, every trial passes (they grade the
    counter): 5 x (passed / run) + 5, shown as "partial".
  torch's add instead of the bias kernel fails the test that looks for torch arithmetic, and
    the trials see aten.add where the kernel was asked for: 0/10.
  a CUDA GELU that returns its input, graded on a CPU: stage 4 is "ungraded" (0 / 0): its
    CUDA source compiles, but nothing ran it.
"""


@dataclass(frozen=True)
class Score:
    correctness: str     # the "correct" column: pass | partial | fail | pass on CPU | partial on CPU | ungraded
    score: float
    max_score: float

    @property
    def ungraded(self) -> bool:
        return self.correctness == UNGRADED


def correctness_points(tests_passed: int, tests_failed: int, trials: str, run_tests: bool) -> float:
    """Correctness points before violations and before the CPU's share (:func:`cpu_share`):
    ``trials`` is the worker's verdict."""
    ran = tests_passed + tests_failed
    tests_frac = tests_passed / ran if ran else 0.0
    trials_ok = trials == PASS
    if not run_tests or trials == NEEDS_GPU:    # trials only: they carry the whole correctness score
        return CORRECT_POINTS if trials_ok else 0.0
    return TESTS_POINTS * tests_frac + (TRIALS_POINTS if trials_ok else 0.0)


def cpu_share(tests_run: int, tests_gpu_only: int) -> float:
    """The share of a stage's graded tests that ran (1.0 on a GPU): its score and maximum are scaled by it."""
    total = tests_run + tests_gpu_only
    return tests_run / total if total else 1.0


def combined_speedup(speedups: list[float]) -> float:
    """The speedup a stage timed at several shapes is scored by: the geometric mean of its
    per-shape speedups (a 2x win on one shape and a 2x loss on another make 1x)."""
    if not speedups:
        raise ValueError("no speedups to combine")
    return geomean(speedups)


def perf_points(speedup: float, perf_target: float) -> float:
    """Speed points for a stage with all its correctness points."""
    return PERF_POINTS * min(PERF_CAP, speedup / perf_target)


def score(*, tests_passed: int, tests_failed: int, trials: str, violations: bool, run_tests: bool,
          timed: bool, speedup: float | None, perf_target: float | None, tests_gpu_only: int = 0) -> Score:
    """A stage's label and score. ``timed``: a GPU is present and the stage has a performance
    case (its maximum then includes the speed points); ``speedup`` is None when it was not timed.
    ``tests_gpu_only``: graded tests skipped for want of a GPU; the score and the maximum are then
    the share of the tests that ran (:func:`cpu_share`). Trials that need a GPU: ungraded, 0 / 0."""
    if trials == NEEDS_GPU:  # the stage's graded work runs on a GPU only: nothing of it was checked
        return Score(UNGRADED, 0.0, 0.0)
    correct = correctness_points(tests_passed, tests_failed, trials, run_tests)
    label = trials
    if violations:           # the PyTorch op called, or torch patched: nothing counts
        correct, label = 0.0, FAIL
    elif trials == PASS and tests_failed:     # the trials passed, a test did not: not a "pass"
        label = PARTIAL
    share = cpu_share(tests_passed + tests_failed, tests_gpu_only) if run_tests else 1.0
    if share < 1.0 and label in (PASS, PARTIAL):
        label += ON_CPU
    max_score, perf = round(CORRECT_POINTS * share, SCORE_DECIMALS), 0.0
    correct = round(correct * share, SCORE_DECIMALS)
    if timed:
        max_score = CORRECT_POINTS + PERF_POINTS
        if speedup is not None and correct == CORRECT_POINTS:
            perf = perf_points(speedup, perf_target)
    return Score(label, round(correct + perf, SCORE_DECIMALS), max_score)
