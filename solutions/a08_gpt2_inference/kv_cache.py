"""Assignment 8, kernel 3: the KV cache, allocated once, and the kernel that writes into it.

    from solutions.a08_gpt2_inference.kv_cache import KVCache, write_kv
    cache = KVCache(n_layer=12, batch=4, n_head=12, head_dim=64, max_seq_len=1024, dtype=torch.bfloat16)
    write_kv(qkv, cache.k[layer], cache.v[layer], start)   # qkv [B, T, 3C] from c_attn

Without a cache, token t+1 recomputes the keys and values of all t tokens before it. With one,
each step computes K and V for the new token only and appends them. The cache is allocated ONCE
for S_max positions ([n_layer, B, H, S_max, d] for K and again for V): nothing is allocated while
decoding, shapes never change, and a decode step can be captured in a CUDA graph.

Memory: every token of every sequence keeps one key and one value vector per head per
layer, ``2 · n_layer · n_head · d · itemsize`` bytes (GPT-2 small in bf16: 36 KiB a
token, 36 MiB for 1024 tokens; a batch of 64 at 1024 tokens: 2.25 GiB).

``write_kv`` takes c_attn's fused output [B, T, 3C] (q | k | v, each C = H·d, head-major
inside) and copies its k and v parts for token t of sequence b to position
``start[b] + t`` of that layer's cache. Prefill: start = 0, T = the padded prompt
length. Decode: start = the current lengths, T = 1. Slots at or past S_max are never
written (the engine checks lengths on the host, where it knows them).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from common import pdl_supported
from common.checks import FLOAT_DTYPES, check_same, check_tensor
from common.launch import cdiv, fast, next_power_of_2
from common.triton_helpers import dim_mask


@triton.jit
def _write_kv_kernel(QKV, K_CACHE, V_CACHE, START, T, H, S_MAX, s_row, s_cb, s_ch, s_cn,
                     HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr, USE_PDL: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program (b·T + t): token t of sequence b. QKV row b·T + t (row stride s_row) holds
    [q | k | v], C = H·HEAD_DIM each, head h at columns h·HEAD_DIM... of its part.
    K_CACHE[b, h, START[b] + t, :] = k[h, :] and V_CACHE likewise for every head h
    (cache strides s_cb, s_ch, s_cn; last dim contiguous; the two caches share strides).
    Positions >= S_MAX are not written. HEAD_DIM is padded to BLOCK_D (a power of two) with a mask."""
    if USE_PDL:   # given: programmatic dependent launch (tuned_gemv.PDL_NOTES): wait for the previous kernel,
        tl.extra.cuda.gdc_wait()                   # then let the next one start launching
        tl.extra.cuda.gdc_launch_dependents()
    # TODO(a08): kernel 3 (append K and V to the cache). Program `row` = b * T + t:
    #   pos = START[b] + t. For every head h < H (tl.arange(0, BLOCK_H), masked) and d < HEAD_DIM
    #   (tl.arange(0, BLOCK_D), masked with dim_mask(HEAD_DIM, BLOCK_D)):
    #   K_CACHE[b, h, pos, d] = QKV[row, C + h * HEAD_DIM + d] and
    #   V_CACHE[b, h, pos, d] = QKV[row, 2 * C + h * HEAD_DIM + d], with C = H * HEAD_DIM.
    #   Row `row` of QKV starts at QKV + row * s_row; cache element [b, h, pos, d] is at
    #   b * s_cb + h * s_ch + pos * s_cn + d (int64). Write nothing where pos >= S_MAX.
    # STUB: pass
    # SOLUTION
    row = tl.program_id(0)
    b = row // T
    t = row % T
    pos = tl.load(START + b) + t
    hs = tl.arange(0, BLOCK_H)
    ds = tl.arange(0, BLOCK_D)
    c = H * HEAD_DIM
    ok = (hs[:, None] < H) & (pos < S_MAX) & dim_mask(HEAD_DIM, BLOCK_D)[None, :]
    src = QKV + row.to(tl.int64) * s_row + hs[:, None] * HEAD_DIM + ds[None, :]
    dst = b.to(tl.int64) * s_cb + hs[:, None].to(tl.int64) * s_ch + pos.to(tl.int64) * s_cn + ds[None, :]
    k = tl.load(src + c, mask=ok, other=0.0)
    v = tl.load(src + 2 * c, mask=ok, other=0.0)
    tl.store(K_CACHE + dst, k, mask=ok)
    tl.store(V_CACHE + dst, v, mask=ok)
    # END TODO(a08)


# ==================================================================== launch (given)
def check_caches(like: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: torch.Tensor,
                 name: str) -> None:
    """The checks on a cache write's destination, for write_kv and gemv(..., kv_cache=...): caches [B, H, S_max, d]
    of ``like``'s dtype and device, one shape and strides, last dim contiguous; start int32 [.] on that device."""
    check_tensor(k_cache, "k_cache", dtypes=(like.dtype,), ndim=4)
    check_tensor(v_cache, "v_cache", dtypes=(like.dtype,), ndim=4)
    check_tensor(start, "start", dtypes=(torch.int32,), ndim=1)
    check_same(like, k_cache, f"{name}, k_cache")
    check_same(like, start, f"{name}, start", dtype=False)
    if v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride():
        raise ValueError(f"v_cache: expected k_cache's shape and strides {tuple(k_cache.shape)} {k_cache.stride()}, "
                         f"got {tuple(v_cache.shape)} {v_cache.stride()}")
    if k_cache.stride(-1) != 1:
        raise ValueError(f"the cache (strides {k_cache.stride()}) must have a contiguous last dim")


def write_kv(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, start: torch.Tensor, *,
             pdl: bool = False) -> None:
    """Copy the k and v parts of ``qkv`` [B, T, 3C] into ``k_cache``/``v_cache`` [B, H, S_max, d]
    at positions ``start[b] + t`` (start: int32 [B] on the device). qkv rows contiguous
    (row stride free); caches one layer's view of :class:`KVCache`, same dtype as qkv.
    ``pdl=True``: programmatic dependent launch where the GPU supports it (tuned_gemv.PDL_NOTES)."""
    check_tensor(qkv, "qkv", dtypes=FLOAT_DTYPES, ndim=3)
    check_caches(qkv, k_cache, v_cache, start, "qkv")
    b, t, three_c = qkv.shape
    cb, h, s_max, d = k_cache.shape
    if three_c != 3 * h * d or cb != b or start.shape[0] != b:
        raise ValueError(f"qkv {tuple(qkv.shape)}, cache {tuple(k_cache.shape)}, start {tuple(start.shape)}: expected "
                         f"qkv [B, T, 3·H·d] with the cache's B={cb}, H={h}, d={d}, and start [B]")
    if qkv.stride(-1) != 1 or qkv.stride(0) != t * qkv.stride(1):
        raise ValueError(f"qkv (strides {qkv.stride()}) must have contiguous rows")
    if b * t == 0:
        return
    use_pdl = bool(pdl) and pdl_supported(qkv.device)
    fast(_write_kv_kernel)[(b * t,)](qkv, k_cache, v_cache, start, t, h, s_max, qkv.stride(1),
                                     k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
                                     HEAD_DIM=d, BLOCK_H=next_power_of_2(h), num_warps=4, BLOCK_D=next_power_of_2(d),
                                     USE_PDL=use_pdl, **(dict(launch_pdl=True) if use_pdl else {}))


class KVCache:
    """Keys and values of every layer for ``batch`` sequences of up to ``max_seq_len`` tokens.

    ``k``, ``v``: [n_layer, batch, n_head, max_seq_len, head_dim]; ``k[layer]`` is the
    [B, H, S_max, d] view the kernels take. ``lengths`` (int32 [batch], on the device):
    tokens held per sequence; ``host_lengths`` the same numbers on the host (the engine
    updates both, so it never reads the device to know them).
    """

    def __init__(self, n_layer: int, batch: int, n_head: int, head_dim: int, max_seq_len: int,
                 dtype: torch.dtype, device: str | torch.device):
        shape = (n_layer, batch, n_head, max_seq_len, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device)
        self.host_lengths = [0] * batch
        self.n_layer, self.batch, self.n_head, self.head_dim, self.max_seq_len = shape[0], batch, n_head, head_dim, max_seq_len

    @staticmethod
    def bytes_per_token(n_layer: int, n_head: int, head_dim: int, dtype: torch.dtype) -> int:
        """2 (K and V) · n_layer · n_head · head_dim · itemsize."""
        return 2 * n_layer * n_head * head_dim * torch.empty((), dtype=dtype).element_size()

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def describe(self) -> str:
        per = self.bytes_per_token(self.n_layer, self.n_head, self.head_dim, self.k.dtype)
        return (f"KV cache: {self.batch} x {self.max_seq_len} positions x {per / 1024:.1f} KiB per token "
                f"(2·{self.n_layer} layers·{self.n_head} heads·{self.head_dim}·{self.k.element_size()} B) "
                f"= {self.nbytes / 2**20:.1f} MiB")
