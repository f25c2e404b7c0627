"""Experiment (issue #28): the decode GEMV at 4 and 16 rows on GPT-2 XL's >= 10 MB weights, against cuBLAS.

Times (H100, bf16, weights out of L2 by rotation, CUDA graph, as bench --gemv does):
  * cuBLAS (both layouts, the faster), the gemv's default config;
  * the FMA path (use_dot False) at 4 and 16 rows, a few column counts / widths / warps;
  * a TMA variant of the tl.dot path: W^T [N, K] read through a host TensorDescriptor, pipelined by Triton.
Run: PYTHONPATH=. python lectures/results/experiments/gemv_rows/run.py
"""
import sys
import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from solutions.a08_gpt2_inference import gemv as gv
from solutions.a08_gpt2_inference.bench import rotated_ms, l2_bytes

SHAPES = {"qkv": (1600, 4800), "fc": (1600, 6400), "fc_proj": (6400, 1600)}


@triton.jit
def tma_gemv(X, w_desc, Y, M, N, K, stride_xm, SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr, SWAP: tl.constexpr):
    pid = tl.program_id(0)
    off_n = pid * BLOCK_N
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, BLOCK_K)
    if SWAP:
        acc = tl.zeros((BLOCK_N, BLOCK_M), tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
        w = w_desc.load([off_n, k0])                                   # [BLOCK_N, BLOCK_K], K contiguous
        x = tl.load(X + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :],
                    mask=(offs_m[:, None] < M) & ((k0 + offs_k)[None, :] < K), other=0.0)
        if SWAP:
            acc = tl.dot(w, tl.trans(x), acc)
        else:
            acc = tl.dot(x, tl.trans(w), acc)
    offs_n = off_n + tl.arange(0, BLOCK_N)
    if SWAP:
        out = tl.trans(acc)
    else:
        out = acc
    tl.store(Y + offs_m[:, None] * N + offs_n[None, :], out.to(Y.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def tma_call(x, wt, y, bn, bk, stages, warps, swap):
    m, k = x.shape
    n = wt.shape[0]
    desc = TensorDescriptor.from_tensor(wt, [bn, bk])
    tma_gemv[(triton.cdiv(n, bn),)](x, desc, y, m, n, k, x.stride(0), SPLIT_K=1, BLOCK_M=16 if not swap else 16,
                                    BLOCK_N=bn, BLOCK_K=bk, NUM_STAGES=stages, SWAP=swap, num_warps=warps)
    return y


def main():
    dt = torch.bfloat16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name, (k, n) in SHAPES.items():
        wbytes = k * n * 2
        copies = max(3, -(-3 * l2_bytes() // wbytes))
        wts = [torch.randn(n, k, device="cuda", dtype=dt) * k**-0.5 for _ in range(copies)]   # W^T [N, K]
        ws = [t.t() for t in wts]                                                              # K-major W
        stored = [w.contiguous() for w in ws]
        for m in (1, 4, 16):
            xs = [torch.randn(m, k, device="cuda", dtype=dt) for _ in range(copies)]
            ys = [torch.empty(m, n, device="cuda", dtype=dt) for _ in range(copies)]
            ref = (xs[0].double() @ ws[0].double())
            cub = min(rotated_ms(lambda i: torch.matmul(xs[i], ws[i]), copies),
                      rotated_ms(lambda i: torch.matmul(xs[i], stored[i]), copies))

            def report(label, call, check=None):
                try:
                    out = call(0)
                    err = float((out.double() - ref).norm() / ref.norm())
                    t = rotated_ms(call, copies)
                except Exception as e:  # noqa: BLE001
                    print(f"{name} M={m} {label}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                    torch.cuda.synchronize()
                    return
                gbps = wbytes / t / 1e6
                rows.append((name, m, label, t * 1e3, gbps, cub / t, err))
                print(f"{name:8s} M={m:2d} {label:42s} {t*1e3:7.2f} us {gbps:7.0f} GB/s {cub/t:5.2f}x cuBLAS "
                      f"err {err:.1e}", flush=True)

            print(f"{name} M={m}: cuBLAS {cub*1e3:.2f} us {wbytes/cub/1e6:.0f} GB/s; default "
                  f"{gv.choose_config(m, n, k, dt, True, sms)}", flush=True)
            report("gemv default", lambda i: gv.gemv(xs[i], ws[i]))
            report("gemv default pdl", lambda i: gv.gemv(xs[i], ws[i], pdl=True))
            if m > 1:
                for bn in (1, 2, 4, 8):
                    for bk in (256, 512):
                        for w in (4, 8):
                            if m * bk * bn // (32 * w) > 64:
                                continue
                            cfg = (bn, bk, 1, w, 1, False)
                            report(f"fma {cfg}", lambda i, c=cfg: gv.gemv(xs[i], ws[i], config=c))
            for swap in (False, True):
                for bn in ((16, 32, 64) if not swap else (64, 128)):
                    for bk in (64, 128, 256):
                        for st in (3, 4, 6):
                            if (bn * bk * 2) * st > 160 * 1024:
                                continue
                            report(f"tma swap={int(swap)} bn={bn} bk={bk} st={st}",
                                   lambda i, a=(bn, bk, st, 4, swap): tma_call(xs[i], wts[i], ys[i], *a))
        del wts, ws, stored
        torch.cuda.empty_cache()
    print("\nbest per (gemm, M):")
    for name in SHAPES:
        for m in (1, 4, 16):
            sel = [r for r in rows if r[0] == name and r[1] == m]
            if sel:
                best = max(sel, key=lambda r: r[4])
                print(f"  {name} M={m}: {best[2]} {best[4]:.0f} GB/s {best[5]:.2f}x cuBLAS")


if __name__ == "__main__":
    main()
