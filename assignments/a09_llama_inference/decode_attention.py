"""Assignment 9, grouped-query attention: flash-decoding over a shared KV head, and the prompt's attention.

    from assignments.a09_llama_inference.decode_attention import gqa_decode_attention, gqa_prefill_attention
    o = gqa_decode_attention(q, k_cache, v_cache, lengths)   # q [B, H, d]; caches [B, Hkv, S_max, d]
    o = gqa_prefill_attention(q, k, v)                       # q [B, H, T, d]; k, v [B, Hkv, T_k, d]

Why grouped-query attention. In decode every step reads the whole KV cache, once per token generated: at
batch 16 and a few thousand tokens of context the cache can outweigh the model's weights. Llama 3 and Qwen 3
keep fewer KV heads than query heads (Llama-3.2-1B: 32 query heads, 8 KV heads): query head h uses KV head
h // G, G = H // Hkv the group (transformers' repeat_kv). The cache, and the bytes a decode step reads from
it, shrink by G.

Why one program per KV head. Stage 8's decode_attention gives each (sequence, head) its own programs; run
on the G query heads of a group it would read each K and V row G times, and the saving would stay on paper.
Here ONE program per (sequence, KV head, key split) loads the group's G queries as a [G, d] tile and walks
its keys in [BLOCK_N, d] tiles: the scores are a [G, d] x [d, BLOCK_N] product (tl.dot, the group padded
to at least 16 rows), and the output a [G, BLOCK_N] x [BLOCK_N, d] one, so every K and V element is read
once per group. The rest is stage 8's flash-decoding: the keys of a sequence are split over programs
(num_splits, shapes only, so a step replays from a CUDA graph), each split keeps an online softmax per
query row, and stage 8's combine kernel (_decode_combine) merges the splits per query head, in a fixed
order (the same inputs give the same bits).

Prefill: the stride trick. A prompt's causal attention runs through stage 7's flash attention forward,
unchanged. Its kernel reads head h of batch z at z·stride(0) + h·stride(1): view K as [B·Hkv, G, T_k, d]
with stride 0 on the group dim (expand) and head g of "batch" (b, j) reads KV head j of sequence b, for
every g, with no copy of K or V. Only q is rearranged (einops: [B, H, T, d] -> [B·Hkv, G, T, d], a view
where q's layout allows one).

fp32 inputs compute in IEEE fp32 (both dots ``input_precision="ieee"``; a GPU's default for an fp32
``tl.dot`` is TF32, ~3e-4 relative): stage 9's fp32 engine must generate transformers' tokens. Head dims up
to MAX_HEAD_DIM, padded to a power of two with masks.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from einops import rearrange

from common import TRITON_INTERPRET, pdl_supported
from common.checks import FLOAT_DTYPES, check_same, check_tensor, meta
from common.gpu import limits
from common.launch import fast, next_power_of_2
from common.triton_helpers import dim_mask

from ..a07_flash_attention.flash_triton import attention_forward
from ..a08_gpt2_inference.decode_attention import BLOCK_N, LOG2E, MAX_HEAD_DIM, _decode_combine, num_splits, split_warps


@triton.jit
def _gqa_decode_split(Q, K, V, LENS, O, O_PART, L_PART,
                      sqb, sqh, skb, skh, skn, svb, svh, svn, sob, soh,
                      H, HKV, qk_scale,
                      GROUP: tl.constexpr, BLOCK_G: tl.constexpr, NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, USE_PDL: tl.constexpr):
    """Program (split, b·HKV + j): the GROUP query heads j·GROUP .. j·GROUP + GROUP - 1 of sequence b
    against KV head j. Keys: positions [0, LENS[b]); this split takes [split·per, min((split+1)·per,
    LENS[b])) with per = cdiv(cdiv(LENS[b], NUM_SPLITS), BLOCK_N)·BLOCK_N (maybe empty).
    qk_scale = log2(e)/sqrt(d). Rows of the [BLOCK_G, BLOCK_D] query tile past GROUP, and columns past
    HEAD_DIM, are masked (BLOCK_G >= 16 and BLOCK_D >= 16: tl.dot's minimum). PRECISION: the dots'
    input_precision ("ieee" for fp32 inputs). Partial results per QUERY head, the layout of stage 8's
    combine: O_PART[(b·H + h)·NUM_SPLITS + split, :] (normalised, fp32, rows HEAD_DIM long) and
    L_PART[(b·H + h)·NUM_SPLITS + split] (log2-sum-exp2 of the scaled scores, -inf if the slice is
    empty). NUM_SPLITS == 1: write O[b, h, :] (out dtype) directly instead. Last dims have stride 1."""
    if USE_PDL:   # given: programmatic dependent launch (a08 tuned_gemv.PDL_NOTES): wait for the previous kernel,
        tl.extra.cuda.gdc_wait()                   # then let the next one start launching
        tl.extra.cuda.gdc_launch_dependents()
    # TODO(a09): the split kernel of grouped-query decode attention. Program (split, bj): b = bj // HKV,
    #   KV head j = bj % HKV; its query heads are h = j * GROUP + g for g < GROUP (transformers' repeat_kv:
    #   query head h reads KV head h // GROUP).
    #   1. length = LENS[b]; per = cdiv(cdiv(length, NUM_SPLITS), BLOCK_N) * BLOCK_N;
    #      this program's keys are [split * per, min(split * per + per, length)) (maybe empty).
    #   2. q: the [BLOCK_G, BLOCK_D] tile Q[b, j * GROUP + g, :] in q's dtype (rows g >= GROUP and head dims
    #      past HEAD_DIM masked to 0: d_ok = dim_mask(HEAD_DIM, BLOCK_D), as in stage 8).
    #   3. Online softmax per query row over the slice, in chunks of BLOCK_N keys: k, v [BLOCK_N, BLOCK_D]
    #      (keys past the slice's end masked);
    #      s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale   ([BLOCK_G, BLOCK_N], log2 units;
    #      masked keys -inf); m_new = max(m, rowmax s); p = exp2(s - m_new[:, None]); alpha = exp2(m - m_new);
    #      l = l * alpha + rowsum p; acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=...);
    #      m = m_new. (m: [BLOCK_G] -inf, l: [BLOCK_G] 0, acc: [BLOCK_G, BLOCK_D] 0, all fp32.) Each K and V
    #      tile is loaded ONCE for the group: that is the point of the kernel. (A tl.sum of a broadcast
    #      [G, N, d] product instead is a pattern Triton may rewrite into a tl.dot of its default precision,
    #      TF32 for fp32 on a GPU: write the tl.dot, with PRECISION, yourself.)
    #   4. NUM_SPLITS == 1: O[b, h, :] = acc / l (O's dtype) for the GROUP real rows. Otherwise per query head
    #      h (row r = b * H + h): O_PART[r * NUM_SPLITS + split, :] = acc / l (fp32, rows HEAD_DIM long),
    #      L_PART[r * NUM_SPLITS + split] = m + log2(l); an empty slice writes 0 and -inf.
    pass


# ==================================================================== launch (given)
def block_g(group: int) -> int:
    """Rows of the query tile: the group G rounded up to a power of two, at least 16 (tl.dot's M on every
    GPU the course runs on; the padded rows are masked, and cost no memory traffic)."""
    return max(16, next_power_of_2(group))


def block_d(head_dim: int) -> int:
    """The padded head dim: a power of two, at least 16 (tl.dot's K for the score product)."""
    return max(16, next_power_of_2(head_dim))


#: Bytes of one K (or V) tile a split program loads per step at most: BLOCK_N is halved below stage 8's
#: BLOCK_N while a [BLOCK_N, d] tile is larger (fp32 from d = 128; counted in fp32 where dots run on FMAs).
TILE_BYTES = 16384


def split_config(head_dim: int, dtype: torch.dtype, device_limits: tuple | None) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) of a split program on a device of ``device_limits``
    (common.gpu.limits: capability, shared memory per block; None: the interpreter, one stage).
    Warps: stage 8's split_warps, but 8 where the dots run on FMAs (fp32's IEEE dots; every dtype before
    sm_80 in Triton 3.6) at d >= 64: their operands spill from 4 warps' registers. Stages: the loop feeds
    tl.dot, which Triton software-pipelines through shared memory, each stage a K and a V tile; a device
    gets the stages (1 to 3) whose tiles fit half its shared memory per block (the rest: the dots'
    operands and layouts)."""
    lim = device_limits
    fma = dtype == torch.float32 or (lim is not None and lim[0] < (8, 0))
    n, tile = BLOCK_N, block_d(head_dim) * dtype.itemsize
    while n > 16 and n * block_d(head_dim) * (4 if fma else dtype.itemsize) > TILE_BYTES:   # FMA dots: fp32 tiles
        n //= 2
    warps = 8 if fma and head_dim >= 64 else split_warps(head_dim)
    if lim is None:
        return n, warps, 1
    return n, warps, max(1, min(3, (lim[1] // 2) // (2 * n * tile)))


def gqa_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor, *,
                         splits: int | None = None, out: torch.Tensor | None = None,
                         pdl: bool = False) -> torch.Tensor:
    """softmax(q·kᵀ/sqrt(d)) v for one new query per (sequence, query head), against a grouped KV cache.

    q: [B, H, d] (last dim contiguous, e.g. a view of the fused QKV output); k_cache, v_cache:
    [B, Hkv, S_max, d], last dim contiguous; H a multiple of Hkv: query head h reads KV head h // (H // Hkv)
    (transformers' repeat_kv). One float dtype, on the kernel device. lengths: int32 [B], the valid keys of
    each sequence, 1 <= lengths[b] <= S_max (not checked: reading it would synchronise). Returns [B, H, d] in
    q's dtype (or writes ``out``, contiguous). ``splits`` forces the key slices per (sequence, KV head)
    (default: stage 8's num_splits over B·Hkv programs). Accumulates in fp32 (fp32 inputs: IEEE dots);
    deterministic; capturable in a CUDA graph. ``pdl=True``: programmatic dependent launch where the GPU
    supports it. Head dims 1 .. MAX_HEAD_DIM.
    """
    try:   # the call's key: everything its checks and decisions read (lecture 3, "Host overhead")
        key = (meta(q), meta(k_cache), meta(v_cache), meta(lengths), meta(out), splits, bool(pdl))
        call = _CALLS.get(key)
    except (AttributeError, TypeError):   # not tensors: the checks say what is wrong
        key = call = None
    if call is None:
        call = _checked_call(q, k_cache, v_cache, lengths, splits, out, pdl)
        if key is not None:
            _CALLS[key] = call
    out_shape, part_shapes, split, combine = call
    if out is None:
        out = q.new_empty(out_shape)
    if split is None:                      # B = 0
        return out
    if part_shapes is not None:
        o_part = q.new_empty(part_shapes[0], dtype=torch.float32)
        l_part = q.new_empty(part_shapes[1], dtype=torch.float32)
    else:
        o_part = l_part = out          # unused
    h = out_shape[1]
    split(q, k_cache, v_cache, lengths, out, o_part, l_part, q.stride(0), q.stride(1), k_cache.stride(0),
          k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0),
          out.stride(1), h, k_cache.shape[1], LOG2E / math.sqrt(out_shape[2]))
    if combine is not None:
        combine(o_part, l_part, out, out.stride(0), out.stride(1), h)
    return out


#: The calls per key (the tensors' metadata and the options): shapes and the kernels' prepared launches, made
#: by _checked_call on a key's first call and looked up after that (lecture 3, "Host overhead").
_CALLS: dict[tuple, tuple] = {}


def _checked_call(q, k_cache, v_cache, lengths, splits, out, pdl) -> tuple:
    """The checks of a call (a clear error for a bad input) and its decisions: (out's shape, the partial
    results' shapes or None, the split kernel's prepared launch, the combine's or None)."""
    check_tensor(q, "q", dtypes=FLOAT_DTYPES, ndim=3)
    check_tensor(k_cache, "k_cache", dtypes=FLOAT_DTYPES, ndim=4)
    check_tensor(v_cache, "v_cache", dtypes=FLOAT_DTYPES, ndim=4)
    check_tensor(lengths, "lengths", dtypes=(torch.int32,), ndim=1)
    check_same(q, k_cache, "q, k_cache")
    check_same(q, v_cache, "q, v_cache")
    check_same(q, lengths, "q, lengths", dtype=False)
    b, h, d = q.shape
    if k_cache.shape != v_cache.shape:
        raise ValueError(f"k_cache and v_cache must have one shape, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    hkv = k_cache.shape[1]
    if k_cache.shape[0] != b or k_cache.shape[3] != d:
        raise ValueError(f"k_cache: expected [B={b}, Hkv, S_max, d={d}] to match q {tuple(q.shape)}, "
                         f"got {tuple(k_cache.shape)}")
    if hkv < 1 or h % hkv != 0 or h == 0:
        raise ValueError(f"grouped-query attention needs the query heads H={h} to be a positive multiple of the KV "
                         f"heads Hkv={hkv} (k_cache {tuple(k_cache.shape)}): query head h reads KV head h // (H // Hkv)")
    if k_cache.shape[2] < 1:
        raise ValueError(f"k_cache: the cache holds no position (S_max = 0), shape {tuple(k_cache.shape)}")
    if lengths.shape[0] != b:
        raise ValueError(f"lengths: expected one length per sequence ({b},), got {tuple(lengths.shape)}")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head dim d={d} is not supported; expected 1 <= d <= {MAX_HEAD_DIM}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: the last dim must be contiguous (stride 1), got strides {t.stride()}")
    if out is not None:
        check_tensor(out, "out", dtypes=(q.dtype,), contiguous=True)
        check_same(q, out, "q, out")
        if tuple(out.shape) != (b, h, d):
            raise ValueError(f"out: expected shape {(b, h, d)}, got {tuple(out.shape)}")
    if b == 0:
        return (b, h, d), None, None, None
    block_n, warps, stages = split_config(d, q.dtype, None if TRITON_INTERPRET else limits(q.device))
    n = splits if splits is not None else num_splits(b * hkv, k_cache.shape[2], block_n=block_n)
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"splits: expected an int >= 1, got {n!r}")
    use_pdl = bool(pdl) and pdl_supported(q.device)
    launch = dict(launch_pdl=True) if use_pdl else {}
    group = h // hkv
    split_kw = dict(GROUP=group, BLOCK_G=block_g(group), NUM_SPLITS=n, HEAD_DIM=d, BLOCK_N=block_n,
                    BLOCK_D=block_d(d), PRECISION="ieee" if q.dtype == torch.float32 else "tf32", USE_PDL=use_pdl,
                    num_warps=warps, num_stages=stages, **launch)
    split = fast(_gqa_decode_split).prepare((n, b * hkv), **split_kw)
    if n == 1:
        return (b, h, d), None, split, None
    combine = fast(_decode_combine).prepare((b * h,), NUM_SPLITS=n, SPLITS_P2=next_power_of_2(n), HEAD_DIM=d,
                                            USE_PDL=use_pdl, BLOCK_D=next_power_of_2(d), num_warps=1, **launch)
    return (b, h, d), ((b * h, n, d), (b * h, n)), split, combine


# ==================================================================== prefill (given)
def gqa_prefill_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, allow_tf32: bool = True) -> torch.Tensor:
    """Causal attention of a prompt with grouped KV heads, on stage 7's flash attention forward (unchanged).

    q: [B, H, T, d] (any strides); k, v: [B, Hkv, T_k, d] with T_k >= T, H a multiple of Hkv (query head h
    reads KV head h // (H // Hkv)), and k.stride(0) == Hkv·k.stride(1) (the same for v) where B > 1 and
    Hkv > 1: the cache's slots k_cache[:, :, :T_k] are such a view. The T queries are the LAST T of the
    T_k positions (stage 7's bottom-right causal mask): query t attends to keys 0 .. T_k - T + t. The engine
    passes the prompt's own T keys (T_k = T: the usual lower triangle); T_k > T is a prompt that continues
    a cache already holding T_k - T positions. Returns [B, H, T, d] in q's dtype (a new tensor).
    ``allow_tf32=False``: IEEE fp32 dots for fp32 inputs (stage 7's attention_forward).

    How: q is rearranged to [B·Hkv, G, T, d] (a copy unless q's layout allows a view); k and v are VIEWED
    as [B·Hkv, G, T_k, d] with stride 0 on the group dim, so stage 7's kernel, reading head g of batch
    (b, j), reads KV head j of sequence b for every g of the group, with no copy of K or V.
    """
    check_tensor(q, "q", dtypes=FLOAT_DTYPES, ndim=4)
    check_tensor(k, "k", dtypes=FLOAT_DTYPES, ndim=4)
    check_tensor(v, "v", dtypes=FLOAT_DTYPES, ndim=4)
    check_same(q, k, "q, k")
    check_same(q, v, "q, v")
    b, h, t, d = q.shape
    if k.shape != v.shape:
        raise ValueError(f"k and v must have one shape [B, Hkv, T_k, d], got {tuple(k.shape)} and {tuple(v.shape)}")
    hkv, t_k = k.shape[1], k.shape[2]
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k: expected [B={b}, Hkv, T_k, d={d}] to match q {tuple(q.shape)}, got {tuple(k.shape)}")
    if hkv < 1 or h % hkv != 0 or h == 0:
        raise ValueError(f"grouped-query attention needs the query heads H={h} to be a positive multiple of the KV "
                         f"heads Hkv={hkv} (q {tuple(q.shape)}, k {tuple(k.shape)})")
    if t_k < t:
        raise ValueError(f"k holds T_k={t_k} positions but q has T={t} queries; expected T_k >= T (the queries are "
                         "the last T positions)")
    for name, x in (("k", k), ("v", v)):
        if b > 1 and hkv > 1 and x.stride(0) != hkv * x.stride(1):
            raise ValueError(f"{name}: expected stride(0) == Hkv·stride(1) (batch and KV heads merge into one dim "
                             f"as a view, e.g. the cache k_cache[:, :, :T]), got strides {x.stride()} with "
                             f"Hkv={hkv}")
    g = h // hkv
    q4 = rearrange(q, "b (j g) t d -> (b j) g t d", g=g)
    k4 = k.flatten(0, 1)[:, None].expand(b * hkv, g, t_k, d)     # stride 0 on the group dim: no copy
    v4 = v.flatten(0, 1)[:, None].expand(b * hkv, g, t_k, d)
    o, _ = attention_forward(q4, k4, v4, True, allow_tf32=allow_tf32)
    return rearrange(o, "(b j) g t d -> b (j g) t d", b=b)
