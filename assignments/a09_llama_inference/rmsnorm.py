# PLACEHOLDER (owner: a09kern)
"""RMSNorm (placeholder in plain PyTorch until the kernel file replaces it)."""
from __future__ import annotations

import torch


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float, *, out: torch.Tensor | None = None,
            pdl: bool = False) -> torch.Tensor:
    xf = x.float()
    inv = torch.pow((xf * xf).sum(-1, keepdim=True) / x.shape[-1] + eps, -0.5)
    y = (w.to(x.dtype) * (xf * inv).to(x.dtype)).contiguous()
    if out is not None:
        out.copy_(y)
        return out
    return y


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float, *,
                pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    h = (x + residual).contiguous()
    return h, rmsnorm(h, w, eps)
