"""Assignment 8, kernel 2: decode attention against a KV cache (flash-decoding), in Triton.

    from solutions.a08_gpt2_inference.decode_attention import decode_attention
    o = decode_attention(q, k_cache, v_cache, lengths)   # q [B, H, d]; caches [B, H, S_max, d]

In decode every sequence brings ONE new query per head, and it attends to all the keys in the
cache. One program per (sequence, head) would leave most of the GPU idle at batch 1 (GPT-2 small:
12 programs on 132 SMs) while it walks the whole cache alone. Flash-decoding splits the KEYS instead:

  1. _decode_split    program (split, b·h): the keys [start, end) of its slice of the
                      sequence's own length; online softmax over them in BLOCK_N chunks
                      (fp32, exp2 domain); writes the slice's normalised partial output
                      O_s and its logsumexp L_s (log2 units; -inf for an empty slice).
                      With one split it writes the final output directly.
  2. _decode_combine  program b·h: O = sum_s 2^(L_s - L) O_s with L = log2 sum_s 2^L_s.

``lengths[b]`` is the number of valid cache positions of sequence b (the new token's key included);
slots past it are never read. The number of splits depends only on shapes (B·H and S_max), never on
the lengths' values: no host synchronisation, so a decode step can be captured in a CUDA graph.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from common import TRITON_INTERPRET, pdl_supported
from common.checks import FLOAT_DTYPES, check_same, check_tensor, meta
from common.gpu import l2_bytes
from common.launch import cdiv, fast, next_power_of_2
from common.triton_helpers import dim_mask

LOG2E = 1.4426950408889634


@triton.jit
def _prefetch_l2(ptrs):
    # prefetch.global.L2: ask L2 for the 128-byte line holding each address (no register, no wait)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_cache(K, V, LENS, skb, skh, skn, svb, svh, svn, H,
                    NUM_SPLITS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, KEYS: tl.constexpr,
                    LINE: tl.constexpr):
    """Given (tuned path: only with PDL). Ask L2 for the K and V rows of this program's first KEYS keys, BEFORE
    the PDL wait, so that they arrive while the previous kernel (c_attn's GEMV) still runs. Safe: LENS's
    value only picks which lines are asked for, and a prefetch to L2 never makes the new token's row stale."""
    split = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    n_keys = tl.load(LENS + b)                       # a hint: a stale value only changes what is prefetched
    per = tl.cdiv(tl.cdiv(n_keys, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per
    end = tl.minimum(start + tl.minimum(per, KEYS), n_keys)
    rows = start + tl.arange(0, KEYS)[:, None]
    rows = tl.where(rows < end, rows, start)         # past the slice: the first row again (no extra line)
    cols = (tl.arange(0, (BLOCK_D + LINE - 1) // LINE) * LINE)[None, :]
    _prefetch_l2(K + b.to(tl.int64) * skb + h.to(tl.int64) * skh + rows.to(tl.int64) * skn + cols)
    _prefetch_l2(V + b.to(tl.int64) * svb + h.to(tl.int64) * svh + rows.to(tl.int64) * svn + cols)


@triton.jit
def _decode_split(Q, K, V, LENS, O, O_PART, L_PART,
                  sqb, sqh, skb, skh, skn, svb, svh, svn, sob, soh,
                  H, qk_scale,
                  NUM_SPLITS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, USE_PDL: tl.constexpr,
                  BLOCK_D: tl.constexpr, PREFETCH: tl.constexpr, LINE: tl.constexpr):
    """Program (split, b·h). Keys of sequence b: positions [0, LENS[b]); this split takes the
    slice [split·per, min((split+1)·per, LENS[b])) with per = cdiv(cdiv(LENS[b], NUM_SPLITS),
    BLOCK_N)·BLOCK_N. qk_scale = log2(e)/sqrt(d). Partial results: O_PART[b·h, split, :]
    (normalised, fp32) and L_PART[b·h, split] (log2-sum-exp2 of the scaled scores, -inf if the
    slice is empty). NUM_SPLITS == 1: write O[b, h, :] (out dtype) directly instead.
    The last dim of every tensor is contiguous (stride 1). The head dim HEAD_DIM is padded to
    BLOCK_D (a power of two): columns d >= HEAD_DIM are masked (O_PART rows are HEAD_DIM long).
    PREFETCH (keys; 0: none): the given L2 prefetch of the slice's first keys, before the PDL wait."""
    if PREFETCH > 0:   # given: ask for the cache rows this program will read, before waiting (_prefetch_cache)
        _prefetch_cache(K, V, LENS, skb, skh, skn, svb, svh, svn, H, NUM_SPLITS, BLOCK_D, BLOCK_N, PREFETCH, LINE)
    if USE_PDL:   # given: programmatic dependent launch (tuned_gemv.PDL_NOTES): wait for the previous kernel,
        tl.extra.cuda.gdc_wait()                   # then let the next one start launching
        tl.extra.cuda.gdc_launch_dependents()
    # TODO(a08): kernel 2a (one split of the keys). Program (split, bh): b = bh // H, h = bh % H.
    #   1. length = LENS[b]; per = cdiv(cdiv(length, NUM_SPLITS), BLOCK_N) * BLOCK_N;
    #      this program's keys are [split * per, min(split * per + per, length)) (maybe empty).
    #   2. q = Q[b, h, :] in fp32, times qk_scale (scores then come out in log2 units). Head dims: offs_d =
    #      arange(0, BLOCK_D), masked with d_ok = dim_mask(HEAD_DIM, BLOCK_D) in every load and store.
    #   3. Online softmax over the slice in chunks of BLOCK_N keys [BLOCK_N, HEAD_DIM] (mask keys
    #      past the slice's end; masked scores are -inf): s = sum(k * q, axis=1);
    #      m_new = max(m, max s); p = exp2(s - m_new); alpha = exp2(m - m_new);
    #      l = l * alpha + sum p; acc = acc * alpha + sum(p[:, None] * v, axis=0); m = m_new.
    #      (m starts at -inf and l at 0 as fp32 scalars, acc as BLOCK_D zeros.)
    #   4. NUM_SPLITS == 1: O[b, h, :] = acc / l (O's dtype). Otherwise write the partial results:
    #      O_PART[bh * NUM_SPLITS + split, :] = acc / l (fp32), L_PART[...] = m + log2(l);
    #      an empty slice writes 0 and -inf.
    # STUB: pass
    # SOLUTION
    split = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    length = tl.load(LENS + b)
    per = tl.cdiv(tl.cdiv(length, NUM_SPLITS), BLOCK_N) * BLOCK_N
    start = split * per
    end = tl.minimum(start + per, length)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = dim_mask(HEAD_DIM, BLOCK_D)                                     # constant True if HEAD_DIM == BLOCK_D
    offs_n = tl.arange(0, BLOCK_N)
    q = tl.load(Q + b.to(tl.int64) * sqb + h * sqh + offs_d, mask=d_ok, other=0.0).to(tl.float32) * qk_scale
    k_base = K + b.to(tl.int64) * skb + h.to(tl.int64) * skh
    v_base = V + b.to(tl.int64) * svb + h.to(tl.int64) * svh

    m_i = tl.max(tl.full([BLOCK_N], float("-inf"), tl.float32), axis=0)   # scalar -inf
    l_i = tl.sum(tl.zeros([BLOCK_N], tl.float32), axis=0)                  # scalar 0
    acc = tl.zeros([BLOCK_D], tl.float32)
    for n0 in range(start, end, BLOCK_N):
        cols = n0 + offs_n
        ok = cols < end
        k = tl.load(k_base + cols[:, None].to(tl.int64) * skn + offs_d[None, :], mask=ok[:, None] & d_ok[None, :],
                    other=0.0)
        s = tl.sum(k.to(tl.float32) * q[None, :], axis=1)                  # [BLOCK_N], log2 units
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))                         # finite: ok has a True
        p = tl.math.exp2(s - m_new)
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        v = tl.load(v_base + cols[:, None].to(tl.int64) * svn + offs_d[None, :], mask=ok[:, None] & d_ok[None, :],
                    other=0.0)
        acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
        m_i = m_new

    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)
    if NUM_SPLITS == 1:
        tl.store(O + b.to(tl.int64) * sob + h * soh + offs_d, out.to(O.dtype.element_ty), mask=d_ok)
    else:
        part = bh.to(tl.int64) * NUM_SPLITS + split
        tl.store(O_PART + part * HEAD_DIM + offs_d, out, mask=d_ok)
        tl.store(L_PART + part, tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf")))
    # END TODO(a08)


@triton.jit
def _decode_combine(O_PART, L_PART, O, sob, soh, H,
                    NUM_SPLITS: tl.constexpr, SPLITS_P2: tl.constexpr, HEAD_DIM: tl.constexpr,
                    USE_PDL: tl.constexpr, BLOCK_D: tl.constexpr):
    """Program b·h: O[b, h, :] = sum_s 2^(L_s - L) · O_PART[b·h, s, :], L = log2 sum_s 2^L_s,
    over the NUM_SPLITS partial results (SPLITS_P2: NUM_SPLITS rounded up to a power of 2).
    Empty splits have L_s = -inf and weigh nothing; split 0 is never empty. HEAD_DIM padded to BLOCK_D
    with masks, as in _decode_split."""
    if USE_PDL:   # given: programmatic dependent launch, as in _decode_split
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # TODO(a08): kernel 2b (combine the splits). Program bh:
    #   L_s = L_PART[bh * NUM_SPLITS + s] for s < NUM_SPLITS (tl.arange(0, SPLITS_P2), masked, -inf);
    #   m = max_s L_s; w_s = exp2(L_s - m); O[b, h, :] = sum_s w_s * O_PART[...s, :] / sum_s w_s
    #   (head dims arange(0, BLOCK_D) masked with dim_mask(HEAD_DIM, BLOCK_D), as in kernel 2a).
    #   Empty splits (L_s = -inf) get weight 0: do not let their partial output (0 * NaN) leak in.
    # STUB: pass
    # SOLUTION
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    s = tl.arange(0, SPLITS_P2)
    s_ok = s < NUM_SPLITS
    base = bh.to(tl.int64) * NUM_SPLITS
    lse = tl.load(L_PART + base + s, mask=s_ok, other=float("-inf"))
    m = tl.max(lse, axis=0)
    w = tl.math.exp2(lse - m)                                              # 0 for empty splits
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = dim_mask(HEAD_DIM, BLOCK_D)
    o = tl.load(O_PART + (base + s)[:, None] * HEAD_DIM + offs_d[None, :],
                mask=s_ok[:, None] & (w[:, None] > 0) & d_ok[None, :], other=0.0)
    out = tl.sum(w[:, None] * o, axis=0) / tl.sum(w, axis=0)
    tl.store(O + b.to(tl.int64) * sob + h * soh + offs_d, out.to(O.dtype.element_ty), mask=d_ok)
    # END TODO(a08)


# ==================================================================== launch (given)
#: Any head dim up to this (padded to a power of two with masks: 80 and 96 run in 128-wide blocks)
MAX_HEAD_DIM = 256
#: Keys per inner step: the interpreter is fastest with few, large steps; on a GPU 64 keys x d
#: fp16 is a 8 KB tile per load, enough bytes in flight per program.
BLOCK_N = 16 if TRITON_INTERPRET else 64


def split_warps(head_dim: int) -> int:
    """Warps of a _decode_split program: 4 for a [BLOCK_N, d] tile of d >= 64, else 2."""
    return 4 if head_dim >= 64 else 2


def num_splits(batch_heads: int, max_seq_len: int, *, block_n: int = BLOCK_N) -> int:
    """How many programs share one (sequence, head): enough to give every SM ~4 programs,
    never a slice shorter than one BLOCK_N chunk. Depends on shapes only (graph-safe)."""
    return _num_splits(batch_heads, max_seq_len, block_n, None if TRITON_INTERPRET else torch.cuda.current_device())


@functools.lru_cache(maxsize=4096)   # shapes only: decided once per key, looked up after that
def _num_splits(batch_heads: int, max_seq_len: int, block_n: int, device: int | None) -> int:
    sms = 4 if device is None else torch.cuda.get_device_properties(device).multi_processor_count
    want = cdiv(4 * sms, max(batch_heads, 1))
    return int(max(1, min(want, cdiv(max_seq_len, block_n), 64)))


#: Keys of its slice each split program asks L2 for before the PDL wait (two BLOCK_N chunks), as long as
#: all of them stay under PREFETCH_L2_SHARE of the GPU's L2 (B·H·S_max rows of K and V: an upper bound).
#: On the H100 it helped where the cache fits L2 and slowed XL at batch 16 (EXPERIMENTS.md).
PREFETCH_KEYS, PREFETCH_L2_SHARE = 128, 0.25


def prefetch_keys(k_cache: torch.Tensor) -> int:
    """The split kernel's PREFETCH for a launch WITH PDL (only then does it overlap the previous kernel):
    PREFETCH_KEYS where the caches' K and V (two of ``k_cache``) fit PREFETCH_L2_SHARE of L2, else 0."""
    cache_bytes = 2 * k_cache.numel() * k_cache.element_size()
    return PREFETCH_KEYS if cache_bytes <= PREFETCH_L2_SHARE * l2_bytes(k_cache.device) else 0


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor, *,
                     splits: int | None = None, out: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """softmax(q·kᵀ/sqrt(d)) v for one new query per (sequence, head), against a KV cache.

    q: [B, H, d] (last dim contiguous, e.g. a view of the fused QKV output); k_cache, v_cache:
    [B, H, S_max, d], last dim contiguous; one float dtype on the kernel device. lengths: int32 [B], the
    valid keys of each sequence, 1 <= lengths[b] <= S_max (not checked: reading it would synchronise).
    Returns [B, H, d] in q's dtype (or writes ``out``, contiguous). ``splits`` forces the key slices per
    (sequence, head) (default: num_splits()). Accumulates in fp32; capturable in a CUDA graph. ``pdl=True``:
    programmatic dependent launch where the GPU supports it (the tuned path: tuned_gemv.PDL_NOTES).
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
        out = torch.empty(*out_shape, dtype=q.dtype, device=q.device)
    if split is None:                      # B = 0 or H = 0
        return out
    if part_shapes is not None:
        o_part = torch.empty(*part_shapes[0], dtype=torch.float32, device=q.device)
        l_part = torch.empty(*part_shapes[1], dtype=torch.float32, device=q.device)
    else:
        o_part = l_part = out          # unused
    h = out_shape[1]
    split(q, k_cache, v_cache, lengths, out, o_part, l_part, q.stride(0), q.stride(1), k_cache.stride(0),
          k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), out.stride(0),
          out.stride(1), h, LOG2E / math.sqrt(out_shape[2]))
    if combine is not None:
        combine(o_part, l_part, out, out.stride(0), out.stride(1), h)
    return out


#: The calls per key (the tensors' metadata and the options): shapes and the kernels' prepared launches, made
#: by _checked_call on a key's first call and looked up after that (lecture 3, "Host overhead").
_CALLS: dict[tuple, tuple] = {}


def _checked_call(q, k_cache, v_cache, lengths, splits, out, pdl) -> tuple:
    """The checks of a call (a clear error for a bad input) and its decisions: (out's shape, the partial
    results' shapes or None, the split kernel's prepared launch, the combine's or None: common.launch.Prepared)."""
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
    if k_cache.shape[0] != b or k_cache.shape[1] != h or k_cache.shape[3] != d:
        raise ValueError(f"k_cache: expected [B={b}, H={h}, S_max, d={d}] to match q {tuple(q.shape)}, "
                         f"got {tuple(k_cache.shape)}")
    if lengths.shape[0] != b:
        raise ValueError(f"lengths: expected one length per sequence ({b},), got {tuple(lengths.shape)}")
    if not 1 <= d <= MAX_HEAD_DIM:
        raise ValueError(f"head dim d={d} is not supported; expected 1 <= d <= {MAX_HEAD_DIM}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(-1) != 1:
            raise ValueError(f"{name}: the last dim must be contiguous (stride 1), got strides {t.stride()}")
    if out is not None:
        check_tensor(out, "out", dtypes=(q.dtype,), contiguous=True)
        if tuple(out.shape) != (b, h, d):
            raise ValueError(f"out: expected shape {(b, h, d)}, got {tuple(out.shape)}")
    if b == 0 or h == 0:
        return (b, h, d), None, None, None
    n = splits if splits is not None else num_splits(b * h, k_cache.shape[2])
    if n < 1:
        raise ValueError(f"splits: expected >= 1, got {n}")
    use_pdl = bool(pdl) and pdl_supported(q.device)
    launch = dict(launch_pdl=True) if use_pdl else {}
    split_kw = dict(NUM_SPLITS=n, HEAD_DIM=d, BLOCK_N=BLOCK_N, USE_PDL=use_pdl, BLOCK_D=next_power_of_2(d),
                    num_warps=split_warps(d), PREFETCH=prefetch_keys(k_cache) if use_pdl else 0,
                    LINE=128 // q.dtype.itemsize, **launch)
    split = fast(_decode_split).prepare((n, b * h), **split_kw)
    if n == 1:
        return (b, h, d), None, split, None
    combine = fast(_decode_combine).prepare((b * h,), NUM_SPLITS=n, SPLITS_P2=next_power_of_2(n), HEAD_DIM=d,
                                            USE_PDL=use_pdl, BLOCK_D=next_power_of_2(d), num_warps=1, **launch)
    return (b, h, d), ((b * h, n, d), (b * h, n)), split, combine
