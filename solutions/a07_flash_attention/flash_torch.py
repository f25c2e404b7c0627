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
    # STUB: raise NotImplementedError("a07: flash_forward_torch (stage 7a forward)")
    # SOLUTION
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    shift = nk - nq                                   # query i sees keys j <= i + shift
    o = torch.empty_like(q, memory_format=torch.contiguous_format)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
    neg_inf = float("-inf")
    for m0 in range(0, nq, block_m):
        m1 = min(m0 + block_m, nq)
        qi = q[..., m0:m1, :].float() * scale
        m_i = torch.full(qi.shape[:-1], neg_inf, device=q.device)   # running row max
        l_i = torch.zeros(qi.shape[:-1], device=q.device)            # running sum of exp(s - m_i)
        acc = torch.zeros(qi.shape, device=q.device)                 # running sum of exp(s - m_i) v
        hi = nk if not is_causal else max(0, min(nk, m1 + shift))   # tiles past the diagonal: skipped
        for n0 in range(0, hi, block_n):
            n1 = min(n0 + block_n, nk)
            s = qi @ k[..., n0:n1, :].float().transpose(-1, -2)       # [..., tile_m, tile_n]
            if is_causal and n1 - 1 > m0 + shift:                     # tile crosses the diagonal
                rows = torch.arange(m0, m1, device=q.device)[:, None]
                cols = torch.arange(n0, n1, device=q.device)[None, :]
                s = s.masked_fill(cols > rows + shift, neg_inf)
            m_new = torch.maximum(m_i, s.amax(dim=-1))
            m_safe = torch.where(m_new == neg_inf, 0.0, m_new)        # a row that has seen no key yet
            p = torch.exp(s - m_safe[..., None])
            alpha = torch.exp(m_i - m_safe)                           # rescales what was summed so far
            l_i = l_i * alpha + p.sum(dim=-1)
            acc = acc * alpha[..., None] + p @ v[..., n0:n1, :].float()
            m_i = m_new
        seen = l_i > 0
        l_safe = torch.where(seen, l_i, 1.0)
        o[..., m0:m1, :] = (acc / l_safe[..., None]).to(q.dtype)
        lse[..., m0:m1] = torch.where(seen, m_i + torch.log(l_safe), neg_inf)
    return o, lse
    # END TODO(a07)


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
    # STUB: raise NotImplementedError("a07: flash_backward_torch (stage 7a backward)")
    # SOLUTION
    nq, nk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    shift = nk - nq
    delta = (do.float() * o.float()).sum(dim=-1)                      # D, [..., Nq]
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    dk = torch.zeros(k.shape, dtype=torch.float32, device=q.device)
    dv = torch.zeros(v.shape, dtype=torch.float32, device=q.device)
    for n0 in range(0, nk, block_n):                                  # key tiles outside: dK, dV stay local
        n1 = min(n0 + block_n, nk)
        kj, vj = k[..., n0:n1, :].float(), v[..., n0:n1, :].float()
        lo = 0 if not is_causal else max(0, n0 - shift) // block_m * block_m   # earlier queries see none of it
        for m0 in range(lo, nq, block_m):
            m1 = min(m0 + block_m, nq)
            qi, doi = q[..., m0:m1, :].float(), do[..., m0:m1, :].float()
            s = (qi @ kj.transpose(-1, -2)) * scale
            p = torch.exp(s - lse[..., m0:m1, None])
            if is_causal and n1 - 1 > m0 + shift:
                rows = torch.arange(m0, m1, device=q.device)[:, None]
                cols = torch.arange(n0, n1, device=q.device)[None, :]
                p = p.masked_fill(cols > rows + shift, 0.0)
            dv[..., n0:n1, :] += p.transpose(-1, -2) @ doi
            dp = doi @ vj.transpose(-1, -2)
            ds = p * (dp - delta[..., m0:m1, None])
            dq[..., m0:m1, :] += (ds @ kj) * scale
            dk[..., n0:n1, :] += (ds.transpose(-1, -2) @ qi) * scale
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)
    # END TODO(a07)


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
