"""Stage 2, the pre-transposed Linear: its outputs, its host transfers per call, its speed against F.linear."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from common import reference as ref
from common.kernel_check import held_tensors, input_copies
from common.roofline import matmul_bytes, matmul_flops
from common.testing import REL_TOL
from common.course.stages.base import (DTYPE_CYCLE, Perf, Run, Stage, Trial, _call, _count_layer, _cuda_randn,
                                       _dtype_of_draw, _gen, _no_copies, _randn, _refilled, _twice, _with_repeat)


@_call
def a02_linear(r: Run, w, b, x):
    """The layer's output, with what the graded tests check of its weight: W^T stored once, [in, out] and
    contiguous, the same storage after two calls, and no copy of a held tensor on a call."""
    layer = r.load("a02_pretransposed_linear.pretransposed_linear").PretransposedLinear(w, b)
    wt = getattr(layer, "weight_t", None)
    before = wt.data_ptr() if isinstance(wt, torch.Tensor) else None
    out, copies = input_copies(lambda: layer(x), **{**held_tensors(layer), "weight (as given)": w})
    layer(x)
    wt = getattr(layer, "weight_t", None)
    r.fact("copies", copies)
    r.fact("weight_t", None if not isinstance(wt, torch.Tensor) else
           {"shape": list(wt.shape), "contiguous": wt.is_contiguous(), "kept": wt.data_ptr() == before,
            "transposed": bool(wt.shape == w.t().shape and torch.equal(wt.detach().to(w.dtype), w.t()))})
    return out


def _a02_weight_judge(facts: dict) -> str | None:
    """Judge: weight_t is W^T ([in, out], contiguous), made once, and no held tensor is copied on a call."""
    wt = facts.get("weight_t")
    if wt is None:
        return "the layer has no tensor weight_t: the contract keeps W^T in it"
    if not (wt["transposed"] and wt["contiguous"]):
        return (f"weight_t is {wt['shape']}{'' if wt['contiguous'] else ', not contiguous'}, not W^T [in, out] "
                "contiguous: transpose the weight once, at construction, and read it in place on every call")
    if not wt["kept"]:
        return "weight_t was rebuilt by a call: it is made once, at construction"
    return _no_copies(facts)


@_call
def a02_linear_twice(r: Run, w, b, x, x2):
    layer = r.load("a02_pretransposed_linear.pretransposed_linear").PretransposedLinear(w, b)
    return layer(x), layer(_refilled(x, x2))


@_call
def a02_transfers(r: Run, bias: bool):
    return _count_layer(r.load("a02_pretransposed_linear.pretransposed_linear").PretransposedLinear, bias)


def _a02_trials(rng):
    g = _gen(rng)

    def build(r, g, i):
        dtype = _dtype_of_draw(i)
        fin, fout = r.randint(1, 400), r.randint(1, 700)
        lead = tuple(r.randint(1, 7) for _ in range(r.randint(1, 3)))
        bias = r.random() < 0.5
        w = _randn(g, fout, fin, dtype=dtype, scale=fin**-0.5)
        b = _randn(g, fout, dtype=dtype) if bias else None
        x = _randn(g, *lead, fin, dtype=dtype)
        return [Trial(f"PretransposedLinear {fin}->{fout} lead={lead} {dtype}", "a02_linear", dict(w=w, b=b, x=x),
                      ref.linear(x, w, b), REL_TOL[dtype], scale=ref.linear_scale(x, w, b), dtypes=(dtype,),
                      judge=_a02_weight_judge)]
    trials = _with_repeat(rng, g, build, 3)
    dtype = rng.choice(DTYPE_CYCLE)
    fin, fout, lead = rng.randint(1, 300), rng.randint(1, 300), (rng.randint(1, 5), rng.randint(1, 5))
    w, b = _randn(g, fout, fin, dtype=dtype, scale=fin**-0.5), _randn(g, fout, dtype=dtype)
    x, x2 = _randn(g, *lead, fin, dtype=dtype), _randn(g, *lead, fin, dtype=dtype)
    trials.append(_twice(f"PretransposedLinear {fin}->{fout} lead={lead} {dtype}", "a02_linear_twice",
                         dict(w=w, b=b, x=x, x2=x2), (ref.linear(x, w, b), ref.linear(x2, w, b)), REL_TOL[dtype],
                         scale=(ref.linear_scale(x, w, b), ref.linear_scale(x2, w, b))))
    bias = rng.random() < 0.5
    trials.append(Trial(f"host transfers per call, bias={bias}", "a02_transfers", dict(bias=bias),
                        torch.tensor([2 if bias else 0]), 0, exact=True))
    return trials


def _a02_perf(load):
    mod = load("a02_pretransposed_linear.pretransposed_linear")
    lin = torch.nn.Linear(768, 3072, bias=False, device="cuda", dtype=torch.bfloat16)
    layer = mod.PretransposedLinear.from_linear(lin)
    m, n, k = 32 * 1024, 3072, 768
    return Perf("PretransposedLinear 32x1024 768->3072 bf16, no bias",
                lambda g: {"x": _cuda_randn(g, 32, 1024, 768)}, lambda i: layer(i["x"]),
                lambda i: F.linear(i["x"], lin.weight), "F.linear", matmul_flops(m, n, k),
                matmul_bytes(m, n, k, torch.bfloat16))


STAGE = Stage("a02_pretransposed_linear", "Pre-transposed Linear", _a02_trials, _a02_perf)
#: ``python -m common.course.bench KEY`` runs this module of solutions/ (stages 1-3 share the Linear track's bench)
BENCHES = {"a02": "a03_fused_linear.bench"}


# ----------------------------------------------------------------------------- results (make results)
def results_runs() -> dict:
    """The GPU runs behind this stage's files in lectures/results/ (``make results STAGE=...``): each a
    script and the files it makes (lectures/_tools/results.py)."""
    from solutions.a03_fused_linear.stage import results_runs as linear
    return {"a02": linear()["a02"]}
