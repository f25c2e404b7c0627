"""Experiment (issue #5): faster stage-7 forward for d=128. Variants, each timed against the
shipped forward and SDPA (H100, bf16, S=4096, B·H=128) and checked against the float64
reference, one variant per process (results: a07_fwd_try.log; none beat the shipped kernel):

  ptr    the shipped forward (pointer loads, two loops: mask-free tiles, then masked ones)
  pipe   FA3-style software pipelining written by hand: S_{j+1} = Q K_{j+1}ᵀ is issued
         before the softmax of tile j (prologue/epilogue peeled), so the async wgmma of the
         next score tile could overlap the exp2 work of this one
  ws     TMA tensor descriptors (4-D, so head-strided inputs need no copy) and
         tl.range(..., warp_specialize=True): Triton 3.6's Hopper pass splits the loop into a
         producer warp group (TMA loads) and two consumer warp groups (64 query rows each).
         That pass only accepts ONE loop whose loads are all descriptor loads, so the key
         tiles run in a single loop and the mask is applied on every tile (EVEN: skipped
         when the kernel is not causal and N_K is a multiple of BLOCK_N)
  desc   the same kernel with warp_specialize=False (what the descriptors and the single
         masked loop cost or give without the warp groups)

    python3 lectures/results/experiments/a07_fwd_try.py --time "ws 128x64w4s2"     # GPU: TFLOP/s at S=4096
    python3 lectures/results/experiments/a07_fwd_try.py --check "ws 128x64w4s2" 0  # one correctness case
    python3 lectures/results/experiments/a07_fwd_try.py                             # CPU (interpreter): checks of pipe and ws
    bash lectures/results/experiments/a07_fwd_try.sh                                  # what the H100 run did
"""
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import common  # noqa: E402,F401
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.tools.tensor_descriptor import TensorDescriptor  # noqa: E402

from common import reference as ref  # noqa: E402
from common.testing import rel_error  # noqa: E402


@triton.jit
def _fwd_pipe(Q, K, V, O, LSE,
              sqz, sqh, sqm, sqd, skz, skh, skn, skd, svz, svh, svn, svd, soz, soh, som, sod,
              H, N_Q, N_K, qk_scale,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    zh = tl.program_id(1)
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
    if n_full > 0:
        k = tl.load(k_ptrs)
        qk = tl.dot(q, tl.trans(k))                       # prologue: S_0
        for start_n in range(BLOCK_N, n_full, BLOCK_N):
            start_n = tl.multiple_of(start_n, BLOCK_N)
            k = tl.load(k_ptrs + start_n * skn)
            qk_next = tl.dot(q, tl.trans(k))              # S_{j+1} first ...
            m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)   # ... then the softmax of S_j
            p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
            alpha = tl.math.exp2(m_i - m_ij)
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptrs + (start_n - BLOCK_N) * svn)
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
            m_i = m_ij
            qk = qk_next
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)      # epilogue: the last S
        p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_ptrs + (n_full - BLOCK_N) * svn)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_ij
    for start_n in range(n_full, hi, BLOCK_N):
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
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) / 1.4426950408889634, float("-inf"))
    tl.store(O + offs_m[:, None] * som + offs_d[None, :] * sod, acc.to(O.dtype.element_ty), mask=row_ok[:, None])
    tl.store(LSE + zh.to(tl.int64) * N_Q + offs_m, lse, mask=row_ok)


@triton.jit
def _fwd_desc(desc_q, desc_k, desc_v, O, LSE, soz, soh, som, sod, H, N_Q, N_K, qk_scale,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              EVEN_N: tl.constexpr, WS: tl.constexpr):
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    zh = tl.program_id(1)
    z = zh // H
    h = zh % H
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q = desc_q.load([z, h, m0, 0]).reshape(BLOCK_M, HEAD_DIM)    # rows >= N_Q come back as 0
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    shift = N_K - N_Q
    if CAUSAL:
        hi = tl.minimum(N_K, m0 + BLOCK_M + shift)
    else:
        hi = N_K
    for start_n in tl.range(0, hi, BLOCK_N, warp_specialize=WS):
        k = desc_k.load([z, h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = tl.dot(q, k.T) * qk_scale
        if CAUSAL or not EVEN_N:
            cols = start_n + offs_n
            keep = cols[None, :] < N_K
            if CAUSAL:
                keep = keep & (cols[None, :] <= offs_m[:, None] + shift)
            qk = tl.where(keep, qk, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = desc_v.load([z, h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc = acc * alpha[:, None]
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_ij
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    acc = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) / 1.4426950408889634, float("-inf"))
    offs_d = tl.arange(0, HEAD_DIM)
    O += z.to(tl.int64) * soz + h.to(tl.int64) * soh
    tl.store(O + offs_m[:, None] * som + offs_d[None, :] * sod, acc.to(O.dtype.element_ty), mask=(offs_m < N_Q)[:, None])
    tl.store(LSE + zh.to(tl.int64) * N_Q + offs_m, lse, mask=offs_m < N_Q)


def fwd_pipe(q, k, v, causal, cfg):
    Z, H, nq, d = q.shape
    nk = k.shape[2]
    o = torch.empty_like(q)
    lse = torch.empty(Z, H, nq, device=q.device, dtype=torch.float32)
    _fwd_pipe[(triton.cdiv(nq, cfg["BLOCK_M"]), Z * H)](
        q, k, v, o, lse, *q.stride(), *k.stride(), *v.stride(), *o.stride(), H, nq, nk, 1.4426950408889634 / math.sqrt(d),
        HEAD_DIM=d, CAUSAL=causal, **cfg)
    return o, lse


def fwd_desc(q, k, v, causal, cfg, ws):
    Z, H, nq, d = q.shape
    nk = k.shape[2]
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    o = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    lse = torch.empty(Z, H, nq, device=q.device, dtype=torch.float32)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    dq = TensorDescriptor(q, list(q.shape), list(q.stride()), [1, 1, bm, d])
    dk = TensorDescriptor(k, list(k.shape), list(k.stride()), [1, 1, bn, d])
    dv = TensorDescriptor(v, list(v.shape), list(v.stride()), [1, 1, bn, d])
    _fwd_desc[(triton.cdiv(nq, bm), Z * H)](dq, dk, dv, o, lse, *o.stride(), H, nq, nk, 1.4426950408889634 / math.sqrt(d),
                                            HEAD_DIM=d, CAUSAL=causal, EVEN_N=nk % bn == 0, WS=ws, **cfg)
    return o, lse


CFG = {"ptr": None, "sdpa": None,
       "pipe 128x64w8s2": ("pipe", dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2)),
       "desc 128x64w8s2": ("desc", dict(BLOCK_M=128, BLOCK_N=64, num_warps=8, num_stages=2)),
       "ws 128x64w4s2": ("ws", dict(BLOCK_M=128, BLOCK_N=64, num_warps=4, num_stages=2)),
       "ws 128x128w4s2": ("ws", dict(BLOCK_M=128, BLOCK_N=128, num_warps=4, num_stages=2))}
CASES = [(45, 70, 64, True, torch.bfloat16), (70, 45, 16, True, torch.float16), (256, 256, 128, False, torch.bfloat16),
         (37, 37, 32, True, torch.bfloat16), (300, 300, 128, True, torch.bfloat16), (200, 333, 128, False, torch.bfloat16)]


def variant(name):
    from solutions.a07_flash_attention import flash_triton as FT
    if name == "ptr":
        return lambda q, k, v, c: FT.attention_forward(q, k, v, c)
    if name == "sdpa":
        return lambda q, k, v, c: (torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=c), None)
    kind, cfg = CFG[name]
    if kind == "pipe":
        return lambda q, k, v, c: fwd_pipe(q, k, v, c, cfg)
    return lambda q, k, v, c: fwd_desc(q, k, v, c, cfg, kind == "ws")


def check(name, i):
    """One correctness case (one process each on the GPU: a hung kernel only costs its timeout)."""
    nq, nk, d, causal, dt = CASES[i]
    dev = common.DEVICE
    x = torch.randn(2, nq, 3, d, device=dev, dtype=dt).transpose(1, 2)      # head-strided q
    kk = torch.randn(2, 3, nk, d, device=dev, dtype=dt)
    vv = torch.randn(2, 3, nk, d, device=dev, dtype=dt)
    o, lse = variant(name)(x, kk, vv, causal)
    ro, rl = ref.attention(x, kk, vv, causal)
    o, lse = o.float().cpu(), lse.cpu()
    keep = torch.isfinite(rl)
    eo = rel_error(torch.where(keep[..., None], o, 0.0), torch.where(keep[..., None], ro, 0.0))
    el = rel_error(torch.where(keep, lse, 0.0), torch.where(keep, rl, 0.0))
    ok = bool(torch.isfinite(o).all()) and bool((o[~keep] == 0).all()) and bool((lse[~keep] == float("-inf")).all())
    good = eo <= (3e-3 if dt == torch.float32 else 1e-2) and el <= 1e-3 and ok
    print(f"[try] check {name} nq={nq} nk={nk} d={d} causal={causal} {dt}: O {eo:.1e} L {el:.1e} "
          f"empty rows ok={ok} -> {'ok' if good else 'WRONG'}", flush=True)


def time_all(name):
    """TFLOP/s at S=4096, d=128 and 64, causal and not (bf16, B·H=128), with the error vs SDPA."""
    from common.roofline import attention_flops
    from common.timing import bench
    fn, s = variant(name), 4096
    for d in (128, 64):
        for causal in (False, True):
            bh = (1 << 19) // s
            q, k, v = (torch.randn(bh // 16, 16, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            fl = attention_flops(bh, s, s, d, causal)
            o = fn(q, k, v, causal)[0]
            err = rel_error(o, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal))
            t = [bench(lambda: fn(q, k, v, causal)).median_ms for _ in range(2)]
            print(f"[try] TIME {name:16s} d={d:3d} causal={int(causal)}: {fl / t[0] / 1e9:6.1f} {fl / t[1] / 1e9:6.1f} "
                  f"TFLOP/s (err vs sdpa {err:.0e})", flush=True)
            del q, k, v


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--time":
        time_all(sys.argv[2])
    elif len(sys.argv) > 3 and sys.argv[1] == "--check":
        check(sys.argv[2], int(sys.argv[3]))
    else:
        for n in ("pipe 128x64w8s2", "ws 128x64w4s2"):
            for i in range(4):
                check(n, i)
