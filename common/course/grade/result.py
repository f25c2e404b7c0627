"""What the judge (judge.py) found for one stage, trials and timing: :class:`WorkerResult`, whose
fields :class:`~common.course.grade.report.StageResult` extends.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields

from .score import FAIL


@dataclass(kw_only=True)
class WorkerResult:
    """What the worker found: the trials' verdict and, when timed, the performance numbers.
    :class:`~common.course.grade.report.StageResult` adds the tests and the score to these fields
    (keyword-only, so that a StageResult is built with its stage and title first)."""
    correctness: str = FAIL            # pass | fail | needs a GPU (the trials' verdict)
    message: str = ""
    violations: list[str] = field(default_factory=list)
    not_implemented: list[str] = field(default_factory=list)   # NotImplementedError / output never written
    trials_passed: int = 0
    trials_total: int = 0
    worst_error: float | None = None
    tolerance: float | None = None
    perf_note: str = ""
    timing: str = ""                   # how ms and baseline_ms were measured
    ms: float | None = None
    baseline_ms: float | None = None
    #: eager calls back to back, ms per call (host work included), summed over the timed shapes:
    #: reported, not scored (a slow wrapper shows here, not in the graph-replayed ``ms``)
    eager_ms: float | None = None
    baseline_eager_ms: float | None = None
    baseline: str = ""
    perf_label: str = ""
    speedup: float | None = None
    bound: str | None = None
    roofline_fraction: float | None = None
    kernels_per_call: int | None = None
    host_transfers_per_call: int | None = None
    flops: float | None = None
    bytes: float | None = None
    ceilings: dict | None = None
    perf_target: float | None = None
    #: one dict per timed shape (label, ms, baseline_ms, speedup, flops, bytes, bound,
    #: roofline_fraction, timing, kernels_per_call, host_transfers_per_call); the fields above
    #: sum them up (summarize): ``speedup``, what is scored, is their speedups' geometric mean
    cases: list[dict] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=float)

    @classmethod
    def from_json(cls, text: str) -> WorkerResult:
        data = json.loads(text)
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})
