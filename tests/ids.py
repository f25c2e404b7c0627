"""Readable ids for parametrized tests: ``test_add_bias[7x13-fp32]``, not ``test_add_bias[shape2-dtype0]``,
so a failure names its case and ``-k`` (``make check K=...``) can pick one."""
from __future__ import annotations

import torch

DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64"}


def dtype_id(dtype: torch.dtype) -> str:
    """fp32, fp16, bf16."""
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def shape_id(shape) -> str:
    """(3, 5, 1000) -> 3x5x1000."""
    return "x".join(map(str, shape))


def mnk_id(mnk) -> str:
    """A GEMM's (M, N, K) -> M17-N33-K40."""
    return "M{}-N{}-K{}".format(*mnk)


def linear_id(case) -> str:
    """(in_features, out_features, leading dims) -> in7-out1000-batch3."""
    return f"in{case[0]}-out{case[1]}-batch{shape_id(case[2])}"


def attention_id(case) -> str:
    """((batch, heads), Nq, Nk, d[, dtype]) -> b2x3-q130-k130-d32[-bf16]."""
    lead, nq, nk, d = case[:4]
    return f"b{shape_id(lead)}-q{nq}-k{nk}-d{d}" + (f"-{dtype_id(case[4])}" if len(case) > 4 else "")


def bias_id(bias: bool) -> str:
    return "bias" if bias else "nobias"
