"""CUDA matmul versions 1-6 as a torch operator (given code: identical in both trees).

    from solutions.a06_matmul.matmul_cuda import matmul
    c = matmul(a, b, version=4)      # a [M, K], b [K, N] contiguous CUDA tensors

Versions (kernels in matmul_kernels.cu):
    1 naive  2 coalesced  3 shared-memory tiles  4 register blocking     (float32)
    5 tensor cores 128x128 tile  6 tensor cores 128x256 tile       (float16 / bfloat16)

The extension is built on the first call (about a minute), never at import, and cached
(common.cuda_ext.load_op). Each impl registers its op in its own namespace, so
assignments/ and solutions/ can be loaded in one process.
"""
from __future__ import annotations

from pathlib import Path

import torch

from common.checks import check_same, check_tensor
from common.cuda_ext import load_op
from common.impl import op_namespace

HERE = Path(__file__).resolve().parent
SOURCES = [HERE / "matmul_kernels.cu", HERE / "binding.cpp"]
NAMESPACE = op_namespace(__name__)
VERSIONS = {1: "naive", 2: "coalesced", 3: "smem tiling", 4: "register blocking",
            5: "tensor cores 128x128", 6: "tensor cores 128x256"}
FP32_VERSIONS = (1, 2, 3, 4)
TENSOR_CORE_VERSIONS = (5, 6)


def _op():
    load_op("a06_matmul", SOURCES, namespace=NAMESPACE)
    return getattr(torch.ops, NAMESPACE).matmul_out


def matmul(a: torch.Tensor, b: torch.Tensor, version: int, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B with CUDA kernel ``version`` (1-6).

    a: [M, K], b: [K, N], both contiguous (row-major) CUDA tensors of one dtype:
    float32 for versions 1-4, float16 or bfloat16 for versions 5-6 (fp32 accumulation).
    Any M, N, K >= 0. ``out`` (optional, contiguous [M, N], same dtype) is written and returned.
    Raises ValueError/TypeError for a bad version, device, dtype, shape or layout.
    """
    if version not in VERSIONS:
        raise ValueError(f"version: expected one of {sorted(VERSIONS)}, got {version!r}")
    dtypes = (torch.float32,) if version in FP32_VERSIONS else (torch.float16, torch.bfloat16)
    check_tensor(a, "a", device="cuda", dtypes=dtypes, ndim=2, contiguous=True)
    check_tensor(b, "b", device="cuda", dtypes=dtypes, ndim=2, contiguous=True)
    check_same(a, b, "a, b")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a, b: inner dimensions differ: a {tuple(a.shape)} @ b {tuple(b.shape)}")
    m, n = a.shape[0], b.shape[1]
    if out is None:
        out = torch.empty(m, n, device=a.device, dtype=a.dtype)
    else:
        check_tensor(out, "out", device="cuda", dtypes=(a.dtype,), ndim=2, contiguous=True)
        check_same(a, out, "a, out")
        if tuple(out.shape) != (m, n):
            raise ValueError(f"out: expected shape {(m, n)}, got {tuple(out.shape)}")
    return _op()(a, b, version, out, torch.cuda.current_stream(a.device).cuda_stream)
