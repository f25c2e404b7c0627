"""A small GPT-2 with GPT-2's own conventions, for patching kernels into a real model.

Random weights (no download), but the layout of the original checkpoint:

* ``Conv1D`` layers keep their weight as ``[in, out]`` and compute ``x @ W + b``
  (the transpose of ``nn.Linear``), as in GPT-2's ``c_attn``, ``c_fc``, ``c_proj``;
* pre-LayerNorm blocks (``ln_1``, ``ln_2``, final ``ln_f``, eps 1e-5);
* the MLP is ``c_fc`` (d -> 4d), the activation ``act`` = ``gelu_new`` (the tanh form
  of GELU, written as plain torch ops), ``c_proj`` (4d -> d);
* learned position embeddings ``wpe``, token embeddings ``wte`` tied to the LM head;
* init N(0, 0.02), residual projections N(0, 0.02/sqrt(2·n_layer)).

    from common.gpt2 import GPT2, GPT2Config
    model = GPT2(GPT2Config.tiny()).to("cuda")
    logits = model(torch.randint(0, model.cfg.vocab_size, (2, 16), device="cuda"))

Module paths follow the Hugging Face names (``h[i].mlp.act``), so a patch written
for this model reads like one written for ``transformers``' GPT-2.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


def gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's GELU, 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), as plain torch ops.

    Written exactly as the original code does: each op launches its own kernel on a
    GPU and reads and writes the whole tensor (8 kernels; see lecture 4's profile).
    """
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class NewGELU(nn.Module):
    """``gelu_new`` as a module: the activation a patch replaces (``block.mlp.act``)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gelu_new(x)


@dataclass(frozen=True)
class GPT2Config:
    vocab_size: int = 50257
    n_positions: int = 1024
    n_embd: int = 768
    n_layer: int = 12
    n_head: int = 12
    layer_norm_epsilon: float = 1e-5

    @classmethod
    def tiny(cls) -> GPT2Config:
        """Small enough for CPU tests (odd vocabulary on purpose)."""
        return cls(vocab_size=97, n_positions=64, n_embd=64, n_layer=2, n_head=4)


class Conv1D(nn.Module):
    """GPT-2's linear layer: weight [in, out], y = x @ W + b."""

    def __init__(self, n_in: int, n_out: int, std: float = 0.02, device=None):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n_in, n_out, device=device) * std)
        self.bias = nn.Parameter(torch.zeros(n_out, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)


class Attention(nn.Module):
    def __init__(self, cfg: GPT2Config, device=None):
        super().__init__()
        self.n_head = cfg.n_head
        self.c_attn = Conv1D(cfg.n_embd, 3 * cfg.n_embd, device=device)
        self.c_proj = Conv1D(cfg.n_embd, cfg.n_embd, std=0.02 / math.sqrt(2 * cfg.n_layer), device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: GPT2Config, device=None):
        super().__init__()
        self.c_fc = Conv1D(cfg.n_embd, 4 * cfg.n_embd, device=device)
        self.act: nn.Module = NewGELU()
        self.c_proj = Conv1D(4 * cfg.n_embd, cfg.n_embd, std=0.02 / math.sqrt(2 * cfg.n_layer), device=device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, cfg: GPT2Config, device=None):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon, device=device)
        self.attn = Attention(cfg, device)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon, device=device)
        self.mlp = MLP(cfg, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2(nn.Module):
    """Token ids [B, T] -> logits [B, T, vocab]. ``device``: where the parameters are made
    (e.g. a fake CUDA device inside ``common.profiling.fake_cuda``)."""

    def __init__(self, cfg: GPT2Config, device=None):
        super().__init__()
        self.cfg = cfg
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd, _weight=0.02 * torch.randn(cfg.vocab_size, cfg.n_embd, device=device))
        self.wpe = nn.Embedding(cfg.n_positions, cfg.n_embd, _weight=0.01 * torch.randn(cfg.n_positions, cfg.n_embd, device=device))
        self.h = nn.ModuleList(Block(cfg, device) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.n_embd, eps=cfg.layer_norm_epsilon, device=device)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        if t > self.cfg.n_positions:
            raise ValueError(f"sequence length {t} exceeds n_positions={self.cfg.n_positions}")
        pos = torch.arange(t, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T   # LM head tied to the token embedding


def randomize_(model: nn.Module, *, generator: torch.Generator | None = None, std: float = 0.02) -> nn.Module:
    """Give every bias and LayerNorm parameter random values too (the init zeros them /
    sets them to one), so a test exercises every parameter. In place; returns ``model``."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in f".{name}":
                base = 1.0 if name.endswith("weight") else 0.0
                p.copy_(base + std * torch.randn(p.shape, generator=generator).to(p))
    return model
