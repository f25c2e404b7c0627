"""Assignment 9, kernel 2: rotary position embeddings (RoPE), in place on the fused QKV output.

    from assignments.a09_llama_inference.rope import apply_rope, rope_cache, rope_frequencies
    inv_freq = rope_frequencies(head_dim=64, theta=500000.0, scaling=config.rope_scaling)   # once
    cos, sin = rope_cache(inv_freq, max_pos=4096, device="cuda")                           # once
    apply_rope(qkv, cos, sin, start, n_head, n_kv_head)        # every layer: q and k rotated in place

GPT-2 adds a learned position vector to each token's embedding once, at the bottom of the model.
Llama instead ROTATES each query and key, in every layer, by an angle that grows with the token's
position. A head's d values are taken as d/2 pairs (x_i, x_{i+d/2}) (transformers' ``rotate_half``
layout: the first half of the head against the second, not neighbours), and pair i at position p is
turned by the angle ``p · inv_freq[i]``:

    x_i'       = x_i · cos(p·θ_i) − x_{i+d/2} · sin(p·θ_i)
    x_{i+d/2}' = x_{i+d/2} · cos(p·θ_i) + x_i · sin(p·θ_i)        θ_i = inv_freq[i] = theta^(−2i/d)

Why a rotation: a dot product of two vectors rotated by angles a and b depends only on b − a. So
``q(m)·k(n)``, the attention score of a query at position m and a key at position n, depends on
the content and on m − n alone: attention sees RELATIVE positions, with no table of positions to
learn and none to run out of. Each pair turns at its own speed, from θ_0 = 1 radian a token (a
wavelength of 6 tokens: fine, local order) down to about 1/theta (a wavelength of about 2π·theta
tokens: 63 000 at theta = 10 000, millions at Llama 3's 500 000: distant positions). Only q and k are
rotated; v carries content and is left as it is. Keys go into the KV cache already rotated, so
decoding rotates one new q and k per step.

Llama 3's frequency scaling (``rope_type="llama3"``) stretches the context a model was trained on
(``original_max_position_embeddings``, 8192) by ``factor`` (8, 32): frequencies whose wavelength is
longer than ``original / low_freq_factor`` are divided by the factor (positions far apart look
closer, as in training), those shorter than ``original / high_freq_factor`` are kept (local order
stays sharp), and those between are blended smoothly. It changes inv_freq only, computed once.

Qwen 3 also normalises each head's q and k vectors (an RMSNorm over the d values of one head,
weights ``q_norm`` and ``k_norm`` of [d]) before the rotation; the kernel does both in one pass.

``rope_frequencies`` and ``rope_cache`` are given (they must match transformers bit for bit, so
that generated tokens match); the kernel is yours.

Run: ``pytest tests/test_a09_llama_inference.py -k rope`` (CPU: the interpreter).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from common import pdl_supported
from common.checks import FLOAT_DTYPES, check_same, check_tensor, meta
from common.launch import fast, next_power_of_2
from common.triton_helpers import dim_mask


# ==================================================================== frequencies and the cos/sin cache (given)
def _get(scaling, name):
    """A field of a rope_scaling dict, or of a config object (transformers 5 keeps rope_parameters as a dict)."""
    return scaling[name] if isinstance(scaling, dict) else getattr(scaling, name)


def rope_frequencies(head_dim: int, theta: float, scaling=None) -> torch.Tensor:
    """The inverse frequencies ``inv_freq`` [head_dim // 2] (fp32, CPU) of transformers' rotary embedding.

    ``scaling``: None (or a dict whose ``rope_type`` is "default"): ``1 / theta^(2i / head_dim)``.
    ``{"rope_type": "llama3", "factor", "low_freq_factor", "high_freq_factor",
    "original_max_position_embeddings"}`` (a model config's ``rope_scaling`` / ``rope_parameters``): Llama 3's
    scaled frequencies. Computed with transformers' own operations in their order, so the values are bit for
    bit those of ``LlamaRotaryEmbedding.inv_freq``. Any other rope_type raises ValueError.
    """
    if isinstance(head_dim, bool) or not isinstance(head_dim, int) or head_dim < 2 or head_dim % 2:
        raise ValueError(f"head_dim: expected an even int >= 2, got {head_dim!r}")
    if not theta > 0:
        raise ValueError(f"theta: expected a positive base, got {theta!r}")
    rope_type = "default" if scaling is None else (_get(scaling, "rope_type") if (
        isinstance(scaling, dict) and "rope_type" in scaling) or hasattr(scaling, "rope_type") else
        _get(scaling, "type"))
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(dtype=torch.float) / head_dim))
    if rope_type == "default":
        return inv_freq
    if rope_type != "llama3":
        raise ValueError(f"rope_type {rope_type!r} is not supported: expected 'default' or 'llama3'")
    factor = _get(scaling, "factor")
    low_freq_factor = _get(scaling, "low_freq_factor")
    high_freq_factor = _get(scaling, "high_freq_factor")
    old_context_len = _get(scaling, "original_max_position_embeddings")
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rope_cache(inv_freq: torch.Tensor, max_pos: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), fp32 [max_pos, head_dim // 2] each on ``device``: row p holds cos(p·inv_freq) and
    sin(p·inv_freq), computed as transformers does (fp32 positions times fp32 inv_freq, then cos and sin).
    Made once per model; ``apply_rope`` reads row ``start[b] + t`` for token t of sequence b."""
    if not isinstance(inv_freq, torch.Tensor) or inv_freq.dim() != 1:
        raise ValueError(f"inv_freq: expected a 1-dim tensor, got {type(inv_freq).__name__}")
    if isinstance(max_pos, bool) or not isinstance(max_pos, int) or max_pos < 1:
        raise ValueError(f"max_pos: expected an int >= 1, got {max_pos!r}")
    freqs = torch.arange(max_pos, device=device).float()[:, None] * inv_freq.to(device=device, dtype=torch.float)
    return freqs.cos().contiguous(), freqs.sin().contiguous()


# ==================================================================== the kernel
@triton.jit
def _rope_kernel(QKV, COS, SIN, START, QW, KW, T, N_POS, s_b, s_t, s_cos, eps,
                 N_HEAD: tl.constexpr, N_KV_HEAD: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr,
                 BLOCK_HALF: tl.constexpr, HAS_Q_NORM: tl.constexpr, HAS_K_NORM: tl.constexpr,
                 USE_PDL: tl.constexpr):
    """Program (b·T + t): token t of sequence b, at position p = START[b] + t. Its QKV row (QKV + b·s_b +
    t·s_t, columns contiguous) holds N_HEAD q heads, then N_KV_HEAD k heads (then the v heads, untouched),
    each of 2·HALF values. For every q and k head: (optionally) RMSNorm of the head's 2·HALF values with
    weights QW (q heads) or KW (k heads), then the rotation of each pair (i, i + HALF) by cos/sin row p
    (COS + p·s_cos, HALF values); in fp32, stored once in QKV's dtype. Positions >= N_POS are not written."""
    if USE_PDL:   # given: programmatic dependent launch (tuned_gemv.PDL_NOTES): wait for the previous kernel,
        tl.extra.cuda.gdc_wait()                   # then let the next one start launching
        tl.extra.cuda.gdc_launch_dependents()
    # TODO(a09): kernel 2 (RoPE, with Qwen 3's per-head q/k RMSNorm). Program `row` = b * T + t:
    #   pos = START[b] + t. Heads hs = tl.arange(0, BLOCK_H) (the first N_HEAD are q heads, the next
    #   N_KV_HEAD k heads: mask hs < N_HEAD + N_KV_HEAD) against i = tl.arange(0, BLOCK_HALF) (masked
    #   with dim_mask(HALF, BLOCK_HALF)). Head h's first half is at columns h * 2 * HALF + i of the row,
    #   its second half HALF further: load both, x1 and x2, in fp32 (the k heads follow the q heads,
    #   so the same formula covers both). Write nothing where pos >= N_POS.
    #   1. Where HAS_Q_NORM (q heads) / HAS_K_NORM (k heads): RMSNorm each head over its 2·HALF values
    #      as kernel 1 does: ms = (sum(x1²) + sum(x2²)) / (2·HALF); x * rsqrt(ms + eps) rounded to
    #      QKV's dtype, times the weight (QW for q heads, KW for k heads: w[i] for x1, w[HALF + i] for
    #      x2), rounded again, back to fp32. Heads without a norm keep x1, x2 as they are.
    #   2. c, s = COS[pos, i], SIN[pos, i] (row pos at COS + pos * s_cos); store, in QKV's dtype,
    #      x1 * c - x2 * s to the first half and x2 * c + x1 * s to the second.
    #   Use int64 for the row offset (b * s_b + t * s_t can pass 2^31 in a large batch).
    pass


# ==================================================================== launch (given)
#: The calls per key (the tensors' metadata, the head counts and pdl): (T, the prepared launch), made by
#: _checked_call on a key's first call and looked up after that (lecture 3, "Host overhead").
_CALLS: dict[tuple, tuple] = {}


def _checked_call(qkv, cos, sin, start, n_head, n_kv_head, q_norm, k_norm, pdl) -> tuple:
    """The checks of a call (a clear error for a bad input) and its decisions: (T, the prepared launch)."""
    check_tensor(qkv, "qkv", dtypes=FLOAT_DTYPES, ndim=3)
    for name, n in (("n_head", n_head), ("n_kv_head", n_kv_head)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name}: expected an int >= 1, got {n!r}")
    check_tensor(cos, "cos", dtypes=(torch.float32,), ndim=2, contiguous=True)
    check_tensor(sin, "sin", dtypes=(torch.float32,), ndim=2, contiguous=True)
    check_tensor(start, "start", dtypes=(torch.int32,), ndim=1)
    check_same(qkv, cos, "qkv, cos", dtype=False)
    check_same(qkv, start, "qkv, start", dtype=False)
    if sin.shape != cos.shape:
        raise ValueError(f"sin: expected cos's shape {tuple(cos.shape)}, got {tuple(sin.shape)}")
    b, t, width = qkv.shape
    half = cos.shape[1]
    d = 2 * half
    if width != (n_head + 2 * n_kv_head) * d:
        raise ValueError(f"qkv {tuple(qkv.shape)}: expected [B, T, (n_head + 2·n_kv_head)·d] = "
                         f"[B, T, {(n_head + 2 * n_kv_head) * d}] with n_head={n_head}, n_kv_head={n_kv_head} and "
                         f"d = 2·cos.shape[1] = {d}")
    if start.shape[0] != b:
        raise ValueError(f"start: expected shape ({b},), one position per sequence, got {tuple(start.shape)}")
    if qkv.stride(2) != 1:
        raise ValueError(f"qkv (strides {qkv.stride()}) must have a contiguous last dim")
    for name, w in (("q_norm", q_norm), ("k_norm", k_norm)):
        if w is not None:
            check_tensor(w, name, dtypes=(qkv.dtype, torch.float32), ndim=1, contiguous=True)
            check_same(qkv, w, f"qkv, {name}", dtype=False)
            if w.shape[0] != d:
                raise ValueError(f"{name}: expected shape ({d},), the head dim, got {tuple(w.shape)}")
    use_pdl = bool(pdl) and pdl_supported(qkv.device)
    block_h = next_power_of_2(n_head + n_kv_head)
    block_half = next_power_of_2(half)
    warps = 1 if block_h * block_half <= 256 else 2 if block_h * block_half <= 1024 else 4
    return t, fast(_rope_kernel).prepare(
        (b * t,), N_HEAD=n_head, N_KV_HEAD=n_kv_head, HALF=half, BLOCK_H=block_h, BLOCK_HALF=block_half,
        HAS_Q_NORM=q_norm is not None, HAS_K_NORM=k_norm is not None, USE_PDL=use_pdl, num_warps=warps,
        **(dict(launch_pdl=True) if use_pdl else {}))


def apply_rope(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, start: torch.Tensor, n_head: int,
               n_kv_head: int, *, q_norm: torch.Tensor | None = None, k_norm: torch.Tensor | None = None,
               eps: float = 1e-6, pdl: bool = False) -> None:
    """Rotate the q and k heads of ``qkv`` in place (one kernel launch); v is left untouched.

    qkv: [B, T, (n_head + 2·n_kv_head)·d], fp32/fp16/bf16, last dim contiguous, any row strides (a view of
    a wider buffer is fine): columns are the n_head q heads, the n_kv_head k heads, the n_kv_head v heads,
    d values each. cos, sin: fp32 [max_pos, d/2], contiguous (:func:`rope_cache`). start: int32 [B] on the
    device; token t of sequence b is at position ``start[b] + t`` (the engine keeps positions below max_pos;
    a token at or past it is left as it is). Pair (i, i + d/2) of a head turns by that position's angle
    (transformers' ``rotate_half`` convention), in fp32, rounded to qkv's dtype once.
    q_norm, k_norm: optional [d] RMSNorm weights (qkv's dtype or fp32; Qwen 3), applied to each q / k head
    as :func:`~.rmsnorm.rmsnorm` does (eps) BEFORE the rotation.
    ``pdl=True``: programmatic dependent launch where the GPU supports it (tuned_gemv.PDL_NOTES).
    """
    try:   # the call's key: everything its checks and decisions read (lecture 3, "Host overhead")
        key = (meta(qkv), meta(cos), meta(sin), meta(start), n_head, n_kv_head, meta(q_norm), meta(k_norm), bool(pdl))
        call = _CALLS.get(key)
    except (AttributeError, TypeError):   # not tensors: the checks say what is wrong
        key = call = None
    if call is None:
        call = _checked_call(qkv, cos, sin, start, n_head, n_kv_head, q_norm, k_norm, pdl)
        if key is not None:
            _CALLS[key] = call
    t, launch = call
    if qkv.numel() == 0:
        return
    launch(qkv, cos, sin, start, qkv if q_norm is None else q_norm, qkv if k_norm is None else k_norm, t,
           cos.shape[0], qkv.stride(0), qkv.stride(1), cos.stride(0), float(eps))
