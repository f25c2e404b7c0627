"""Stage 7b: FlashAttention-2 in Triton, forward and backward.

Four kernels, each one numbered step of the recipe (same conventions as stage 7a,
flash_torch.py: scale 1/sqrt(d), bottom-right causal mask, L = row logsumexp saved):

  1. _attn_fwd        one program per (query tile, batch·head). Online softmax in
                      fp32 in the exp2 domain; key tiles wholly above the causal
                      diagonal are never visited; tiles on the diagonal (and the
                      ragged last key tile) are masked, the others run mask-free.
  2. _attn_bwd_delta  D = rowsum(dO ∘ O), one fp32 per query row.
  3. _attn_bwd_dkdv   one program per (key tile, batch·head): walks the query tiles
                      that see its keys, recomputes Pᵀ = exp(K Qᵀ·scale - L) and
                      accumulates dV = Pᵀ dO and dK = dSᵀ Q in registers.
  4. _attn_bwd_dq     one program per (query tile, batch·head): walks the key tiles,
                      recomputes P and accumulates dQ = dS K in registers.

dQ gets its own kernel instead of atomics: a dK/dV program owns its key tile, but
every one of them contributes to every dQ row, so adding into dQ from there needs
fp32 atomics (a buffer, a cast pass, and a nondeterministic sum). Kernel 4 pays two
extra matmuls per tile (it recomputes S and dP) and gets exclusive, deterministic
writes. See the handout (README.md) for the arithmetic.

    python -m pytest tests/test_a07_flash_attention.py -k triton    # CPU: interpreter; GPU: also larger sizes
    python -m common.course.bench a07                 # H100: TFLOP/s vs SDPA (--impl solutions: the reference)

Block sizes, autotuning and the fallback for GPUs with less shared memory: flash_configs.py (given).
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from common import TRITON_INTERPRET
from common.course import native
from common.checks import FLOAT_DTYPES, check_same, check_tensor, meta
from common.launch import cdiv, fast
from common.timing import compile_together
from common.triton_helpers import dim_mask

from .flash_configs import (CONFIGS, DKDV_TUNE, DQ_TUNE, FWD_TUNE, HALF_D128, LaunchOptions, _kernel,  # noqa: F401
                            _launch, _options, _smaller, _tuned, launch_options, smaller_configs)

#: Head dims of the backward kernels (and of the tables' measured configs)
HEAD_DIMS = (16, 32, 64, 128)
#: The forward takes any head dim up to this, padded to a power of two (>= 16) with masks
MAX_FWD_HEAD_DIM = 256
LOG2E = 1.4426950408889634


# =============================================================================== kernels
@triton.jit
def _attn_fwd(Q, K, V, O, LSE,
              sqz, sqh, sqm, sqd, skz, skh, skn, skd, svz, svh, svn, svd, soz, soh, som, sod,
              H, N_Q, N_K, qk_scale,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_D: tl.constexpr):
    """O[zh, tile] and LSE[zh, tile] for one query tile. qk_scale = log2(e)/sqrt(d). The head dim
    HEAD_DIM is padded to BLOCK_D (a power of two, >= 16): columns d >= HEAD_DIM are masked."""
    # TODO(a07): kernel 1 (forward). Program (pid_m, zh): query rows m0 = pid_m·BLOCK_M ..,
    #   batch z = zh // H, head h = zh % H (offset the pointers with the strides).
    #   0. Head dims 0..BLOCK_D (a power of two), d_ok = dim_mask(HEAD_DIM, BLOCK_D) (all True when HEAD_DIM
    #      is one): AND it into every load's and store's mask (other=0: the padded columns add 0 to q·kᵀ).
    #   1. Load the q tile (rows >= N_Q masked to 0). m_i = -inf, l_i = 0, acc = 0, all fp32.
    #   2. Key tiles [0, n_full): no mask. [n_full, hi): the causal diagonal band (query i sees
    #      keys j <= i + N_K - N_Q) and the ragged last tile, masked to -inf. Tiles past hi: skipped.
    #      Per tile: s = tl.dot(q, kᵀ)·qk_scale (log2 units); m_new = max(m_i, rowmax s);
    #      p = exp2(s - m_new); alpha = exp2(m_i - m_new); l_i = l_i·alpha + rowsum p;
    #      acc = tl.dot(p.to(v.dtype), v, acc·alpha); m_i = m_new.
    #      (A row with every key masked so far has m_new = -inf: subtract 0 instead, never NaN.)
    #   3. O = acc / l_i; LSE = (m_i + log2 l_i)·ln 2 (natural log); rows with no key: O = 0, LSE = -inf.
    pass


@triton.jit
def _attn_bwd_delta(O, DO, DELTA, soz, soh, som, sod, sdz, sdh, sdm, sdd, H, N_Q,
                    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """DELTA[zh, m] = sum_d O[zh, m, d] * dO[zh, m, d] in fp32."""
    # TODO(a07): kernel 2. Program (pid_m, zh): DELTA[zh, rows] = rowsum(O ∘ dO) in fp32.
    pass


@triton.jit
def _attn_bwd_dkdv(Q, K, V, DO, LSE, DELTA, DK, DV,
                   sqz, sqh, sqm, sqd, skz, skh, skn, skd, svz, svh, svn, svd, sdz, sdh, sdm, sdd,
                   sgz, sgh, sgn, H, N_Q, N_K, sm_scale,
                   HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """DK, DV ([Z, H, N_K, HEAD_DIM], one layout: strides sgz, sgh, sgn, 1) for one key tile; loops over
    query tiles."""
    # TODO(a07): kernel 3 (dK, dV). Program (pid_n, zh) owns keys n0 = pid_n·BLOCK_N ..: load k, v once,
    #   dk = dv = 0 (fp32). Loop over the query tiles that see these keys (shift = N_K - N_Q; causal:
    #   start at row n0 - shift, mask the band up to row n0 + BLOCK_N - 1 - shift, then no mask).
    #   Per query tile (load q, dO, LSE, DELTA):
    #     pᵀ = exp2(k qᵀ·sm_scale·log2e - LSE·log2e)   (0 where masked; padding rows: LSE = +inf)
    #     dv += pᵀ dO;  dpᵀ = v dOᵀ;  dsᵀ = pᵀ ∘ (dpᵀ - DELTA);  dk += dsᵀ q
    #   Store dk·sm_scale and dv: element (z, h, n, j) of DK and DV at z·sgz + h·sgh + n·sgn + j.
    pass


@triton.jit
def _attn_bwd_dq(Q, K, V, DO, LSE, DELTA, DQ,
                 sqz, sqh, sqm, sqd, skz, skh, skn, skd, svz, svh, svn, svd, sdz, sdh, sdm, sdd,
                 sgz, sgh, sgm, H, N_Q, N_K, sm_scale,
                 HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """DQ ([Z, H, N_Q, HEAD_DIM], strides sgz, sgh, sgm, 1) for one query tile; loops over key tiles."""
    # TODO(a07): kernel 4 (dQ). Program (pid_m, zh) owns query rows m0 = pid_m·BLOCK_M ..: load q, dO,
    #   LSE, DELTA once, dq = 0 (fp32). Loop over key tiles as in kernel 1 (unmasked, then the band):
    #     p = exp2(q kᵀ·sm_scale·log2e - LSE·log2e) (0 where masked); dp = dO vᵀ;
    #     ds = p ∘ (dp - DELTA); dq += ds k
    #   Store dq·sm_scale: element (z, h, m, j) of DQ at z·sgz + h·sgh + m·sgm + j.
    pass


# =============================================================================== launch (given)
_compiled_backward: set[tuple] = set()   # kinds of backward call whose kernels compile_together compiled


def fwd_block_d(d: int) -> int:
    """The forward's padded head dim: d rounded up to a power of two, at least 16 (tl.dot's minimum)."""
    return max(16, triton.next_power_of_2(d))


def check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backward: bool = True) -> None:
    """What the Triton kernels accept (given code): the forward any head dim up to MAX_FWD_HEAD_DIM,
    the backward (``backward=True``) those of HEAD_DIMS."""
    check_tensor(q, "q", dtypes=FLOAT_DTYPES, min_ndim=2)
    check_tensor(k, "k", dtypes=FLOAT_DTYPES, min_ndim=2)
    check_tensor(v, "v", dtypes=FLOAT_DTYPES, min_ndim=2)
    check_same(q, k, "q, k")
    check_same(q, v, "q, v")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape [..., Nk, d], got {tuple(k.shape)} and {tuple(v.shape)}")
    if q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q [..., Nq, d] and k [..., Nk, d] must share leading dims and d, "
                         f"got {tuple(q.shape)} and {tuple(k.shape)}")
    d = q.shape[-1]
    if backward and d not in HEAD_DIMS:
        raise ValueError(f"head dim d={d} is not supported by the backward kernels; expected one of {HEAD_DIMS} "
                         f"(the forward alone, attention_forward, takes any d up to {MAX_FWD_HEAD_DIM})")
    if not 1 <= d <= MAX_FWD_HEAD_DIM:
        raise ValueError(f"head dim d={d} is not supported; expected 1 <= d <= {MAX_FWD_HEAD_DIM}")
    if q.shape[-2] == 0 or k.shape[-2] == 0:
        raise ValueError(f"empty sequence: q {tuple(q.shape)}, k {tuple(k.shape)}")


def _as4d(x: torch.Tensor) -> torch.Tensor:
    """[..., N, d] -> [Z, H, N, d] as a view when possible (strides kept: head-strided is fine)."""
    if x.dim() == 2:
        return x[None, None]
    if x.dim() == 3:
        return x[None]
    if x.dim() == 4:
        return x
    return x.reshape(-1, *x.shape[-3:])


def _new(shape, like: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    dtype = dtype or like.dtype
    if _options[-1].poison:
        return torch.full(shape, float("nan"), dtype=dtype, device=like.device)
    return torch.empty(shape, dtype=dtype, device=like.device)


#: Launch plans per key (the inputs' metadata and the call's options), made on a call's first use of a key
#: (the checks, the configs, the grids, the integer arguments) and looked up after that: an eager call
#: pays a dict lookup for them (lecture 3, "Host overhead"). Only under the default launch options.
_FWD_PLANS: dict[tuple, tuple] = {}
_BWD_PLANS: dict[tuple, tuple] = {}
_DEFAULT = _options[0]


def _forward_plan(q, k, v, is_causal: bool, allow_tf32: bool) -> tuple:
    check_inputs(q, k, v, backward=False)
    q4, k4, v4 = _as4d(q), _as4d(k), _as4d(v)
    Z, H, nq, d = q4.shape
    nk = k4.shape[2]
    o4 = _as4d(torch.empty(q.shape, dtype=q.dtype, device="meta"))   # the layout of the output
    kernel, cfg, fallback = _kernel(_attn_fwd, "fwd", d, nq, q.dtype)
    grid = lambda meta: (cdiv(nq, meta["BLOCK_M"]), Z * H)  # noqa: E731
    if q.dtype == torch.float32 and not allow_tf32 and not TRITON_INTERPRET:
        # A compile option: with TF32 not allowed, tl.dot's default precision for fp32 is IEEE
        # (and the option is part of the compiled kernel's cache key). The interpreter is IEEE anyway.
        cfg["allowed_dot_input_precisions"] = ("ieee",)
    ints = (*q4.stride(), *k4.stride(), *v4.stride(), *o4.stride(), H, nq, nk, LOG2E / math.sqrt(d))
    kwargs = dict(HEAD_DIM=d, CAUSAL=bool(is_causal), BLOCK_D=fwd_block_d(d), **cfg)
    return kernel, grid, ints, kwargs, fallback, tuple(q.shape[:-1]), fast(kernel).prepare(grid, **kwargs)


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      is_causal: bool, *, allow_tf32: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(O [..., Nq, d] in q's dtype, L [..., Nq] fp32) with kernel 1.

    ``allow_tf32=False`` compiles kernel 1 with IEEE fp32 dots for fp32 inputs (Triton's
    default for an fp32 ``tl.dot`` on a GPU is TF32, ~3e-4 relative): stage 8 uses it to
    match transformers' fp32 GPT-2 token for token. No effect on 16-bit inputs.
    """
    if _options[-1] is _DEFAULT:
        try:
            key = (meta(q), meta(k), meta(v), bool(is_causal), allow_tf32)
            plan = _FWD_PLANS.get(key)
        except (AttributeError, TypeError):     # not tensors: _forward_plan's checks say what is wrong
            key = plan = None
        if plan is None:
            plan = _forward_plan(q, k, v, is_causal, allow_tf32)
            if key is not None:
                _FWD_PLANS[key] = plan
        kernel, grid, ints, kwargs, fallback, lse_shape, prepared = plan
        # the default options: no poison, so plain allocations (not torch.empty(q.shape, ...): a torch.Size
        # argument costs the parser more than the allocation itself; lecture 3, "Host overhead")
        o = torch.empty_like(q) if q.is_contiguous() else torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = q.new_empty(lse_shape, dtype=torch.float32)
        if q.dim() == 4:                        # [Z, H, N, d] already: no view objects to make
            _launch(kernel, grid, (q, k, v, o, lse, *ints), kwargs, fallback, prepared)
            return o, lse
        _launch(kernel, grid, (_as4d(q), _as4d(k), _as4d(v), _as4d(o), lse, *ints), kwargs, fallback, prepared)
        return o, lse
    else:
        kernel, grid, ints, kwargs, fallback, _, _ = _forward_plan(q, k, v, is_causal, allow_tf32)
        o = _new(q.shape, q)
        lse = _new(q.shape[:-1], q, torch.float32)
    _launch(kernel, grid, (_as4d(q), _as4d(k), _as4d(v), _as4d(o), lse, *ints), kwargs, fallback)
    return o, lse


def grad_strides(x: torch.Tensor) -> tuple[int, ...] | None:
    """Strides for x's gradient: dense, in x's own memory order, when x is 4-D [Z, H, N, d] with d
    contiguous; None (a contiguous gradient) otherwise. GPT-2's q, k, v are head views of one
    [B, S, 3·H·d] tensor, in [B, S, H, d] order: a gradient in that order needs no copy when autograd
    takes it back through the views (a contiguous [B, H, S, d] one would: a transpose-and-copy per
    tensor, about a fifth of a training step's attention time at GPT-2 small's shape)."""
    if x.dim() != 4 or x.stride(3) != 1:
        return None
    order = sorted(range(3), key=lambda i: -x.stride(i))     # the outer dims, outermost first
    strides, step = [0, 0, 0, 1], x.shape[3]
    for i in reversed(order):
        strides[i] = step
        step *= x.shape[i]
    return tuple(strides)


def _grad(x: torch.Tensor, strides: tuple[int, ...] | None) -> torch.Tensor:
    if strides is None:
        return _new(x.shape, x)
    g = torch.empty_strided(x.shape, strides, dtype=x.dtype, device=x.device)
    return g.fill_(float("nan")) if _options[-1].poison else g


def _backward_plan(q, k, v, o, do, is_causal: bool) -> tuple:
    q4, k4, v4, o4, do4 = _as4d(q), _as4d(k), _as4d(v), _as4d(o), _as4d(do)
    Z, H, nq, d = q4.shape
    nk = k4.shape[2]
    sm_scale = 1.0 / math.sqrt(d)
    gq, gk = grad_strides(q), grad_strides(k)        # the layouts of dQ and of dK, dV
    ints = (*q4.stride(), *k4.stride(), *v4.stride(), *do4.stride())
    rest = (H, nq, nk, sm_scale)
    # a contiguous gradient's strides as [Z, H, N, d] (its shape as q's, leading dims folded into Z)
    gq4 = gq[:3] if gq is not None else (H * nq * d, nq * d, d)
    gk4 = gk[:3] if gk is not None else (H * nk * d, nk * d, d)
    (dkdv, dkdv_cfg, dkdv_fallback), (dq_kernel, dq_cfg, dq_fallback) = (
        _kernel(_attn_bwd_dkdv, "dkdv", d, nq, q.dtype), _kernel(_attn_bwd_dq, "dq", d, nq, q.dtype))
    # (kernel, grid, integer arguments, kwargs, may fall back): delta, dK/dV, dQ
    launches = ((_attn_bwd_delta, (cdiv(nq, 64), Z * H), (*o4.stride(), *do4.stride(), H, nq),
                 dict(HEAD_DIM=d, BLOCK_M=64), False),
                (dkdv, lambda meta: (cdiv(nk, meta["BLOCK_N"]), Z * H), (*ints, *gk4, *rest),
                 dict(HEAD_DIM=d, CAUSAL=bool(is_causal), **dkdv_cfg), dkdv_fallback),
                (dq_kernel, lambda meta: (cdiv(nq, meta["BLOCK_M"]), Z * H), (*ints, *gq4, *rest),
                 dict(HEAD_DIM=d, CAUSAL=bool(is_causal), **dq_cfg), dq_fallback))
    prepared = tuple(fast(kernel).prepare(grid, **kwargs) for kernel, grid, _, kwargs, _ in launches)
    # then the gradients' strides (None: contiguous), and q's, k's and delta's shapes as plain tuples
    return (*launches, gq, gk, tuple(q.shape), tuple(k.shape), tuple(q.shape[:-1]), prepared)


def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
                       do: torch.Tensor, is_causal: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dQ, dK, dV) with kernels 2, 3 and 4, from the saved O and L (head dims of HEAD_DIMS only)."""
    if q.shape[-1] not in HEAD_DIMS:
        raise ValueError(f"head dim d={q.shape[-1]} is not supported by the backward kernels; expected one of {HEAD_DIMS}")
    default = _options[-1] is _DEFAULT
    key = (meta(q), meta(k), meta(v), meta(o), meta(do), bool(is_causal))
    plan = _BWD_PLANS.get(key) if default else None
    fresh = plan is None
    if fresh:
        plan = _backward_plan(q, k, v, o, do, is_causal)
        if default:
            _BWD_PLANS[key] = plan
    (delta_k, delta_grid, delta_ints, delta_kw, _), (dkdv, dkdv_grid, dkdv_ints, dkdv_kw, dkdv_fb), \
        (dq_k, dq_grid, dq_ints, dq_kw, dq_fb), gq, gk, q_shape, k_shape, delta_shape, prepared = plan
    if q.dim() == 4:                   # [Z, H, N, d] already (then all five are): no view objects to make
        q4, k4, v4, o4, do4 = q, k, v, o, do
    else:
        q4, k4, v4, o4, do4 = _as4d(q), _as4d(k), _as4d(v), _as4d(o), _as4d(do)
    if default:    # no poison: plain allocations, their shapes as plain tuples (a torch.Size costs the parser)
        delta = q.new_empty(delta_shape, dtype=torch.float32)
        # a gradient in its tensor's own layout (q dense: the usual case) is an empty_like, cheaper to
        # parse than empty_strided with its shape and strides
        if gq is None:
            dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        else:
            dq = torch.empty_like(q) if q.stride() == gq else \
                torch.empty_strided(q_shape, gq, dtype=q.dtype, device=q.device)
        if gk is None:
            dk, dv = (torch.empty_like(k, memory_format=torch.contiguous_format),
                      torch.empty_like(v, memory_format=torch.contiguous_format))
        elif k.stride() == gk and v.stride() == gk:
            dk, dv = torch.empty_like(k), torch.empty_like(v)
        else:                                                              # dV in dK's layout
            dev = k.device
            dk, dv = (torch.empty_strided(k_shape, gk, dtype=k.dtype, device=dev),
                      torch.empty_strided(k_shape, gk, dtype=v.dtype, device=dev))
    else:
        delta = _new(q.shape[:-1], q, torch.float32)
        dq, dk, dv = _grad(q, gq), _grad(k, gk), _grad(v, gk)     # dV in dK's layout: one set of strides
    launches = [(delta_k, delta_grid, (o4, do4, delta, *delta_ints), delta_kw),
                (dkdv, dkdv_grid, (q4, k4, v4, do4, lse, delta, dk, dv, *dkdv_ints), dkdv_kw),
                (dq_k, dq_grid, (q4, k4, v4, do4, lse, delta, dq, *dq_ints), dq_kw)]
    # The first backward of a kind compiles its three kernels side by side (a second or more each on
    # a Hopper); the key is coarse: a kind it misses compiles one kernel after another, as without it.
    # (Asked once per plan: a known plan was compiled by its first call.)
    if fresh and not _options[-1].tune:
        kind = (q.dtype, q4.shape[-1], bool(is_causal), str(_options[-1]), q4.shape[2] % 16, k4.shape[2] % 16,
                tuple(st % 16 for t in (q4, k4, v4, o4, do4) for st in t.stride()))
        if kind not in _compiled_backward:
            _compiled_backward.add(kind)
            compile_together(launches)
    for (kernel, grid, kernel_args, kwargs), fallback, prep in zip(launches, (False, dkdv_fb, dq_fb),
                                                                   prepared if default else (None,) * 3):
        _launch(kernel, grid, kernel_args, kwargs, fallback, prep)
    if default and q.dim() == 4 and key[:3] + key[5:] not in _NATIVE:
        _native_plan(key[:3] + key[5:], q, k, v, o, lse, do, (delta, dq, dk, dv), launches, prepared)
    return dq, dk, dv


#: Native plans (common.course.native) by forward key (meta(q), meta(k), meta(v), is_causal): once a key's backward
#: has run from Python (every kernel compiled), its forward and backward replay from C++, so a training step
#: runs no Python in the backward pass (lecture 3, "Host overhead"). -1: a key that cannot have one.
_NATIVE: dict[tuple, int] = {}


def _native_plan(key, q, k, v, o, lse, do, allocated, launches, prepared) -> None:
    m = native.ext()                     # the first call starts the extension's build in the background
    fwd = _FWD_PLANS.get((*key, True))
    if m is None or fwd is None:
        return                           # not built yet (or never: no GPU): ask again next time
    if do.shape != o.shape or do.stride() != o.stride() or do.dtype != o.dtype or do.data_ptr() % 16:
        return                           # a gradient in another layout than O's: ask again next time
    fslots, bslots = [q, k, v, o, lse], [q, k, v, o, lse, do, *allocated]
    if len(set(map(id, bslots))) < len(bslots):
        return                           # one tensor passed twice (self-attention on x, x, x): not a plan for others
    if o.stride() != (q.stride() if q.is_contiguous() else o.new_empty(o.shape).stride()) or not lse.is_contiguous():
        return                           # O or L not as attention_forward makes them (a direct backward call)
    _NATIVE[key] = -1                    # unless recorded below (a launch fallen back to smaller tiles is not)
    f = native.record(fwd[6], (q, k, v, o, lse, *fwd[2]), fslots)
    b = [native.record(p, args, bslots) for p, (_, _, args, _) in zip(prepared, launches)]
    if f is None or None in b:
        return
    pid = native.add_plan(([native.alloc(o), native.alloc(lse)], [f]), 3, [0, 1, 2, 3, 4], (q, k, v),
                          ([native.alloc(t) for t in allocated], b), do, [7, 8, 9], 3)
    if pid is not None:
        _NATIVE[key] = pid


class FlashAttentionTriton(torch.autograd.Function):
    """``FlashAttentionTriton.apply(q, k, v, is_causal)`` -> O; saves (q, k, v, O, L) for backward."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
        # attention_forward checks the inputs (once per key: its plan); a backward also needs a head dim of
        # HEAD_DIMS, asked here so that the error comes now, not in the backward pass
        if not (isinstance(q, torch.Tensor) and q.dim() >= 2 and q.shape[-1] in HEAD_DIMS) \
                and any(ctx.needs_input_grad[:3]):
            check_inputs(q, k, v, backward=True)
        o, lse = attention_forward(q, k, v, bool(is_causal))
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = bool(is_causal)
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = attention_backward(q, k, v, o, lse, do, ctx.is_causal)
        return dq, dk, dv, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d)) v with the Triton kernels, differentiable.

    A call that records no gradient (no input requires one, or grad mode is off) runs the forward
    kernel directly: ``autograd.Function.apply`` costs about as much host time as the launch itself
    (lecture 3, "Host overhead"), and there is nothing to save for a backward.
    """
    try:
        grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    except AttributeError:      # not tensors: attention_forward's checks say what is wrong
        grad = False
    if grad:
        if _NATIVE:        # this key's native plan, past its first backward (common.course.native; lecture 3, §7)
            try:
                key = (meta(q), meta(k), meta(v), bool(is_causal))
                pid = _NATIVE.get(key, -1)
            except (AttributeError, TypeError):
                pid = -1
            if pid >= 0 and _options[-1] is _DEFAULT and native.eager_ok(q, k, v):
                try:
                    o = native._module.apply(pid, q, k, v)
                except RuntimeError as e:   # the driver refused the launch here: this key keeps the Python path
                    if "native autograd" not in str(e):
                        raise               # anything else (out of memory) is the caller's to see
                    _NATIVE[key], o = -1, None
                if o is not None:
                    return o
        return FlashAttentionTriton.apply(q, k, v, is_causal)
    return attention_forward(q, k, v, bool(is_causal))[0]
