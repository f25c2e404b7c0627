"""Stage 7a: FlashAttention written with plain torch ops, one tile at a time.

The algorithm of the Triton kernels (stage 7b), without a kernel: the attention
matrix is never built. Queries are cut into tiles of BLOCK_M rows, keys and values
into tiles of BLOCK_N rows; each query tile walks over the key tiles keeping, per
row, a running max ``m`` and a running sum ``l`` of exponentials (online softmax),
and saves only ``L = m + log(l)`` (the row logsumexp) for backward. Backward
recomputes P = exp(S - L) tile by tile. Runs on any device (CPU for the tests),
slowly: it exists so the algorithm can be debugged with print() before it is
written as a kernel.

    python -m pytest tests/test_a07_flash_attention.py -k torch      # your work (--impl solutions: the reference)

Conventions (shared with stage 7b):
  * q [..., Nq, d], k and v [..., Nk, d], same leading dims; scale 1/sqrt(d).
  * causal: bottom-right aligned, query i sees keys j <= i + (Nk - Nq). With
    Nq > Nk the first Nq - Nk queries see no key: their output row is 0 and L is -inf.
  * math in fp32 whatever the input dtype; O has the input dtype, L is fp32 [..., Nq].
"""
from __future__ import annotations

import math

import torch

from common.checks import FLOAT_DTYPES, check_same, check_tensor

#: Query rows per tile and key rows per tile.
BLOCK_M: int = 64
BLOCK_N: int = 64


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, device: str | None = None) -> None:
    """Shapes, dtypes and devices attention accepts (given code)."""
    check_tensor(q, "q", device=device, dtypes=FLOAT_DTYPES, min_ndim=2)
    check_tensor(k, "k", device=device, dtypes=FLOAT_DTYPES, min_ndim=2)
    check_tensor(v, "v", device=device, dtypes=FLOAT_DTYPES, min_ndim=2)
    check_same(q, k, "q, k")
    check_same(q, v, "q, v")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape [..., Nk, d], got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q [..., Nq, d] and k [..., Nk, d] must share leading dims and d, "
                         f"got {tuple(q.shape)} and {tuple(k.shape)}")


def flash_forward_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                        block_m: int = BLOCK_M, block_n: int = BLOCK_N) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiled attention forward: returns (O, L).

    q [..., Nq, d], k and v [..., Nk, d] (any float dtype, any device, same leading dims).
    O [..., Nq, d] in q's dtype; L [..., Nq] float32, the logsumexp of row i of the
    scaled scores S = q kᵀ / sqrt(d) (masked entries excluded). Never materialises
    more than one [.., block_m, block_n] tile of S.
    """
    # TODO(a07): 7a forward. For each query tile (block_m rows): m = -inf, l = 0, acc = 0 (fp32);
    #   for each key tile (block_n rows; causal: stop after the diagonal, mask the tile it crosses):
    #     s = q_tile k_tileᵀ / sqrt(d); m_new = max(m, rowmax s); p = exp(s - m_new);
    #     alpha = exp(m - m_new); l = l·alpha + rowsum p; acc = acc·alpha + p v_tile; m = m_new.
    #   O_tile = acc / l; L_tile = m + log l. A row that sees no key: O = 0, L = -inf (no NaN).
    raise NotImplementedError("a07: flash_forward_torch (stage 7a forward)")


def flash_backward_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                         do: torch.Tensor, is_causal: bool, block_m: int = BLOCK_M,
                         block_n: int = BLOCK_N) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tiled attention backward from the saved L: returns (dQ, dK, dV) in the input dtype.

    Recomputes P = exp(S - L) one tile at a time. With D = rowsum(dO ∘ O):
    dV = Pᵀ dO, dP = dO Vᵀ, dS = P ∘ (dP - D), dQ = dS K / sqrt(d), dK = dSᵀ Q / sqrt(d).
    """
    # TODO(a07): 7a backward. D = rowsum(dO ∘ O). For each key tile (dK, dV accumulate here),
    #   for each query tile that sees it: P = exp(q kᵀ/sqrt(d) - L) (0 where masked);
    #   dV += Pᵀ dO; dP = dO vᵀ; dS = P ∘ (dP - D); dQ += dS k / sqrt(d); dK += dSᵀ q / sqrt(d).
    raise NotImplementedError("a07: flash_backward_torch (stage 7a backward)")


class FlashAttentionTorch(torch.autograd.Function):
    """``FlashAttentionTorch.apply(q, k, v, is_causal)`` -> O; saves (q, k, v, O, L) for backward."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        check_inputs(q, k, v)
        o, lse = flash_forward_torch(q, k, v, bool(is_causal))
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = bool(is_causal)
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward_torch(q, k, v, o, lse, do, ctx.is_causal)
        return dq, dk, dv, None


def flash_attention_torch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d)) v, tiled, differentiable."""
    return FlashAttentionTorch.apply(q, k, v, is_causal)
