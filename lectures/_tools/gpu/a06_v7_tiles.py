"""Stage 6, CUDA v7: each tile shape of the persistent kernel, and its own pick, at every
shape of the real-shape sweep v7 can run (K and N multiples of 8), against cuBLAS in the same process.

    python3 lectures/_tools/gpu/a06_v7_tiles.py --out DIR     # H100: DIR/a06_v7_tiles.{md,csv}

What it answers: which tile shape wins where (wave quantization: a 128x256 tile leaves most of the
132 SMs idle at GPT-2's 512-token GEMMs), and whether `pick_tile` (matmul_v7_wgmma.cu, a cost model
of ceil(tiles / SMs) x tile area / relative speed) picks the winner or near it. Every output is
checked against torch.matmul before it is timed (relative error <= 2e-2, else WRONG, not timed).
Timing as the bench: CUDA-graph replay, CUDA-event median, L2 flushed (common.timing.bench_graph).
"""
from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from common.impl import add_impl_argument, load  # noqa: E402
from common.testing import rel_error  # noqa: E402
from common.timing import bench_graph, geomean  # noqa: E402
from solutions.a06_matmul.bench import real_shapes  # noqa: E402

TOL = 2e-2


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/a06_v7_tiles")
    add_impl_argument(ap, default="solutions")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cu = load("a06_matmul.matmul_cuda", args.impl)
    tiles = [None, *cu.V7_TILES]
    label = {None: "pick"} | {t: f"{t[0]}x{t[1]}" for t in cu.V7_TILES}
    rows = []
    shapes = [(sec, name, m, k, n) for sec, name, m, k, n, _ in real_shapes() if n % 8 == 0 and k % 8 == 0]
    shapes.append(("cube", "4096^3", 4096, 4096, 4096))
    for sec, name, m, k, n in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        ref = torch.matmul(a, b)
        base = bench_graph(lambda: torch.matmul(a, b, out=c)).median_ms
        row = {"section": sec, "shape": name, "M": m, "K": k, "N": n, "cublas_ms": base}
        for t in tiles:
            got = cu.matmul(a, b, 7, out=torch.full_like(c, float("nan")), tile=t)
            err = rel_error(got, ref)
            if not err <= TOL:
                row[label[t]] = float("nan")
                print(f"WRONG {name} tile {label[t]}: relative error {err:.2e}", flush=True)
                continue
            row[label[t]] = base / bench_graph(lambda: cu.matmul(a, b, 7, out=c, tile=t)).median_ms
        best = max((lab for lab in label.values() if lab != "pick"), key=lambda lab: row[lab])
        row["best"] = best
        rows.append(row)
        print(f"{name:28s} cuBLAS {2 * m * n * k / base / 1e9:6.1f} TFLOP/s  " +
              "  ".join(f"{label[t]} {row[label[t]]:.2f}x" for t in tiles) + f"  best {best}", flush=True)
        del a, b, c, ref
    cols = ["section", "shape", "M", "K", "N", "cublas_ms", *label.values(), "best"]
    with open(out / "a06_v7_tiles.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    gpt2 = [r for r in rows if r["section"] == "gpt2"]
    lines = [f"# CUDA v7 tile shapes vs cuBLAS (ratio = cuBLAS time / v7 time), {torch.cuda.get_device_name()}",
             "", "Made by `python3 lectures/_tools/gpu/a06_v7_tiles.py --out DIR`.", "",
             "| shape | M | K | N | " + " | ".join(label.values()) + " | best |",
             "|---|---|---|---|" + "---|" * (len(label) + 1)]
    for r in rows:
        lines.append(f"| {r['shape']} | {r['M']} | {r['K']} | {r['N']} | " +
                     " | ".join(f"{r[lab]:.2f}x" for lab in label.values()) + f" | {r['best']} |")
    lines += ["", "Over the GPT-2 shapes (the floor's set): " + ", ".join(
        f"{lab} min {min(r[lab] for r in gpt2):.2f}x geomean {geomean([r[lab] for r in gpt2]):.2f}x"
        for lab in label.values()),
              "best tile per shape: min {:.2f}x geomean {:.2f}x".format(
                  min(r[r['best']] for r in gpt2), geomean([r[r["best"]] for r in gpt2]))]
    (out / "a06_v7_tiles.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-2:]))


if __name__ == "__main__":
    main()
