"""ncu driver: the XL qkv GEMM (1600 -> 4800, bf16) as the gemv runs it at M = 1 and 4, and cuBLAS at M = 4.
Run: ncu --profile-from-start off --clock-control none --section ... python .../ncu_driver.py"""
import torch
from solutions.a08_gpt2_inference import gemv as gv

k, n = 1600, 4800
wt = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
w = wt.t()
x1 = torch.randn(1, k, device="cuda", dtype=torch.bfloat16)
x4 = torch.randn(4, k, device="cuda", dtype=torch.bfloat16)
calls = [lambda: gv.gemv(x1, w), lambda: gv.gemv(x4, w), lambda: gv.gemv(x4, w, config=(4, 256, 1, 8, 1, False)),
         lambda: torch.matmul(x4, w), lambda: torch.matmul(x4, w.contiguous())]
for c in calls:
    c()
torch.cuda.synchronize()
torch.cuda.profiler.start()
for c in calls:
    c()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
