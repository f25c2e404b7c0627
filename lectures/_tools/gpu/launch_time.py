"""What one launch costs from Python, four ways (GPU only).

    PYTHONPATH=. python lectures/_tools/gpu/launch_time.py

kernel[grid](...) (Triton's launcher), common.launch.fast(kernel)[grid](...) (the course's cached
launcher), the compiled kernel's own CompiledKernel.run, and x.add_(0) and torch.empty for scale:
µs per eager call, calls back to back, the median of 7 batches of 2000.
"""
import statistics
import time

import torch
import triton
import triton.language as tl

from common.launch import Launcher


@triton.jit
def bare(X):
    tl.store(X, 1.0)

@triton.jit
def eleven(Y, B, O, M, N, s0, s1, s2, s3, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    tl.store(O, tl.load(Y) + tl.load(B))

x = torch.zeros(64, device="cuda")
fb = Launcher(bare); fe = Launcher(eleven)
ck = bare[(1,)](x)
def t(fn, n=2000):
    for _ in range(200): fn()
    torch.cuda.synchronize()
    res = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n): fn()
        torch.cuda.synchronize()
        res.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(res)
dev = torch.cuda.current_device()
cases = {
 "x.add_(0)": lambda: x.add_(0),
 "torch.empty(8,64)": lambda: torch.empty(8, 64, device="cuda"),
 "bare[grid](x)": lambda: bare[(1,)](x),
 "Launcher(bare)[grid](x)": lambda: fb[(1,)](x),
 "Launcher(bare).run(grid, x)": lambda: fb.run((1,), x),
 "ck.run direct": lambda: ck.run(1, 1, 1, torch._C._cuda_getCurrentRawStream(dev), ck.function, ck.packed_metadata, None, None, None, x),
 "eleven[grid]": lambda: eleven[(1, 1)](x, x, x, 8, 64, 64, 1, 64, 1, BLOCK_M=8, BLOCK_N=64),
 "Launcher(eleven)[grid]": lambda: fe[(1, 1)](x, x, x, 8, 64, 64, 1, 64, 1, BLOCK_M=8, BLOCK_N=64),
}
for name, fn in cases.items():
    print(f"{name:40s} {t(fn):6.2f} us/call eager", flush=True)
b = bare.device_caches[dev][4]
print(f"{'binder(x) alone':40s} {t(lambda: b(x)):6.2f}")
print(f"{'current_device()':40s} {t(lambda: torch.cuda.current_device()):6.2f}")
