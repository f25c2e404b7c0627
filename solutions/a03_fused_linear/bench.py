"""Benchmark the Linear track: stages 1-3 against F.linear, in one run.

For GPT-2-small shapes (tokens 8x128 and 32x1024; 768->3072 and 3072->768) it times
RoundTripLinear (stage 1), PretransposedLinear (stage 2), FusedLinear with the bias
in the cuBLAS epilogue and with the Triton bias kernel (stage 3), addmm on a
contiguous [in, out] copy of W^T (the operand-layout lesson), and F.linear, and
profiles each for host transfers and kernels per call.

    python -m solutions.a03_fused_linear.bench                  # the reference solutions
    python -m assignments.a03_fused_linear.bench                # your work
    python -m solutions.a03_fused_linear.bench --out lectures/results   # also write .md/.csv

Times are medians of CUDA-event timings with L2 flushed (common.timing.bench).
"""
from __future__ import annotations

import argparse
import csv
from pathlib import Path

import torch
import torch.nn.functional as F

from common.profiling import profile
from common.timing import bench

from ..a01_roundtrip_linear.roundtrip_linear import RoundTripLinear
from ..a02_pretransposed_linear.pretransposed_linear import PretransposedLinear
from .fused_linear import FusedLinear

TOKENS = [(8, 128), (32, 1024)]
FEATURES = [(768, 3072), (3072, 768)]


def run(dtypes=(torch.float32, torch.bfloat16)) -> list[dict]:
    rows = []
    for dtype in dtypes:
        for (b, t) in TOKENS:
            for (fin, fout) in FEATURES:
                torch.manual_seed(0)
                lin = torch.nn.Linear(fin, fout, device="cuda", dtype=dtype)
                x = torch.randn(b, t, fin, device="cuda", dtype=dtype)
                wt_copy = lin.weight.detach().t().contiguous()  # the layout lesson: W^T as an [in, out] copy
                layers = {
                    "F.linear": lambda: F.linear(x, lin.weight, lin.bias),
                    "FusedLinear(addmm)": FusedLinear.from_linear(lin, "addmm"),
                    "FusedLinear(triton)": FusedLinear.from_linear(lin, "triton"),
                    "addmm, W^T contiguous copy": lambda: torch.addmm(lin.bias, x.view(-1, fin), wt_copy),
                    "PretransposedLinear": PretransposedLinear.from_linear(lin),
                    "RoundTripLinear": RoundTripLinear.from_linear(lin),
                }
                ref = None
                for name, layer in layers.items():
                    fn = layer if not isinstance(layer, torch.nn.Module) else (lambda layer=layer: layer(x))
                    slow = name in ("RoundTripLinear", "PretransposedLinear")
                    ms = bench(fn, warmup_ms=50 if slow else 25, rep_ms=300 if slow else 100).median_ms
                    rep = profile(fn, calls=3)
                    ref = ms if name == "F.linear" else ref
                    rows.append(dict(dtype=str(dtype).replace("torch.", ""), tokens=b * t, shape=f"{fin}->{fout}",
                                     layer=name, ms=round(ms, 4), vs_F_linear=round(ref / ms, 3),
                                     host_transfers=rep.host_transfers, kernels=rep.n_kernels,
                                     memcpy_share=round(rep.memcpy_share, 3)))
                    print(f"{rows[-1]['dtype']:>8} {b * t:>6} {fin:>4}->{fout:<4} {name:<22} {ms:9.4f} ms "
                          f"{ref / ms:7.3f}x F.linear  transfers {rep.host_transfers}  kernels {rep.n_kernels}  "
                          f"memcpy share {rep.memcpy_share:.3f}",
                          flush=True)
                del layers
    return rows


def markdown(rows: list[dict]) -> str:
    head = ("| dtype | tokens | in->out | layer | ms | speed vs F.linear | host transfers/call | kernels/call "
            "| memcpy share of GPU time |")
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['tokens']} | {r['shape']} | {r['layer']} | {r['ms']:.4f} | "
                     f"{r['vs_F_linear']:.3f} | {r['host_transfers']} | {r['kernels']} | {r['memcpy_share']:.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="folder for a01_a03_linear.md and .csv")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "both"], default="both")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("this benchmark needs a CUDA GPU; the committed H100 numbers are in "
                         "lectures/results/a01_a03_linear.md")
    dtypes = {"float32": (torch.float32,), "bfloat16": (torch.bfloat16,),
              "both": (torch.float32, torch.bfloat16)}[args.dtype]
    rows = run(dtypes)
    table = markdown(rows)
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        with open(args.out / "a01_a03_linear.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        gpu = torch.cuda.get_device_name()
        (args.out / "a01_a03_linear.md").write_text(
            f"# Linear track (stages 1-3) on {gpu}\n\n"
            f"torch {torch.__version__}. Command: `python -m solutions.a03_fused_linear.bench --out lectures/results`\n\n"
            + table + "\n")


if __name__ == "__main__":
    main()
