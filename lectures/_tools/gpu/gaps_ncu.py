"""Nsight Compute at the shapes where the reference kernels miss their floors.

    OUT=/some/dir bash lectures/_tools/gpu/gaps_ncu.sh     # H100, about 2 minutes
    python3 lectures/_tools/gpu/gaps_ncu.py CASE            # the profiled program (ncu runs it)
    python3 lectures/_tools/gpu/gaps_ncu.py --summary DIR   # the table, from DIR/gaps_ncu_*.csv

One case per process. Each builds its inputs, calls every kernel of the case a few times
(Triton compiles and autotunes, cuBLAS / SDPA pick their kernels, the CUDA extension builds), then
calls each once more between cudaProfilerStart/Stop: that call is what ncu profiles
(--profile-from-start off). The cases are the minima of the real-shape sweeps
(lectures/results/a06_matmul_real_shapes.md, a07_real_shapes.md):

  mm_qkv2048        GPT-2 small QKV at T = 2048: [2048, 768] x [768, 2304] bf16, Triton 0.69x and
                    CUDA v7 0.60x cuBLAS (the minimum of both)
  mm_mlpdown8192    GPT-2 small MLP-down at T = 8192: [8192, 3072] x [3072, 768], Triton 0.78x
  mm_proj8192       GPT-2 small attention projection at T = 8192: [8192, 768] x [768, 768], Triton 0.77x
  attn_fwd512       attention forward S = 512, d = 128, non-causal, B·H = 512: Triton 0.61x SDPA
                    (0.68x after the 64x64 forward tiles of HALF_D128)
  attn_fb1537       attention forward + backward S = 1537, d = 128, causal, B·H = 160: Triton 0.70x
                    (0.73x after)

The summary prints one line per kernel: time, the tensor pipe's busy share (of the whole run and of
the cycles the SM had work), how busy the SMs were, issue slots busy, grid, block, registers,
achieved warps per SM, and the three largest warp-stall reasons (cycles per issued instruction).
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

CASES = ("mm_qkv2048", "mm_mlpdown8192", "mm_proj8192", "attn_fwd512", "attn_fb1537")
GEMMS = {"mm_qkv2048": (2048, 768, 2304), "mm_mlpdown8192": (8192, 3072, 768), "mm_proj8192": (8192, 768, 768)}
ATTN = {"attn_fwd512": (32, 16, 512, 128, False, False), "attn_fb1537": (10, 16, 1537, 128, True, True)}


def ops(case: str):
    import torch
    import torch.nn.functional as F
    from common.impl import load
    if case in GEMMS:
        m, k, n = GEMMS[case]
        tri = load("a06_matmul.matmul_triton", "solutions")
        cu = load("a06_matmul.matmul_cuda", "solutions")
        a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        b = torch.randn(k, n, device="cuda").to(torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        return [lambda: tri.matmul(a, b, out=c), lambda: torch.matmul(a, b, out=c),
                lambda: cu.matmul(a, b, 7, out=c)]
    bsz, h, s, d, causal, backward = ATTN[case]
    fa = load("a07_flash_attention.flash_triton", "solutions")
    q, k, v = (torch.randn(bsz, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=backward)
               for _ in range(3))
    if not backward:
        return [lambda: fa.flash_attention(q, k, v, causal),
                lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)]
    do = torch.randn_like(q)

    def fwd_bwd(fn):
        return lambda: torch.autograd.grad(fn(q, k, v, causal), (q, k, v), do)
    return [fwd_bwd(fa.flash_attention),
            fwd_bwd(lambda q, k, v, c: F.scaled_dot_product_attention(q, k, v, is_causal=c))]


def profile(case: str) -> None:
    import torch
    calls = ops(case)
    for _ in range(3):
        for f in calls:
            f()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for f in calls:
        f()
        torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def summary(folder: Path) -> str:
    """One line per kernel from the raw CSVs (read by common.course.ncu.parse_raw_csv). "tensor % elapsed" is
    the tensor pipe's busy share of the kernel's whole duration on an average SM; "tensor % active"
    the same over the cycles that SM had work; "SM busy %" = SM active cycles / elapsed cycles (what
    idle SMs, e.g. a part-full last wave, cost). Stalls: warp-cycles per issued instruction, the three
    largest reasons."""
    from common.course.ncu import parse_raw_csv
    lines = ["| case | kernel | time us | tensor % elapsed | tensor % active | SM busy % | issue % | grid | block "
             "| regs | warps/SM % | top stalls (cycles per instruction) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    stall = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")
    pct = lambda x: "?" if x is None else f"{x:.0f}"           # noqa: E731
    count = lambda x: "?" if x is None else f"{x:,.0f}"        # noqa: E731
    for case in CASES:
        path = folder / f"gaps_ncu_{case}.csv"
        kernels = parse_raw_csv(path.read_text()) if path.exists() else []
        if not kernels:
            lines.append(f"| {case} | (no report) |" + " |" * 10)
            continue
        for k in kernels:
            t_us = k.get("gpu__time_duration.sum") * 1e6       # parse_raw_csv gives seconds
            active, elapsed = k.get("sm__cycles_active.avg"), k.get("gpc__cycles_elapsed.max")
            busy = 100 * active / elapsed if active and elapsed else None
            stalls = sorted(((v or 0.0, stall.match(name).group(1)) for name, v in k.metrics.items()
                             if stall.match(name)), reverse=True)[:3]
            lines.append(
                f"| {case} | {k.name[:48]} | {pct(t_us) if t_us >= 100 else f'{t_us:.1f}'} | "
                f"{pct(k.get('sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed'))} | "
                f"{pct(k.get('sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active'))} | {pct(busy)} | "
                f"{pct(k.get('sm__issue_active.avg.pct_of_peak_sustained_elapsed'))} | "
                f"{count(k.get('launch__grid_size'))} | {count(k.get('launch__block_size'))} | "
                f"{count(k.get('launch__registers_per_thread'))} | "
                f"{pct(k.get('sm__warps_active.avg.pct_of_peak_sustained_active'))} | "
                + ", ".join(f"{name} {val:.1f}" for val, name in stalls) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--summary"]:
        print(summary(Path(sys.argv[2])))
    elif len(sys.argv) == 2 and sys.argv[1] in CASES:
        profile(sys.argv[1])
    else:
        sys.exit(f"usage: gaps_ncu.py CASE ({' | '.join(CASES)}) | --summary DIR")
