"""The tuned path's decode GEMV (given; it REPLACES your gemv.py kernel where the engine runs tuned).

    from solutions.a08_gpt2_inference.tuned_gemv import gemv, fold_layernorm
    y = gemv(x, w, bias, "gelu_tanh", residual=h, ln_colsum=colsum, kv_cache=(kc, vc, start), pdl=True)

The same contract as gemv.py (your core kernel), plus what makes the reference's decode step fast:
per-GPU config rules (:func:`choose_config`), a tensor-core path for more than 2 rows, epilogues
that fuse the LayerNorm before it (:func:`fold_layernorm`, :func:`fold_pays`), the KV-cache write
after c_attn and the residual add, programmatic dependent launch (:data:`PDL_NOTES`), and a
prepared launch per call key (:func:`_checked_call`). Speeds: lectures/results/a08_gemv.md.

A decode step multiplies B rows (one new token per sequence) by every weight matrix: a
matrix-VECTOR product at batch 1, a GEMM of a few rows at batch 16. Each weight element is
read once for 2·M FLOPs, so the kernel's only job is to stream W through the SMs at the
memory bandwidth. A GEMM tile (stage 6) is the wrong shape for that:

* its BLOCK_M >= 16 rows hold 1 real row at batch 1 (the tensor cores compute 16 rows of
  which 15 are thrown away: harmless, the math is free here, but the tile's shape is
  chosen for FLOPs, not bytes);
* it parallelises over output tiles only: GPT-2 XL's 6400 -> 1600 projection has 1600
  outputs, 25 tiles of 64 columns on 132 SMs, each walking all 6400 rows of K alone. Most
  SMs idle and the few that work cannot keep enough bytes in flight.

This kernel parallelises over N *and* K (split-K) so that every SM streams several slabs of
the weight at once, and loads W along its contiguous dimension in wide vectors:

  program (pid_n, split): columns [pid_n·BLOCK_N, +BLOCK_N), rows k of [split·K_PER_SPLIT, +K_PER_SPLIT)
    1. acc = 0 (fp32). For each BLOCK_K slice of the split's rows: load the W tile (masked at K
       and N) and x (masked at M and K), and
         USE_DOT = False (M <= 2): acc[BLOCK_M, BLOCK_K, BLOCK_N] += x * w, W loaded as a
                 [1, BLOCK_K, BLOCK_N] tile so that the accumulator keeps the load's layout
                 (CUDA-core FMAs; summed over K once, after the loop: no reduction per slice);
         USE_DOT = True  (M > 2, BLOCK_M = 16): accᵀ[BLOCK_N, BLOCK_M] = tl.dot(wᵀ, xᵀ, accᵀ)
                 (tensor cores: 16 rows of FMAs per weight element would make the CUDA cores the bottleneck;
                 the operands swapped, "swap AB", so that 64 columns of W fill a Hopper wgmma's 64-row side
                 and x's few rows its narrow one; lectures/results/a08_gemv.md compares both sides).
    2. SPLIT_K == 1: y = act(acc + bias), one cast, one store.
       SPLIT_K  > 1: store the fp32 partial sums to PART[split, :M, cols]; the LAST program of
       the column block to arrive (a ticket counter, _last_to_arrive) adds the SPLIT_K partials in
       a fixed order (COMBINE of them per load, chunk after chunk), then bias and GELU, and stores
       y. The order is fixed, so the result is the same bits on every run (an atomic add of the
       partials into y would not be: fp32 addition is not associative). One kernel, no second
       "reduce" launch.

Configs (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) come from :func:`choose_config`, a rule
of the shapes (M, N, K, dtype, which dim of W is contiguous, the SM count): no autotuning, no
host sync, nothing that depends on values, so a decode step that calls it can be captured in a
CUDA graph. Programmatic dependent launch (``pdl=True``, sm_90+): see :data:`PDL_NOTES`.

Bandwidth on a GPU: ``python -m common.course.bench a08 --gemv``.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from common import TRITON_INTERPRET, pdl_supported
from common.checks import check_same, check_tensor, meta
from common.gpu import shared_memory_per_block
from common.launch import cdiv, fast, next_power_of_2
from common.triton_helpers import ticket_counters

from ..a06_matmul.matmul_triton import _gelu_tanh
from .kv_cache import check_caches

ACTIVATIONS = (None, "gelu_tanh")
#: Rows a call may have: a decode step's batch. More rows are a GEMM: use the a06 matmul.
MAX_ROWS = 16

PDL_NOTES = """Programmatic dependent launch (PDL), as Triton 3.6 does it (read from its source):

* ``kernel[grid](..., launch_pdl=True)``: launch_pdl is a compile option (CUDAOptions.launch_pdl,
  part of the kernel's cache key); the NVIDIA launcher then calls cuLaunchKernelEx with
  CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 1. The kernel may start before the
  previous kernel in the stream has finished: as soon as every program of that kernel has
  executed ``gdc_launch_dependents()`` (or exited).
* ``tl.extra.cuda.gdc_wait()`` (PTX griddepcontrol.wait) blocks until the previous kernel has
  completed and its memory is visible; ``gdc_launch_dependents()`` (griddepcontrol.launch_dependents)
  lets the next PDL kernel start launching. Both are no-ops in a kernel launched without PDL, and
  need sm_90+ (Hopper) to compile. Under the CPU interpreter they cannot run (inline PTX), so
  every kernel here takes them behind a constexpr USE_PDL that the launch sets only on sm_90+.
* Inside a CUDA graph: Triton does nothing special. Stream capture records the launch attribute,
  and the CUDA driver (12.3 and later) turns it into a programmatic dependency between the two
  kernel nodes, so a replayed graph overlaps the kernels the same way (Triton's own PDL tutorial,
  11-programmatic-dependent-launch.py, times it with do_bench_cudagraph). A kernel launched
  WITHOUT the attribute (PyTorch's own kernels in the step: the embedding gathers, lengths + 1,
  argmax) waits for everything before it, as usual.

The rule every PDL kernel of the course follows: the FIRST thing each program does is
``gdc_wait()``, unconditionally, then ``gdc_launch_dependents()``. Waiting first makes the chain
safe whatever a kernel reads or writes (a kernel that skipped the wait could finish before its
predecessor, and the next one's wait would no longer cover that predecessor); signalling right
after lets the next kernel's programs be scheduled and sit at their own wait while this one
runs, so its launch and ramp-up overlap this kernel's tail. The next kernel is admitted only
once every program of this one has started, so it never takes an SM slot this one needs.

Work before the wait: a program may do what depends on no earlier kernel before its gdc_wait. The
decode attention does (decode_attention._prefetch_cache): it asks L2 for its first cache rows, which
then arrive while c_attn's GEMV still runs. The same for the weights here, an L2 prefetch of each
program's slab before the wait (tried at whole slabs and at 256 or 1024 rows), made every step SLOWER
on the H100 (EXPERIMENTS.md); the prefetches compete with the running kernel's own weight stream and the lines they bring are
evicted by it before use. A weight is read once, at full speed, by the kernel that uses it."""


@triton.jit
def _fence_gpu():
    # fence.acq_rel.gpu: this thread's earlier writes are visible GPU-wide before its later ones.
    tl.inline_asm_elementwise("fence.acq_rel.gpu; // dummy $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _last_to_arrive(COUNT, SPLIT_K: tl.constexpr, FENCE: tl.constexpr):
    """Given. Every program of one column block calls this once, after storing its partial sums;
    it returns True in exactly one of them, the last to arrive, and by then every other
    program's partial sums are visible to it. It takes a ticket from the block's counter
    (an atomic add) and resets the counter to 0 for the next call. FENCE: on a GPU (not
    under the interpreter, which runs programs one after the other)."""
    if FENCE:
        _fence_gpu()                      # this thread's partial sums leave before the ticket is taken
    tl.debug_barrier()                    # ... and every other thread's of this program too
    ticket = tl.atomic_add(COUNT, 1, sem="acq_rel", scope="gpu")
    last = ticket == SPLIT_K - 1
    if last:
        tl.atomic_xchg(COUNT, 0, sem="relaxed", scope="gpu")    # the next call starts from 0
        if FENCE:
            _fence_gpu()                  # acquire side: the other programs' partials, not stale ones
    return last


@triton.jit
def _row_stats(X, M, K, stride_xm, stride_xk, eps, BLOCK_M: tl.constexpr, STAT_K: tl.constexpr):
    """Given. LayerNorm statistics of X's rows [BLOCK_M] (rows >= M: 0 and 1): the mean and 1/sqrt(var + eps)
    with the biased variance (divide by K, as torch.nn.LayerNorm), in fp32, in two passes over the row
    (STAT_K columns a load; the row was just read by the main loop, so these are cache hits)."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, STAT_K)
    m_ok = offs_m < M
    rows = X + offs_m[:, None].to(tl.int64) * stride_xm
    total = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, STAT_K):
        ok = m_ok[:, None] & (k0 + offs_k < K)[None, :]
        x = tl.load(rows + (k0 + offs_k)[None, :] * stride_xk, mask=ok, other=0.0)
        total += tl.sum(x.to(tl.float32), axis=1)
    mean = total / K
    sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, STAT_K):
        ok = m_ok[:, None] & (k0 + offs_k < K)[None, :]
        x = tl.load(rows + (k0 + offs_k)[None, :] * stride_xk, mask=ok, other=0.0).to(tl.float32)
        d = tl.where(ok, x - mean[:, None], 0.0)
        sq += tl.sum(d * d, axis=1)
    return mean, 1.0 / tl.sqrt(sq / K + eps)


@triton.jit
def _row_tile(X, M, K, stride_xm, stride_xk, BLOCK_M: tl.constexpr, STAT_K: tl.constexpr):
    """Given. X's rows [BLOCK_M, STAT_K] in one load (STAT_K >= K; masked to 0 past M and K), loaded before
    the main loop and reduced after it (_tile_stats), so the load's latency hides behind the weight stream."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, STAT_K)
    ok = (offs_m < M)[:, None] & (offs_k < K)[None, :]
    return tl.load(X + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :] * stride_xk, mask=ok, other=0.0)


@triton.jit
def _tile_stats(xrow, K, eps, STAT_K: tl.constexpr):
    """Given. (mean, rstd) [BLOCK_M] of a _row_tile: two passes over registers, biased variance."""
    x = xrow.to(tl.float32)
    mean = tl.sum(x, axis=1) / K
    d = tl.where((tl.arange(0, STAT_K) < K)[None, :], x - mean[:, None], 0.0)
    return mean, 1.0 / tl.sqrt(tl.sum(d * d, axis=1) / K + eps)


@triton.jit
def _row_rms(X, M, K, stride_xm, stride_xk, eps, BLOCK_M: tl.constexpr, STAT_K: tl.constexpr):
    """Given. RMSNorm statistic of X's rows [BLOCK_M] (rows >= M: 1/sqrt(eps)): rsqrt(mean(x²) + eps) in fp32,
    as transformers' LlamaRMSNorm (no mean subtracted), in one pass over the row, STAT_K columns a load."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, STAT_K)
    m_ok = offs_m < M
    rows = X + offs_m[:, None].to(tl.int64) * stride_xm
    sq = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for k0 in range(0, K, STAT_K):
        ok = m_ok[:, None] & (k0 + offs_k < K)[None, :]
        x = tl.load(rows + (k0 + offs_k)[None, :] * stride_xk, mask=ok, other=0.0).to(tl.float32)
        sq += tl.sum(x * x, axis=1)
    return 1.0 / tl.sqrt(sq / K + eps)


@triton.jit
def _tile_rms(xrow, K, eps):
    """Given. rsqrt(mean(x²) + eps) [BLOCK_M] of a _row_tile (masked to 0 past K: no mask needed)."""
    x = xrow.to(tl.float32)
    return 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / K + eps)


@triton.jit
def _silu_mul(g, u, DT: tl.constexpr):
    """Given. SwiGLU's silu(g)·u, rounded as transformers' LlamaMLP rounds it in the dtype DT: the two
    projections rounded to DT, silu computed in fp32 from the rounded gate and rounded, the product of the two
    rounded values rounded once more (by the caller's store). fp32: no rounding at all."""
    g = g.to(DT).to(tl.float32)
    u = u.to(DT).to(tl.float32)
    s = (g / (1.0 + tl.exp(-g))).to(DT).to(tl.float32)
    return s * u


@triton.jit
def _rope_store(acc, Y, TAB, KC, VC, START, M, N, stride_ym, s_cb, s_ch, s_cn, S_MAX, HEAD_DIM, KV_HEADS: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Given. The ROPE epilogue: acc holds a block of q|k|v [BLOCK_M, BLOCK_N] whose heads' columns W interleaves
    (interleave_rope: columns 2i, 2i + 1 of a head are its i and i + d/2). Each pair, rounded to Y's dtype (the
    projection as stored unfused), is rotated at the row's position START[m] (q and k heads; v's pass through):
    (x_i, x_{i+d/2}) -> (x_i·cos − x_{i+d/2}·sin, x_{i+d/2}·cos + x_i·sin) in fp32 with TAB [S_MAX, HEAD_DIM] =
    cos | sin (fp32), rounded once; stored to Y at the head's columns i and i + d/2 (q|k|v in the engine's order),
    and the k and v heads also to the caches KC / VC [B, KV_HEADS, S_MAX, HEAD_DIM] at position START[m]: what
    apply_rope and write_kv would do after the GEMV (the same arithmetic), without their kernels."""
    a, b = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N // 2, 2)))
    a = a.to(Y.dtype.element_ty).to(tl.float32)
    b = b.to(Y.dtype.element_ty).to(tl.float32)
    offs_m = tl.arange(0, BLOCK_M)
    col = 2 * (tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2))    # a's column in W's order
    head = col // HEAD_DIM
    half = HEAD_DIM // 2
    i = (col - head * HEAD_DIM) // 2
    m_ok = offs_m < M
    ok = m_ok[:, None] & (col < N)[None, :]
    pos = tl.load(START + offs_m, mask=m_ok, other=0)
    q_heads = N // HEAD_DIM - 2 * KV_HEADS
    rot = ok & (head < q_heads + KV_HEADS)[None, :] & (pos < S_MAX)[:, None]       # q and k heads, in the table
    tab = TAB + pos[:, None].to(tl.int64) * HEAD_DIM + i[None, :]
    c = tl.load(tab, mask=rot, other=1.0)
    sn = tl.load(tab + half, mask=rot, other=0.0)
    ya = (a * c - b * sn).to(Y.dtype.element_ty)
    yb = (b * c + a * sn).to(Y.dtype.element_ty)
    out = Y + offs_m[:, None] * stride_ym + (head * HEAD_DIM + i)[None, :]
    tl.store(out, ya, mask=ok)
    tl.store(out + half, yb, mask=ok)
    part = head - q_heads                                   # k heads: 0 .. KV_HEADS - 1, then v's
    is_k = (part >= 0) & (part < KV_HEADS)
    is_v = part >= KV_HEADS
    kvh = tl.where(is_v, part - KV_HEADS, part)
    in_cache = ok & (pos < S_MAX)[:, None]
    dst = (offs_m[:, None].to(tl.int64) * s_cb + kvh[None, :].to(tl.int64) * s_ch
           + pos[:, None].to(tl.int64) * s_cn + i[None, :])
    tl.store(KC + dst, ya, mask=in_cache & is_k[None, :])
    tl.store(KC + dst + half, yb, mask=in_cache & is_k[None, :])
    tl.store(VC + dst, ya, mask=in_cache & is_v[None, :])
    tl.store(VC + dst + half, yb, mask=in_cache & is_v[None, :])


@triton.jit
def _epilogue(acc, xrow, X, BIAS, COLSUM, R, Y, M, N, K, stride_xm, stride_xk, stride_rm, stride_ym, eps,
              KC, VC, START, s_cb, s_ch, s_cn, S_MAX, HEAD_DIM, KV_WRITE: tl.constexpr, HAS_BIAS: tl.constexpr,
              ACTIVATION: tl.constexpr, FAST_TANH: tl.constexpr,
              HAS_RESIDUAL: tl.constexpr, LN_FOLD: tl.constexpr, PRELOAD: tl.constexpr, ONE_TILE: tl.constexpr,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, STAT_K: tl.constexpr, RMS_FOLD: tl.constexpr,
              SWIGLU: tl.constexpr, ROPE: tl.constexpr, KV_HEADS: tl.constexpr):
    """Given. Column block pid_n's output from acc = X @ W[:, cols] (fp32 [BLOCK_M, BLOCK_N], all splits summed):

        LN_FOLD:       acc = rstd_m · (acc − mean_m · COLSUM[n])   (X's row statistics: of ``xrow``, the rows
                       loaded before the main loop, with PRELOAD; else loaded now, in one tile (ONE_TILE:
                       K <= STAT_K) or in STAT_K slices (_row_stats))
        HAS_BIAS:      acc += BIAS[n]
        ACTIVATION:    acc = gelu_tanh(acc)
        HAS_RESIDUAL:  acc = round(acc) + R[m, n]   (round: to Y's dtype, what h + proj(a) adds unfused)
        Y[m, n] = acc, cast to Y's dtype once;
        KV_WRITE:      Y is c_attn's [q | k | v] (C = N / 3 columns each, heads of HEAD_DIM inside): the k and v
                       columns of row m also go to the KV cache KC / VC [B, H, S_MAX, HEAD_DIM] (strides s_cb,
                       s_ch, s_cn, last dim contiguous) at position START[m], what write_kv would copy (the same
                       bits) without its own kernel; nothing at or past S_MAX.

    The LayerNorm fold (see fold_layernorm): with W = diag(γ)·W₀, COLSUM = Σ_k W[k, :] and BIAS = β·W₀ + b₀,
    rstd·(x·W − mean·COLSUM) + BIAS = ((x − mean)·rstd·γ + β)·W₀ + b₀ = LayerNorm(x)·W₀ + b₀: the LayerNorm
    kernel before the GEMV is gone, and only the statistics (two numbers a row) are computed here.

    Two more epilogues for Llama-family models (stage 9), off for GPT-2:
        RMS_FOLD:      acc = rstd_m · acc, rstd_m = rsqrt(mean(x_m²) + eps): RMSNorm folded into W = diag(γ)·W₀
                       (fold_rmsnorm; no mean, no column sums)
        SWIGLU:        W's columns interleave a gate and an up projection (interleave_gate_up: column 2f the
                       gate of feature f, 2f + 1 its up): Y[m, f] = silu(gate)·up (_silu_mul), N / 2 outputs,
                       BLOCK_N / 2 of them a program (N here: W's columns, 2F).
        ROPE:          Y is q|k|v of a grouped-query attention (KV_HEADS k and v heads after the q heads), W's
                       columns interleaved per head by interleave_rope; q and k rotated at START[m], k and v
                       written to the caches (_rope_store; COLSUM is then the rotation table cos | sin)."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N
    mask = (offs_m < M)[:, None] & n_ok[None, :]
    if LN_FOLD:
        if PRELOAD:
            mean, rstd = _tile_stats(xrow, K, eps, STAT_K)
        elif ONE_TILE:
            mean, rstd = _tile_stats(_row_tile(X, M, K, stride_xm, stride_xk, BLOCK_M, STAT_K), K, eps, STAT_K)
        else:
            mean, rstd = _row_stats(X, M, K, stride_xm, stride_xk, eps, BLOCK_M, STAT_K)
        colsum = tl.load(COLSUM + offs_n, mask=n_ok, other=0.0).to(tl.float32)
        acc = (acc - mean[:, None] * colsum[None, :]) * rstd[:, None]
    if RMS_FOLD:
        if PRELOAD:
            rstd = _tile_rms(xrow, K, eps)
        elif ONE_TILE:
            rstd = _tile_rms(_row_tile(X, M, K, stride_xm, stride_xk, BLOCK_M, STAT_K), K, eps)
        else:
            rstd = _row_rms(X, M, K, stride_xm, stride_xk, eps, BLOCK_M, STAT_K)
        acc = acc * rstd[:, None]
    if HAS_BIAS:
        acc += tl.load(BIAS + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if ACTIVATION == "gelu_tanh":
        acc = _gelu_tanh(acc, FAST_TANH)
    if HAS_RESIDUAL:   # rounded to Y's dtype first, as the unfused model stores the sub-layer's output
        r = tl.load(R + offs_m[:, None] * stride_rm + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
        acc = acc.to(Y.dtype.element_ty).to(tl.float32) + r
    if ROPE:           # pairs (x_i, x_{i+d/2}) of a head -> rotated, stored in place, k and v to the caches
        _rope_store(acc, Y, COLSUM, KC, VC, START, M, N, stride_ym, s_cb, s_ch, s_cn, S_MAX, HEAD_DIM, KV_HEADS,
                    BLOCK_M, BLOCK_N)
    elif SWIGLU:       # pairs (gate, up) of columns -> one output each
        g, u = tl.split(tl.reshape(acc, (BLOCK_M, BLOCK_N // 2, 2)))
        acc = _silu_mul(g, u, Y.dtype.element_ty)
        offs_f = tl.program_id(0) * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        mask = (offs_m < M)[:, None] & (offs_f < N // 2)[None, :]
        tl.store(Y + offs_m[:, None] * stride_ym + offs_f[None, :], acc.to(Y.dtype.element_ty), mask=mask)
    else:
        y = acc.to(Y.dtype.element_ty)
        tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :], y, mask=mask)
    if KV_WRITE and not ROPE:
        c = N // 3
        part = offs_n // c                                   # 0: q, 1: k, 2: v
        j = offs_n - part * c
        pos = tl.load(START + offs_m, mask=offs_m < M, other=0)
        ok = mask & (pos < S_MAX)[:, None]
        dst = (offs_m[:, None].to(tl.int64) * s_cb + (j // HEAD_DIM)[None, :].to(tl.int64) * s_ch
               + pos[:, None].to(tl.int64) * s_cn + (j % HEAD_DIM)[None, :])
        tl.store(KC + dst, y, mask=ok & (part == 1)[None, :])
        tl.store(VC + dst, y, mask=ok & (part == 2)[None, :])


# Not named "*gemv*": the profiler's kernel names are checked for vendor kernels (cuBLAS's gemv,
# common.kernel_check.BLAS_KERNELS), and a Triton kernel is named after its function.
@triton.jit
def _matvec_kernel(X, W, BIAS, Y, PART, COUNT, R, COLSUM,
                 M, N, K, K_PER_SPLIT, stride_xm, stride_xk, stride_wk, stride_wn, stride_ym, stride_rm, eps,
                 KC, VC, START, s_cb, s_ch, s_cn, S_MAX, HEAD_DIM, KV_WRITE: tl.constexpr, HAS_BIAS: tl.constexpr,
              ACTIVATION: tl.constexpr, FAST_TANH: tl.constexpr,
                 HAS_RESIDUAL: tl.constexpr, LN_FOLD: tl.constexpr, PRELOAD: tl.constexpr, ONE_TILE: tl.constexpr,
                 STAT_K: tl.constexpr,
                 SPLIT_K: tl.constexpr, COMBINE: tl.constexpr, USE_DOT: tl.constexpr, DOT_FP32: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, W_K_CONTIG: tl.constexpr,
                 FENCE: tl.constexpr, USE_PDL: tl.constexpr, RMS_FOLD: tl.constexpr = False,
                 SWIGLU: tl.constexpr = False, ROPE: tl.constexpr = False, KV_HEADS: tl.constexpr = 0):
    """Program (pid_n, split): Y[:M, cols] = act(X[:M, :] @ W[:, cols] + BIAS[cols]) (+ R[:M, cols]) for
    the BLOCK_N columns cols of block pid_n (LN_FOLD: X's rows layer-normalised first, see _epilogue),
    the rows k of W in [split·K_PER_SPLIT, +K_PER_SPLIT)
    (K_PER_SPLIT a multiple of BLOCK_K; the last split may be shorter, or empty). X [M, K] and
    W [K, N] with any strides (elements); Y [M, N] with row stride stride_ym, columns contiguous;
    BIAS [N] contiguous (if HAS_BIAS). SPLIT_K > 1: PART is an fp32 [SPLIT_K, M, N] workspace
    (contiguous), COUNT[pid_n] the block's ticket counter (0 between calls), COMBINE (a power of 2)
    the partial sums the combining program loads at once. BLOCK_M >= M. W_K_CONTIG: W's K dim has
    stride 1 (the LM head's wteᵀ).
    USE_DOT: BLOCK_M = 16 and tl.dot, the operands swapped (accᵀ = Wᵀ·xᵀ); else an FMA accumulator
    [BLOCK_M, BLOCK_K, BLOCK_N].
    DOT_FP32: cast the tl.dot operands to fp32 (the interpreter's bf16 tl.dot is wrong).
    Your part computes ``acc``, this program's X @ W[:, cols] in fp32, and ``finish``: whether this
    program writes the column block's output; the given :func:`_epilogue` then adds the rest."""
    if USE_PDL:   # given: programmatic dependent launch (PDL_NOTES): wait for the previous kernel, then
        tl.extra.cuda.gdc_wait()                   # let the next one start launching
        tl.extra.cuda.gdc_launch_dependents()
    xrow = 0.0    # given: the LayerNorm (RMSNorm) fold's rows of x, loaded now and reduced in _epilogue (PRELOAD)
    if (LN_FOLD or RMS_FOLD) and PRELOAD:
        xrow = _row_tile(X, M, K, stride_xm, stride_xk, BLOCK_M, STAT_K)
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    m_ok = offs_m < M
    n_ok = offs_n < N
    k_lo = split * K_PER_SPLIT
    k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)
    # int64 scalar bases; the in-tile offsets stay small (int32)
    w_base = W + (pid_n * BLOCK_N).to(tl.int64) * stride_wn + k_lo.to(tl.int64) * stride_wk
    x_base = X + k_lo * stride_xk
    if USE_DOT:
        # W's tile is loaded as [BLOCK_N, BLOCK_K] (Wᵀ's: along K, W's contiguous dim in the engine's
        # K-major copy) and takes the tensor core's wide side: accᵀ[BLOCK_N, BLOCK_M] = Wᵀ·xᵀ, so that
        # BLOCK_N = 64 columns fill the 64 rows of a Hopper wgmma and x's 16 rows its narrow side
        # ("swap AB", as cuBLAS's own skinny-GEMM kernels do); transposed back once, after the loop.
        acc_t = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        w_offs = tl.arange(0, BLOCK_N)[:, None] * stride_wn + offs_k[None, :] * stride_wk
        x_offs = offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
        for k0 in range(k_lo, k_hi, BLOCK_K):
            k_ok = k0 + offs_k < k_hi
            w = tl.load(w_base + w_offs, mask=n_ok[:, None] & k_ok[None, :], other=0.0, eviction_policy="evict_first")
            x = tl.load(x_base + x_offs, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            if DOT_FP32:
                x = x.to(tl.float32)
                w = w.to(tl.float32)
            acc_t = tl.dot(w, tl.trans(x), acc_t, input_precision="ieee")
            w_base += BLOCK_K * stride_wk
            x_base += BLOCK_K * stride_xk
        acc = tl.trans(acc_t)
    else:
        # W's tile is loaded as [1, BLOCK_K, BLOCK_N]: its layout (threads along W's contiguous dim,
        # 16-byte vectors) is then the accumulator's too, and x broadcasts into it: no reshuffle of
        # the weight through shared memory on every slice.
        acc3 = tl.zeros((BLOCK_M, BLOCK_K, BLOCK_N), dtype=tl.float32)
        w_offs = offs_k[None, :, None] * stride_wk + tl.arange(0, BLOCK_N)[None, None, :] * stride_wn
        x_offs = offs_m[:, None, None] * stride_xm + offs_k[None, :, None] * stride_xk
        if W_K_CONTIG:    # x read per column too (L1 hits), so that it takes W's layout (threads along K)
            x_offs += tl.arange(0, BLOCK_N)[None, None, :] * 0
        for k0 in range(k_lo, k_hi, BLOCK_K):
            k_ok = k0 + offs_k < k_hi
            w = tl.load(w_base + w_offs, mask=k_ok[None, :, None] & n_ok[None, None, :], other=0.0, eviction_policy="evict_first")
            x = tl.load(x_base + x_offs, mask=m_ok[:, None, None] & k_ok[None, :, None], other=0.0)
            acc3 += x.to(tl.float32) * w.to(tl.float32)
            w_base += BLOCK_K * stride_wk
            x_base += BLOCK_K * stride_xk
        acc = tl.sum(acc3, axis=1)

    finish = True
    if SPLIT_K > 1:
        mask = m_ok[:, None] & n_ok[None, :]
        part = PART + (split * M + offs_m[:, None]).to(tl.int64) * N + offs_n[None, :]
        tl.store(part, acc, mask=mask)
        finish = _last_to_arrive(COUNT + pid_n, SPLIT_K, FENCE)
        if finish:
            # COMBINE partial sums loaded at once (their loads in flight together), chunk after chunk:
            # a fixed order of additions, so the same bits on every run
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            offs_s = tl.arange(0, COMBINE)
            for s0 in range(0, SPLIT_K, COMBINE):
                s = s0 + offs_s
                p = PART + (s[:, None, None] * M + offs_m[None, :, None]).to(tl.int64) * N + offs_n[None, None, :]
                parts = tl.load(p, mask=(s < SPLIT_K)[:, None, None] & mask[None, :, :], other=0.0,
                                cache_modifier=".cg")
                acc += tl.sum(parts, axis=0)
    if finish:   # given: the program that holds the block's full sums adds the rest and stores
        _epilogue(acc, xrow, X, BIAS, COLSUM, R, Y, M, N, K, stride_xm, stride_xk, stride_rm, stride_ym, eps,
                  KC, VC, START, s_cb, s_ch, s_cn, S_MAX, HEAD_DIM, KV_WRITE, HAS_BIAS, ACTIVATION, FAST_TANH,
                  HAS_RESIDUAL, LN_FOLD, PRELOAD, ONE_TILE, BLOCK_M, BLOCK_N, STAT_K, RMS_FOLD, SWIGLU, ROPE,
                  KV_HEADS)


# ==================================================================== launch (given)
@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _smem(device: torch.device) -> int | None:
    """Shared memory a block may use on ``device`` (choose_config's ``smem``); None under the interpreter."""
    if TRITON_INTERPRET or device.type != "cuda":
        return None
    return shared_memory_per_block(device)


def sm_count(device: torch.device) -> int:
    """The device's SM count (132 on an H100 SXM); 4 under the interpreter (programs cost host time)."""
    if TRITON_INTERPRET or device.type != "cuda":
        return 4
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def use_dot(m: int) -> bool:
    """The default path for M rows: tl.dot (tensor cores) above 2 rows, CUDA-core FMAs for 1 or 2.
    (lectures/results/a08_gemv.md: on the H100 the FMA path at 4 rows of K-major W falls behind tl.dot.)"""
    return m > 2


def block_m(m: int, dot: bool) -> int:
    """BLOCK_M for M rows: 16 with tl.dot (its smallest M), else the next power of 2 of M."""
    return 16 if dot else next_power_of_2(max(m, 1))


#: Programs per SM :func:`choose_config` aims at: several slabs of W in flight on every SM.
PROGRAMS_PER_SM = 4
#: fp32 accumulators per thread on the FMA path (BLOCK_M·BLOCK_K·BLOCK_N / threads). 32 keeps a program
#: at 56-96 registers a thread (sm_90, compiled offline: 64 spilled nothing but took 130-220), so that
#: 4 programs of 8 warps fit on an SM, each with 64 bytes of W in flight per thread.
ACCUMULATORS = 32
#: Split-K writes and reads SPLIT_K·M·N fp32 partial sums: keep that under this share of W's bytes.
WORKSPACE_SHARE = 0.25
#: ... and give every split at least this many BLOCK_K slices.
MIN_SLICES = 1


def dot_stage_bytes(bn: int, bk: int, size: int) -> int:
    """Shared memory one pipeline stage of the tl.dot path takes, as Triton 3.6 allocates it (W's [bn, bk]
    tile and x's [16, bk], elements of ``size`` bytes), with room for its barriers: 6 stages of 64 columns
    of bf16 ask 124 KB on sm_90 (cross-compiled: common.course.portability)."""
    return (bn + 16) * bk * size + 512


@functools.lru_cache(maxsize=4096)   # a rule of its arguments: decided once per key, looked up after that
def choose_config(m: int, n: int, k: int, dtype: torch.dtype, k_contiguous: bool, sms: int, *,
                  smem: int | None = None, interpreter: bool = TRITON_INTERPRET) -> tuple[int, int, int, int, int]:
    """(BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) for M rows of x, W [K, N] of ``dtype``
    (``k_contiguous``: W's K dim has stride 1, e.g. the LM head's wteᵀ), on ``sms`` SMs with ``smem``
    bytes of shared memory a block (None: enough, as on an H100 or A100)
    (``interpreter``: the CPU interpreter's wide tiles; False shows what a GPU runs).

    The rule, from shapes only (graph-safe, no autotuning):
    * K-major W (the engine's decode weights, the LM head): a program takes a few whole columns,
      each a contiguous row of memory, and walks all of K: 4 or 8 columns with 8 warps on the FMA
      path (M <= 2; 8 where that still gives PROGRAMS_PER_SM programs an SM); 64 columns with 4 warps
      on the tl.dot path (W's tile on the wgmma's 64-row side), 256 bytes of each column a slice,
      pipelined 6 deep where the shared memory holds it (4 deep on 99 KB: RTX 30xx/40xx; 32 columns
      where 4 stages of 64 do not fit: a T4's 64 KB); split-K only for a K of 16 slices or more whose
      columns give fewer programs than SMs (the MLP's down projection). This is the fast layout
      (lectures/results/a08_gemv.md).
    * N-major W (GPT-2's Conv1D [in, out] as stored): loads of 16 bytes per thread along N; the FMA path
      keeps its [BLOCK_M, BLOCK_K, BLOCK_N] accumulator at ACCUMULATORS fp32 registers a thread (8 warps),
      so BLOCK_K·BLOCK_N shrinks as BLOCK_M grows; the tl.dot path takes a [128, 64] tile ([128, 32] where
      N has fewer than 2 blocks of 64 per SM), 4 warps, pipelined 3 deep; split-K for PROGRAMS_PER_SM
      programs on every SM, but no split shorter than MIN_SLICES slices and no more partial-sum traffic
      than WORKSPACE_SHARE of the weight's bytes. Correct, but slower than K-major at one row.
    Under the interpreter: a few wide programs (each costs milliseconds of Python).
    """
    size = dtype.itemsize
    vec = 16 // size                                   # elements per 16-byte load
    bm = block_m(m, use_dot(m))
    want_programs = PROGRAMS_PER_SM * sms
    if k_contiguous and not interpreter:               # K-major W: every column a contiguous row of W
        # Each program walks the whole of K for a few columns (no split-K while the columns alone give
        # every SM a program), its warps reading rows of W along memory in 16-byte vectors.
        want_programs = sms                            # split K only where the columns give < 1 program an SM
        if use_dot(m):                                 # tl.dot, BLOCK_M = 16, W's tile the 64-row side
            warps, bk = 4, 256 // size                 # 256-byte rows of W per slice
            bn = 64 if smem is None or 4 * dot_stage_bytes(64, bk, size) <= smem else 32
            stages = 6 if smem is None or 6 * dot_stage_bytes(bn, bk, size) <= smem else 4
            blocks = cdiv(n, bn)                       # no split-K (its partial sums cost more than idle SMs),
            want_programs = blocks                     # except for few columns of a long K: at most 4 ways
            if blocks < sms and k >= 16 * bk:
                want_programs = min(4, cdiv(2 * sms, blocks)) * blocks
        else:                                          # FMAs: 8 warps, 4 or 8 columns a program
            warps, stages, bk = 8, 1, 32 * vec
            bn = 8 if cdiv(n, 8) >= PROGRAMS_PER_SM * sms else 4
    elif use_dot(m):                                   # tl.dot, BLOCK_M = 16
        warps, stages = 4, 3
        bn, bk = 64, (128 if size == 2 else 64)
        if cdiv(n, bn) < 2 * sms:                      # narrower tiles before more splits (less workspace)
            bn = 32
    else:                                              # N-major W (a K-major one only under the interpreter,
        warps, stages = 8, 1                           # whose tiles follow): FMAs, ACCUMULATORS per thread
        per_program = ACCUMULATORS * 32 * warps // bm  # BLOCK_K * BLOCK_N, a warp's 32 threads along N
        bn = 32 * vec
        bk = max(per_program // bn, 1)
    if interpreter:                                    # few, wide programs; split K at most 2 ways
        bn, bk = (64, 32) if use_dot(m) else (256, 64)
    n_blocks = cdiv(n, bn)
    k_slices = max(cdiv(k, bk), 1)
    want = 2 if interpreter else cdiv(want_programs, n_blocks)
    by_ws = int(WORKSPACE_SHARE * k * size / (8 * max(m, 1)))      # 2 passes of 4-byte partials
    splits = max(1, min(want, k_slices // MIN_SLICES, by_ws, 128))
    # whole slices per split, and no empty split
    per = cdiv(k_slices, splits)
    splits = cdiv(k_slices, per)
    return bn, bk, splits, warps, stages


def combine_chunk(splits: int, bm: int, bn: int, warps: int) -> int:
    """How many split-K partial sums the last program loads at once (a power of 2): all of them up to
    32 fp32 values a thread (their loads in flight together: one L2 round trip, not SPLIT_K of them)."""
    return max(1, min(next_power_of_2(splits), 32 * 32 * warps // (bm * bn)))


#: gemv's launch plans per key (rows, N, K, dtype, W's layout, device and the options): the config, the
#: grid and the kernel's constexprs, decided on a key's first call and looked up after that (lecture 3,
#: "Host overhead").
_PLANS: dict[tuple, tuple] = {}


def _plan(m: int, n: int, k: int, dtype: torch.dtype, k_contig: bool, device: torch.device, activation: str | None,
          has_bias: bool, config, pdl: bool, residual: bool = False, ln_fold: bool = False,
          kv_write: bool = False, rms_fold: bool = False, swiglu: bool = False, rope_kv_heads: int = 0) -> tuple:
    """(grid, rows of W per split, launch kwargs) for one gemv key; raises on a bad ``config``."""
    if config is None:
        config = choose_config(m, n, k, dtype, k_contig, sm_count(device), smem=_smem(device))
    if len(config) not in (5, 6):
        raise ValueError(f"config: expected (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages[, use_dot]), got {config}")
    bn, bk, splits, warps, stages = config[:5]
    dot = bool(config[5]) if len(config) == 6 else use_dot(m)
    bm = block_m(m, dot)
    if bn < 1 or bk < 1 or bn & (bn - 1) or bk & (bk - 1) or (dot and (bn < 16 or bk < 16)):
        raise ValueError(f"config: BLOCK_N={bn} and BLOCK_K={bk} must be powers of 2 (>= 16 with tl.dot)")
    if splits < 1:
        raise ValueError(f"config: SPLIT_K={splits}; expected >= 1")
    if (swiglu or rope_kv_heads) and bn < 2:
        raise ValueError(f"config: BLOCK_N={bn}; swiglu and rope need >= 2 (column pairs)")
    per = cdiv(cdiv(max(k, 1), bk), splits) * bk      # rows of W per split, whole slices
    n_blocks = cdiv(n, bn)
    use_pdl = bool(pdl) and pdl_supported(device)
    kwargs = dict(KV_WRITE=kv_write, HAS_BIAS=has_bias, ACTIVATION=activation,
                  FAST_TANH=not TRITON_INTERPRET and dtype != torch.float32,
                  HAS_RESIDUAL=residual, LN_FOLD=ln_fold, PRELOAD=preload(k, bm, warps),
                  ONE_TILE=stat_k(k, bm, warps) >= k, STAT_K=stat_k(k, bm, warps),
                  SPLIT_K=splits, COMBINE=combine_chunk(splits, bm, bn, warps), USE_DOT=dot,
                  DOT_FP32=TRITON_INTERPRET and dtype == torch.bfloat16, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                  W_K_CONTIG=k_contig, FENCE=not TRITON_INTERPRET, USE_PDL=use_pdl, num_warps=warps,
                  num_stages=stages, **(dict(launch_pdl=True) if use_pdl else {}))
    if rms_fold or swiglu or rope_kv_heads:           # stage 9's epilogues (GPT-2's launches: the defaults)
        kwargs.update(RMS_FOLD=rms_fold, SWIGLU=swiglu, ROPE=rope_kv_heads > 0, KV_HEADS=rope_kv_heads)
    return (n_blocks, splits), per, kwargs


def stat_k(k: int, bm: int, warps: int) -> int:
    """Columns of the BLOCK_M rows the LayerNorm statistics load at once (_row_tile, _row_stats): on the FMA
    path (BLOCK_M <= 2) at most 4 values a thread for K <= FOLD_MAX_K (its many small programs keep to 32
    registers, 8 programs of 8 warps an SM), and at one row up to 8 for the wider rows of GPT-2 large and XL,
    so that one load before the main loop holds the row (PRELOAD; sm_90: 38 registers, 6 programs an SM,
    which :func:`fold_pays` accounts for); 16 a thread on the tl.dot path."""
    per_thread = (8 if bm == 1 and k > FOLD_MAX_K else 4) if bm <= 2 else 16
    return max(16, min(next_power_of_2(max(k, 1)), per_thread * 32 * warps // bm))


def preload(k: int, bm: int, warps: int) -> bool:
    """Load x's rows for the LayerNorm statistics before the main loop, their latency hidden behind the weight
    stream, where one load of :func:`stat_k` columns holds them (K <= STAT_K)."""
    return stat_k(k, bm, warps) >= k


#: The LayerNorm fold pays where the GEMV's epilogue gets the row statistics cheaply: a few rows (the FMA
#: path) of at most this many columns, loaded before the main loop (:func:`preload`). Measured on the H100
#: (lectures/results/a08_decode_profile.md): at GPT-2 small's width the folded step is faster; at XL's, with the
#: statistics after the loop, each folded GEMV took longer than the LayerNorm kernel it replaced.
FOLD_MAX_K = 1024
#: Wider rows (up to this many columns) at ONE row: loaded before the main loop too, 8 values a thread
#: (:func:`stat_k`), which costs registers: 6 programs of 8 warps an SM on sm_90 instead of 8. The fold then pays
#: where the GEMV's grid still fits one wave of FOLD_PROGRAMS_PER_SM programs an SM (EXPERIMENTS.md,
#: `a08 wide fold`: XL's c_attn and large's c_fc gain; XL's c_fc and large's c_attn, more than a wave, lose).
FOLD_WIDE_MAX_K = 2048
FOLD_PROGRAMS_PER_SM = 6


@functools.lru_cache(maxsize=1024)   # called on every decode step's c_attn and c_fc: decided once per key
def fold_pays(m: int, k: int, n: int | None = None, sms: int | None = None, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether ``gemv(..., ln_colsum=...)`` of M rows and K columns beats a LayerNorm kernel before the GEMV:
    a few rows of at most FOLD_MAX_K columns; or one row of at most FOLD_WIDE_MAX_K where the GEMV's grid
    (choose_config for a K-major W [K, N] on ``sms`` SMs) fits one wave of FOLD_PROGRAMS_PER_SM programs an SM
    (without N and the SM count: no)."""
    if m <= 2 and k <= FOLD_MAX_K:
        return True
    if m != 1 or k > FOLD_WIDE_MAX_K or n is None or sms is None:
        return False
    bn, _, splits, _, _ = choose_config(1, n, k, dtype, True, sms, interpreter=False)
    return cdiv(n, bn) * splits <= FOLD_PROGRAMS_PER_SM * sms


def fold_layernorm(ln_weight: torch.Tensor, ln_bias: torch.Tensor, w: torch.Tensor,
                   bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold a LayerNorm's affine part into the weight that follows it, once, at load time:

        w_f, bias_f, colsum = fold_layernorm(ln.weight, ln.bias, w, b)
        gemv(h, w_f, bias_f, act, ln_colsum=colsum, eps=ln.eps)  ==  act(LayerNorm(h) @ w + b)

    LayerNorm(h)·w + b = ((h − mean)·rstd·γ + β)·w + b = rstd·(h·w_f − mean·colsum) + bias_f with
    w_f = diag(γ)·w (w's dtype and memory layout), colsum = Σ_k w_f[k, :] (fp32, summed from the ROUNDED
    w_f, so that mean·colsum cancels exactly what h·w_f adds) and bias_f = β·w + b (fp32). The kernel then
    reads h itself, not a normalised copy: the LayerNorm kernel and its launch are gone, and the GEMV
    computes each row's mean and rstd in its epilogue (_row_stats). Computed in float64.
    """
    k, n = w.shape
    if ln_weight.shape != (k,) or ln_bias.shape != (k,):
        raise ValueError(f"fold_layernorm: the LayerNorm's weight and bias must be [{k}] (w's K), got "
                         f"{tuple(ln_weight.shape)} and {tuple(ln_bias.shape)}")
    if bias is not None and bias.shape != (n,):
        raise ValueError(f"fold_layernorm: bias must be [{n}] (w's N), got {tuple(bias.shape)}")
    w64 = w.double()
    dense = w.is_contiguous() or w.t().is_contiguous()
    w_f = torch.empty_strided(w.shape, w.stride(), dtype=w.dtype, device=w.device) if dense else torch.empty_like(
        w, memory_format=torch.contiguous_format)
    w_f.copy_(ln_weight.double()[:, None] * w64)
    colsum = w_f.double().sum(0).float()
    bias_f = ln_bias.double() @ w64
    if bias is not None:
        bias_f += bias.double()
    return w_f, bias_f.float(), colsum


def fold_rmsnorm(norm_weight: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Fold an RMSNorm's weight into the weight that follows it, once, at load time:

        w_f = fold_rmsnorm(norm.weight, w)
        gemv(h, w_f, rms_fold=True, eps=norm.eps)  ≈  RMSNorm(h) @ w

    RMSNorm(h)·w = (h·rstd·γ)·w = rstd·(h·(diag(γ)·w)): w_f = diag(γ)·w, computed in float64 and rounded
    once to w's dtype, in w's memory layout (a K-major w stays K-major); the kernel reads h itself and computes
    each row's rstd = rsqrt(mean(h²) + eps) in its epilogue. transformers rounds the normalised row to the
    dtype before γ multiplies; the fold does not (a 16-bit rounding's difference, which is why the tuned path
    folds only in 16 bits)."""
    k = w.shape[0]
    if w.dim() != 2 or norm_weight.shape != (k,):
        raise ValueError(f"fold_rmsnorm: expected the norm's weight [K] and w [K, N]; got "
                         f"{tuple(norm_weight.shape)} and {tuple(w.shape)}")
    dense = w.is_contiguous() or w.t().is_contiguous()
    w_f = torch.empty_strided(w.shape, w.stride(), dtype=w.dtype, device=w.device) if dense else torch.empty_like(
        w, memory_format=torch.contiguous_format)
    w_f.copy_(norm_weight.to(w.device, torch.float64)[:, None] * w.double())
    return w_f


def interleave_gate_up(w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor | tuple:
    """[gate | up] -> gate and up interleaved, for ``gemv(..., swiglu=True)``: w [K, 2F] (the gate's F columns,
    then the up's) becomes w_i [K, 2F] with w_i[:, 2f] = gate's column f and w_i[:, 2f + 1] = up's column f, in
    w's memory layout (a K-major w stays K-major: its copy is made along the contiguous dim). Any BLOCK_N (even)
    then holds the gate and the up of BLOCK_N / 2 whole features, whatever config a batch size gets. With
    ``bias`` [2F]: (w_i, bias_i), the bias interleaved the same way."""
    if w.dim() != 2 or w.shape[1] % 2:
        raise ValueError(f"interleave_gate_up: expected w [K, 2F] ([gate | up]), got {tuple(w.shape)}")
    k, n = w.shape
    f = n // 2
    if w.stride(0) == 1 and k > 1:                     # K-major: interleave the rows of wᵀ, stay K-major
        w_i = w.t().reshape(2, f, k).transpose(0, 1).reshape(n, k).contiguous().t()
    else:
        w_i = w.reshape(k, 2, f).transpose(1, 2).reshape(k, n).contiguous()
    if bias is None:
        return w_i
    if bias.shape != (n,):
        raise ValueError(f"interleave_gate_up: bias must be [{n}] (w's 2F), got {tuple(bias.shape)}")
    return w_i, bias.reshape(2, f).t().reshape(n).contiguous()


def interleave_rope(w: torch.Tensor, head_dim: int) -> torch.Tensor:
    """q|k|v's columns interleaved per head for ``gemv(..., rope=...)``: w [K, N] (N a multiple of head_dim, each
    head's head_dim columns contiguous) becomes w_r with, in every head, column 2i = the head's column i and
    2i + 1 = its column i + d/2 (the two values one rotation mixes: transformers' rotate_half convention), in w's
    memory layout (a K-major w stays K-major). The GEMV then holds each rotation's pair in one program whatever
    its BLOCK_N (even), and stores the result in the original order."""
    k, n = w.shape if w.dim() == 2 else (0, -1)
    if w.dim() != 2 or head_dim < 2 or head_dim % 2 or n % head_dim:
        raise ValueError(f"interleave_rope: expected w [K, N] with N a multiple of an even head_dim, got "
                         f"{tuple(w.shape)} and head_dim={head_dim}")
    heads, half = n // head_dim, head_dim // 2
    if w.stride(0) == 1 and k > 1:                     # K-major: permute the rows of wᵀ, stay K-major
        return w.t().reshape(heads, 2, half, k).transpose(1, 2).reshape(n, k).contiguous().t()
    return w.reshape(k, heads, 2, half).transpose(2, 3).reshape(k, n).contiguous()


def rope_table(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotation table ``gemv(..., rope=...)`` reads: cos | sin [S, d / 2] each (rope.rope_cache) side by side,
    fp32 [S, d] contiguous."""
    return torch.cat([cos.float(), sin.float()], -1).contiguous()


def _check_rope(x2: torch.Tensor, n: int, table: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor,
                start: torch.Tensor) -> int:
    """The checks of a ``rope`` call; returns the caches' KV head count."""
    check_caches(x2, kc, vc, start, "x")
    b, hkv, s_max, d = kc.shape
    check_tensor(table, "rope", ndim=2, dtypes=(torch.float32,), contiguous=True)
    check_same(x2, table, "x, rope", dtype=False)
    if table.shape[1] != d or table.shape[0] < s_max:
        raise ValueError(f"rope: expected the table cos | sin [>= S_max={s_max}, d={d}] (rope_table), got "
                         f"{tuple(table.shape)}")
    if n % d or n // d <= 2 * hkv or b != x2.shape[0] or start.shape[0] != b:
        raise ValueError(f"rope, kv_cache: expected q|k|v [B, (H + 2·{hkv})·{d}] (H >= 1) with the cache's B={b} and "
                         f"start [B]; got {x2.shape[0]} rows of {n} columns and start {tuple(start.shape)}")
    return hkv


def _check_kv(x2: torch.Tensor, n: int, kc: torch.Tensor, vc: torch.Tensor, start: torch.Tensor) -> None:
    check_caches(x2, kc, vc, start, "x")
    b, h, _, d = kc.shape
    if n != 3 * h * d or b != x2.shape[0] or start.shape[0] != b:
        raise ValueError(f"kv_cache: expected c_attn's output [B, 3·H·d] with the cache's B={b}, H={h}, d={d} and "
                         f"start [B]; got {x2.shape[0]} rows of {n} columns and start {tuple(start.shape)}")


def gemv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None, *,
         residual: torch.Tensor | None = None, ln_colsum: torch.Tensor | None = None, eps: float = 1e-5,
         kv_cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None, out: torch.Tensor | None = None, config: tuple[int, int, int, int, int] | None = None,
         pdl: bool = False, rms_fold: bool = False, swiglu: bool = False,
         rope: torch.Tensor | None = None) -> torch.Tensor:
    """``act(x @ w + bias) + residual`` for a few rows of x: the decode step's GEMMs, in one Triton kernel.

    x: [..., K] with at most MAX_ROWS (16) rows in all (leading dims flattened; a 2-D x may have any
    strides); w: [K, N], any strides (GPT-2's Conv1D weight [in, out], or the LM head's ``wte.t()``);
    bias: [N] contiguous, or None; x and w one dtype (fp32/fp16/bf16) on the kernel device, bias
    that dtype or fp32. activation: None or "gelu_tanh" (GPT-2's tanh GELU; on a GPU in 16 bits the
    hardware tanh, as a06's epilogue). Accumulates in fp32 (fp32 inputs: IEEE fp32, no TF32). Returns
    a new contiguous [..., N] tensor of x's dtype, or writes ``out`` (contiguous, that shape and dtype;
    it may be ``residual`` itself: an update in place) and returns it.

    Fused into the epilogue, for a decode step with fewer kernels (lecture 8, §7):
    ``residual``: [..., N] like the output (x's dtype, rows of one stride, columns contiguous), added
    after the activation (GPT-2's ``h + proj(a)``), to the product rounded to x's dtype (the unfused
    model's rounding). ``ln_colsum``: x's rows are layer-normalised
    (statistics in fp32, biased variance, ``eps``) before the product, with the LayerNorm's γ and β
    folded into w and bias by :func:`fold_layernorm`, which gives this fp32 [N] vector.
    ``kv_cache`` = (k_cache, v_cache, start): the output is c_attn's [q | k | v] (N = 3·H·d) of one new
    token per sequence, and its k and v columns also go to the caches [B, H, S_max, d] (x's dtype, last
    dim contiguous, B = x's rows) at position start[b] (int32 [B], device): kv_cache.write_kv's work
    (the same bits) without its launch.

    ``config`` = (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) overrides :func:`choose_config`; a
    6th element True/False forces the tl.dot / FMA path (default: tl.dot above 2 rows, :func:`use_dot`).
    Split-K partial sums are combined in a fixed order: the same inputs give the same bits. No host
    sync, no allocation that depends on values: capturable in a CUDA graph (after one eager call on
    the device). ``pdl=True``: launched with programmatic dependent launch where the GPU supports it
    (sm_90+; ignored elsewhere and under the interpreter), see PDL_NOTES.

    Two epilogues for Llama-family models (stage 9's tuned path; both off by default, GPT-2's calls unchanged):
    ``rms_fold=True``: x's rows are RMS-normalised (``x · rsqrt(mean(x²) + eps)``, fp32) before the product,
    the RMSNorm's weight folded into w by :func:`fold_rmsnorm` (not with ``ln_colsum``). ``swiglu=True``: w's
    2F columns are a gate and an up projection interleaved by :func:`interleave_gate_up` (column 2f the gate of
    feature f, 2f + 1 its up; bias, if any, interleaved the same way); the output is [..., F] =
    silu(gate)·up, rounded as transformers' LlamaMLP rounds it (each projection, the silu, the product: to x's
    dtype); no activation, residual or kv_cache with it. ``rope`` (with ``kv_cache``): the rotation table
    [S, d] fp32 (cos | sin of rope.rope_cache side by side, S >= the cache's S_max, d its head dim): the output
    is q|k|v of a grouped-query attention ((H + 2·Hkv)·d columns, Hkv the cache's heads), w's columns
    interleaved per head by :func:`interleave_rope`; each row's q and k heads are rotated at position start[b]
    (rope.apply_rope's arithmetic: the projection rounded to x's dtype, rotated in fp32, rounded once), the
    output stored in q|k|v order, k and v appended to the caches at start[b] (write_kv's work); no bias,
    activation, residual or swiglu with it.
    """
    try:   # the call's key: everything its checks and decisions read (lecture 3, "Host overhead")
        key = (meta(x), meta(w), meta(bias), meta(residual), meta(ln_colsum), meta(out),
               None if kv_cache is None else tuple(map(meta, kv_cache)), activation, config, bool(pdl),
               *((bool(rms_fold), bool(swiglu), meta(rope)) if rms_fold or swiglu or rope is not None else ()))
        call = _CALLS.get(key)
    except (AttributeError, TypeError):   # not tensors, or a config given as a list: checked afresh
        key = call = None
    if call is None:
        call = _checked_call(x, w, bias, activation, residual, ln_colsum, kv_cache, out, config, pdl, rms_fold, swiglu,
                             rope)
        if key is not None:
            _CALLS[key] = call
    m, n, k, out_shape, grid, per, launch, kept = call
    if out is None:
        out = x.new_empty(out_shape)   # x's dtype and device (cheaper to parse than torch.empty's keywords)
    if m == 0 or n == 0:
        return out
    x2 = x if x.dim() == 2 else x.reshape(-1, k)
    y2 = out if out.dim() == 2 else out.view(m, out_shape[-1])
    if residual is not None:
        r2 = residual if residual.dim() == 2 else residual.reshape(m, n)
        if r2.stride(1) != 1 and n > 1:
            r2 = r2.contiguous()
    else:
        r2 = y2                                                    # unused
    kv = kv_cache if kv_cache is not None else (y2, y2, y2)       # unused without it
    part, count, ints, kv_ints = kept
    if ints is None:                   # the key's first call: the integers follow from the key's metadata
        ints = (m, n, k, per, x2.stride(0), x2.stride(1), w.stride(0), w.stride(1), y2.stride(0), r2.stride(0))
        kc = kv[0]
        kv_ints = (kc.stride(0), kc.stride(1), kc.stride(2), kc.shape[2], kc.shape[3]) if kv_cache is not None \
            else (0, 0, 0, 0, 1)
        if grid[1] > 1:                # split-K: partial sums (a workspace of the key) and ticket counters
            part = torch.empty((grid[1], m, n), dtype=torch.float32, device=x.device)
            count = ticket_counters(x.device, grid[0])
        if not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            kept[:] = part, count, ints, kv_ints   # kept from the key's first call (a workspace made while a
                                                   # graph is captured is the graph's)
    if part is None:                   # no split-K: placeholders, unused
        part = count = y2
    launch(x2, w, bias if bias is not None else y2, y2, part, count, r2,
           rope if rope is not None else ln_colsum if ln_colsum is not None else y2,
           *ints, float(eps), *kv, *kv_ints)
    return out


#: gemv's calls per key (the tensors' metadata and the options): (M, N, K, the output's shape, the plan,
#: [split-K partial sums, ticket counters, the launch's integers]), made by _checked_call on a key's first
#: call, looked up after that: a call pays its key and a dict lookup for the checks and the decisions, which
#: depend on nothing else (lecture 3, "Host overhead"). The partial sums are a workspace of the key, allocated
#: once (an allocation costs about as much host time as the launch): calls in one stream's order use it one
#: after the other, as they use the device's ticket counters; split-K calls on two streams at once would
#: share both.
_CALLS: dict[tuple, tuple] = {}


def _checked_call(x, w, bias, activation, residual, ln_colsum, kv_cache, out, config, pdl, rms_fold=False,
                  swiglu=False, rope=None) -> tuple:
    """The checks of a gemv call (a clear error for a bad input) and its decisions:
    (M, N, K, the output's shape, grid, rows of W per split, the prepared launch: common.launch.Prepared,
    [split-K partial sums, ticket counters, the launch's integers, the KV cache's]: Nones until the key's
    first call outside a graph capture fills them)."""
    check_tensor(x, "x", min_ndim=1)
    check_tensor(w, "w", ndim=2)
    check_same(x, w, "x, w")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")
    k, n = w.shape
    if x.shape[-1] != k:
        raise ValueError(f"x, w: inner dimensions differ: x {tuple(x.shape)} @ w {tuple(w.shape)}")
    for name, v in (("bias", bias), ("ln_colsum", ln_colsum)):
        if v is None:
            continue
        check_tensor(v, name, ndim=1)
        check_same(x, v, f"x, {name}", dtype=False)
        if v.dtype not in (x.dtype, torch.float32):
            raise TypeError(f"{name}: expected dtype {x.dtype} (x's) or torch.float32, got {v.dtype}")
        if v.shape[0] != n:
            raise ValueError(f"{name}: expected shape ({n},) to match w's N, got {tuple(v.shape)}")
        if v.stride(0) != 1 and n > 1:
            raise ValueError(f"{name}: expected a contiguous vector, got stride {v.stride(0)}")
    x2 = x if x.dim() == 2 else x.reshape(-1, k)
    m = x2.shape[0]
    if m > MAX_ROWS:
        raise ValueError(f"x: {m} rows; gemv takes at most {MAX_ROWS} (a decode step's batch). "
                         "More rows are a GEMM: use the a06 matmul")
    out_shape = (*x.shape[:-1], n)
    if rms_fold and ln_colsum is not None:
        raise ValueError("rms_fold=True and ln_colsum: one norm folds into a GEMV (RMSNorm or LayerNorm), not both")
    if swiglu:
        if n % 2:
            raise ValueError(f"swiglu=True: w must have an even number of columns (gate and up interleaved), got {n}")
        if activation is not None or residual is not None or kv_cache is not None:
            raise ValueError("swiglu=True: the output is silu(gate)·up; no activation, residual or kv_cache with it")
        out_shape = (*x.shape[:-1], n // 2)
    if residual is not None:
        check_tensor(residual, "residual")
        check_same(x, residual, "x, residual")
        if tuple(residual.shape) != out_shape:
            raise ValueError(f"residual: expected the output's shape {out_shape}, got {tuple(residual.shape)}")
    if out is not None:
        check_tensor(out, "out", dtypes=(x.dtype,), contiguous=True)
        check_same(x, out, "x, out")
        if tuple(out.shape) != out_shape:
            raise ValueError(f"out: expected shape {out_shape}, got {tuple(out.shape)}")
    if kv_cache is not None:
        if not isinstance(kv_cache, (tuple, list)) or len(kv_cache) != 3:
            raise TypeError("kv_cache: expected (k_cache, v_cache, start)")
        if rope is None:
            _check_kv(x2, n, *kv_cache)
    kv_heads = 0
    if rope is not None:
        if kv_cache is None:
            raise ValueError("rope: needs kv_cache=(k_cache, v_cache, start) (the positions and the caches)")
        if bias is not None or activation is not None or residual is not None or swiglu or ln_colsum is not None:
            raise ValueError("rope: the output is the rotated q|k|v; no bias, activation, residual, swiglu or "
                             "ln_colsum with it")
        kv_heads = _check_rope(x2, n, rope, *kv_cache)
    if m == 0 or n == 0:
        return m, n, k, out_shape, None, None, None, [None] * 4
    k_contig = w.stride(0) == 1 and k > 1
    key = (m, n, k, x.dtype, k_contig, x.device, activation, bias is not None, config, bool(pdl),
           residual is not None, ln_colsum is not None, kv_cache is not None,
           *((bool(rms_fold), bool(swiglu), kv_heads) if rms_fold or swiglu or kv_heads else ()))
    try:
        plan = _PLANS.get(key)
    except TypeError:                  # a config given as a list: no key, decided afresh
        key, plan = None, None
    if plan is None:
        plan = _plan(m, n, k, x.dtype, k_contig, x.device, activation, bias is not None, config, pdl,
                     residual is not None, ln_colsum is not None, kv_cache is not None, bool(rms_fold), bool(swiglu),
                     kv_heads)
        if key is not None:
            _PLANS[key] = plan
    grid, per, kwargs = plan
    return m, n, k, out_shape, grid, per, fast(_matvec_kernel).prepare(grid, **kwargs), [None, None, None, None]
