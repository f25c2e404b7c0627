"""Experiment (stage 6 floors, issue #12): which changes close the gaps of the Triton matmul to
cuBLAS at the shapes where lectures/results/a06_matmul_real_shapes.md has them NOT met. Each
variant is a self-contained copy of the shipped kernel (solutions/a06_matmul/matmul_triton.py)
with one change, run in its own process (a07_fwd_try.sh style: a hang or crash costs its time
limit only); every (shape, config) is checked against float64 on the GPU (sampled rows, all
columns) before it is timed by CUDA-graph replay (common.timing.bench_graph, L2 flushed), with
cuBLAS (torch.matmul) timed in the same process. Results: not yet run. What Triton 3.6 generates
for sm_90 for each variant (compiled on a CPU with --asm, and read): a06_try_asm.log.

  shipped     the solution's matmul(a, b), autotuned as in the sweep (the baseline)
  base        this file's copy of the shipped kernel at fixed configs (sanity: = shipped)
  tf32_kmaj   fp32: b given K-major (an [N, K] tensor's .t(), nn.Linear's layout): the ceiling
  tf32_cfg    fp32, b [K, N] N-major: other BLOCK_K / warps / stages than the shipped set
  tf32_swap   fp32, b N-major: C^T = B^T A^T, so b is wgmma's A operand, which may come from
              registers in any layout (rounded to TF32 by cvt.rna there), and a row-major a is the
              K-major B operand TF32 needs: every copy 16-byte cp.async (a06_try_asm.log)
  tf32_reg    fp32, b N-major: b goes through registers (rounded to TF32 by cvt.rna.tf32.f32),
              so it is loaded with 16-byte ld.global.v4 and transposed on the way to shared
              memory, instead of 4-byte cp.async per element (see --asm)
  splitk      few output tiles: SPLIT_K programs per tile over K, fp32 partials [SPLIT_K, M, N]
              summed (+ cast) by a second small kernel; MODE=2 configs use fp32 atomics into a
              zeroed workspace instead (memset + GEMM + cast kernel)
  bk128       16-bit: BLOCK_K = 128 configs (which _prune drops), smaller tiles
  tma         persistent, one program per SM, device-side TMA descriptors (tl.make_tensor_
              descriptor, Triton's 09-persistent-matmul tutorial); row strides must be 16-byte
              multiples, so aligned shapes only
  prefetch    unaligned strides: the next K slice is loaded into registers before this slice's
              tl.dot (manual double buffering); Triton does not pipeline 2-byte loads (no
              cp.async below 4 bytes), so without this every K step waits on memory
  recomp      unaligned strides: int32 offsets kept across the K loop and pointers formed per
              slice (unaligned loads are one 64-bit pointer per element: 128-wide tiles spill)
  unal_cfg    the shipped kernel at the same configs as prefetch/recomp (their control)
  gemv        M = 1 (decode lm-head): no tensor cores, fp32 FMA + tl.sum over K, wide N tiles
  pad         data point only (the course rules it out): copy a, b into 16-byte-aligned padded
              buffers, run the aligned kernel, copy c out; the copies are timed
  tma_ws      tma with tl.range(warp_specialize=True), run last (it hung in stage 7)

    python3 lectures/results/experiments/a06_try.py --check            # CPU: interpreter checks, all variants
    python3 lectures/results/experiments/a06_try.py --asm               # CPU or GPU: sm_90 TTGIR/PTX reading
    python3 lectures/results/experiments/a06_try.py --time splitk --csv X  # GPU: one variant, rows appended to X
    python3 lectures/results/experiments/a06_try.py --table X            # the compact table of X
    python3 lectures/results/experiments/a06_try.py --time splitk --csv X --tiny   # CPU smoke run of that path
    OUT=/some/dir bash lectures/results/experiments/a06_try.sh          # the whole H100 run (< 8 min)
"""
import csv
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
ASM = "--asm" in sys.argv
if ASM:
    os.environ.setdefault("TRITON_INTERPRET", "0")    # compile for sm_90 even on a CPU machine
import common  # noqa: E402,F401  (on a CPU without --asm: TRITON_INTERPRET=1)
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

INTERP = os.environ.get("TRITON_INTERPRET", "0") == "1"
GPU = torch.cuda.is_available()


# ------------------------------------------------------------------------------------- kernels
@triton.jit
def _tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    first_pid_m = (pid // num_pid_in_group) * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + (pid % num_pid_in_group) % group_size_m
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _tf32_round(x):
    # round-to-nearest to TF32 (what cuBLAS does to fp32 inputs); the result stays in registers
    return tl.inline_asm_elementwise("cvt.rna.tf32.f32 $0, $1;", "=r,r", [x.to(tl.uint32, bitcast=True)],
                                     dtype=tl.uint32, is_pure=True, pack=1).to(tl.float32, bitcast=True)


@triton.jit
def _mm(a_ptr, b_ptr, c_ptr, ws_ptr, M, N, K,
        stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
        INPUT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, DOT_FP32: tl.constexpr,
        SPLIT_K: tl.constexpr, MODE: tl.constexpr, PREFETCH: tl.constexpr, B_CVT: tl.constexpr,
        RECOMP: tl.constexpr = False):
    """The shipped kernel (no bias/GELU) plus: split-K over program_id(1) (MODE 0: store C;
    1: store the fp32 partial to ws[pid_k]; 2: atomic-add it into ws), PREFETCH (next K slice
    into registers before this slice's dot), B_CVT (b through registers, rounded to TF32),
    RECOMP (int32 offsets kept across the loop, pointers formed per K slice: unaligned loads
    are one 64-bit pointer per element, two registers each, and spill at 128-wide tiles)."""
    pid_m, pid_n = _tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    k_tiles = tl.cdiv(K, BLOCK_K)
    per = tl.cdiv(k_tiles, SPLIT_K)
    kt0 = pid_k * per
    kt1 = tl.minimum(kt0 + per, k_tiles)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (offs_m % M)[:, None] * stride_am + (kt0 * BLOCK_K + offs_k)[None, :] * stride_ak
    b_ptrs = b_ptr + (kt0 * BLOCK_K + offs_k)[:, None] * stride_bk + (offs_n % N)[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if PREFETCH:
        k_left = K - kt0 * BLOCK_K
        a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
        b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        for kt in range(kt0, kt1):
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
            k_left = K - (kt + 1) * BLOCK_K          # <= 0 past K: the last prefetch loads nothing
            a_n = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b_n = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            if DOT_FP32:
                acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=INPUT_PRECISION)
            else:
                acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
            a = a_n
            b = b_n
    elif RECOMP:
        a_off = (offs_m % M)[:, None] * stride_am + offs_k[None, :] * stride_ak
        b_off = offs_k[:, None] * stride_bk + (offs_n % N)[None, :] * stride_bn
        for kt in range(kt0, kt1):
            k_left = K - kt * BLOCK_K
            a = tl.load(a_ptr + kt * BLOCK_K * stride_ak + a_off, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptr + kt * BLOCK_K * stride_bk + b_off, mask=offs_k[:, None] < k_left, other=0.0)
            if DOT_FP32:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
    else:
        for kt in range(kt0, kt1):
            if EVEN_K:
                a = tl.load(a_ptrs)
                b = tl.load(b_ptrs)
            else:
                k_left = K - kt * BLOCK_K
                a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
                b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            if B_CVT:
                b = _tf32_round(b)
            if DOT_FP32:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    if MODE == 0:
        c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
        tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)
    elif MODE == 1:
        w_ptrs = ws_ptr + pid_k.to(tl.int64) * M * N + offs_m[:, None] * N + offs_n[None, :]
        tl.store(w_ptrs, acc, mask=mask)
    else:
        tl.atomic_add(ws_ptr + offs_m[:, None] * N + offs_n[None, :], acc, mask=mask, sem="relaxed")


@triton.jit
def _mm_swap(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
             EVEN_K: tl.constexpr, CVT: tl.constexpr, DOT_FP32: tl.constexpr):
    """fp32 (TF32) with b N-major, operands swapped: the tile of C^T = B^T A^T. TF32 wgmma reads an
    operand in shared memory K-major only, but its A operand may come from registers in any
    layout: B^T goes there (rounded to TF32 by cvt.rna on the way, CVT, which also keeps it in
    registers), and a row-major a is K-major as the B operand. Both copies are then 16-byte
    cp.async (a06_try_asm.log); the accumulator is [BLOCK_N, BLOCK_M], stored transposed."""
    pid_m, pid_n = _tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    bt_ptrs = b_ptr + (offs_n % N)[:, None] * stride_bn + offs_k[None, :] * stride_bk    # [BLOCK_N, BLOCK_K]
    at_ptrs = a_ptr + offs_k[:, None] * stride_ak + (offs_m % M)[None, :] * stride_am    # [BLOCK_K, BLOCK_M]
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for kt in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            bt = tl.load(bt_ptrs)
            at = tl.load(at_ptrs)
        else:
            k_left = K - kt * BLOCK_K
            bt = tl.load(bt_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            at = tl.load(at_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if CVT:
            bt = _tf32_round(bt)
        if DOT_FP32:
            bt = bt.to(tl.float32)
            at = at.to(tl.float32)
        acc = tl.dot(bt, at, acc, input_precision="tf32")
        bt_ptrs += BLOCK_K * stride_bk
        at_ptrs += BLOCK_K * stride_ak
    c_ptrs = c_ptr + offs_n[:, None] * stride_cn + offs_m[None, :] * stride_cm
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(offs_n[:, None] < N) & (offs_m[None, :] < M))


@triton.jit
def _reduce(ws_ptr, c_ptr, M, N, stride_cm, stride_cn, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    """c = cast(sum over s of ws[s]) (split-K's second kernel; where a bias/GELU would go)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < M * N
    acc = tl.zeros([BLOCK], tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0)
    tl.store(c_ptr + (offs // N) * stride_cm + (offs % N) * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _mm_tma(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_bn, stride_cm,
            INPUT_PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
            GROUP_M: tl.constexpr, NUM_SMS: tl.constexpr, B_KMAJOR: tl.constexpr, WS: tl.constexpr,
            DOT_FP32: tl.constexpr):
    """Persistent (grid = min(#SMs, #tiles)), tiles in grouped order, TMA descriptors made on the
    device (inner strides 1, outer strides 16-byte multiples); TMA zero-fills out-of-range
    loads and clips stores, so no masks. After Triton's 09-persistent-matmul tutorial."""
    start_pid = tl.program_id(0)
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
    if B_KMAJOR:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, 1], block_shape=[BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1], block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1], block_shape=[BLOCK_M, BLOCK_N])
    tile_id_c = start_pid - NUM_SMS
    for tile_id in tl.range(start_pid, num_tiles, NUM_SMS, flatten=False, warp_specialize=WS):
        pid_m, pid_n = _tile(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            if B_KMAJOR:
                b = b_desc.load([pid_n * BLOCK_N, ki * BLOCK_K]).T
            else:
                b = b_desc.load([ki * BLOCK_K, pid_n * BLOCK_N])
            if DOT_FP32:
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)
        tile_id_c += NUM_SMS   # as the tutorial: the epilogue's tile from its own counter
        pid_mc, pid_nc = _tile(tile_id_c, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        c_desc.store([pid_mc * BLOCK_M, pid_nc * BLOCK_N], acc.to(c_ptr.dtype.element_ty))


@triton.jit
def _gemv(a_ptr, b_ptr, c_ptr, N, K, stride_ak, stride_bk, stride_bn,
          BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """c[0, :] = a[0, :] @ b for M = 1: fp32 FMAs and a sum over K, no tensor cores."""
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + (offs_n % N)[None, :] * stride_bn
    acc = tl.zeros([BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kmask = offs_k < K - k0
        a = tl.load(a_ptr + (k0 + offs_k) * stride_ak, mask=kmask, other=0.0).to(tl.float32)
        b = tl.load(b_ptrs, mask=kmask[:, None], other=0.0).to(tl.float32)
        acc += tl.sum(a[:, None] * b, 0)
        b_ptrs += BLOCK_K * stride_bk
    tl.store(c_ptr + offs_n, acc.to(c_ptr.dtype.element_ty), mask=offs_n < N)


# ------------------------------------------------------------------------------------ launchers
# Each variant is run(a, b, cfg, L) -> c; L(kernel, grid, args, consts, warps, stages) launches a
# kernel (or, with --asm, compiles it for sm_90 and reads the result). cfg: dict with
# BM, BN, BK, w, s and the variant's extras.
def _launch(kernel, grid, args, consts, warps, stages):
    kernel[grid](*args, **consts, num_warps=warps, num_stages=stages)


def _prec(a):
    return "tf32" if a.dtype == torch.float32 else "ieee"


def _dot_fp32(a):
    return INTERP and a.dtype != torch.float32   # the interpreter's bf16 tl.dot is wrong in Triton 3.6


def run_mm(a, b, cfg, L, prefetch=False, b_cvt=False, recomp=False):
    m, k = a.shape
    n = b.shape[1]
    sk, mode = cfg.get("SK", 1), cfg.get("MODE", 0)
    c = torch.empty(m, n, device=a.device, dtype=a.dtype)
    if sk == 1:
        ws = c
    elif mode == 1:
        ws = torch.empty(sk, m, n, device=a.device, dtype=torch.float32)
    else:
        ws = torch.zeros(m, n, device=a.device, dtype=torch.float32)
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn), sk)
    L(_mm, grid, [a, b, c, ws, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1)],
      dict(INPUT_PRECISION=_prec(a), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, EVEN_K=k % bk == 0,
           DOT_FP32=_dot_fp32(a), SPLIT_K=sk, MODE=mode if sk > 1 else 0, PREFETCH=prefetch,
           B_CVT=b_cvt and not INTERP and a.dtype == torch.float32, RECOMP=recomp), cfg["w"], cfg["s"])
    if sk > 1:
        nred = sk if mode == 1 else 1
        L(_reduce, (triton.cdiv(m * n, 1024),), [ws, c, m, n, c.stride(0), c.stride(1)],
          dict(SPLIT_K=nred, BLOCK=1024), 4, 1)
    return c


def run_swap(a, b, cfg, L):
    """fp32 only (the variant's shapes): C^T = B^T A^T, B^T through registers (see _mm_swap)."""
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty(m, n, device=a.device, dtype=a.dtype)
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    L(_mm_swap, (triton.cdiv(m, bm) * triton.cdiv(n, bn),),
      [a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1)],
      dict(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, EVEN_K=k % bk == 0,
           CVT=not INTERP and a.dtype == torch.float32, DOT_FP32=_dot_fp32(a)), cfg["w"], cfg["s"])
    return c


_NUM_SMS = [None]


def _sms():
    if _NUM_SMS[0] is None:
        _NUM_SMS[0] = torch.cuda.get_device_properties(0).multi_processor_count if GPU else 132
        if GPU:
            triton.set_allocator(lambda size, align, stream: torch.empty(size, device="cuda", dtype=torch.int8))
    return _NUM_SMS[0]


def run_tma(a, b, cfg, L, ws=False):
    m, k = a.shape
    n = b.shape[1]
    kmaj = b.stride(0) == 1 and b.stride(1) != 1
    c = torch.empty(m, n, device=a.device, dtype=a.dtype)
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    sms = _sms() if not INTERP else 4
    grid = (min(sms, triton.cdiv(m, bm) * triton.cdiv(n, bn)),)
    L(_mm_tma, grid, [a, b, c, m, n, k, a.stride(0), b.stride(0), b.stride(1), c.stride(0)],
      dict(INPUT_PRECISION=_prec(a), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, NUM_SMS=grid[0],
           B_KMAJOR=kmaj, WS=ws, DOT_FP32=_dot_fp32(a)), cfg["w"], cfg["s"])
    return c


def run_gemv(a, b, cfg, L):
    k, n = b.shape
    c = torch.empty(1, n, device=a.device, dtype=a.dtype)
    L(_gemv, (triton.cdiv(n, cfg["BN"]),), [a, b, c, n, k, a.stride(1), b.stride(0), b.stride(1)],
      dict(BLOCK_N=cfg["BN"], BLOCK_K=cfg["BK"]), cfg["w"], cfg["s"])
    return c


def _pad8(x):
    """x in a buffer whose row stride is a multiple of 8 elements (16 bytes), as a view."""
    r, cols = x.shape
    buf = torch.empty(r, (cols + 7) // 8 * 8, device=x.device, dtype=x.dtype)
    v = buf[:, :cols]
    v.copy_(x)
    return v


def run_pad(a, b, cfg, L):
    m, k = a.shape
    n = b.shape[1]
    ap, bp = _pad8(a), _pad8(b)
    cp = torch.empty(m, (n + 7) // 8 * 8, device=a.device, dtype=a.dtype)[:, :n]
    bm, bn, bk = cfg["BM"], cfg["BN"], cfg["BK"]
    L(_mm, (triton.cdiv(m, bm) * triton.cdiv(n, bn), 1),
      [ap, bp, cp, cp, m, n, k, ap.stride(0), ap.stride(1), bp.stride(0), bp.stride(1), cp.stride(0), cp.stride(1)],
      dict(INPUT_PRECISION=_prec(a), BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, EVEN_K=k % bk == 0,
           DOT_FP32=_dot_fp32(a), SPLIT_K=1, MODE=0, PREFETCH=False, B_CVT=False), cfg["w"], cfg["s"])
    return cp.contiguous()


def run_shipped(a, b, cfg, L):
    from solutions.a06_matmul.matmul_triton import matmul
    return matmul(a, b)


# ------------------------------------------------------------------------------ shapes, configs
BF, F32 = torch.bfloat16, torch.float32
#: name -> (M, K, N, dtype): x [M, K] @ W [K, N], the worst shapes of the sweep and healthy ones
SHAPES = {
    "mlp-down T=512": (512, 3072, 768, BF), "mlp-down T=1023": (1023, 3072, 768, BF),
    "qkv T=2048": (2048, 768, 2304, BF), "qkv T=4097": (4097, 768, 2304, BF),
    "mlp-down T=4097": (4097, 3072, 768, BF),
    "mlp-up T=8192": (8192, 768, 3072, BF), "4096^3": (4096, 4096, 4096, BF),            # healthy
    "lm-head T=1": (1, 768, 50257, BF), "1793^3": (1793, 1793, 1793, BF),               # unaligned
    "lm-head T=1 wte.t()": (1, 768, 50257, BF),   # b K-major as stage 8 passes it: aligned loads, unaligned C
    "4097^3": (4097, 4097, 4097, BF), "3000x1000x777": (3000, 1000, 777, BF),
    "f32 mlp-down T=2048": (2048, 3072, 768, F32), "f32 qkv T=2048": (2048, 768, 2304, F32),
    "f32 mlp-up T=2048": (2048, 768, 3072, F32), "f32 1793^3": (1793, 1793, 1793, F32),
}
FEW = ["mlp-down T=512", "mlp-down T=1023", "qkv T=2048", "qkv T=4097", "mlp-down T=4097"]
HEALTHY = ["mlp-up T=8192", "4096^3"]
UNAL = ["lm-head T=1", "1793^3", "4097^3", "3000x1000x777"]
FP32 = ["f32 mlp-down T=2048", "f32 qkv T=2048", "f32 mlp-up T=2048", "f32 1793^3"]


def C(bm, bn, bk, w, s, **kw):
    return dict(BM=bm, BN=bn, BK=bk, w=w, s=s, **kw)


def label(cfg):
    x = f"{cfg['BM']}x{cfg['BN']}x{cfg['BK']} w{cfg['w']}s{cfg['s']}"
    if cfg.get("SK", 1) > 1:
        x += f" sk{cfg['SK']}" + (" atomic" if cfg.get("MODE") == 2 else "")
    return x


_UNAL_CFGS = [C(128, 128, 32, 8, 1), C(128, 128, 64, 8, 1), C(64, 128, 32, 4, 1), C(128, 256, 32, 8, 1),
              C(128, 128, 32, 8, 3)]   # 1 stage: 2-byte loads are not pipelined anyway; s3 checks that
#: M <= 64 with unaligned b: per-thread tiles small enough not to spill (16x128x128 spills 0.5-10 KB)
_SKINNY_CFGS = [C(16, 64, 64, 4, 1), C(16, 128, 32, 4, 1), C(16, 32, 128, 4, 1), C(16, 128, 64, 8, 1)]
_TF32_CFGS = [C(128, 128, 32, 8, 3), C(128, 256, 32, 8, 3), C(128, 128, 32, 4, 4), C(128, 128, 64, 8, 3)]


def _unal(m, dt):
    return _SKINNY_CFGS if m <= 64 else _UNAL_CFGS


def _unal4(m, dt):   # recomp / prefetch: the same minus the s3 check
    return _SKINNY_CFGS if m <= 64 else _UNAL_CFGS[:4]


def _by_dtype(bf16, f32):
    return lambda m, dt: f32 if dt == torch.float32 else bf16


#: name -> (run, shapes, GPU configs: a list or f(M, dtype) -> list, CPU-check configs)
VARIANTS = {
    "shipped": (run_shipped, FEW + HEALTHY + UNAL + ["lm-head T=1 wte.t()"] + FP32, [C(0, 0, 0, 0, 0)],
                [C(0, 0, 0, 0, 0)]),
    "base": (run_mm, FEW + HEALTHY,
             [C(128, 128, 64, 8, 4), C(128, 256, 64, 8, 3)], [C(32, 32, 32, 4, 1)]),
    "tf32_kmaj": (run_mm, FP32, _TF32_CFGS, [C(32, 32, 32, 4, 1)]),
    "tf32_cfg": (run_mm, FP32, [C(128, 128, 16, 8, 5), C(128, 256, 16, 8, 4), C(64, 256, 32, 8, 3),
                                C(128, 128, 32, 4, 2)], [C(32, 32, 16, 4, 1)]),
    "tf32_reg": (lambda a, b, cfg, L: run_mm(a, b, cfg, L, b_cvt=True), FP32, _TF32_CFGS, [C(32, 32, 32, 4, 1)]),
    "tf32_swap": (run_swap, FP32, [C(128, 128, 32, 8, 3), C(128, 256, 32, 8, 3), C(256, 128, 32, 8, 3),
                                   C(128, 128, 32, 4, 4), C(64, 128, 32, 4, 4)], [C(32, 32, 32, 4, 1)]),
    "splitk": (run_mm, FEW + ["f32 mlp-down T=2048"], _by_dtype(
        [C(128, 128, 64, 8, 4, SK=2, MODE=1), C(128, 128, 64, 8, 4, SK=3, MODE=1), C(128, 128, 64, 8, 4, SK=4, MODE=1),
         C(64, 128, 64, 4, 4, SK=2, MODE=1), C(128, 64, 64, 4, 4, SK=4, MODE=1), C(128, 128, 64, 8, 4, SK=3, MODE=2)],
        [C(128, 128, 32, 8, 3, SK=2, MODE=1), C(128, 128, 32, 8, 3, SK=3, MODE=1), C(128, 128, 32, 8, 3, SK=4, MODE=1),
         C(128, 128, 32, 8, 3, SK=3, MODE=2)]),
        [C(32, 32, 32, 4, 1, SK=3, MODE=1), C(32, 32, 16, 4, 1, SK=2, MODE=2)]),
    "bk128": (run_mm, FEW + HEALTHY, [C(128, 128, 128, 8, 3), C(64, 128, 128, 4, 4), C(128, 64, 128, 4, 4),
                                      C(128, 256, 128, 8, 2)], [C(32, 32, 64, 4, 1)]),
    "tma": (run_tma, FEW + HEALTHY + ["f32 mlp-down T=2048", "f32 qkv T=2048"], _by_dtype(
        [C(128, 256, 64, 8, 3), C(128, 128, 64, 8, 4), C(128, 128, 128, 8, 3), C(64, 128, 64, 4, 4)],
        [C(128, 128, 32, 8, 3), C(128, 256, 32, 8, 2), C(64, 128, 32, 4, 4)]),
        [C(32, 32, 32, 4, 2)]),
    "prefetch": (lambda a, b, cfg, L: run_mm(a, b, cfg, L, prefetch=True), UNAL + ["f32 1793^3"], _unal4,
                 [C(32, 32, 32, 4, 1)]),
    "recomp": (lambda a, b, cfg, L: run_mm(a, b, cfg, L, recomp=True), UNAL + ["f32 1793^3"], _unal4,
               [C(32, 32, 32, 4, 1)]),
    "unal_cfg": (run_mm, UNAL + ["lm-head T=1 wte.t()", "f32 1793^3"], _unal, [C(32, 32, 32, 4, 1)]),
    "gemv": (run_gemv, ["lm-head T=1", "lm-head T=1 wte.t()"], [C(1, 128, 32, 4, 1), C(1, 256, 32, 8, 1), C(1, 64, 64, 4, 1),
                                                                C(1, 128, 64, 8, 1)], [C(1, 32, 32, 4, 1)]),
    "pad": (run_pad, UNAL, lambda m, dt: [C(16, 64, 128, 4, 3)] if m <= 64 else [C(128, 256, 64, 8, 3), C(128, 128, 64, 8, 4)],
            [C(32, 32, 32, 4, 1)]),
    "tma_ws": (lambda a, b, cfg, L: run_tma(a, b, cfg, L, ws=True), FEW + HEALTHY,
               [C(128, 256, 64, 8, 3), C(128, 128, 64, 8, 4)], [C(32, 32, 32, 4, 2)]),
}


def configs(name, m, dt):
    c = VARIANTS[name][2]
    return c(m, dt) if callable(c) else c


def operands(name, device, gen=None):
    m, k, n, dt = SHAPES[name]
    a = torch.randn(m, k, device=device, generator=gen).to(dt)
    b = torch.randn(k, n, device=device, generator=gen).to(dt)
    return a, (kmajor(b) if "wte.t()" in name else b)


def kmajor(b):
    """The same values as b [K, N], stored K-major (an [N, K] tensor's .t())."""
    return b.t().contiguous().t()


def rel_err_rows(c, a, b, rows, ref=None):
    if ref is None:
        ref = a[rows].double() @ b.double()
    got = c[rows].double()
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def sample_rows(m, device):
    g = torch.Generator(device="cpu").manual_seed(m)
    r = torch.cat([torch.arange(min(m, 128)), torch.arange(max(0, m - 128), m), torch.randint(0, m, (256,), generator=g)])
    return torch.unique(r).to(device)


TOL = 1e-2   # relative Frobenius error to float64 (bf16 outputs: ~2-4e-3 when right; TF32 ~1e-3)


# ------------------------------------------------------------------------------------ GPU timing
def time_variant(name, csv_path):
    from common.roofline import matmul_flops
    from common.timing import bench_graph
    run, shapes, cfgs, _ = VARIANTS[name]
    dev = "cuda" if GPU else "cpu"
    if GPU:
        sync = torch.cuda.synchronize
    else:   # --tiny smoke run of this code path under the interpreter (CPU wall clock, numbers meaningless)
        from common.timing import bench_cpu
        bench_graph = lambda fn, rep_ms=0, check=None: bench_cpu(fn, warmup=0, rep=1)  # noqa: E731
        sync = lambda: None  # noqa: E731
    fields = ["variant", "shape", "dtype", "M", "K", "N", "config", "ms", "tflops", "cublas_ms", "ratio", "err", "status"]
    new = not Path(csv_path).exists()
    f = open(csv_path, "a", newline="")
    w = csv.DictWriter(f, fieldnames=fields)
    if new:
        w.writeheader()
    t_start = time.time()
    for sh in shapes:
        m, k, n, dt = SHAPES[sh]
        torch.manual_seed(0)
        a, b = operands(sh, dev)
        if name == "tf32_kmaj":
            b = kmajor(b)
        rows = sample_rows(m, dev)
        ref = a[rows].double() @ b.double()    # float64 on the GPU, once per shape
        torch.backends.cuda.matmul.allow_tf32 = dt == torch.float32
        t_cub = bench_graph(lambda: torch.matmul(a, b), rep_ms=50).median_ms
        if name == "tf32_kmaj":   # and the layout the sweep timed, for the ratio
            bn_ = b.contiguous()
            t_cub_n = bench_graph(lambda: torch.matmul(a, bn_), rep_ms=50).median_ms
            print(f"[try] cuBLAS {sh}: b K-major {t_cub:.4f} ms, b N-major {t_cub_n:.4f} ms", flush=True)
            t_cub = t_cub_n
        fl = matmul_flops(m, n, k)
        row0 = dict(variant=name, shape=sh, dtype=str(dt).replace("torch.", ""), M=m, K=k, N=n)
        w.writerow(dict(row0, variant="cuBLAS", config="", ms=f"{t_cub:.5f}", tflops=f"{fl / t_cub / 1e9:.1f}",
                        cublas_ms=f"{t_cub:.5f}", ratio="1.00", err="", status="ok"))
        for cfg in configs(name, m, dt):
            lab = "autotuned" if name == "shipped" else label(cfg)
            fn = lambda: run(a, b, cfg, _launch)  # noqa: E731
            t0 = time.time()
            try:
                out = fn()
                sync()
                err = rel_err_rows(out, a, b, rows, ref)
            except Exception as e:  # a config that does not compile / launch: say so, go on
                msg = f"{type(e).__name__}: {str(e).splitlines()[0][:150] if str(e) else ''}"
                print(f"[try] {name:9s} {sh:20s} {lab:24s} FAILED {msg}", flush=True)
                w.writerow(dict(row0, config=lab, status="FAILED " + msg.replace(",", ";")))
                f.flush()
                continue
            t1 = time.time()
            if not err <= TOL:
                print(f"[try] {name:9s} {sh:20s} {lab:24s} WRONG err {err:.1e}", flush=True)
                w.writerow(dict(row0, config=lab, err=f"{err:.1e}", status="WRONG"))
                f.flush()
                continue

            def chk(o):
                e = rel_err_rows(o, a, b, rows, ref)
                if not e <= TOL:
                    raise AssertionError(f"graph replay output wrong: {e:.1e}")
            try:
                ms = bench_graph(fn, rep_ms=50, check=chk).median_ms
            except Exception as e:
                print(f"[try] {name:9s} {sh:20s} {lab:24s} FAILED in timing: {e}", flush=True)
                w.writerow(dict(row0, config=lab, err=f"{err:.1e}", status="FAILED timing"))
                f.flush()
                continue
            print(f"[try] {name:9s} {sh:20s} {lab:24s} {fl / ms / 1e9:7.1f} TFLOP/s  cuBLAS {fl / t_cub / 1e9:7.1f}  "
                  f"ratio {t_cub / ms:5.2f}x  err {err:.1e}  (first call {t1 - t0:.1f} s)", flush=True)
            w.writerow(dict(row0, config=lab, ms=f"{ms:.5f}", tflops=f"{fl / ms / 1e9:.1f}", cublas_ms=f"{t_cub:.5f}",
                            ratio=f"{t_cub / ms:.3f}", err=f"{err:.1e}", status="ok"))
            f.flush()
        torch.backends.cuda.matmul.allow_tf32 = False
        del a, b, ref
    print(f"[try] {name}: done in {time.time() - t_start:.0f} s", flush=True)


def table(csv_path, md_path=None):
    """Best config per (variant, shape): TFLOP/s, ratio to cuBLAS (same process), correct?"""
    rows = list(csv.DictReader(open(csv_path)))
    best, seen = {}, {}
    for r in rows:
        if r["variant"] == "cuBLAS":
            continue
        key = (r["variant"], r["shape"])
        seen.setdefault(key, []).append(r["status"])
        if r["status"] == "ok" and (key not in best or float(r["ms"]) < float(best[key]["ms"])):
            best[key] = r
    lines = ["| variant | shape | config | TFLOP/s | cuBLAS TFLOP/s | ratio | correct? |", "|---|---|---|---|---|---|---|"]
    for key in sorted(seen, key=lambda x: (list(SHAPES).index(x[1]) if x[1] in SHAPES else 99, x[0])):
        st = seen[key]
        if key in best:
            r = best[key]
            fl = 2.0 * int(r["M"]) * int(r["N"]) * int(r["K"])
            lines.append(f"| {key[0]} | {key[1]} | {r['config']} | {r['tflops']} | {fl / float(r['cublas_ms']) / 1e9:.1f} | "
                         f"{float(r['ratio']):.2f}x | yes ({st.count('ok')}/{len(st)} configs ok) |")
        else:
            lines.append(f"| {key[0]} | {key[1]} | - | - | - | - | no: {'; '.join(sorted(set(st)))[:80]} |")
    txt = "\n".join(lines)
    print(txt)
    if md_path:
        Path(md_path).write_text("# a06_try: best config per variant and shape\n\n" + txt + "\n")


# ------------------------------------------------------------------------------ CPU checks
CHECK_SHAPES = [(67, 129, 95), (64, 128, 96), (67, 136, 104), (1, 129, 95)]   # odd, even K, TMA-legal odd, one row


def check_all(names=None):
    """Every variant under the interpreter at small odd shapes, bf16 and fp32, b N-major (and
    K-major for tf32_kmaj), against float64. TMA descriptors and split-K atomics included."""
    bad = 0
    for name in names or VARIANTS:
        run, _, _, ccfgs = VARIANTS[name]
        for (m, k, n) in CHECK_SHAPES:
            if (m == 1) != (name == "gemv") and name not in ("shipped", "unal_cfg", "prefetch", "pad", "splitk"):
                continue
            if name == "gemv" and m != 1:
                continue
            for dt in (torch.bfloat16, torch.float32):
                for cfg in ccfgs:
                    g = torch.Generator().manual_seed(1)
                    a = torch.randn(m, k, generator=g).to(dt)
                    b = torch.randn(k, n, generator=g).to(dt)
                    if name == "tf32_kmaj":
                        b = kmajor(b)
                    if name.startswith("tma") and (k * a.element_size() % 16 or n * b.element_size() % 16):
                        continue   # TMA needs 16-byte row strides: aligned shapes only
                    t0 = time.time()
                    c = run(a, b, cfg, _launch)
                    err = rel_err_rows(c, a, b, torch.arange(m))
                    ok = err <= TOL and c.shape == (m, n)
                    bad += not ok
                    print(f"[check] {name:9s} {m}x{k}x{n} {str(dt)[6:]:8s} {label(cfg):22s} err {err:.1e} "
                          f"{'ok' if ok else 'WRONG'} ({time.time() - t0:.1f} s)", flush=True)
    print(f"[check] {'all ok' if not bad else f'{bad} WRONG'}")
    return bad


# ------------------------------------------------------------------------------ sm_90 reading
def _sig(kernel, args, consts):
    sig, attrs, cons = {}, {}, dict(consts)
    names = [n for n in kernel.arg_names if n not in consts]
    for i, (nm, v) in enumerate(zip(names, args)):
        if isinstance(v, torch.Tensor):
            sig[nm] = "*" + {torch.bfloat16: "bf16", torch.float32: "fp32", torch.float16: "fp16"}[v.dtype]
            attrs[(kernel.arg_names.index(nm),)] = [["tt.divisibility", 16]]
        elif isinstance(v, bool):
            sig[nm] = "i1"
        elif v == 1:
            sig[nm], cons[nm] = "constexpr", 1
        else:
            sig[nm] = "i32"
            if v % 16 == 0:
                attrs[(kernel.arg_names.index(nm),)] = [["tt.divisibility", 16]]
    for nm in consts:
        sig[nm] = "constexpr"
    return sig, cons, attrs


def asm_report(names=None, save_dir=None):
    """Compile each variant's GPU configs for sm_90 (no GPU needed) at one aligned and one
    unaligned shape and count what matters in the PTX: wgmma vs mma.sync, cp.async width,
    ld.global width, register spills (ptxas -v)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    target = GPUTarget("cuda", 90, 32)
    done = set()

    def L(kernel, grid, args, consts, warps, stages):
        sig, cons, attrs = _sig(kernel, args, consts)
        key = (kernel.__name__, str(sig), str(sorted(cons.items())), str(attrs), warps, stages)
        if key in done:
            return
        done.add(key)
        t0 = time.time()
        try:
            ck = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=cons, attrs=attrs), target=target,
                                options={"num_warps": warps, "num_stages": stages})
        except Exception as e:
            print(f"   {kernel.__name__} w{warps}s{stages}: COMPILE FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
            return
        dt = time.time() - t0
        ptx, ttgir = ck.asm["ptx"], ck.asm["ttgir"]
        cnt = lambda pat: len(re.findall(pat, ptx))  # noqa: E731
        from collections import Counter
        cp = Counter(int(x, 0) for x in re.findall(r"cp\.async\.c[ag]\.shared\.global\S*\s*\[[^\]]*\], \[[^\]]*\], (0x[0-9a-f]+|\d+)", ptx))
        cp = "/".join(str(cp.get(w, 0)) for w in (4, 8, 16))
        ldg = dict(Counter(re.findall(r"ld\.global[\w.:]*", ptx)))
        sts = dict(Counter(re.findall(r"st\.shared[\w.:]*", ptx)))
        spill = ""
        p = Path("/tmp/a06_try_asm.ptx")
        p.write_text(ptx)
        r = subprocess.run([str(ptxas), "-arch=sm_90a", "-v", str(p), "-o", "/dev/null"], capture_output=True, text=True)
        mm = re.search(r"Used (\d+) registers", r.stderr)
        ms = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", r.stderr)
        spill = f"regs {mm.group(1) if mm else '?'} spill {ms.group(1) + '/' + ms.group(2) if ms else '?'}"
        sh = sorted(set(re.findall(r"#ttg\.nvmma_shared<\{[^}]*\}>", ttgir)))
        sh = [s.replace("#ttg.nvmma_shared<{", "").replace("}>", "").replace("swizzlingByteWidth", "swz")
              .replace("elementBitWidth", "bits") for s in sh]
        n_wg, n_wait, n_sync = cnt(r"wgmma\.mma_async"), cnt(r"wgmma\.wait_group"), cnt(r"mma\.sync")
        n_tma, n_local = cnt(r"cp\.async\.bulk\.tensor"), cnt(r"ld\.local")
        tile = f"{consts['BLOCK_M']}x{consts['BLOCK_N']}x{consts['BLOCK_K']}" if "BLOCK_M" in consts else ""
        print(f"   {kernel.__name__} {tile} w{warps}s{stages}: compile {dt:.1f}s | wgmma {n_wg} (wait {n_wait}) "
              f"mma.sync {n_sync} | cp.async 4B/8B/16B {cp} | tma {n_tma} | ld.global {ldg} | st.shared {sts} | "
              f"ld.local {n_local} | {spill} | smem {ck.metadata.shared} | shared {sh}", flush=True)
        if save_dir:
            stem = f"{kernel.__name__}_{len(done)}"
            Path(save_dir, stem + ".ttgir").write_text(ttgir)
            Path(save_dir, stem + ".ptx").write_text(ptx)

    reps = {torch.bfloat16: [("aligned 2048x3072x768", (2048, 3072, 768)), ("unaligned 1793^3", (1793, 1793, 1793)),
                             ("M=1 768x50257", (1, 768, 50257))],
            torch.float32: [("aligned 2048x3072x768", (2048, 3072, 768)), ("unaligned 1793^3", (1793, 1793, 1793))]}
    for name in names or VARIANTS:
        if name == "shipped":
            continue
        run, shapes, cfgs, _ = VARIANTS[name]
        dts = sorted({SHAPES[s][3] for s in shapes}, key=str)
        for dt in dts:
            for desc, (m, k, n) in reps[dt]:
                if not any(SHAPES[s][3] == dt and (SHAPES[s][0] == 1 if m == 1 else SHAPES[s][0] > 1 and
                           ("unaligned" in desc) == (s in UNAL or "1793" in s)) for s in shapes):
                    continue
                a = torch.empty(m, k, device="meta", dtype=dt)
                b = torch.empty(k, n, device="meta", dtype=dt)
                if name == "tf32_kmaj":
                    b = torch.empty(n, k, device="meta", dtype=dt).t()
                for cfg in configs(name, m, dt):
                    print(f"[asm] {name} {str(dt)[6:]} {desc} {label(cfg)}", flush=True)
                    run(a, b, cfg, L)


if __name__ == "__main__":
    args = sys.argv[1:] + (["--tiny"] if os.environ.get("A06_TRY_TINY") == "1" else [])   # CPU smoke of the .sh
    if "--tiny" in args:   # CPU smoke run of --time: every shape cut to at most 67 x 136 x 104
        args.remove("--tiny")
        SHAPES.update({k: (min(m, 67), min(kk, 136), min(n, 104), dt) for k, (m, kk, n, dt) in SHAPES.items()})
    if args[:1] == ["--time"]:
        csv_path = args[args.index("--csv") + 1] if "--csv" in args else "a06_try.csv"
        time_variant(args[1], csv_path)
    elif args[:1] == ["--table"]:
        table(args[1], args[2] if len(args) > 2 else None)
    elif args[:1] == ["--asm"]:
        asm_report(args[1:] or None)
    elif args[:1] == ["--check"]:
        sys.exit(1 if check_all(args[1:] or None) else 0)
    else:
        print(__doc__)
