"""Stage 4, the fused GELU as a CUDA op (a GPU only): the GELU trials and speed cases of gelu.py."""
from __future__ import annotations

from .. import HAS_CUDA
from .base import NeedsGPU, Stage
from .gelu import _gelu_perf, _gelu_trials


def _a04_trials(rng):
    if not HAS_CUDA:
        raise NeedsGPU("the CUDA op runs on a GPU (its sources are compile-checked by the tests on CPU)")
    return _gelu_trials("a04", "fused_gelu (CUDA)", rng)


STAGE = Stage("a04_cuda_gelu", "Fused GELU (CUDA op)", _a04_trials, _gelu_perf("a04", "CUDA fused_gelu"),
              gpu_only=True)
