# PLACEHOLDER (owner: a09kern)
"""SwiGLU (placeholder in plain PyTorch until the kernel file replaces it)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def swiglu(gu: torch.Tensor, *, out: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    f = gu.shape[-1] // 2
    gate, up = gu[..., :f], gu[..., f:]
    y = (F.silu(gate.float()).to(gu.dtype).float() * up.float()).to(gu.dtype)
    if out is not None:
        out.copy_(y)
        return out
    return y
