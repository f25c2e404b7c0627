"""Experiment (issue #12 floors): what closes the stage-7 gaps at the losing real shapes?

lectures/results/a07_real_shapes.md (H100, bf16, B·H·S ≈ 2^18) has the shipped Triton flash
attention at 0.64x SDPA forward (S=512 d=128) and 0.72x forward+backward (S=1000/1537 d=128
causal); floors 0.9x / 0.8x. The shipped block configs (flash_triton.CONFIGS) are one per head
dim, the winners at S = 4096. This script measures, at the worst shapes of that sweep
(S = 512, 1000, 1024, 1537, 2048 with d = 128, causal and not; d = 64 S = 512 causal; S = 4096
d = 128 as a no-regression check), with B·H as in the sweep (common.shapes.attention_batch):

  fwd     the shipped _attn_fwd over a grid of explicit configs (BLOCK_M {64,128} x BLOCK_N
          {32,64,128} x num_warps {4,8} x num_stages {2,3,4}, pruned: see fwd_grid())
  fwdvar  a copy of the shipped forward with three knobs (kernel _fwd_var), at two configs:
          order=1   grid (B·H, query tiles) instead of (query tiles, B·H): consecutive programs are
                    different heads, and with the causal reversal the longest tiles of ALL heads
                    start first (shipped: longest first within each head only)
          oneloop   causal / ragged: one masked loop over all key tiles instead of the mask-free
                    loop + masked band (at S = 512 a causal tile has 2-8 key tiles: two software
                    pipelines each pay their own prologue/drain)
          nolse     the LSE store left out (what the logsumexp store costs; not a usable kernel)
          base      the copy with the shipped knobs (must time as the shipped kernel)
  delta   the shipped _attn_bwd_delta at BLOCK_M 32/64/128 (its launch alone)
  dkdv    the shipped _attn_bwd_dkdv over a config grid, its launch alone (dkdv_grid())
  dq      the shipped _attn_bwd_dq over a config grid, its launch alone (dq_grid())
  fused   one dK/dV/dQ pass (kernel _bwd_fused: the dK/dV kernel also adds dS·K into an fp32 dQ
          buffer with relaxed atomics), with the delta pre-pass zeroing that buffer (_delta_zero)
          and a cast pass (_dq_cast): 3 launches, 5 products per tile pair instead of 7
  best    the best delta + dkdv + dq of this shape launched together (the whole backward)

Every variant is first run once into NaN-filled outputs and compared with a float64 reference
computed on the GPU for two of the B·H heads (the first and the last); off by more than TOL ->
WRONG, not timed. Times: triton.testing.do_bench medians (L2 flushed, warmup 5 ms, rep 25 ms,
the course autotuner's budget), SDPA (F.scaled_dot_product_attention; backward through
autograd.grad as in bench.py) in the same process. Rows are appended to $OUT/shapes_try.csv as
they are measured; --report prints the per-shape table (best vs shipped vs SDPA).

    OUT=DIR bash lectures/results/experiments/a07_shapes_try.sh               # H100: the whole run (3-4 min, 400 s at most)
    python3 lectures/results/experiments/a07_shapes_try.py --check            # CPU: interpreter checks (~80 s; GPU: ~100 compiles)
    TRITON_INTERPRET=0 python3 lectures/results/experiments/a07_shapes_try.py --regs [KINDS [DS]]   # CPU: sm_90 compiles
    python3 lectures/results/experiments/a07_shapes_try.py --warm 0 15        # GPU: compile shard 0 of 15 (no launches)
    python3 lectures/results/experiments/a07_shapes_try.py --time fwd|bwd     # GPU: time, rows to $OUT/shapes_try.csv
    python3 lectures/results/experiments/a07_shapes_try.py --report           # the tables from $OUT/shapes_try.csv
    (--time / --report with --tiny: two small shapes under the interpreter, a smoke test of the logic)

Budget (the .sh): ~270 distinct compiles (the grids below x 5 specializations: d = 128 causal or
not, S a multiple of 16 or not, plus d = 64 causal), ~2-5 s each, 15 processes in parallel (~80 s);
then ~380 forward and ~330 backward check+time runs of ~50-70 ms each (do_bench 5 + 25 ms).

Compile-time findings (--regs, sm_90a, Triton 3.6 + its ptxas, on a CPU machine; full list in
a07_shapes_try_regs.log): the shipped forward 128x64w8s3 is 182 registers, no spill, 128 KiB shared
memory, so 1 CTA per SM (256 threads x 182 registers, and the shared memory); 64x64w4 at 2-3
stages (196-206 registers, 80-112 KiB) fits 2 CTAs per SM and 64x32w4 (126-128 registers, 48-80
KiB) 2-4. At d = 128 the forward's 128x64 and 128x128 tiles with 4 warps spill (428-1992 bytes);
128x32w4 does not (254-255 registers). The shipped d = 128 dK/dV kernel 64x128w8s3 sits at 255
registers and spills 88 bytes when causal (36 at 2 stages); its 4-warp versions spill 1.6-3.3 KB.
The fused kernel's dQ adds compile to vectorized atom.global.gpu.relaxed.add.v4.f32 (4-32 of them
in the PTX); fused 32x128w8s2 at d = 128 is 232-242 registers, no spill.
"""
import csv
import math
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
if "--regs" not in sys.argv:
    import common  # noqa: E402,F401  (CPU: TRITON_INTERPRET=1)
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from solutions.a07_flash_attention import flash_triton as FT  # noqa: E402

LOG2E = 1.4426950408889634
OUT = Path(os.environ.get("OUT", "/tmp/a07_shapes"))
CSV = OUT / "shapes_try.csv"
TINY = "--tiny" in sys.argv   # --time/--report on a CPU: two small shapes, interpreter configs (a smoke test of the logic)
TOL = 2e-2   # bf16 vs float64 (the shipped kernels are at ~4e-3 on O, ~6e-3 on the gradients)


# =============================================================================== kernels
@triton.jit
def _fwd_var(Q, K, V, O, LSE,
             sqz, sqh, sqm, sqd, skz, skh, skn, skd, svz, svh, svn, svd, soz, soh, som, sod,
             H, N_Q, N_K, qk_scale,
             HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             ORDER: tl.constexpr, ONE_LOOP: tl.constexpr, STORE_LSE: tl.constexpr):
    """The shipped _attn_fwd (flash_triton.py) with three knobs (module docstring)."""
    if ORDER == 0:
        pid_m = tl.program_id(0)
        zh = tl.program_id(1)
        n_m = tl.num_programs(0)
    else:
        pid_m = tl.program_id(1)
        zh = tl.program_id(0)
        n_m = tl.num_programs(1)
    if CAUSAL:
        pid_m = n_m - 1 - pid_m
    z = (zh // H).to(tl.int64)
    h = (zh % H).to(tl.int64)
    Q += z * sqz + h * sqh
    K += z * skz + h * skh
    V += z * svz + h * svh
    O += z * soz + h * soh
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m < N_Q
    q = tl.load(Q + offs_m[:, None] * sqm + offs_d[None, :] * sqd, mask=row_ok[:, None], other=0.0)
    k_ptrs = K + offs_n[:, None] * skn + offs_d[None, :] * skd
    v_ptrs = V + offs_n[:, None] * svn + offs_d[None, :] * svd
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    shift = N_K - N_Q
    n_even = (N_K // BLOCK_N) * BLOCK_N
    if CAUSAL:
        hi = tl.minimum(N_K, m0 + BLOCK_M + shift)
        n_full = tl.minimum((tl.maximum(m0 + shift + 1, 0) // BLOCK_N) * BLOCK_N, n_even)
    else:
        hi = N_K
        n_full = n_even
    lo_mask = n_full
    if ONE_LOOP:
        lo_mask = n_full * 0
    else:
        for start_n in range(0, n_full, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            k = tl.load(k_ptrs + start_n * skn)
            qk = tl.dot(q, tl.trans(k))
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
            p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
            alpha = tl.math.exp2(m_i - m_ij)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptrs + start_n * svn)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_ij
    for start_n in range(lo_mask, hi, BLOCK_N):
        cols = start_n + offs_n
        col_ok = cols < N_K
        k = tl.load(k_ptrs + start_n * skn, mask=col_ok[:, None], other=0.0)
        qk = tl.dot(q, tl.trans(k))
        keep = col_ok[None, :]
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None] + shift)
        qk = tl.where(keep, qk * qk_scale, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs + start_n * svn, mask=col_ok[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_ij
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    acc = acc / l_safe[:, None]
    tl.store(O + offs_m[:, None] * som + offs_d[None, :] * sod, acc.to(O.dtype.element_ty), mask=row_ok[:, None])
    if STORE_LSE:
        lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) / 1.4426950408889634, float("-inf"))
        tl.store(LSE + zh.to(tl.int64) * N_Q + offs_m, lse, mask=row_ok)


@triton.jit
def _delta_zero(O, DO, DELTA, DQA, soz, soh, som, sod, sdz, sdh, sdm, sdd, H, N_Q,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """The shipped delta pre-pass, also zeroing the fused kernel's fp32 dQ buffer (no memset launch)."""
    zh = tl.program_id(1)
    z = (zh // H).to(tl.int64)
    h = (zh % H).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    row_ok = offs_m[:, None] < N_Q
    o = tl.load(O + z * soz + h * soh + offs_m[:, None] * som + offs_d[None, :] * sod, mask=row_ok, other=0.0)
    do = tl.load(DO + z * sdz + h * sdh + offs_m[:, None] * sdm + offs_d[None, :] * sdd, mask=row_ok, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(DELTA + zh.to(tl.int64) * N_Q + offs_m, delta, mask=offs_m < N_Q)
    out = zh.to(tl.int64) * N_Q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DQA + out, tl.zeros([BLOCK_M, HEAD_DIM], tl.float32), mask=row_ok)


@triton.jit
def _bwd_fused(Q, K, V, DO, LSE, DELTA, DK, DV, DQA,
               sqz, sqh, sqm, sqd, skz, skh, skn, skd, svz, svh, svn, svd, sdz, sdh, sdm, sdd,
               H, N_Q, N_K, sm_scale,
               HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The shipped _attn_bwd_dkdv plus dQA[rows] += dS·K (fp32, unscaled) per tile pair (relaxed atomics)."""
    pid_n = tl.program_id(0)
    zh = tl.program_id(1)
    z = (zh // H).to(tl.int64)
    h = (zh % H).to(tl.int64)
    Q += z * sqz + h * sqh
    K += z * skz + h * skh
    V += z * svz + h * svh
    DO += z * sdz + h * sdh
    LSE += zh.to(tl.int64) * N_Q
    DELTA += zh.to(tl.int64) * N_Q
    DQA += zh.to(tl.int64) * N_Q * HEAD_DIM
    n0 = pid_n * BLOCK_N
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, HEAD_DIM)
    col_ok = offs_n < N_K
    k = tl.load(K + offs_n[:, None] * skn + offs_d[None, :] * skd, mask=col_ok[:, None], other=0.0)
    v = tl.load(V + offs_n[:, None] * svn + offs_d[None, :] * svd, mask=col_ok[:, None], other=0.0)
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    qk_scale = sm_scale * 1.4426950408889634
    shift = N_K - N_Q
    if CAUSAL:
        lo = (tl.maximum(n0 - shift, 0) // BLOCK_M) * BLOCK_M
        mid = tl.maximum(((n0 + BLOCK_N - 1 - shift + BLOCK_M - 1) // BLOCK_M) * BLOCK_M, lo)
        mid = tl.minimum(mid, N_Q)
    else:
        lo = 0
        mid = 0
    for start_m in range(lo, mid, BLOCK_M):                    # diagonal band, masked
        rows = start_m + offs_m
        row_ok = rows < N_Q
        q = tl.load(Q + rows[:, None] * sqm + offs_d[None, :] * sqd, mask=row_ok[:, None], other=0.0)
        do = tl.load(DO + rows[:, None] * sdm + offs_d[None, :] * sdd, mask=row_ok[:, None], other=0.0)
        lse2 = tl.load(LSE + rows, mask=row_ok, other=float("inf")) * 1.4426950408889634
        delta = tl.load(DELTA + rows, mask=row_ok, other=0.0)
        qkT = tl.dot(k, tl.trans(q))
        pT = tl.math.exp2(qkT * qk_scale - lse2[None, :])
        pT = tl.where(offs_n[:, None] <= rows[None, :] + shift, pT, 0.0)
        dv = tl.dot(pT.to(do.dtype), do, dv)
        dpT = tl.dot(v, tl.trans(do))
        dsT = (pT * (dpT - delta[None, :])).to(q.dtype)
        dk = tl.dot(dsT, q, dk)
        dq = tl.dot(tl.trans(dsT), k)
        tl.atomic_add(DQA + rows[:, None] * HEAD_DIM + offs_d[None, :], dq, mask=row_ok[:, None], sem="relaxed")
    for start_m in range(mid, N_Q, BLOCK_M):                   # every row sees every key here
        rows = start_m + offs_m
        row_ok = rows < N_Q
        q = tl.load(Q + rows[:, None] * sqm + offs_d[None, :] * sqd, mask=row_ok[:, None], other=0.0)
        do = tl.load(DO + rows[:, None] * sdm + offs_d[None, :] * sdd, mask=row_ok[:, None], other=0.0)
        lse2 = tl.load(LSE + rows, mask=row_ok, other=float("inf")) * 1.4426950408889634
        delta = tl.load(DELTA + rows, mask=row_ok, other=0.0)
        qkT = tl.dot(k, tl.trans(q))
        pT = tl.math.exp2(qkT * qk_scale - lse2[None, :])
        dv = tl.dot(pT.to(do.dtype), do, dv)
        dpT = tl.dot(v, tl.trans(do))
        dsT = (pT * (dpT - delta[None, :])).to(q.dtype)
        dk = tl.dot(dsT, q, dk)
        dq = tl.dot(tl.trans(dsT), k)
        tl.atomic_add(DQA + rows[:, None] * HEAD_DIM + offs_d[None, :], dq, mask=row_ok[:, None], sem="relaxed")
    dk = dk * sm_scale
    out = zh.to(tl.int64) * N_K * HEAD_DIM + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    tl.store(DK + out, dk.to(DK.dtype.element_ty), mask=col_ok[:, None])
    tl.store(DV + out, dv.to(DV.dtype.element_ty), mask=col_ok[:, None])


@triton.jit
def _dq_cast(DQA, DQ, n, scale, BLOCK: tl.constexpr):
    """DQ = (DQA·scale) in DQ's dtype, both contiguous, n elements."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < n
    tl.store(DQ + offs, (tl.load(DQA + offs, mask=ok, other=0.0) * scale).to(DQ.dtype.element_ty), mask=ok)


# =============================================================================== launchers
LAST = [None]   # the compiled kernel of the last launch (n_regs, n_spills, metadata.shared)
# Explicit configs only: the shipped kernels are launched directly with a config dict
# (BLOCK_M, BLOCK_N, num_warps, num_stages), as flash_triton.attention_forward/backward do.
def _fwd_args(q, k, v, o, lse):
    Z, H, nq, d = q.shape
    return (q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(), H, nq, k.shape[2], LOG2E / math.sqrt(d))


def fwd_shipped(q, k, v, causal, cfg, o=None, lse=None, knobs=None, warm=False):
    """O, LSE with _attn_fwd (knobs None) or _fwd_var (knobs dict ORDER/ONE_LOOP/STORE_LSE), config ``cfg``."""
    Z, H, nq, d = q.shape
    o = torch.empty_like(q) if o is None else o
    lse = torch.empty(Z, H, nq, device=q.device, dtype=torch.float32) if lse is None else lse
    n_m = triton.cdiv(nq, cfg["BLOCK_M"])
    kw = dict(HEAD_DIM=d, CAUSAL=bool(causal), **cfg)
    if knobs is None:
        fn, grid = FT._attn_fwd, (n_m, Z * H)
        kw["BLOCK_D"] = d               # the head dim's block (a power of two: d itself at the d swept here)
    else:
        fn, grid = _fwd_var, ((n_m, Z * H) if knobs["ORDER"] == 0 else (Z * H, n_m))
        kw.update(knobs)
    if warm:
        return fn.warmup(*_fwd_args(q, k, v, o, lse), grid=grid, **kw)
    LAST[0] = fn[grid](*_fwd_args(q, k, v, o, lse), **kw)
    return o, lse


def _bwd_args(q, k, v, do):
    Z, H, nq, d = q.shape
    return (*q.stride(), *k.stride(), *v.stride(), *do.stride(), H, nq, k.shape[2], 1.0 / math.sqrt(d))


def bwd_delta(o, do, delta, bm, warm=False):
    Z, H, nq, d = o.shape
    grid = (triton.cdiv(nq, bm), Z * H)
    args = (o, do, delta, *o.stride(), *do.stride(), H, nq)
    if warm:
        return FT._attn_bwd_delta.warmup(*args, grid=grid, HEAD_DIM=d, BLOCK_M=bm)
    FT._attn_bwd_delta[grid](*args, HEAD_DIM=d, BLOCK_M=bm)


def bwd_dkdv(q, k, v, do, lse, delta, dk, dv, causal, cfg, warm=False):
    Z, H, nq, d = q.shape
    grid = (triton.cdiv(k.shape[2], cfg["BLOCK_N"]), Z * H)
    args = (q, k, v, do, lse, delta, dk, dv, *_bwd_args(q, k, v, do))
    if warm:
        return FT._attn_bwd_dkdv.warmup(*args, grid=grid, HEAD_DIM=d, CAUSAL=bool(causal), **cfg)
    LAST[0] = FT._attn_bwd_dkdv[grid](*args, HEAD_DIM=d, CAUSAL=bool(causal), **cfg)


def bwd_dq(q, k, v, do, lse, delta, dq, causal, cfg, warm=False):
    Z, H, nq, d = q.shape
    grid = (triton.cdiv(nq, cfg["BLOCK_M"]), Z * H)
    args = (q, k, v, do, lse, delta, dq, *_bwd_args(q, k, v, do))
    if warm:
        return FT._attn_bwd_dq.warmup(*args, grid=grid, HEAD_DIM=d, CAUSAL=bool(causal), **cfg)
    LAST[0] = FT._attn_bwd_dq[grid](*args, HEAD_DIM=d, CAUSAL=bool(causal), **cfg)


def bwd_split(q, k, v, o, lse, do, causal, delta_bm, dkdv_cfg, dq_cfg, out=None):
    """The shipped backward's three launches with explicit configs: (dQ, dK, dV)."""
    Z, H, nq, d = q.shape
    delta, dq, dk, dv = out or (torch.empty(Z, H, nq, device=q.device, dtype=torch.float32),
                                torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    bwd_delta(o, do, delta, delta_bm)
    bwd_dkdv(q, k, v, do, lse, delta, dk, dv, causal, dkdv_cfg)
    bwd_dq(q, k, v, do, lse, delta, dq, causal, dq_cfg)
    return dq, dk, dv


def bwd_fused(q, k, v, o, lse, do, causal, cfg, out=None, warm=False):
    """(dQ, dK, dV) with _delta_zero, _bwd_fused (atomic fp32 dQ) and _dq_cast."""
    Z, H, nq, d = q.shape
    nk = k.shape[2]
    delta, dqa, dq, dk, dv = out or (torch.empty(Z, H, nq, device=q.device, dtype=torch.float32),
                                     torch.empty(Z, H, nq, d, device=q.device, dtype=torch.float32),
                                     torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    dbm = 64 if not FT.TRITON_INTERPRET else 16
    dargs = (o, do, delta, dqa, *o.stride(), *do.stride(), H, nq)
    fargs = (q, k, v, do, lse, delta, dk, dv, dqa, *_bwd_args(q, k, v, do))
    cargs = (dqa, dq, dq.numel(), 1.0 / math.sqrt(d))
    if warm:
        return [_delta_zero.warmup(*dargs, grid=(1, 1), HEAD_DIM=d, BLOCK_M=dbm),
                _bwd_fused.warmup(*fargs, grid=(1, 1), HEAD_DIM=d, CAUSAL=bool(causal), **cfg),
                _dq_cast.warmup(*cargs, grid=(1,), BLOCK=1024)]
    _delta_zero[(triton.cdiv(nq, dbm), Z * H)](*dargs, HEAD_DIM=d, BLOCK_M=dbm)
    LAST[0] = _bwd_fused[(triton.cdiv(nk, cfg["BLOCK_N"]), Z * H)](*fargs, HEAD_DIM=d, CAUSAL=bool(causal), **cfg)
    _dq_cast[(triton.cdiv(dq.numel(), 1024),)](*cargs, BLOCK=1024)
    return dq, dk, dv


# =============================================================================== what is tried
def C(bm, bn, w, s):
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": s}


def dedupe(cfgs):
    out = []
    for c in cfgs:
        if c not in out:
            out.append(c)
    return out


def cname(c):
    return f"{c['BLOCK_M']}x{c['BLOCK_N']}w{c['num_warps']}s{c['num_stages']}"


SHIPPED = {"fwd": {64: C(128, 64, 8, 3), 128: C(128, 64, 8, 3)},       # flash_triton.CONFIGS on a GPU
           "dkdv": {64: C(32, 128, 4, 4), 128: C(64, 128, 8, 3)},
           "dq": {64: C(128, 64, 8, 3), 128: C(128, 64, 8, 3)}}


def smem_fwd(c, d, el=2):
    """Shared memory of the forward: q tile + num_stages x (k, v tiles) (Triton's pipeliner keeps
    num_stages - 1 tiles in flight, plus the one being consumed: an upper estimate)."""
    return el * (c["BLOCK_M"] * d + c["num_stages"] * 2 * c["BLOCK_N"] * d)


SMEM_MAX = 232448   # H100 dynamic shared memory per block (227 KiB)


def _grid(kind, d, bms, bns, warps, stages, smem, skip):
    """Every C(bm, bn, w, s) of the given sets, in that order, that fits SMEM_MAX (``smem(bm, bn, s)``
    bytes), is not ``skip(bm, bn, w)``, and was not found to spill for sm_90 (REGS_PRUNED)."""
    return [c for bm in bms for bn in bns for w in warps for s in stages for c in [C(bm, bn, w, s)]
            if smem(bm, bn, s) <= SMEM_MAX and not skip(bm, bn, w) and (kind, d, cname(c)) not in REGS_PRUNED]


def fwd_grid(d):
    """BLOCK_M {64,128} x BLOCK_N {32,64,128} x warps {4,8} x stages {2,3,4}, pruned: shared memory
    (estimate above), BLOCK_M=64 with 8 warps (a 64-row tile over 2 warp groups: 16-row wgmma
    slices, never better on Hopper), and what --regs found to spill for sm_90 (REGS_PRUNED)."""
    if TINY:
        return [C(32, 16, 4, 1), C(16, 32, 4, 1)]
    return _grid("fwd", d, (128, 64), (128, 64, 32), (8, 4), (2, 3, 4),
                 lambda bm, bn, s: smem_fwd(C(bm, bn, 0, s), d), lambda bm, bn, w: bm == 64 and w == 8)


def dkdv_grid(d):
    if TINY:
        return [C(16, 32, 4, 1), C(32, 16, 4, 1)]
    return _grid("dkdv", d, (32, 64, 128), (64, 128), (4, 8), (2, 3),
                 lambda bm, bn, s: 2 * (bn * d * 2 + s * 2 * bm * d),      # k, v + stages x (q, dO)
                 lambda bm, bn, w: bn == 64 and w == 8)


def dq_grid(d):
    if TINY:
        return [C(32, 16, 4, 1), C(16, 16, 4, 1)]
    return _grid("dq", d, (64, 128), (32, 64, 128), (4, 8), (2, 3),
                 lambda bm, bn, s: 2 * (bm * d * 2 + s * 2 * bn * d),      # q, dO + stages x (k, v)
                 lambda bm, bn, w: bm == 64 and w == 8)


#: Fused dK/dV/dQ configs (key tile BLOCK_N per program, query tiles BLOCK_M in the loop).
FUSED = {64: [C(64, 128, 8, 2), C(32, 64, 4, 2), C(32, 128, 8, 2)],   # (64: 32x128w4s2 spills 156 bytes causal)
         128: [C(32, 128, 8, 2), C(64, 128, 8, 2), C(32, 64, 4, 2)]}   # (128: 64x64w4s2 spills 396 bytes)
#: _fwd_var knob sets; each at the shipped config and at 64x64w4s3 (the small-tile, 2-CTAs/SM candidate).
VAR_KNOBS = {"base": dict(ORDER=0, ONE_LOOP=False, STORE_LSE=True), "order1": dict(ORDER=1, ONE_LOOP=False, STORE_LSE=True),
             "oneloop": dict(ORDER=0, ONE_LOOP=True, STORE_LSE=True), "nolse": dict(ORDER=0, ONE_LOOP=False, STORE_LSE=False)}
VAR_CFGS = [C(128, 64, 8, 3), C(64, 64, 4, 3)]
DELTA_BM = (32, 64, 128)

#: Configs whose sm_90 compile spills more than 100 bytes (ptxas "bytes spill stores", causal or
#: not), found by --regs on a CPU machine (Triton 3.6, its bundled ptxas, sm_90a): pruned from the
#: grids above before anything is compiled on the GPU. Nearly all are 4-warp configs whose
#: accumulators cover a 128-row or 128-column tile (d = 128: fwd 128xN; dK/dV 128xN, 64x128,
#: 32x128; dQ 128x32/64, 64x128), plus dK/dV 128x128 at 8 warps and, at d = 128, 64x64w4s3.
#: Kept though they spill a little (<= 100 bytes): the SHIPPED d = 128 dK/dV 64x128w8s3 (88 bytes
#: causal, 36 at s2; 255 registers), dK/dV 64x64w4s2 (64), dQ 128x128w8s2 (60 causal), fused
#: 64x128w8s2 (56), and at d = 64 dK/dV 128x64w4 / dQ 128x64w4 (56-92), fwd 128x128w4 (16-20 non-causal).
REGS_PRUNED = {("dkdv", 128, c) for c in ("128x128w4s2", "128x128w8s2", "128x64w4s2", "128x64w4s3", "32x128w4s2",
                                           "32x128w4s3", "64x128w4s2", "64x128w4s3", "64x64w4s3")} | \
              {("dq", 128, c) for c in ("128x128w4s2", "128x32w4s2", "128x32w4s3", "128x64w4s2", "128x64w4s3",
                                         "64x128w4s2", "64x128w4s3")} | \
              {("fwd", 128, c) for c in ("128x128w4s2", "128x128w4s3", "128x64w4s2", "128x64w4s3", "128x64w4s4")} | \
              {("dkdv", 64, c) for c in ("128x128w4s2", "128x128w4s3", "128x128w8s2", "128x128w8s3", "128x64w4s2",
                                          "128x64w4s3", "64x128w4s2", "64x128w4s3")} | \
              {("dq", 64, c) for c in ("128x128w4s2", "128x128w4s3", "128x64w4s2", "128x64w4s3")} | \
              {("fwd", 64, c) for c in ("128x128w4s2", "128x128w4s3", "128x128w4s4")}

#: (S, d, causal): the worst shapes of a07_real_shapes.md first (a time-out loses the least useful).
SHAPES = [(512, 128, False), (512, 128, True), (1000, 128, True), (1537, 128, True), (1024, 128, True),
          (1000, 128, False), (1024, 128, False), (2048, 128, False), (2048, 128, True), (1537, 128, False),
          (512, 64, True), (4096, 128, False), (4096, 128, True)]
HEADS = {64: 12, 128: 16}
if TINY:
    SHAPES = [(67, 64, True), (48, 128, False)]
    HEADS = {64: 2, 128: 2}
    SHIPPED["dkdv"] = {64: C(16, 32, 4, 1), 128: C(16, 32, 4, 1)}
    SHIPPED["fwd"] = SHIPPED["dq"] = {64: C(32, 16, 4, 1), 128: C(32, 16, 4, 1)}   # the interpreter's CONFIGS
    VAR_CFGS = [C(32, 16, 4, 1)]
    FUSED = {64: [C(16, 32, 4, 1)], 128: [C(16, 32, 4, 1)]}
    DELTA_BM = (16, 64)


def batch(s, d):
    if TINY:
        return 1
    return max(1, (1 << 18) // (s * HEADS[d]))


# =============================================================================== checks
def ref64(q, k, v, do, causal, heads):
    """float64 O, LSE, dQ, dK, dV for B·H rows ``heads`` of [B,H,S,d] inputs, on their device."""
    Z, H, nq, d = q.shape
    sel = lambda t: t.reshape(Z * H, t.shape[2], d)[heads].detach().double().requires_grad_()
    qq, kk, vv = sel(q), sel(k), sel(v)
    s = (qq @ kk.transpose(-1, -2)) / math.sqrt(d)
    if causal:
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(k.shape[2], device=q.device)[None, :]
        s = s.masked_fill(j > i + (k.shape[2] - nq), float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.exp(s - torch.where(torch.isfinite(lse), lse, 0.0)[..., None])   # rows that see no key: P = 0, O = 0
    o = p @ vv
    g = torch.autograd.grad(o, (qq, kk, vv), do.reshape(Z * H, nq, d)[heads].double())
    return [o.detach(), lse.detach(), *g]


def relerr(x, r):
    x = x.double()
    if not torch.isfinite(x).all():
        return float("inf")
    return ((x - r).norm() / r.norm().clamp_min(1e-30)).item()


def errs(outs, ref, heads):
    """Max relative error of (O[, LSE]) or (dQ, dK, dV) against the reference slice."""
    e = 0.0
    for x, r in zip(outs, ref):
        x = x.reshape(-1, *x.shape[2:])[heads] if x.dim() == 4 else x.reshape(-1, x.shape[-1])[heads]
        keep = torch.isfinite(r)
        if not torch.equal(torch.isfinite(x.double()) | ~keep, torch.ones_like(keep)):
            return float("inf")
        if r.dim() == 2 and not torch.equal(x[~keep].double(), r[~keep]):   # LSE of rows with no key: -inf
            return float("inf")
        e = max(e, relerr(torch.where(keep, x.double(), 0.0), torch.where(keep, r, 0.0)))
    return e


def nan_like(t, dtype=None):
    return torch.full(t.shape, float("nan"), device=t.device, dtype=dtype or t.dtype)


def check(dev="cpu"):
    """Interpreter (CPU) or GPU correctness of every kernel and launcher above at small odd shapes."""
    small = FT.TRITON_INTERPRET
    cases = [(67, 67, 64, True, torch.bfloat16), (67, 67, 128, False, torch.bfloat16), (67, 67, 128, True, torch.float32),
             (45, 70, 64, True, torch.float32), (70, 45, 128, True, torch.bfloat16), (67, 67, 64, False, torch.float32)]
    if small:
        fcfgs, kcfgs, qcfgs = [C(32, 16, 4, 1), C(16, 32, 4, 1)], [C(16, 32, 4, 1), C(32, 16, 4, 1)], [C(32, 16, 4, 1), C(16, 32, 4, 1)]
    else:
        fcfgs, kcfgs, qcfgs = [C(128, 64, 8, 3), C(64, 32, 4, 2)], [C(64, 128, 8, 2), C(32, 64, 4, 2)], [C(128, 64, 8, 3), C(64, 32, 4, 2)]
    bad = 0
    torch.manual_seed(0)
    for nq, nk, d, causal, dt in cases:
        tol = TOL if dt != torch.float32 else (1e-4 if small else 5e-3)
        q = torch.randn(2, nq, 3, d, device=dev, dtype=dt).transpose(1, 2)   # head-strided q, as the shipped tests
        k, v = (torch.randn(2, 3, nk, d, device=dev, dtype=dt) for _ in range(2))
        do = torch.randn(2, 3, nq, d, device=dev, dtype=dt)
        heads = torch.tensor([0, 5], device=dev)
        ref = ref64(q, k, v, do, causal, heads)
        o_ref, lse_ref = FT.attention_forward(q, k, v, causal)
        o_ref = o_ref.contiguous()
        res = []
        for c in fcfgs:
            res.append((f"fwd {cname(c)}", errs(fwd_shipped(q, k, v, causal, c, nan_like(q).contiguous(), nan_like(q[..., 0], torch.float32)), ref[:2], heads)))
            for name, kn in VAR_KNOBS.items():
                o, lse = fwd_shipped(q, k, v, causal, c, nan_like(q).contiguous(), nan_like(q[..., 0], torch.float32), knobs=kn)
                res.append((f"fwdvar {name} {cname(c)}", errs((o,) if name == "nolse" else (o, lse), ref[:2], heads)))
        for bm in (16, 64):
            delta = nan_like(q[..., 0], torch.float32)
            bwd_delta(o_ref, do, delta, bm)
            rd = (o_ref.double() * do.double()).sum(-1)
            res.append((f"delta bm={bm}", relerr(delta, rd)))
        for kc, qc in zip(kcfgs, qcfgs):
            out = (nan_like(q[..., 0], torch.float32), nan_like(q).contiguous(), nan_like(k), nan_like(v))
            res.append((f"bwd dkdv {cname(kc)} dq {cname(qc)}", errs(bwd_split(q, k, v, o_ref, lse_ref, do, causal, 64, kc, qc, out), ref[2:], heads)))
        for c in (kcfgs if small else FUSED[d][:2]):
            out = (nan_like(q[..., 0], torch.float32), nan_like(q, torch.float32).contiguous(), nan_like(q).contiguous(), nan_like(k), nan_like(v))
            res.append((f"fused {cname(c)}", errs(bwd_fused(q, k, v, o_ref, lse_ref, do, causal, c, out), ref[2:], heads)))
        for name, e in res:
            ok = e <= tol
            bad += not ok
            print(f"[shapes] check nq={nq} nk={nk} d={d} causal={int(causal)} {str(dt)[6:]:8s} {name:34s} err {e:.1e} "
                  f"{'ok' if ok else 'WRONG'}", flush=True)
    print(f"[shapes] check: {'all ok' if not bad else f'{bad} WRONG'}", flush=True)
    return bad


# =============================================================================== sm_90 compiles (CPU)
def regs(kinds=("fwd", "dkdv", "dq", "fused", "fwdvar"), d_list=(128,)):
    """Compile for sm_90 without a GPU (TRITON_INTERPRET unset): registers, spills, shared memory.
    Counts register spills from the PTX (local-memory ld/st) and ptxas' report (n_spills)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    assert not FT.TRITON_INTERPRET, "run with TRITON_INTERPRET=0 (or unset) and without importing common first"
    target = GPUTarget("cuda", 90, 32)
    ptrs = lambda names, ty: {n: ty for n in names}

    def sig(fn, ints, ptr_names, lse_names, fl):
        s = {}
        for a in fn.arg_names:
            if a in ptr_names:
                s[a] = "*bf16"
            elif a in lse_names:
                s[a] = "*fp32"
            elif a in fl:
                s[a] = "fp32"
            elif a in ints:
                s[a] = "i32"
            else:
                s[a] = "constexpr"
        return s

    def one(fn, ptr_names, lse_names, cfg, const):
        fl = {"qk_scale", "sm_scale"}
        ints = [a for a in fn.arg_names if a.startswith("s") and a not in fl or a in ("H", "N_Q", "N_K")]
        signature = sig(fn, ints, ptr_names, lse_names, fl)
        constexprs = dict(const, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=cfg["BLOCK_N"])
        for a in fn.arg_names:   # unit inner strides, as on the GPU (contiguous last dim)
            if a in ("sqd", "skd", "svd", "sod", "sdd"):
                constexprs[a] = 1
                signature[a] = "constexpr"
        # tt.divisibility=16 on pointers and on the 16-multiple ints (S multiple of 16)
        attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(fn.arg_names)
                 if signature[a].startswith("*") or (signature[a] == "i32" and a not in ("H",))}
        t0 = time.time()
        try:
            k = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=attrs), target=target,
                               options={"num_warps": cfg["num_warps"], "num_stages": cfg["num_stages"]})
        except Exception as e:   # out of shared memory etc.
            return None, f"{type(e).__name__}: {str(e).splitlines()[0][:90]}", time.time() - t0
        ptx = k.asm["ptx"]
        info = dict(ptxas(ptx), smem=k.metadata.shared, atom=len(re.findall(r"\b(?:red|atom)\.global", ptx)),
                    atom_ops=" ".join(sorted(set(re.findall(r"\b(?:red|atom)\.global[.\w]*", ptx)))) or "-")
        return info, "", time.time() - t0

    def ptxas(ptx):
        """Registers and spill bytes from ptxas -v (the compiled kernel's n_regs needs a GPU)."""
        import subprocess
        import tempfile
        from triton.backends.nvidia.compiler import get_ptxas
        with tempfile.TemporaryDirectory() as tmp:
            f = Path(tmp) / "k.ptx"
            f.write_text(ptx)
            r = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name", "sm_90a", str(f), "-o", str(Path(tmp) / "k.o")],
                               capture_output=True, text=True)
        txt = r.stdout + r.stderr
        regs = re.search(r"Used (\d+) registers", txt)
        st = re.search(r"(\d+) bytes spill stores", txt)
        return dict(regs=int(regs.group(1)) if regs else -1, spill_st=int(st.group(1)) if st else -1)

    fwd_ptr, bwd_ptr = {"Q", "K", "V", "O"}, {"Q", "K", "V", "DO", "DK", "DV"}
    jobs = []
    for d in d_list:
        for causal in (False, True):
            if "fwd" in kinds:
                jobs += [("fwd", d, causal, FT._attn_fwd, fwd_ptr, {"LSE"}, c, {}) for c in fwd_grid(d)]
            if "fwdvar" in kinds:
                jobs += [("fwdvar", d, causal, _fwd_var, fwd_ptr, {"LSE"}, C(128, 64, 8, 3), dict(ORDER=1, ONE_LOOP=True, STORE_LSE=True))]
            if "dkdv" in kinds:
                jobs += [("dkdv", d, causal, FT._attn_bwd_dkdv, bwd_ptr, {"LSE", "DELTA"}, c, {}) for c in dkdv_grid(d)]
            if "dq" in kinds:
                jobs += [("dq", d, causal, FT._attn_bwd_dq, bwd_ptr | {"DQ"}, {"LSE", "DELTA"}, c, {}) for c in dq_grid(d)]
            if "fused" in kinds:
                jobs += [("fused", d, causal, _bwd_fused, bwd_ptr, {"LSE", "DELTA", "DQA"}, c, {}) for c in FUSED[d]]
    shard, nshard = (int(os.environ.get("SHARD", 0)), int(os.environ.get("NSHARD", 1)))
    for i, (kind, d, causal, fn, pn, ln, c, extra) in enumerate(jobs):
        if i % nshard != shard:
            continue
        const = dict(HEAD_DIM=d, CAUSAL=causal, **extra)
        info, err, dt = one(fn, pn, ln, c, const)
        msg = err or " ".join(f"{k}={v}" for k, v in info.items())
        print(f"[regs] {kind:6s} d={d} causal={int(causal)} {cname(c):12s} {msg}  ({dt:.1f} s)", flush=True)


# =============================================================================== GPU: warm, time
def warm_jobs():
    """Every (kind, shape spec, config) the timing run launches, one entry per distinct compile:
    Triton specializes ints on divisibility by 16, so S = 1000/1537 and 512/1024/... compile apart."""
    specs = {}
    for s, d, causal in SHAPES:
        specs.setdefault((s % 16 == 0, d, causal), s)
    jobs = []
    for (_, d, causal), s in specs.items():
        jobs += [("fwd", s, d, causal, c) for c in fwd_grid(d)]
        jobs += [("fwdvar", s, d, causal, (n, c)) for n in VAR_KNOBS for c in VAR_CFGS]
        jobs += [("dkdv", s, d, causal, c) for c in dkdv_grid(d) + [SHIPPED["dkdv"][d]]]
        jobs += [("dq", s, d, causal, c) for c in dq_grid(d) + [SHIPPED["dq"][d]]]
        jobs += [("fused", s, d, causal, c) for c in FUSED[d]]
        jobs += [("delta", s, d, causal, bm) for bm in DELTA_BM]
    return jobs


def warm(shard, nshard):
    """Compile shard ``shard`` of warm_jobs() into Triton's disk cache: JITFunction.warmup (compiles,
    no launch); where that raises, one real launch at B = 1 instead (same specialization)."""
    jobs = warm_jobs()[shard::nshard]
    t0, n, fell_back = time.time(), 0, 0
    for kind, s, d, causal, c in jobs:
        h = HEADS[d]
        q, k, v, o, do = (torch.zeros(1, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(5))
        lse, delta = (torch.zeros(1, h, s, device="cuda", dtype=torch.float32) for _ in range(2))
        calls = {"fwd": lambda w: fwd_shipped(q, k, v, causal, c, o, lse, warm=w),
                 "fwdvar": lambda w: fwd_shipped(q, k, v, causal, c[1], o, lse, knobs=VAR_KNOBS[c[0]], warm=w),
                 "dkdv": lambda w: bwd_dkdv(q, k, v, do, lse, delta, k.clone(), v.clone(), causal, c, warm=w),
                 "dq": lambda w: bwd_dq(q, k, v, do, lse, delta, q.clone(), causal, c, warm=w),
                 "fused": lambda w: bwd_fused(q, k, v, o, lse, do, causal, c, warm=w),
                 "delta": lambda w: bwd_delta(o, do, delta, c, warm=w)}
        try:
            try:
                calls[kind](True)
            except Exception as e:
                if fell_back == 0:
                    print(f"[shapes] warm: warmup() raised {type(e).__name__}: {str(e)[:100]}; launching instead", flush=True)
                fell_back += 1
                calls[kind](False)
                torch.cuda.synchronize()
            n += 1
        except Exception as e:
            print(f"[shapes] warm {kind} S={s} d={d} causal={int(causal)} {c}: {type(e).__name__}: {str(e)[:120]}", flush=True)
    print(f"[shapes] warm shard {shard}/{nshard}: {n}/{len(jobs)} compiled in {time.time() - t0:.0f} s"
          f"{f' ({fell_back} by a launch)' if fell_back else ''}", flush=True)


def do_bench(fn):
    if TINY:
        from common.timing import bench_cpu
        return bench_cpu(fn, warmup=0, rep=1).median_ms
    return triton.testing.do_bench(fn, warmup=5, rep=25, return_mode="median")


COLS = ["S", "d", "causal", "BH", "pass", "variant", "config", "ms", "tflops", "err", "regs", "spills", "note"]


def emit(row):
    new = not CSV.exists()
    with open(CSV, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLS, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(row)
    print(f"[shapes] S={row['S']:5d} d={row['d']:3d} c={int(row['causal'])} {row['pass']:5s} {row['variant']:8s} "
          f"{row['config']:14s} {row['ms']:8.4f} ms {row['tflops']:6.1f} TF err {row['err']:.1e} "
          f"r={row.get('regs', '')} sp={row.get('spills', '')} {row.get('note', '')}", flush=True)


def time_pass(which):
    """GPU: every variant of pass ``which`` (fwd or bwd) at every shape, rows appended to CSV."""
    from common.roofline import attention_flops
    import torch.nn.functional as F
    OUT.mkdir(parents=True, exist_ok=True)
    dev = common.DEVICE
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    torch.manual_seed(0)
    for s, d, causal in SHAPES:
        b, h = batch(s, d), HEADS[d]
        bh = b * h
        q, k, v, do = (torch.randn(b, h, s, d, device=dev, dtype=torch.bfloat16) for _ in range(4))
        heads = torch.tensor([0, bh - 1], device=dev)
        ref = ref64(q, k, v, do, causal, heads)
        fl = attention_flops(bh, s, s, d, causal, backward=(which == "bwd"))
        base = dict(S=s, d=d, causal=causal, BH=bh, **{"pass": which})

        def run(variant, config, call, outs, flops=fl, check=True, err=float("nan")):
            """check call() (its outputs ``outs`` NaN-filled first) against ref, then time it
            (check=False: ``err`` is the error of a check made by the caller)."""
            e, info = err, {}
            try:
                LAST[0] = None
                if check:
                    for t in outs:
                        t.fill_(float("nan"))
                    res = call()
                    sync()
                    e = errs(res, ref[:2] if which == "fwd" else ref[2:], heads)
                else:
                    call()
                kern = LAST[0]
                if kern is not None:
                    info = dict(regs=kern.n_regs, spills=kern.n_spills, note=f"smem={kern.metadata.shared}")
                if check and not e <= TOL:
                    emit(dict(base, variant=variant, config=config, ms=float("nan"), tflops=float("nan"), err=e,
                              **dict(info, note="WRONG")))
                    return float("nan")
                ms = do_bench(call)
            except Exception as ex:
                emit(dict(base, variant=variant, config=config, ms=float("nan"), tflops=float("nan"), err=e,
                          note=f"{type(ex).__name__}: {str(ex)[:80]}".replace("\n", " ")))
                return float("nan")
            emit(dict(base, variant=variant, config=config, ms=ms, tflops=flops / ms / 1e9, err=e, **info))
            return ms

        qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))
        if which == "fwd":
            o, lse = torch.empty_like(q), torch.empty(b, h, s, device=dev, dtype=torch.float32)
            sd = F.scaled_dot_product_attention
            run("sdpa", "-", lambda: (sd(q, k, v, is_causal=causal),), [])
            run("shipped", cname(SHIPPED["fwd"][d]), lambda: FT.attention_forward(q, k, v, causal), [])
            for c in fwd_grid(d):
                run("grid", cname(c), lambda c=c: fwd_shipped(q, k, v, causal, c, o, lse), [o, lse])
            for c in VAR_CFGS:
                for name, kn in VAR_KNOBS.items():
                    if name == "oneloop" and not causal and s % 64 == 0:
                        continue   # nothing masked: the same kernel as base
                    outs = (o,) if name == "nolse" else (o, lse)
                    run(name, cname(c), lambda c=c, kn=kn, outs=outs: fwd_shipped(q, k, v, causal, c, o, lse, knobs=kn)[:len(outs)],
                        list(outs))
        else:
            o, lse = FT.attention_forward(q, k, v, causal)
            o2 = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
            run("sdpa", "-", lambda: torch.autograd.grad(o2, (qs, ks, vs), do, retain_graph=True), [])
            run("shipped", "-", lambda: FT.attention_backward(q, k, v, o, lse, do, causal), [])
            delta = torch.empty(b, h, s, device=dev, dtype=torch.float32)
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            best = {}
            rd = (o.double() * do.double()).sum(-1)
            for bm in DELTA_BM:   # delta alone: memory-bound (reads O and dO)
                delta.fill_(float("nan"))
                bwd_delta(o, do, delta, bm)
                e = relerr(delta, rd)
                if not e <= TOL:
                    emit(dict(base, variant="delta", config=f"bm={bm}", ms=float("nan"), tflops=float("nan"), err=e, note="WRONG"))
                    continue
                ms = do_bench(lambda bm=bm: bwd_delta(o, do, delta, bm))
                gbs = 2 * o.numel() * o.element_size() / ms / 1e6
                emit(dict(base, variant="delta", config=f"bm={bm}", ms=ms, tflops=float("nan"), err=e, note=f"{gbs:.0f} GB/s"))
                best.setdefault("delta", (ms, bm))
                best["delta"] = min(best["delta"], (ms, bm))
            # per-kernel: dkdv alone and dq alone (checked with a shipped-config partner)
            for c in dedupe(dkdv_grid(d) + [SHIPPED["dkdv"][d]]):
                # check the whole backward with this dkdv config, then time the dkdv launch alone
                for t in (dq, dk, dv):
                    t.fill_(float("nan"))
                bwd_split(q, k, v, o, lse, do, causal, 64, c, SHIPPED["dq"][d], (delta, dq, dk, dv))
                sync()
                e = errs((dq, dk, dv), ref[2:], heads)
                if not e <= TOL:
                    emit(dict(base, variant="dkdv", config=cname(c), ms=float("nan"), tflops=float("nan"), err=e, note="WRONG"))
                    continue
                ms = run("dkdv", cname(c), lambda c=c: bwd_dkdv(q, k, v, do, lse, delta, dk, dv, causal, c), [],
                         check=False, err=e, flops=fl * 0.8)   # 4 of the 5 products attention_flops counts
                if ms == ms:
                    best["dkdv"] = min(best.get("dkdv", (1e9, None)), (ms, cname(c)), key=lambda t: t[0])
                    best.setdefault("dkdv_cfg", {})[cname(c)] = c
            for c in dedupe(dq_grid(d) + [SHIPPED["dq"][d]]):
                for t in (dq, dk, dv):
                    t.fill_(float("nan"))
                bwd_split(q, k, v, o, lse, do, causal, 64, SHIPPED["dkdv"][d], c, (delta, dq, dk, dv))
                sync()
                e = errs((dq, dk, dv), ref[2:], heads)
                if not e <= TOL:
                    emit(dict(base, variant="dq", config=cname(c), ms=float("nan"), tflops=float("nan"), err=e, note="WRONG"))
                    continue
                ms = run("dq", cname(c), lambda c=c: bwd_dq(q, k, v, do, lse, delta, dq, causal, c), [],
                         check=False, err=e, flops=fl * 0.6)   # 3 of 5
                if ms == ms:
                    best["dq"] = min(best.get("dq", (1e9, None)), (ms, cname(c)), key=lambda t: t[0])
                    best.setdefault("dq_cfg", {})[cname(c)] = c
            if "dkdv" in best and "dq" in best and "delta" in best:
                kc, qc = best["dkdv_cfg"][best["dkdv"][1]], best["dq_cfg"][best["dq"][1]]
                run("best", f"{cname(kc)}+{cname(qc)}+d{best['delta'][1]}",
                    lambda: bwd_split(q, k, v, o, lse, do, causal, best["delta"][1], kc, qc, (delta, dq, dk, dv)), [dq, dk, dv])
            dqa = torch.empty(b, h, s, d, device=dev, dtype=torch.float32)
            for c in FUSED[d]:
                run("fused", cname(c), lambda c=c: bwd_fused(q, k, v, o, lse, do, causal, c, (delta, dqa, dq, dk, dv)),
                    [dq, dk, dv])
        del q, k, v, do, qs, ks, vs, ref
        if dev == "cuda":
            torch.cuda.empty_cache()


# =============================================================================== report
def report():
    """Per shape: SDPA, shipped, best grid / variant, forward and backward (from CSV)."""
    if not CSV.exists():
        sys.exit(f"[shapes] no {CSV}: nothing measured (set OUT to the run's folder)")
    rows = list(csv.DictReader(open(CSV)))
    for r in rows:
        r["ms"] = float(r["ms"])
    lines = ["| S | d | causal | fwd SDPA ms | fwd shipped ms (x SDPA) | fwd best (x SDPA) | bwd SDPA ms | "
             "bwd shipped ms (x) | bwd best split (x) | fused best (x) | delta ms | fwd+bwd shipped x | fwd+bwd best x |",
             "|---" * 13 + "|"]
    for s, d, causal in SHAPES:
        rr = [r for r in rows if (int(r["S"]), int(r["d"]), r["causal"] == "True") == (s, d, causal) and r["ms"] == r["ms"]]
        if not rr:
            continue
        get = lambda p, v: [r for r in rr if r["pass"] == p and r["variant"] == v]
        one = lambda p, v: (get(p, v) or [dict(ms=float("nan"), config="-")])[0]
        fs, fsh = one("fwd", "sdpa")["ms"], one("fwd", "shipped")["ms"]
        fb = min((r for r in rr if r["pass"] == "fwd" and r["variant"] not in ("sdpa", "shipped", "nolse")),
                 key=lambda r: r["ms"], default=dict(ms=float("nan"), config="-", variant="-"))
        bs, bsh = one("bwd", "sdpa")["ms"], one("bwd", "shipped")["ms"]
        bb = one("bwd", "best")
        fu = min(get("bwd", "fused"), key=lambda r: r["ms"], default=dict(ms=float("nan"), config="-"))
        dl = min((r["ms"] for r in get("bwd", "delta")), default=float("nan"))
        bbest = min(bb["ms"], fu["ms"]) if fu["ms"] == fu["ms"] else bb["ms"]
        x = lambda a, b: f"{a / b:.2f}x" if a == a and b == b else "-"
        lines.append(f"| {s} | {d} | {causal} | {fs:.3f} | {fsh:.3f} ({x(fs, fsh)}) | {fb['ms']:.3f} {fb.get('variant', '')} "
                     f"{fb['config']} ({x(fs, fb['ms'])}) | {bs:.3f} | {bsh:.3f} ({x(bs, bsh)}) | {bb['ms']:.3f} {bb['config']} "
                     f"({x(bs, bb['ms'])}) | {fu['ms']:.3f} {fu['config']} ({x(bs, fu['ms'])}) | {dl:.3f} | "
                     f"{x(fs + bs, fsh + bsh)} | {x(fs + bs, fb['ms'] + bbest)} |")
    lines += ["", "Forward knobs (_fwd_var, ms; ratio to its base copy at the same config, below 1 = faster):", "",
              "| S | d | causal | config | base ms | shipped kernel ms | order1 | oneloop | nolse |", "|---" * 9 + "|"]
    for s, d, causal in SHAPES:
        rr = [r for r in rows if (int(r["S"]), int(r["d"]), r["causal"] == "True") == (s, d, causal) and r["pass"] == "fwd"]
        for c in VAR_CFGS:
            ms = {r["variant"]: r["ms"] for r in rr if r["config"] == cname(c)}
            b0 = ms.get("base", float("nan"))
            f = lambda v: f"{ms[v] / b0:.3f}" if v in ms and b0 == b0 else "-"
            if b0 == b0:
                lines.append(f"| {s} | {d} | {causal} | {cname(c)} | {b0:.4f} | {ms.get('grid', float('nan')):.4f} | "
                             f"{f('order1')} | {f('oneloop')} | {f('nolse')} |")
    lines += ["", "Backward launches alone (ms): shipped config vs best config of each kernel:", "",
              "| S | d | causal | delta bm=64 | delta best | dK/dV shipped | dK/dV best | dQ shipped | dQ best | "
              "sum of bests | best launched together | fused best | shipped bwd | SDPA bwd |", "|---" * 14 + "|"]
    for s, d, causal in SHAPES:
        rr = [r for r in rows if (int(r["S"]), int(r["d"]), r["causal"] == "True") == (s, d, causal)
              and r["pass"] == "bwd" and r["ms"] == r["ms"]]
        if not rr:
            continue
        by = lambda v: [r for r in rr if r["variant"] == v]
        best = lambda v: min(by(v), key=lambda r: r["ms"], default=dict(ms=float("nan"), config="-"))
        at = lambda v, cfg: next((r["ms"] for r in by(v) if r["config"] == cfg), float("nan"))
        dl, kb, qb = best("delta"), best("dkdv"), best("dq")
        lines.append(f"| {s} | {d} | {causal} | {at('delta', 'bm=64'):.4f} | {dl['ms']:.4f} {dl['config']} | "
                     f"{at('dkdv', cname(SHIPPED['dkdv'][d])):.4f} | {kb['ms']:.4f} {kb['config']} | "
                     f"{at('dq', cname(SHIPPED['dq'][d])):.4f} | {qb['ms']:.4f} {qb['config']} | "
                     f"{dl['ms'] + kb['ms'] + qb['ms']:.4f} | {best('best')['ms']:.4f} | {best('fused')['ms']:.4f} "
                     f"{best('fused')['config']} | {best('shipped')['ms']:.4f} | {best('sdpa')['ms']:.4f} |")
    text = "\n".join(lines)
    print(text)
    (OUT / "summary.md").write_text("# a07_shapes_try: best found vs shipped vs SDPA (ms; x = SDPA time / ours)\n\n" + text + "\n")


if __name__ == "__main__":
    a = sys.argv[1:]
    if a[:1] == ["--check"]:
        sys.exit(1 if check(common.DEVICE) else 0)
    elif a[:1] == ["--regs"]:
        regs(tuple(a[1].split(",")) if len(a) > 1 else ("fwd", "dkdv", "dq", "fused", "fwdvar"),
             tuple(int(x) for x in a[2].split(",")) if len(a) > 2 else (128,))
    elif a[:1] == ["--warm"]:
        warm(int(a[1]), int(a[2]))
    elif a[:1] == ["--time"]:
        time_pass(a[1])
    elif a[:1] == ["--report"]:
        report()
    else:
        print(__doc__)
