"""What the grader checks for each stage: correctness trials and the performance cases.

The grader runs in two processes (common/course/grade/): the *judge*, which never imports the
submission, and a *worker*, which does. This module serves both:

* ``trials(rng)`` (judge): a list of :class:`Trial` built on *fresh* random inputs with shapes
  drawn at grading time (never announced, different on every run). Each trial's float64
  reference and tolerance are computed here, in the judge, and never leave it; the worker gets
  only the inputs and the name of the call to make (:class:`Trial`'s ``call`` and ``args``).
  Each stage's draws end with the shapes of an earlier draw again and new values, so an output
  memoised per shape fails; 16-bit matmuls are drawn at long K (Triton attention at long Nk) too
  and may be only a few times less accurate than torch.matmul (SDPA) on the same inputs
  (testing.calibrated_tol).
* the calls (worker): :data:`CALLS`, functions of (:class:`Run`, the trial's args) that run the
  submission and return its outputs. A call may report *facts* the judge checks (the largest
  tensor 7a created, the rows of a decode step's GEMMs).
* what each trial may not call (common.kernel_check, the same check the graded tests make): the
  worker traces aten ops (and on a GPU profiles kernels), the judge refuses what ``forbid`` names.
* ``perf(load)`` (worker, on a GPU): the submission against the PyTorch baseline it is graded
  against, with the FLOPs and bytes that place it on the roofline: one :class:`Perf`, or a list
  of them (stages 4-7: shapes from the benches' real-shape sweeps, common/shapes.py), whose
  speedups the grader combines by their geometric mean (common.course.grade.score). Each timed call gets
  a fresh input set (common.timing.bench_fresh), and its output is checked against the baseline's.

One module per stage, in the stage's own folder of ``solutions/`` (``solutions/aNN_name/stage.py``:
given code, never copied to ``assignments/``; stage 5 shares stage 4's GELU spec), each ending in its
:class:`Stage` (``STAGE``); ``base.py`` holds what they are made of. This module is the registry: it
finds the stage modules (:data:`STAGE_MODULES`), and gives :data:`STAGES`, :func:`by_key`, and any
name a stage module defines (``from common.course.stages import A08_TINY``).
"""
from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

from common import HAS_CUDA
from .base import CALLS, DTYPE_CYCLE, Load, NeedsGPU, Perf, Run, Stage, Trial, nan_safe, perf_cases, tensors

SOLUTIONS = Path(__file__).resolve().parents[3] / "solutions"


def _registry() -> tuple[list[ModuleType], list[Stage]]:
    """:data:`STAGE_MODULES` and :data:`STAGES`. Loaded when this package is imported (every stage's calls
    are then in CALLS before the grader's guard looks); where a stage module was imported first (it imports
    ``base`` from this package, so it is not finished yet), on first use instead."""
    if "STAGES" not in globals():
        modules = [importlib.import_module(f"solutions.{p.parent.name}.stage")
                   for p in sorted(SOLUTIONS.glob("a[0-9][0-9]_*/stage.py"))]
        if not all(hasattr(m, "STAGE") for m in modules):      # one of them is still being imported
            raise ImportError("a stage module is still being imported: the registry is complete after it")
        globals().update(STAGE_MODULES=modules, STAGES=[m.STAGE for m in modules])
    return globals()["STAGE_MODULES"], globals()["STAGES"]


def by_key(key: str) -> Stage:
    for s in _registry()[1]:
        if key in (s.key, s.folder):
            return s
    raise KeyError(f"no stage {key!r}; stages: {[s.key for s in _registry()[1]]}")


def stage_module(key: str) -> ModuleType:
    """The spec module of a stage (``a05`` or ``a05_triton_gelu``)."""
    modules, stages = _registry()
    return modules[stages.index(by_key(key))]


def __getattr__(name: str):
    """``STAGE_MODULES`` (the stages' spec modules, ``solutions.aNN_name.stage`` for each folder that has
    one, in order), ``STAGES`` (each module's ``STAGE``), and any name a stage module defines
    (``A06_SHAPES``, ``a08_decode_case``), importable from here."""
    modules, _ = _registry()
    if name in globals():
        return globals()[name]
    for m in modules:
        if name in vars(m):
            return vars(m)[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


try:
    _registry()
except ImportError:          # imported by a stage module: the registry loads on first use
    pass


__all__ = ["CALLS", "DTYPE_CYCLE", "HAS_CUDA", "Load", "NeedsGPU", "Perf", "Run", "STAGES", "STAGE_MODULES", "Stage",
           "Trial", "by_key", "nan_safe", "perf_cases", "stage_module", "tensors"]
