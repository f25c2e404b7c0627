"""Stage 5, the fused GELU in Triton: the GELU trials and speed cases of stage 4's spec."""
from __future__ import annotations

from common.stages.base import Stage
from solutions.a04_cuda_gelu.stage import _gelu_perf, _gelu_trials


def _a05_trials(rng):
    return _gelu_trials("a05", "gelu (Triton)", rng)


STAGE = Stage("a05_triton_gelu", "Fused GELU (Triton)", _a05_trials, _gelu_perf("a05", "Triton gelu"))
