"""Experiment: the stage-7 forward with TMA tensor descriptors (host-side) vs pointer loads.

    python3 lectures/results/experiments/a07_tma_try.py          # GPU: correctness + timing at S=4096
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
def _attn_fwd_tma(desc_q, desc_k, desc_v, desc_o, LSE, H, N_Q, N_K, qk_scale,
                  HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    zh = tl.program_id(1)
    z = zh // H
    h = zh % H
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    q = desc_q.load([z, h, m0, 0]).reshape(BLOCK_M, HEAD_DIM)
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
    for start_n in range(0, n_full, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        k = desc_k.load([z, h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = tl.dot(q, k.T)
        m_ij = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        p = tl.math.exp2(qk * qk_scale - m_ij[:, None])
        alpha = tl.math.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = desc_v.load([z, h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_ij
    for start_n in range(n_full, hi, BLOCK_N):
        cols = start_n + offs_n
        k = desc_k.load([z, h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        qk = tl.dot(q, k.T)
        keep = cols[None, :] < N_K
        if CAUSAL:
            keep = keep & (cols[None, :] <= offs_m[:, None] + shift)
        qk = tl.where(keep, qk * qk_scale, float("-inf"))
        m_ij = tl.maximum(m_i, tl.max(qk, 1))
        m_safe = tl.where(m_ij == float("-inf"), 0.0, m_ij)
        p = tl.math.exp2(qk - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = desc_v.load([z, h, start_n, 0]).reshape(BLOCK_N, HEAD_DIM)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_ij
    seen = l_i > 0.0
    l_safe = tl.where(seen, l_i, 1.0)
    acc = acc / l_safe[:, None]
    lse = tl.where(seen, (m_i + tl.math.log2(l_safe)) / 1.4426950408889634, float("-inf"))
    desc_o.store([z, h, m0, 0], acc.to(desc_o.dtype).reshape(1, 1, BLOCK_M, HEAD_DIM))
    tl.store(LSE + zh.to(tl.int64) * N_Q + offs_m, lse, mask=offs_m < N_Q)


def fwd_tma(q, k, v, causal, cfg):
    q4, k4, v4 = q, k, v
    Z, H, nq, d = q4.shape
    nk = k4.shape[2]
    o = torch.empty_like(q4)
    lse = torch.empty(Z, H, nq, device=q.device, dtype=torch.float32)
    bm, bn = cfg["BLOCK_M"], cfg["BLOCK_N"]
    dq = TensorDescriptor(q4, list(q4.shape), list(q4.stride()), [1, 1, bm, d])
    dk = TensorDescriptor(k4, list(k4.shape), list(k4.stride()), [1, 1, bn, d])
    dv = TensorDescriptor(v4, list(v4.shape), list(v4.stride()), [1, 1, bn, d])
    do = TensorDescriptor(o, list(o.shape), list(o.stride()), [1, 1, bm, d])
    _attn_fwd_tma[(triton.cdiv(nq, bm), Z * H)](dq, dk, dv, do, lse, H, nq, nk, 1.4426950408889634 / math.sqrt(d),
                                                HEAD_DIM=d, CAUSAL=causal, **cfg)
    return o, lse


def main():
    from common.roofline import attention_flops
    from common.timing import bench
    from solutions.a07_flash_attention import flash_triton as FT
    small = not torch.cuda.is_available()
    dev = common.DEVICE
    # correctness (odd sizes, Nq != Nk, head-strided)
    cfg0 = {"BLOCK_M": 32, "BLOCK_N": 16} if small else {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}
    for (nq, nk, d, causal) in [(37, 37, 32, True), (45, 70, 64, True), (70, 45, 16, False), (300, 300, 128, True)][: 3 if small else 4]:
        x = torch.randn(2, nq, 3, d, device=dev, dtype=torch.bfloat16).transpose(1, 2)
        kk = torch.randn(2, 3, nk, d, device=dev, dtype=torch.bfloat16)
        vv = torch.randn(2, 3, nk, d, device=dev, dtype=torch.bfloat16)
        o, lse = fwd_tma(x, kk, vv, causal, cfg0)
        ro, rl = ref.attention(x, kk, vv, causal)
        print(f"[tma] check nq={nq} nk={nk} d={d} causal={causal}: O {rel_error(o, ro):.1e} L {rel_error(lse, rl):.1e}",
              flush=True)
    if small:
        return
    s = 4096
    cands = [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 8, 3)]
    for d in (64, 128):
        for causal in (False, True):
            bh = (1 << 19) // s
            q, k, v = (torch.randn(bh // 16, 16, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            fl = attention_flops(bh, s, s, d, causal)
            with FT.launch_options(fwd={"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 3}):
                t_ptr = bench(lambda: FT.attention_forward(q, k, v, causal)).median_ms
            t_sdpa = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)).median_ms
            line = f"[tma] d={d} causal={int(causal)} ptr {fl / t_ptr / 1e9:.0f} sdpa {fl / t_sdpa / 1e9:.0f} |"
            for bm, bn, w, st in cands:
                cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": st}
                try:
                    t = bench(lambda: fwd_tma(q, k, v, causal, cfg)).median_ms
                    line += f" {bm}x{bn}w{w}s{st}:{fl / t / 1e9:.0f}"
                except Exception as e:
                    line += f" {bm}x{bn}w{w}s{st}:ERR({type(e).__name__})"
            print(line, flush=True)


if __name__ == "__main__":
    main()
