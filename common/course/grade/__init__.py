"""The grader: one implementation, stage by stage, against PyTorch.

    python -m common.course.grade                         # grade assignments/ (make grade)
    python -m common.course.grade --impl solutions
    python -m common.course.grade --impl path/to/submission --results-json out/results.json
    python -m common.course.grade --submissions subs/ --out graded/     # many, one process per GPU

Every stage runs in its own processes with time limits, so a submission that raises, hangs or
crashes fails that stage only, and the references and verdicts live in a process that never
imports the submission. A stage's grade: correctness from the stage's tests and the grader's
own trials, and on a GPU speed against the PyTorch baseline; the rules are
:data:`common.course.grade.score.SCORING` (``--help`` prints them). On a machine without a GPU no times
are made up and no points are given for work that did not run: a stage counts for the share of its
tests the CPU ran, a stage whose work runs on a GPU only (stage 4) is "ungraded" (0 / 0).

The package, one concern a module:

* ``judge.py``: one stage's trials and timing, judged: draws the trials and their references,
  runs the worker, decides; returns a typed :class:`~.result.WorkerResult`.
* ``worker.py``: the one process that imports the submission (``python -m common.course.grade.worker``):
  runs the calls under the trace, the profiler and the guard, and the timing; reports what it saw.
* ``run.py``: one implementation, stage by stage: the stage's tests (a subprocess with a time
  limit) and the judge, and the :class:`~.report.StageResult` made from both.
* ``result.py``: :class:`~.result.WorkerResult`, the trials' and timing's findings (its fields are the
  first of :class:`~.report.StageResult`'s).
* ``score.py``: the scoring rules (pure functions, named constants).
* ``report.py``: :class:`~.report.StageResult` and its renderings: the table, the JSON report,
  Gradescope's results.json, the plots.
* ``batch.py``: many submissions, each from its own copy in a sandbox, one process per GPU.
* ``__main__.py``: the command line.
"""
from .report import NOT_IMPLEMENTED, StageResult, gradescope, plots, report_json, table
from .run import REPO, grade, grade_stage, junit_outcomes
from .score import CORRECT_POINTS, PERF_POINTS, SCORING

__all__ = ["CORRECT_POINTS", "NOT_IMPLEMENTED", "PERF_POINTS", "REPO", "SCORING", "StageResult", "grade",
           "grade_stage", "gradescope", "junit_outcomes", "plots", "report_json", "table"]
