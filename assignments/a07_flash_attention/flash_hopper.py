"""Stage 7c (advanced, optional): the flash-attention forward for Hopper, in CUDA with TMA + wgmma
and warp-specialised producer/consumer warpgroups (FlashAttention-3's design). Given code
(identical in both trees): the kernel is flash_fwd_hopper.cu, the torch op binding.cpp.

    from assignments.a07_flash_attention.flash_hopper import flash_attention_hopper
    o, lse = flash_attention_hopper(q, k, v, causal=True)   # q, k, v [B, H, S, d] bf16 on an H100

    bash run_hopper.sh (this stage's folder of solutions/)   # H100: build, tests, memcheck, TFLOP/s vs SDPA

The extension is built on the first call (about a minute; sm_90a target), never at import, and
cached (common.cuda_ext.load_op). Forward only: no autograd (the backward is stage 7b's).
"""
from __future__ import annotations

from pathlib import Path

import torch

from common.checks import check_same, check_tensor
from common.cuda_ext import load_op
from common.impl import op_namespace

HERE = Path(__file__).resolve().parent
SOURCES = [HERE / "flash_fwd_hopper.cu", HERE / "binding.cpp"]
NAMESPACE = op_namespace(__name__)
HEAD_DIMS = (64, 128)
#: gridDim.y of the kernel is B*H
MAX_HEADS = 65535


def _require_hopper(device: torch.device) -> None:
    """RuntimeError unless ``device`` is an sm_90 GPU (H100/H200): TMA, wgmma and setmaxnreg."""
    if not torch.cuda.is_available():
        raise RuntimeError("flash_attention_hopper needs an sm_90 GPU (H100/H200) with CUDA; "
                           "this machine has no CUDA GPU")
    cap = torch.cuda.get_device_capability(device)
    if tuple(cap) != (9, 0):
        name = torch.cuda.get_device_name(device)
        raise RuntimeError(f"flash_attention_hopper uses Hopper's TMA and wgmma: it needs an sm_90 GPU (H100/H200), "
                           f"this is {name} (sm_{cap[0]}{cap[1]}); use stage 7b's flash_triton.flash_attention")


def _op():
    # sm_90a: the target with wgmma and setmaxnreg (an -arch flag here replaces torch's own).
    # COURSE_CUDA_DEFINES=A07C_DEBUG_HANG in the environment builds the variant whose mbarrier
    # watchdog prints the stuck barrier before it traps (printf: its wgmma's are serialised, so for
    # debugging only; a separate build, and one process loads one: both register the same op).
    flags = ["-gencode=arch=compute_90a,code=sm_90a", "-DA07C_SM90A"]
    load_op("a07c_flash_hopper", SOURCES, namespace=NAMESPACE, extra_cuda_cflags=flags)
    return getattr(torch.ops, NAMESPACE).attention_fwd_hopper


def flash_attention_hopper(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           causal: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention forward ``O = softmax(Q Kᵀ / sqrt(d) [+ causal mask]) V`` on Hopper; returns ``(O, L)``.

    q, k, v: contiguous bfloat16 CUDA tensors of one shape ``[B, H, S, d]``, d = 64 or 128,
    S >= 1 (any length: the last tiles are masked), B*H <= 65535, 16-byte aligned.
    causal: query i attends to keys j <= i (Nq == Nk, so the bottom-right mask of stage 7 is
    the usual lower triangle). The softmax scale is 1/sqrt(d); fp32 accumulation and softmax.
    Returns O: a new contiguous bfloat16 ``[B, H, S, d]``, and L: float32 ``[B, H, S]``, the
    natural-log row logsumexp of the scaled scores (what a backward pass needs).
    Raises TypeError (not a tensor, dtype), ValueError (shape, layout, head dim, device) and
    RuntimeError off an sm_90 GPU (naming the GPU found). No autograd.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name, device=None, dtypes=(torch.bfloat16,), ndim=4, contiguous=True)
    check_same(q, k, "q, k", device=False)
    check_same(q, v, "q, v", device=False)
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"q, k, v: expected one shape [B, H, S, d], got q {tuple(q.shape)}, k {tuple(k.shape)}, "
                         f"v {tuple(v.shape)} (this kernel takes Nq == Nk)")
    b, h, s, d = q.shape
    if d not in HEAD_DIMS:
        raise ValueError(f"q: head dim d = {d} not supported: expected one of {HEAD_DIMS}")
    if s < 1:
        raise ValueError(f"q: sequence length S = {s}: expected S >= 1")
    if b * h > MAX_HEADS:
        raise ValueError(f"q: B*H = {b * h} heads: at most {MAX_HEADS} (one grid row per head)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_tensor(t, name, device="cuda", dtypes=None)
    check_same(q, k, "q, k")
    check_same(q, v, "q, v")
    _require_hopper(q.device)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.data_ptr() % 16:
            raise ValueError(f"{name}: TMA needs 16-byte aligned tensors; {name} starts at an offset of "
                             f"{t.data_ptr() % 16} bytes (a view into another tensor?): pass a copy")
    o = torch.empty_like(q)
    lse = torch.empty(b, h, s, device=q.device, dtype=torch.float32)
    _op()(q, k, v, bool(causal), o, lse, torch.cuda.current_stream(q.device).cuda_stream)
    return o, lse
