"""Stage 7c (advanced, optional): the Hopper CUDA forward (flash_hopper.py) against SDPA's forward.

    python -m solutions.a07_flash_attention.bench_hopper                 # H100: d = 128, S = 2048..16384
    python -m solutions.a07_flash_attention.bench_hopper --dims 64 128 --out /tmp/x

bf16, B*S = 16384 tokens, H = 16, causal and not; each time is the median of
common.timing.bench (CUDA events through do_bench, L2 flushed between runs); TFLOP/s from
common.roofline.attention_flops (4·S²·d per head, halved when causal). Each case also checks the
output against SDPA's (relative error, printed). The course's floor: >= 1.0x SDPA's
forward at d = 128, S >= 2048 (the `ok` column). Writes a07c_flash_hopper.csv / .md to --out
(default common.impl.results_dir).
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from common.impl import Impl, add_impl_argument, command_line, results_dir
from common.roofline import attention_flops
from common.testing import rel_error
from common.timing import bench

TOKENS, HEADS = 16384, 16
SEQ_LENS = (2048, 4096, 8192, 16384)


def run(fa3, dims, seq_lens, out: Path, cmd: str) -> list[dict]:
    rows = []
    for d in dims:
        for s in seq_lens:
            b = max(1, TOKENS // s)
            q, k, v = (torch.randn(b, HEADS, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            for causal in (False, True):
                flops = attention_flops(b * HEADS, s, s, d, causal)
                o, _ = fa3.flash_attention_hopper(q, k, v, causal=causal)
                so = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                err = rel_error(o, so.double())
                t_ours = bench(lambda: fa3.flash_attention_hopper(q, k, v, causal=causal))
                t_sdpa = bench(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
                tf_ours, tf_sdpa = flops / t_ours.median_ms / 1e9, flops / t_sdpa.median_ms / 1e9
                row = dict(d=d, S=s, B=b, H=HEADS, causal=causal, ms_hopper=round(t_ours.median_ms, 4),
                           ms_sdpa=round(t_sdpa.median_ms, 4), tflops_hopper=round(tf_ours, 1),
                           tflops_sdpa=round(tf_sdpa, 1), ratio=round(tf_ours / tf_sdpa, 3),
                           rel_err_vs_sdpa=f"{err:.2e}", ok=(tf_ours >= tf_sdpa) if d == 128 else "")
                rows.append(row)
                print(f"[a07c] d={d} S={s:5d} B={b} causal={causal!s:5}  hopper {tf_ours:6.1f} TFLOP/s  "
                      f"sdpa {tf_sdpa:6.1f}  ratio {tf_ours / tf_sdpa:.2f}x  err vs sdpa {err:.1e}", flush=True)
            del q, k, v
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "a07c_flash_hopper.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    gpu = torch.cuda.get_device_name()
    lines = [f"# Stage 7c: Hopper CUDA forward vs SDPA forward ({gpu}, bf16, B·S = {TOKENS}, H = {HEADS})", "",
             f"`{cmd}` (torch {torch.__version__}; median of common.timing.bench, L2 flushed)", "",
             "| d | S | causal | hopper ms | SDPA ms | hopper TFLOP/s | SDPA TFLOP/s | ratio | err vs SDPA |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['d']} | {r['S']} | {r['causal']} | {r['ms_hopper']} | {r['ms_sdpa']} | {r['tflops_hopper']} "
                     f"| {r['tflops_sdpa']} | {r['ratio']}x | {r['rel_err_vs_sdpa']} |")
    floor = [r for r in rows if r["d"] == 128 and r["S"] >= 2048]
    if floor:
        worst = min(floor, key=lambda r: r["ratio"])
        lines += ["", f"Floor (>= 1.0x SDPA at d = 128, S >= 2048): {'met' if worst['ratio'] >= 1 else 'NOT met'}; "
                      f"worst {worst['ratio']}x at S = {worst['S']}, causal = {worst['causal']}."]
    (out / "a07c_flash_hopper.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[4:]), flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser()
    add_impl_argument(ap, __spec__.name if __spec__ else __name__)
    ap.add_argument("--dims", type=int, nargs="+", default=[128], choices=(64, 128))
    ap.add_argument("--seq", type=int, nargs="+", default=list(SEQ_LENS))
    ap.add_argument("--out", type=Path, default=None, help="where to write (default: common.impl.results_dir)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("bench_hopper.py needs an sm_90 GPU (H100/H200)")
    impl = Impl.get(args.impl)
    fa3 = impl.load("a07_flash_attention.flash_hopper")
    torch.manual_seed(0)
    run(fa3, args.dims, args.seq, args.out or results_dir(impl),
        command_line(__spec__.name if __spec__ else __name__, argv))


if __name__ == "__main__":
    main()
