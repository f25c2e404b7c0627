"""Reference implementations, computed in float64 on the CPU.

Every stage is graded against these. They use plain PyTorch on upcast copies of
the inputs, so they never share code (or bugs) with the kernels being graded.
"""
from __future__ import annotations

import math

import torch


def _f64(*xs: torch.Tensor | None):
    return [None if x is None else x.detach().to("cpu", torch.float64) for x in xs]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """y = x @ weight.T + bias with weight [out, in] (nn.Linear convention)."""
    x, w, b = _f64(x, weight, bias)
    y = x @ w.T
    return y if b is None else y + b


def linear_scale(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """|x| @ |weight|ᵀ + |bias|: the magnitude of the terms each output sums (for tolerances)."""
    x, w, b = _f64(x, weight, bias)
    y = x.abs() @ w.abs().T
    return y if b is None else y + b.abs()


def add_bias(y: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    y, b = _f64(y, b)
    return y + b


GELU_C = math.sqrt(2.0 / math.pi)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), GPT-2's ``gelu_new``.

    Evaluated as x·sigmoid(2u), the same function: 1 + tanh(u) cancels for u < -19 even
    in float64 (at x = -7 the literal formula is 38% off), while sigmoid keeps full
    relative precision, so the reference stays right where GELU is tiny.
    """
    (x,) = _f64(x)
    return x * torch.sigmoid(2.0 * GELU_C * (x + 0.044715 * x**3))


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a, b = _f64(a, b)
    return a @ b


def causal_mask(nq: int, nk: int) -> torch.Tensor:
    """Boolean [nq, nk], True where query i may attend to key j.

    Bottom-right aligned: the last query sees every key, query i sees keys
    j <= i + (nk - nq). With nq == nk this is the usual lower triangle.
    """
    i = torch.arange(nq)[:, None]
    j = torch.arange(nk)[None, :]
    return j <= i + (nk - nq)


def _attention(q, k, v, is_causal, scale):
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = (q @ k.transpose(-1, -2)) * scale
    if is_causal:
        s = s.masked_fill(~causal_mask(q.shape[-2], k.shape[-2]), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.exp(s - lse[..., None]) @ v, lse


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
              scale: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Materialised softmax(q kᵀ·scale) v in float64; returns (O, L), L the row logsumexp [..., Nq]."""
    return _attention(*_f64(q, k, v), is_causal, scale)


def attention_backward(q, k, v, do, is_causal: bool = False, scale: float | None = None):
    """(dQ, dK, dV) of attention in float64, by autograd through the materialised matrix."""
    q, k, v, do = _f64(q, k, v, do)
    for t in (q, k, v):
        t.requires_grad_(True)
    o, _ = _attention(q, k, v, is_causal, scale)
    return torch.autograd.grad(o, (q, k, v), do)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) · weight + bias over the last dim, biased variance (torch.nn.LayerNorm)."""
    x, w, b = _f64(x, weight, bias)
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths) -> torch.Tensor:
    """One query per (sequence, head) against its first lengths[b] cache positions: q [B, H, d],
    caches [B, H, S_max, d] -> [B, H, d] in float64 (positions past a length are never read)."""
    q, k, v = _f64(q, k_cache, v_cache)
    out = torch.empty_like(q)
    for i, n in enumerate(lengths):
        out[i] = _attention(q[i][:, None], k[i, :, :n], v[i, :, :n], False, None)[0][:, 0]
    return out
