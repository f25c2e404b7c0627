"""What the grader checks for each stage: correctness trials and the performance cases.

The grader runs in two processes (common/grade/): the *judge*, which never imports the
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
  speedups the grader combines by their geometric mean (common.grade.score). Each timed call gets
  a fresh input set (common.timing.bench_fresh), and its output is checked against the baseline's.

One module per stage (``a01.py`` ... ``a08.py``; the two GELU stages share ``gelu.py``), each
ending in its :class:`Stage` (``STAGE``); ``base.py`` holds what they are made of. This module is
the registry: :data:`STAGES`, :func:`by_key`.
"""
from __future__ import annotations

from .. import HAS_CUDA
from . import a01, a02, a03, a04, a05, a06, a07, a08
from .base import CALLS, DTYPE_CYCLE, Load, NeedsGPU, Perf, Run, Stage, Trial, nan_safe, perf_cases, tensors
# what the grader, the tools and the tests read of single stages, importable from here too
from .gelu import GELU_SHAPES
from .a06 import A06_SHAPES, _a06_cuda_versions, _a06_not_here
from .a07 import A07_SHAPES
from .a08 import A08_TINY, _a08_perf, _decode_work_judge, _prompts, a08_decode_case, a08_dependencies

#: The course's stages, in order: each module's ``STAGE``.
STAGES: list[Stage] = [m.STAGE for m in (a01, a02, a03, a04, a05, a06, a07, a08)]


def by_key(key: str) -> Stage:
    for s in STAGES:
        if key in (s.key, s.folder):
            return s
    raise KeyError(f"no stage {key!r}; stages: {[s.key for s in STAGES]}")


__all__ = ["CALLS", "DTYPE_CYCLE", "HAS_CUDA", "Load", "NeedsGPU", "Perf", "Run", "STAGES", "Stage", "Trial", "by_key",
           "nan_safe", "perf_cases", "tensors", "GELU_SHAPES", "A06_SHAPES", "A07_SHAPES", "A08_TINY", "a08_decode_case",
           "a08_dependencies", "_a06_cuda_versions", "_a06_not_here", "_a08_perf", "_decode_work_judge", "_prompts"]
