"""Assignment 8, kernel 4: the decode GEMV, ``act(x @ W + b) (+ residual)`` for a few rows of x, in Triton.

    from assignments.a08_gpt2_inference.gemv import gemv
    y = gemv(x, w, bias, activation="gelu_tanh")     # x [M, K], M <= 16 rows; w [K, N], any strides

A decode step multiplies B rows (one new token per sequence) by every weight: a matrix-VECTOR
product at batch 1, each weight element read once for 2·M FLOPs, so the kernel's only job is to
stream W at the memory bandwidth. A GEMM tile (stage 6) parallelises over output tiles only: GPT-2
XL's 6400 -> 1600 projection has 25 tiles of 64 columns, so most SMs idle. This kernel splits K
as well (split-K), so that every SM streams its own slab of W:

  program (pid_n, split): columns [pid_n·BLOCK_N, +BLOCK_N), rows [split·K_PER_SPLIT, +K_PER_SPLIT) of W
    1. acc[BLOCK_M, BLOCK_N] = 0 (fp32); for each BLOCK_K slice of the split's rows:
       acc += sum_k x[:, k] · w[k, :]   (CUDA-core FMAs: the math is free, the bytes are not)
    2. SPLIT_K == 1: acc is the block's result.
       SPLIT_K  > 1: store acc to the fp32 workspace PART[split]; the LAST program of the column
       block to arrive (a ticket counter, :func:`_last_to_arrive`) adds the SPLIT_K partial sums in
       a fixed order, so the result is the same bits on every run (an atomic add of the partials
       into y would not be: fp32 addition is not associative). One kernel, no "reduce" launch.
    3. the program that finishes adds the bias, GELU and the residual, and stores y.

The config comes from :func:`choose_config`, a rule of the shapes only (no autotuning, no host
sync), so a decode step that calls it can be captured in a CUDA graph. The engine's tuned path
(tuned_gemv.py, not copied to assignments/) runs a faster kernel with the same contract.

Run: ``pytest tests/test_a08_gpt2_inference.py -k gemv``.
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from common import TRITON_INTERPRET
from common.checks import check_same, check_tensor
from common.launch import cdiv, fast, next_power_of_2
from common.triton_helpers import ticket_counters

from ..a06_matmul.matmul_triton import _gelu_tanh

ACTIVATIONS = (None, "gelu_tanh")
#: Rows a call may have: a decode step's batch. More rows are a GEMM: use the a06 matmul.
MAX_ROWS = 16


@triton.jit
def _fence_gpu():
    # fence.acq_rel.gpu: this thread's earlier writes are visible GPU-wide before its later ones.
    tl.inline_asm_elementwise("fence.acq_rel.gpu; // dummy $0", "=r", [], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _last_to_arrive(COUNT, SPLIT_K: tl.constexpr, FENCE: tl.constexpr):
    """Given. Every program of one column block calls this once, after storing its partial sums;
    it returns True in exactly one of them, the last to arrive, and by then every other
    program's partial sums are visible to it. It takes a ticket from the block's counter
    (an atomic add) and resets the counter to 0. FENCE: on a GPU (not under the interpreter,
    which runs programs one after the other)."""
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


# Not named "*gemv*": the profiler's kernel names are checked for vendor kernels (cuBLAS's gemv,
# common.kernel_check.BLAS_KERNELS), and a Triton kernel is named after its function.
@triton.jit
def _matvec_kernel(X, W, BIAS, R, Y, PART, COUNT, M, N, K, K_PER_SPLIT,
                   stride_xm, stride_xk, stride_wk, stride_wn, stride_rm, stride_ym,
                   HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
                   SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   FENCE: tl.constexpr):
    """Program (pid_n, split): Y[:M, cols] = act(X[:M, :] @ W[:, cols] + BIAS[cols]) (+ R[:M, cols]) for the
    BLOCK_N columns of block pid_n; this program reads the rows k of W in [split·K_PER_SPLIT, +K_PER_SPLIT)
    (a multiple of BLOCK_K; the last split may be shorter, or empty). X [M, K] and W [K, N] with any strides
    (elements); Y and R [M, N] with row strides stride_ym / stride_rm, columns contiguous; BIAS [N]
    contiguous. SPLIT_K > 1: PART is an fp32 [SPLIT_K, M, N] workspace (contiguous), COUNT[pid_n] the
    block's ticket counter (0 between calls). BLOCK_M >= M (a power of 2)."""
    pid_n = tl.program_id(0)
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    m_ok = offs_m < M
    n_ok = offs_n < N
    # TODO(a08): kernel 4 (the decode GEMV). split = tl.program_id(1); offs_k = tl.arange(0, BLOCK_K).
    #   This split's rows of W: k_lo = split * K_PER_SPLIT up to k_hi = min(k_lo + K_PER_SPLIT, K).
    #   1. for k0 in range(k_lo, k_hi, BLOCK_K): load the W tile [BLOCK_K, BLOCK_N] at
    #      W + k * stride_wk + n * stride_wn (mask k < k_hi and n < N, other=0) and the x tile [BLOCK_M, BLOCK_K]
    #      at X + m * stride_xm + k * stride_xk (mask m < M and k < k_hi). Use BOTH strides of each: the LM
    #      head's W is wteᵀ, a K-contiguous view. Offsets in int64 where they grow large (n * stride_wn
    #      reaches 80M for the LM head's wteᵀ).
    #      acc3 (fp32 [BLOCK_M, BLOCK_K, BLOCK_N]) += x[:, :, None] * w[None, :, :], both in fp32; after the loop
    #      acc = tl.sum(acc3, axis=1). (A tl.sum of that product inside the loop is a pattern Triton rewrites
    #      into tl.dot, which on a GPU rounds fp32 inputs to TF32: not the fp32 FMAs this kernel is about.)
    #   2. SPLIT_K == 1: acc is the block's result: finish = True.
    #      SPLIT_K > 1: store acc to PART + (split * M + m) * N + n (mask m < M, n < N); then
    #      finish = _last_to_arrive(COUNT + pid_n, SPLIT_K, FENCE), and if finish: acc = the sum of PART[s, m, n]
    #      over s = 0, 1, ..., SPLIT_K - 1 in that order (load with cache_modifier=".cg": from L2, never a
    #      stale L1 line). Add nothing else here: the bias is added once, after the sum (below).
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    finish = True
    if finish:   # given: the program that holds the block's full sums adds the rest and stores
        mask = m_ok[:, None] & n_ok[None, :]
        if HAS_BIAS:
            acc += tl.load(BIAS + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        if ACTIVATION == "gelu_tanh":
            acc = _gelu_tanh(acc)
        if HAS_RESIDUAL:   # rounded to Y's dtype first, as the unfused model stores the sub-layer's output
            r = tl.load(R + offs_m[:, None] * stride_rm + offs_n[None, :], mask=mask, other=0.0).to(tl.float32)
            acc = acc.to(Y.dtype.element_ty).to(tl.float32) + r
        tl.store(Y + offs_m[:, None] * stride_ym + offs_n[None, :], acc.to(Y.dtype.element_ty), mask=mask)


# ==================================================================== launch (given)
def choose_config(m: int, n: int, k: int, device: torch.device) -> tuple[int, int, int, int, int]:
    """(BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) for M rows of x and W [K, N]: 64 columns a
    program, BLOCK_K so that a slice's products stay 64 fp32 values a thread, and split-K until there are
    about two programs per SM (the interpreter: wide tiles, 2 splits). Shapes only: graph-safe."""
    bm = next_power_of_2(max(m, 1))
    if TRITON_INTERPRET or device.type != "cuda":
        bn, bk, sms = 128, 64, 1
    else:
        bn, bk = 64, max(8, 64 * 128 // (bm * 64))
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    slices = max(cdiv(k, bk), 1)
    splits = max(1, min(cdiv(2 * sms, cdiv(n, bn)), slices, 32))
    return bn, bk, cdiv(slices, cdiv(slices, splits)), 4, 1


def _check(x, w, bias, activation, residual, out) -> tuple[int, int, int, tuple]:
    """The checks of a gemv call (a clear error for a bad input): (M, N, K, the output's shape)."""
    check_tensor(x, "x", min_ndim=1)
    check_tensor(w, "w", ndim=2)
    check_same(x, w, "x, w")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")
    k, n = w.shape
    if x.shape[-1] != k:
        raise ValueError(f"x, w: inner dimensions differ: x {tuple(x.shape)} @ w {tuple(w.shape)}")
    if bias is not None:
        check_tensor(bias, "bias", dtypes=(x.dtype, torch.float32), ndim=1)
        check_same(x, bias, "x, bias", dtype=False)
        if bias.shape[0] != n or (bias.stride(0) != 1 and n > 1):
            raise ValueError(f"bias: expected a contiguous ({n},) vector to match w's N, got {tuple(bias.shape)} "
                             f"stride {bias.stride()}")
    m = math.prod(x.shape[:-1])
    if m > MAX_ROWS:
        raise ValueError(f"x: {m} rows; gemv takes at most {MAX_ROWS} (a decode step's batch). "
                         "More rows are a GEMM: use the a06 matmul")
    out_shape = (*x.shape[:-1], n)
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
    return m, n, k, out_shape


def gemv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None, *,
         residual: torch.Tensor | None = None, out: torch.Tensor | None = None,
         config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """``act(x @ w + bias) + residual`` for a few rows of x: the decode step's GEMMs, in one Triton kernel.

    x: [..., K] with at most MAX_ROWS (16) rows in all (leading dims flattened; a 2-D x may have any
    strides); w: [K, N], any strides (GPT-2's Conv1D weight [in, out], or the LM head's ``wte.t()``);
    bias: [N] contiguous, or None; x and w one dtype (fp32/fp16/bf16) on the kernel device, bias
    that dtype or fp32. activation: None or "gelu_tanh" (GPT-2's tanh GELU). ``residual``: [..., N] like
    the output, added after the activation to the product rounded to x's dtype (GPT-2's ``h + proj(a)``).
    Accumulates in fp32. Returns a new contiguous [..., N] tensor of x's dtype, or writes ``out``
    (contiguous, that shape and dtype; it may be ``residual`` itself) and returns it.

    ``config`` = (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages) overrides :func:`choose_config`.
    Split-K partial sums are combined in a fixed order: the same inputs give the same bits. No host
    sync: capturable in a CUDA graph.
    """
    m, n, k, out_shape = _check(x, w, bias, activation, residual, out)
    if out is None:
        out = x.new_empty(out_shape)
    if m == 0 or n == 0:
        return out
    cfg = choose_config(m, n, k, x.device) if config is None else tuple(config)
    if len(cfg) != 5:
        raise ValueError(f"config: expected (BLOCK_N, BLOCK_K, SPLIT_K, num_warps, num_stages), got {config}")
    bn, bk, splits, warps, stages = cfg
    if bn < 1 or bk < 1 or bn & (bn - 1) or bk & (bk - 1) or splits < 1:
        raise ValueError(f"config: BLOCK_N={bn} and BLOCK_K={bk} must be powers of 2 and SPLIT_K={splits} >= 1")
    x2 = x if x.dim() == 2 else x.reshape(m, k)
    y2 = out.view(m, n)
    r2 = y2 if residual is None else residual.reshape(m, n)
    if r2.stride(1) != 1 and n > 1:
        r2 = r2.contiguous()
    per = cdiv(cdiv(max(k, 1), bk), splits) * bk           # rows of W per split, whole slices
    grid = (cdiv(n, bn), splits)
    part = count = y2                                      # placeholders without split-K
    if splits > 1:   # the partial sums, and the device's ticket counters (0 between calls: the kernel resets them)
        part = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
        count = ticket_counters(x.device, grid[0])
    fast(_matvec_kernel)[grid](x2, w, bias if bias is not None else y2, r2, y2, part, count, m, n, k, per,
                               x2.stride(0), x2.stride(1), w.stride(0), w.stride(1), r2.stride(0), y2.stride(0),
                               HAS_BIAS=bias is not None, ACTIVATION=activation, HAS_RESIDUAL=residual is not None,
                               SPLIT_K=splits, BLOCK_M=next_power_of_2(m), BLOCK_N=bn, BLOCK_K=bk,
                               FENCE=not TRITON_INTERPRET, num_warps=warps, num_stages=stages)
    return out
