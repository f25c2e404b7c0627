"""CUDA matmul versions 1-7 as a torch operator (given code: identical in both trees).

    from solutions.a06_matmul.matmul_cuda import matmul
    c = matmul(a, b, version=4)      # a [M, K], b [K, N] contiguous CUDA tensors

Versions (kernels in matmul_kernels.cu):
    1 naive  2 coalesced  3 shared-memory tiles  4 register blocking     (float32, any GPU)
    5 tensor cores 128x128 tile  6 tensor cores 128x256 tile       (float16 / bfloat16, sm_80+:
      mma.sync m16n8k16 and cp.async; on a T4 (sm_75) the wrapper refuses them, naming the GPU)
    7 Hopper: TMA + wgmma + warp specialisation, persistent blocks (matmul_v7_wgmma.cu;
      float16 / bfloat16, an sm_90 GPU, K and N multiples of 8); the kernel picks its tile
      shape per problem, ``tile=`` (one of V7_TILES) forces one

The extension is built on the first call (about a minute), never at import, and cached
(common.cuda_ext.load_op). Each impl registers its op in its own namespace, so
assignments/ and solutions/ can be loaded in one process.
"""
from __future__ import annotations

from pathlib import Path

import torch

from common import gpu, is_hopper  # versions 5-6 need sm_80+, version 7 sm_90 (gpu.NEEDS)
from common.checks import check_same, check_tensor
from common.cuda_ext import load_op
from common.impl import op_namespace

HERE = Path(__file__).resolve().parent
SOURCES = [HERE / "matmul_kernels.cu", HERE / "matmul_v7_wgmma.cu", HERE / "binding.cpp"]
NAMESPACE = op_namespace(__name__)
VERSIONS = {1: "naive", 2: "coalesced", 3: "smem tiling", 4: "register blocking",
            5: "tensor cores 128x128", 6: "tensor cores 128x256", 7: "wgmma + TMA (Hopper)"}
V7_TILES = ((128, 256), (128, 128), (64, 128), (64, 64))   # version 7's tile shapes (BM, BN), in its order
FP32_VERSIONS = (1, 2, 3, 4)
TENSOR_CORE_VERSIONS = (5, 6, 7)


def _op():
    # On Hopper build for sm_90a, the target with wgmma and setmaxnreg (an -arch flag here
    # replaces torch's own); elsewhere torch's default target, and version 7 refuses to run.
    flags = ["-gencode=arch=compute_90a,code=sm_90a", "-DA06_SM90A"] if is_hopper() else []
    load_op("a06_matmul", SOURCES, namespace=NAMESPACE, extra_cuda_cflags=flags)
    return getattr(torch.ops, NAMESPACE).matmul_out


def unsupported(version: int, device=None) -> str | None:
    """Why ``version`` cannot run on this GPU (naming the GPU and what the version needs), or None:
    versions 5 and 6 need sm_80+, version 7 an sm_90 GPU (common.gpu.NEEDS)."""
    return gpu.why_not(f"a06 v{version}", device) if f"a06 v{version}" in gpu.NEEDS else None


def matmul(a: torch.Tensor, b: torch.Tensor, version: int, *, out: torch.Tensor | None = None,
           tile: tuple[int, int] | None = None) -> torch.Tensor:
    """C = A @ B with CUDA kernel ``version`` (1-7).

    a: [M, K], b: [K, N], both contiguous (row-major) CUDA tensors of one dtype:
    float32 for versions 1-4, float16 or bfloat16 for versions 5-7 (fp32 accumulation).
    Any M, N, K >= 0 for versions 1-6 (5-6: an sm_80+ GPU); version 7 needs an sm_90 GPU and K, N multiples of 8
    (TMA's 16-byte row strides). ``out`` (optional, contiguous [M, N], same dtype) is written
    and returned. ``tile`` (version 7 only): one of ``V7_TILES`` instead of the kernel's own pick.
    Raises ValueError/TypeError for a bad version, tile, device, dtype, shape or layout.
    """
    if version not in VERSIONS:
        raise ValueError(f"version: expected one of {sorted(VERSIONS)}, got {version!r}")
    if tile is not None and (version != 7 or tuple(tile) not in V7_TILES):
        raise ValueError(f"tile: version 7 takes one of {V7_TILES} (or None: its own pick), "
                         f"got {tile!r} with version {version}")
    dtypes = (torch.float32,) if version in FP32_VERSIONS else (torch.float16, torch.bfloat16)
    check_tensor(a, "a", device="cuda", dtypes=dtypes, ndim=2, contiguous=True)
    check_tensor(b, "b", device="cuda", dtypes=dtypes, ndim=2, contiguous=True)
    check_same(a, b, "a, b")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"a, b: inner dimensions differ: a {tuple(a.shape)} @ b {tuple(b.shape)}")
    m, n = a.shape[0], b.shape[1]
    why = unsupported(version, a.device)
    if why:
        raise ValueError(why + ("; use version 6" if version == 7 and not unsupported(6, a.device) else
                                "; use version 4 (float32)" if version in (5, 6) else ""))
    if version == 7:
        if a.shape[1] % 8 or n % 8:
            raise ValueError(f"version 7 (TMA) needs K and N multiples of 8 (16-byte row strides), got "
                             f"a {tuple(a.shape)} @ b {tuple(b.shape)}; use version 6 for these shapes")
    if out is None:
        out = torch.empty(m, n, device=a.device, dtype=a.dtype)
    else:
        check_tensor(out, "out", device="cuda", dtypes=(a.dtype,), ndim=2, contiguous=True)
        check_same(a, out, "a, out")
        if tuple(out.shape) != (m, n):
            raise ValueError(f"out: expected shape {(m, n)}, got {tuple(out.shape)}")
    if version == 7:
        for name, t in (("a", a), ("b", b), ("out", out)):
            if t.data_ptr() % 16:
                raise ValueError(f"version 7 (TMA) needs 16-byte aligned tensors; {name} starts at an offset "
                                 f"of {t.data_ptr() % 16} bytes (a view into another tensor?): pass a copy")
    return _op()(a, b, version, out, torch.cuda.current_stream(a.device).cuda_stream,
                 -1 if tile is None else V7_TILES.index(tuple(tile)))
