# PLACEHOLDER (owner: a09kern)
"""Rotary position embeddings (placeholder in plain PyTorch until the kernel file replaces it)."""
from __future__ import annotations

import math

import torch


def rope_frequencies(head_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim))
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if rope_type == "default":
        return inv_freq
    if rope_type != "llama3":
        raise ValueError(f"rope_type={rope_type!r} is not supported (default, llama3)")
    factor, lo, hi = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old = scaling["original_max_position_embeddings"]
    low_wl, high_wl = old / lo, old / hi
    wavelen = 2 * math.pi / inv_freq
    f = torch.where(wavelen > low_wl, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * f / factor + smooth * f
    medium = ~(wavelen < high_wl) * ~(wavelen > low_wl)
    return torch.where(medium, smoothed, f)


def rope_cache(inv_freq: torch.Tensor, max_pos: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    freqs = torch.arange(max_pos, dtype=torch.float)[:, None] * inv_freq.float()[None, :]
    return freqs.cos().to(device), freqs.sin().to(device)


def apply_rope(qkv, cos, sin, start, n_head, n_kv_head, *, q_norm=None, k_norm=None, eps=1e-6, pdl=False) -> None:
    b, t, _ = qkv.shape
    d = cos.shape[-1] * 2
    pos = start.long()[:, None] + torch.arange(t, device=qkv.device)[None, :]      # [B, T]
    c, s = cos[pos][:, :, None, :], sin[pos][:, :, None, :]                        # [B, T, 1, d/2]
    for lo, n, norm in ((0, n_head, q_norm), (n_head * d, n_kv_head, k_norm)):
        part = qkv[..., lo:lo + n * d].unflatten(-1, (n, d))
        x = part.float()
        if norm is not None:
            inv = torch.pow((x * x).sum(-1, keepdim=True) / d + eps, -0.5)
            x = (norm.to(qkv.dtype) * (x * inv).to(qkv.dtype)).float()
        x1, x2 = x[..., :d // 2], x[..., d // 2:]
        part.copy_(torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1).to(qkv.dtype))
