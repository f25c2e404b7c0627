"""Stage 3, the bias kernel and the fused Linear: outputs, in-place add, no copies per call, speed."""
from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from common import reference as ref
from common.roofline import matmul_bytes, matmul_flops
from common.kernel_check import (ATEN_KERNELS, BASELINE_FUNCTIONS, TORCH_ARITH, TORCH_GEMM, Forbidden, held_tensors,
                                 input_copies)
from common.testing import REL_TOL
from common.gpu import Arch
from common.course.portability import BF16, Launch, _dt, _dtypes, _next_pow2
from common.course.stages.base import (DTYPE_CYCLE, Perf, Run, Stage, Trial, _call, _count_layer, _cuda_randn,
                                       _dtype_of_draw, _gen, _no_copies, _randn, _refilled, _twice, _with_repeat)


# ----------------------------------------------------------------------------- what the graded calls may not call
#: a03: the bias kernel (add_bias, add_bias_).
BIAS_KERNEL = Forbidden(TORCH_ARITH, ATEN_KERNELS)
#: a03: what each FusedLinear backend may not call (its contract: "addmm" is one torch.addmm with the
#: bias in cuBLAS's epilogue; "triton" is the GEMM x @ W^T, then the stage's add_bias_ kernel).
#: F.linear, the baseline the stage is timed against, is refused in both.
FUSED_LINEAR = {
    "addmm": Forbidden(TORCH_ARITH + tuple(op for op in TORCH_GEMM if op != "aten.addmm"),
                       functions=BASELINE_FUNCTIONS,
                       use="one torch.addmm(bias, x2, weight_t): the GEMM with the bias added in its epilogue"),
    "triton": Forbidden(TORCH_ARITH + ("aten.addmm", "aten.linear", "aten.baddbmm", "aten._scaled_mm"),
                        functions=BASELINE_FUNCTIONS, use="x2 @ weight_t (the GEMM), then the stage's add_bias_"),
}
#: Without a bias either backend is the GEMM x @ W^T alone (no addmm, no arithmetic, no F.linear).
FUSED_LINEAR_NO_BIAS = FUSED_LINEAR["triton"]


@_call
def a03_add_bias(r: Run, y, b):
    return r.load("a03_fused_linear.add_bias").add_bias(y, b)


@_call
def a03_add_bias_twice(r: Run, y, b, x2):
    ab = r.load("a03_fused_linear.add_bias")
    return ab.add_bias(y, b), ab.add_bias(_refilled(y, x2), b)


@_call
def a03_add_bias_inplace(r: Run, y, b):
    r.load("a03_fused_linear.add_bias").add_bias_(y, b)
    return y


@_call
def a03_add_bias_inplace_or_refused(r: Run, y, b):
    """add_bias_ on a y whose leading dims cannot be viewed as [rows, N]: the contract allows a ValueError
    (then y is left to add_bias, the out-of-place kernel) or a correct in-place add; a bias added into a
    copy leaves y unchanged, and that shows."""
    ab = r.load("a03_fused_linear.add_bias")
    try:
        ab.add_bias_(y, b)
    except ValueError:
        return ab.add_bias(y, b)
    return y


@_call
def a03_fused_linear(r: Run, w, b, x, backend: str):
    layer = r.load("a03_fused_linear.fused_linear").FusedLinear(w, b, backend)
    out, copies = input_copies(lambda: layer(x), **{**held_tensors(layer), "weight (as given)": w})
    r.fact("copies", copies)
    return out


@_call
def a03_fused_linear_twice(r: Run, w, b, x, x2, backend: str):
    layer = r.load("a03_fused_linear.fused_linear").FusedLinear(w, b, backend)
    return layer(x), layer(_refilled(x, x2))


@_call
def a03_transfers(r: Run):
    return _count_layer(r.load("a03_fused_linear.fused_linear").FusedLinear, True)


#: add_bias on a y whose leading dims do not collapse copies y first (its contract: y.reshape), a PyTorch
#: copy kernel on a GPU; no torch arithmetic still
BIAS_ANY_Y = Forbidden(BIAS_KERNEL.ops, (), BIAS_KERNEL.functions)


def _a03_trials(rng):
    g = _gen(rng)

    def bias_pair(r, g, i):
        dtype = _dtype_of_draw(i)
        shape = tuple(r.randint(1, 40) for _ in range(r.randint(1, 2))) + (r.randint(1, 1100),)
        y, b = _randn(g, *shape, dtype=dtype), _randn(g, shape[-1], dtype=dtype)
        expected = ref.add_bias(y, b)
        # y with strides other than (N, 1): rows of a wider matrix (a column slice, any rank) or a transposed
        # matrix (2-D); and a y whose leading dims cannot be viewed as [rows, N] for the in-place add
        rows, n = math.prod(shape[:-1]), shape[-1]
        if r.random() < 0.5:
            strided = _randn(g, rows, n + r.randint(1, 9), dtype=dtype)[:, :n]
        else:
            strided = _randn(g, n, rows, dtype=dtype).t()
        a, c = r.randint(2, 6), r.randint(2, 6)
        unviewable = _randn(g, a, c + 1, n, dtype=dtype)[:, :c]
        return [Trial(f"add_bias {shape} {dtype}", "a03_add_bias", dict(y=y, b=b), expected, REL_TOL[dtype],
                      forbid=BIAS_KERNEL, dtypes=(dtype,)),
                Trial(f"add_bias_ (in place) {shape} {dtype}", "a03_add_bias_inplace", dict(y=y.clone(), b=b),
                      expected, REL_TOL[dtype], forbid=BIAS_KERNEL, inplace=("y",), dtypes=(dtype,)),
                Trial(f"add_bias, y {tuple(strided.shape)} with strides {strided.stride()} {dtype}", "a03_add_bias",
                      dict(y=strided, b=b), ref.add_bias(strided, b), REL_TOL[dtype], forbid=BIAS_KERNEL,
                      dtypes=(dtype,)),
                Trial(f"add_bias_ (in place) on y {tuple(unviewable.shape)} with strides {unviewable.stride()}, "
                      f"not viewable as [rows, N] {dtype}", "a03_add_bias_inplace_or_refused",
                      dict(y=unviewable, b=b), ref.add_bias(unviewable, b), REL_TOL[dtype],
                      forbid=BIAS_ANY_Y, inplace=("y",), dtypes=(dtype,))]

    def linear(r, g, i):
        backend = ("addmm", "triton")[i % 2]
        dtype = _dtype_of_draw(i // 2)           # each backend in each dtype
        fin, fout = r.randint(1, 300), r.randint(1, 900)
        lead = tuple(r.randint(1, 6) for _ in range(r.randint(1, 3)))
        w = _randn(g, fout, fin, dtype=dtype, scale=fin**-0.5)
        b = _randn(g, fout, dtype=dtype)
        x = _randn(g, *lead, fin, dtype=dtype)
        return [Trial(f"FusedLinear({backend}) {fin}->{fout} lead={lead} {dtype}", "a03_fused_linear",
                      dict(w=w, b=b, x=x, backend=backend), ref.linear(x, w, b), REL_TOL[dtype],
                      scale=ref.linear_scale(x, w, b), forbid=FUSED_LINEAR[backend], dtypes=(dtype,),
                      judge=_no_copies)]
    trials = _with_repeat(rng, g, bias_pair, 3) + _with_repeat(rng, g, linear, 6, repeat=2)
    dtype = rng.choice(DTYPE_CYCLE)
    shape = (rng.randint(1, 20), rng.randint(1, 700))
    y, y2, b = _randn(g, *shape, dtype=dtype), _randn(g, *shape, dtype=dtype), _randn(g, shape[1], dtype=dtype)
    trials.append(_twice(f"add_bias {shape} {dtype}", "a03_add_bias_twice", dict(y=y, b=b, x2=y2),
                         (ref.add_bias(y, b), ref.add_bias(y2, b)), REL_TOL[dtype], forbid=BIAS_KERNEL))
    backend = rng.choice(["addmm", "triton"])
    fin, fout = rng.randint(1, 200), rng.randint(1, 300)
    w, b = _randn(g, fout, fin, dtype=dtype, scale=fin**-0.5), _randn(g, fout, dtype=dtype)
    x, x2 = _randn(g, 3, fin, dtype=dtype), _randn(g, 3, fin, dtype=dtype)
    trials.append(_twice(f"FusedLinear({backend}) {fin}->{fout} {dtype}", "a03_fused_linear_twice",
                         dict(w=w, b=b, x=x, x2=x2, backend=backend), (ref.linear(x, w, b), ref.linear(x2, w, b)),
                         REL_TOL[dtype], scale=(ref.linear_scale(x, w, b), ref.linear_scale(x2, w, b)),
                         forbid=FUSED_LINEAR[backend]))
    trials.append(Trial("FusedLinear host transfers per call", "a03_transfers", {}, torch.tensor([0]), 0, exact=True))
    return trials


def _a03_perf(load):
    fl = load("a03_fused_linear.fused_linear")
    lin = torch.nn.Linear(768, 3072, device="cuda", dtype=torch.bfloat16)
    layer = fl.FusedLinear.from_linear(lin)
    m, n, k = 32 * 1024, 3072, 768
    return Perf("FusedLinear 32x1024 768->3072 bf16", lambda g: {"x": _cuda_randn(g, 32, 1024, 768)},
                lambda i: layer(i["x"]), lambda i: F.linear(i["x"], lin.weight, lin.bias), "F.linear",
                matmul_flops(m, n, k), matmul_bytes(m, n, k, torch.bfloat16, bias=True))


STAGE = Stage("a03_fused_linear", "Bias kernel + fused Linear", _a03_trials, _a03_perf)
#: ``python -m common.course.bench KEY`` runs this module of solutions/
BENCHES = {"a03": "a03_fused_linear.bench"}


# ----------------------------------------------------------------------------- host cost
def _hc_add_bias(load, dev, dt):
    m = load("a03_fused_linear.add_bias")
    y, b = torch.randn(8, 64, device=dev, dtype=dt), torch.randn(64, device=dev, dtype=dt)
    return (lambda: m.add_bias(y, b)), (lambda: y + b)


def _hc_fused_linear(backend):
    def make(load, dev, dt):
        m = load("a03_fused_linear.fused_linear")
        w, b, x = torch.randn(64, 64, device=dev, dtype=dt), torch.randn(64, device=dev, dtype=dt), torch.randn(8, 64, device=dev, dtype=dt)
        layer = m.FusedLinear(w, b, backend=backend)
        return (lambda: layer(x)), (lambda: F.linear(x, w, b))
    return make


def hostcost_cases() -> list:
    """This stage's eager host-cost cases (``python -m common.course.hostcost``): its entry points at a launch-bound
    shape, beside the PyTorch op each replaces."""
    from common.course.hostcost import Case
    return [
        Case("a03_add_bias", "a03", "add_bias(y, b) vs y + b; y [8, 64]", 1, _hc_add_bias),
        Case("a03_linear_addmm", "a03", "FusedLinear (addmm) vs F.linear; [8, 64] x 64->64",
             1, _hc_fused_linear("addmm")),
        Case("a03_linear_triton", "a03", "FusedLinear (triton: GEMM + add_bias_) vs F.linear",
             2, _hc_fused_linear("triton")),
    ]


# ----------------------------------------------------------------------------- portability (common.course.portability)
def portability_launches(load, archs: list[Arch], full: bool) -> Iterator[Launch]:
    """The stage's Triton launches as its launcher makes them, for ``python -m common.course.portability``."""
    mod = load("a03_fused_linear.add_bias")
    for n in (1, 768, 50257):                  # BLOCK_N 1 .. 256, BLOCK_M 64 .. 16 (add_bias._launch)
        bn = min(_next_pow2(n), 256)
        bm = max(1, min(64, 4096 // bn))
        for dt in _dtypes(full) if full else (BF16,):
            yield Launch("a03", "add_bias_kernel", f"{dt} BLOCK_M={bm} BLOCK_N={bn}", mod.add_bias_kernel,
                         (_dt(dt),) * 3 + (4096, n, n, 1, n, 1), dict(BLOCK_M=bm, BLOCK_N=bn))


# ----------------------------------------------------------------------------- results (make results)
def results_runs() -> dict:
    """The GPU runs behind this stage's files in lectures/results/ (``make results STAGE=...``): each a
    script and the files it makes (lectures/_tools/results.py)."""
    from lectures._tools.results import Run, _same, ncu
    linear = Run("solutions/a03_fused_linear/run.sh", files=_same("a01_a03_linear.md", "a01_a03_linear.csv"))
    return {"a01": [linear], "a02": [linear], "a03": [linear, ncu("a03")]}
