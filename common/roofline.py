"""Roofline accounting: bytes moved, FLOPs done, and the fraction of a ceiling reached.

Ceilings are *measured* on the machine at hand (a large device-to-device copy
for bandwidth, a large cuBLAS bf16 matmul for compute), never taken from a
datasheet. The H100 figures measured for this course are kept for reference.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

#: Measured once on the course's H100 80GB HBM3 (see lectures/results/).
H100_REFERENCE = {"copy_GBps": 3000.0, "bf16_TFLOPs": 754.0}


def elementwise_bytes(numel: int, dtype: torch.dtype, reads: int = 1, writes: int = 1) -> int:
    """Fewest bytes an elementwise op moves: each input read once, each output written once."""
    return numel * dtype.itemsize * (reads + writes)


def matmul_flops(m: int, n: int, k: int) -> int:
    """2·m·n·k: one multiply and one add per term."""
    return 2 * m * n * k


def matmul_bytes(m: int, n: int, k: int, dtype: torch.dtype, bias: bool = False) -> int:
    b = (m * k + k * n + m * n) * dtype.itemsize
    return b + (n * dtype.itemsize if bias else 0)


def attention_flops(batch_heads: int, nq: int, nk: int, d: int, causal: bool, backward: bool = False) -> float:
    """FLOPs of attention counted as 2 matmuls (4·Nq·Nk·d), halved when causal and Nq == Nk.

    Backward is counted as 2.5x forward (5 matmuls, the FlashAttention convention).
    """
    f = 4.0 * batch_heads * nq * nk * d
    if causal:
        f /= 2
    return f * (2.5 if backward else 1.0)


@dataclass(frozen=True)
class Point:
    """One measured op placed on the roofline."""
    name: str
    flops: float
    bytes: float
    ms: float

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else float("inf")

    @property
    def tflops(self) -> float:
        return self.flops / self.ms / 1e9

    @property
    def gbps(self) -> float:
        return self.bytes / self.ms / 1e6

    def bound(self, ceil: Ceilings) -> str:
        return "compute" if self.intensity >= ceil.ridge else "memory"

    def fraction(self, ceil: Ceilings) -> float:
        """Achieved fraction of the roofline at this op's intensity."""
        attainable_tflops = min(ceil.tflops, self.intensity * ceil.gbps / 1e3)
        return self.tflops / attainable_tflops if attainable_tflops else 0.0


@dataclass(frozen=True)
class Ceilings:
    gbps: float      # device memory bandwidth, GB/s (bytes read + written)
    tflops: float    # dense bf16 matmul rate
    source: str

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) where memory- and compute-bound meet."""
        return self.tflops * 1e3 / self.gbps


@lru_cache(maxsize=1)
def measure_ceilings() -> Ceilings:
    """Measure copy bandwidth and bf16 matmul rate on this GPU (a few seconds, cached)."""
    if not torch.cuda.is_available():
        raise RuntimeError("measure_ceilings() needs a CUDA GPU")
    from .timing import bench
    n = 1 << 28  # 256M fp32 = 1 GiB, far larger than L2
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    ms = bench(lambda: dst.copy_(src)).median_ms  # 2 GiB moved: the L2 flush before it is noise
    gbps = 2 * n * 4 / ms / 1e6
    del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = bench(lambda: a @ b).median_ms
    tflops = matmul_flops(8192, 8192, 8192) / ms / 1e9
    return Ceilings(gbps, tflops, torch.cuda.get_device_name())


def gpt2_decode_flops(n_layer: int, n_embd: int, vocab: int, batch: int, ctx: int) -> float:
    """FLOPs of one GPT-2 decode step: 2 per weight per token in the matmuls (per layer
    3C² + C² + 4C² + 4C² = 12C², and the LM head vocab·C) + attention over ctx keys,
    2·2·ctx·C per layer (q·kᵀ and p·v)."""
    c = n_embd
    return 2 * batch * (n_layer * 12 * c * c + vocab * c) + 4 * batch * n_layer * ctx * c


def gpt2_decode_bytes(n_layer: int, n_embd: int, vocab: int, batch: int, ctx: int, itemsize: int) -> int:
    """Bytes one GPT-2 decode step must read: every weight once (per layer 12C² + 13C: the four
    matmuls, their biases and two LayerNorms; the token embedding, read whole by the tied LM
    head; ln_f; B rows of the position embedding) and the KV cache, ctx positions of K and V
    per layer per sequence."""
    c = n_embd
    weights = n_layer * (12 * c * c + 13 * c) + vocab * c + 2 * c + batch * c
    return (weights + batch * ctx * 2 * n_layer * c) * itemsize
