"""Stage 5, the fused GELU in Triton: the GELU trials and speed cases of stage 4's spec."""
from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from common.gpu import Arch
from common.course.portability import BF16, Launch, _dt, _dtypes
from common.course.stages.base import Stage
from solutions.a04_cuda_gelu.stage import _gelu_perf, _gelu_trials


def _a05_trials(rng):
    return _gelu_trials("a05", "gelu (Triton)", rng)


STAGE = Stage("a05_triton_gelu", "Fused GELU (Triton)", _a05_trials, _gelu_perf("a05", "Triton gelu"))
#: ``python -m common.course.bench KEY`` runs this module of solutions/ (stages 4 and 5 share the GELU bench)
BENCHES = {"a05": "a04_cuda_gelu.bench"}


# ----------------------------------------------------------------------------- host cost
def _hc_triton_gelu(load, dev, dt):
    m = load("a05_triton_gelu.gelu_triton")
    x = torch.randn(8, 64, device=dev, dtype=dt)
    return (lambda: m.gelu(x)), (lambda: F.gelu(x, approximate="tanh"))


def hostcost_cases() -> list:
    """This stage's eager host-cost cases (``python -m common.course.hostcost``): its entry points at a launch-bound
    shape, beside the PyTorch op each replaces."""
    from common.course.hostcost import Case
    return [
        Case("a05_gelu", "a05", "gelu (Triton custom op) vs F.gelu(tanh); [8, 64]", 1, _hc_triton_gelu),
    ]


# ----------------------------------------------------------------------------- portability (common.course.portability)
def portability_launches(load, archs: list[Arch], full: bool) -> Iterator[Launch]:
    """The stage's Triton launches as its launcher makes them, for ``python -m common.course.portability``."""
    mod = load("a05_triton_gelu.gelu_triton")
    for c in mod.gelu_kernel.configs:          # every autotune candidate
        for dt in _dtypes(full) if full else (BF16,):
            yield Launch("a05", "gelu_kernel", f"{dt} BLOCK={c.kwargs['BLOCK']} warps={c.num_warps}", mod.gelu_kernel.fn,
                         (_dt(dt), _dt(dt), 1 << 26), dict(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages))


# ----------------------------------------------------------------------------- results (make results)
def results_runs() -> dict:
    """The GPU runs behind this stage's files in lectures/results/ (``make results STAGE=...``): each a
    script and the files it makes (lectures/_tools/results.py)."""
    from lectures._tools.results import ncu
    from solutions.a04_cuda_gelu.stage import results_runs as gelu
    return {"a05": [*gelu()["a04"], ncu("a05")]}
