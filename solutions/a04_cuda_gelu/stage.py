"""Stage 4, the fused GELU as a CUDA op (a GPU only), and the spec stage 5 (Triton) shares: the GELU
calls, trials and speed cases."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from common import HAS_CUDA
from common import reference as ref
from common.roofline import elementwise_bytes
from common.shapes import GPT2_MODELS
from common.kernel_check import ACT_KERNELS, ATEN_KERNELS, TORCH_ARITH, TORCH_GELU, Forbidden
from common.testing import REL_TOL
from common.course.stages.base import (DTYPE_CYCLE, NeedsGPU, Perf, Run, Stage, Trial, _call, _cuda_randn,
                                       _dtype_of_draw, _gen, _randn, _refilled, _twice, _with_repeat)


# ----------------------------------------------------------------------------- what the graded calls may not call
#: a04 (CUDA op) and a05 (Triton): GELU as one kernel.
GELU_KERNEL = Forbidden(TORCH_ARITH + TORCH_GELU, ATEN_KERNELS + ACT_KERNELS)


#: The GELU each GELU stage grades: (module, function name).
GELU_FN = {"a04": ("a04_cuda_gelu.fused_gelu", "fused_gelu"), "a05": ("a05_triton_gelu.gelu_triton", "gelu")}


@_call
def gelu(r: Run, stage: str, x):
    module, name = GELU_FN[stage]
    return getattr(r.load(module), name)(x)


@_call
def gelu_twice(r: Run, stage: str, x, x2):
    module, name = GELU_FN[stage]
    fn = getattr(r.load(module), name)
    return fn(x), fn(_refilled(x, x2))


def _gelu_trials(stage: str, label: str, rng):
    """Three draws, the first in fp32: only fp32's tolerance (1e-5) tells GPT-2's tanh GELU from the
    erf GELU (1e-4 apart; in bf16 and fp16 both round to nearly the same values). Errors are measured
    against |x| as well as the output (GELU(x) = x·Φ(x)): in fp32 the tanh form underflows to 0 below
    x = -10.1, where the exact value is 1e-38 to 1e-42, and a correct kernel must not fail there."""
    g = _gen(rng)

    def build(r, g, i):
        dtype = _dtype_of_draw(i)              # fp32 first
        lead = 50 if HAS_CUDA else 8          # the interpreter runs each block in Python: <= 1.5M elements
        shape = tuple(r.randint(1, lead) for _ in range(r.randint(1, 3))) + (r.randint(1, 3000),)
        x = _randn(g, *shape, dtype=dtype, scale=3.0)
        return [Trial(f"{label} {shape} {dtype}", "gelu", dict(stage=stage, x=x), ref.gelu_tanh(x), REL_TOL[dtype],
                      scale=x.abs(), forbid=GELU_KERNEL, dtypes=(dtype,))]
    trials = _with_repeat(rng, g, build, 3)
    dtype = rng.choice(DTYPE_CYCLE)
    shape = (rng.randint(1, 8), rng.randint(1, 2000))
    x, x2 = _randn(g, *shape, dtype=dtype, scale=3.0), _randn(g, *shape, dtype=dtype, scale=3.0)
    trials.append(_twice(f"{label} {shape} {dtype}", "gelu_twice", dict(stage=stage, x=x, x2=x2),
                         (ref.gelu_tanh(x), ref.gelu_tanh(x2)), REL_TOL[dtype], scale=(x.abs(), x2.abs()),
                         forbid=GELU_KERNEL))
    return trials


#: GELU's speed cases: GPT-2 small's MLP activation at 8192 tokens [8192, 4·768], and an odd size
#: (an odd element count: the last block is partial, no 16-byte alignment of the tail).
GELU_SHAPES = ((8192, 4 * GPT2_MODELS["small"][0]), (4099, 6397))


def _gelu_perf(stage: str, label: str):
    def perf(load):
        module, name = GELU_FN[stage]
        fn = getattr(load(module), name)
        cases = []
        for shape in GELU_SHAPES:
            n = math.prod(shape)
            cases.append(Perf(f"{label} {'x'.join(map(str, shape))} bf16",
                              lambda g, shape=shape: {"x": _cuda_randn(g, *shape)}, lambda i: fn(i["x"]),
                              lambda i: F.gelu(i["x"], approximate="tanh"), 'F.gelu(approximate="tanh")', 8.0 * n,
                              elementwise_bytes(n, torch.bfloat16)))
        return cases
    return perf


def _a04_trials(rng):
    if not HAS_CUDA:
        raise NeedsGPU("the CUDA op runs on a GPU (its sources are compile-checked by the tests on CPU)")
    return _gelu_trials("a04", "fused_gelu (CUDA)", rng)


STAGE = Stage("a04_cuda_gelu", "Fused GELU (CUDA op)", _a04_trials, _gelu_perf("a04", "CUDA fused_gelu"),
              gpu_only=True)
#: ``python -m common.course.bench KEY`` runs this module of solutions/
BENCHES = {"a04": "a04_cuda_gelu.bench"}


# ----------------------------------------------------------------------------- host cost
def _hc_cuda_gelu(load, dev, dt):
    m = load("a04_cuda_gelu.fused_gelu")
    x = torch.randn(8, 64, device=dev, dtype=dt)
    return (lambda: m.fused_gelu(x)), (lambda: F.gelu(x, approximate="tanh"))


def hostcost_cases() -> list:
    """This stage's eager host-cost cases (``python -m common.course.hostcost``): its entry points at a launch-bound
    shape, beside the PyTorch op each replaces."""
    from common.course.hostcost import Case
    return [
        Case("a04_gelu", "a04", "fused_gelu (CUDA op) vs F.gelu(tanh); [8, 64]", 1, _hc_cuda_gelu, cuda_only=True),
    ]


# ----------------------------------------------------------------------------- CUDA builds (common.cuda_ext)
def cuda_ops() -> dict:
    """The CUDA extensions this stage builds (the op, and its --use_fast_math twin): a cold test run on a GPU prebuilds them
    in the background (tests/autograder.py)."""
    from common.cuda_ext import CourseOp
    return {
        "a04": CourseOp("a04_cuda_gelu.fused_gelu", lambda m: m.build(), "test_a04_cuda_gelu.py"),
        "a04_fast": CourseOp("a04_cuda_gelu.fused_gelu", lambda m: m.build(fast_math=True), "test_a04_cuda_gelu.py"),
    }


# ----------------------------------------------------------------------------- results (make results)
def results_runs() -> dict:
    """The GPU runs behind this stage's files in lectures/results/ (``make results STAGE=...``): each a
    script and the files it makes (lectures/_tools/results.py)."""
    from lectures._tools.results import Run, _same
    gelu = Run("solutions/a04_cuda_gelu/run.sh", env={"SKIP_TESTS": "1"},
               files=_same("a04_a05_gelu.md", "a04_a05_gelu.csv", "a04_a05_gelu.png"))
    return {"a04": [gelu]}
