"""The decode step against the memory wall, as a plot: lectures/results/a08_decode_bandwidth.png.

    python lectures/_tools/plot_decode_bandwidth.py        # from lectures/results/a08_decode_step.csv (CPU)

One group of bars per benched case (GPT-2 small to XL at batch 1, prompt 100; XL at batch 16, prompt 500),
one bar per path of ``bench --step`` (the a06 matmul, the a08 gemv, the gemv with PDL): the step's bytes
(every weight + the KV cache read per step) over its time, as a share of the measured copy bandwidth.
A black tick marks each case's floor."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from results_table import DECODE_FLOORS  # noqa: E402


def main() -> None:
    with open(RESULTS / "a08_decode_step.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cases = list(dict.fromkeys((r["model"], r["batch"], r["prompt"]) for r in rows))
    paths = list(dict.fromkeys(r["path"] for r in rows))
    share = {(r["model"], r["batch"], r["prompt"], r["path"]): 100 * float(r["of_copy"]) for r in rows}
    fig, ax = plt.subplots(figsize=(8, 3.6))
    width = 0.8 / len(paths)
    for j, path in enumerate(paths):
        xs = [i + (j - (len(paths) - 1) / 2) * width for i in range(len(cases))]
        ys = [share.get((*c, path), 0.0) for c in cases]
        bars = ax.bar(xs, ys, width, label=path)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    for i, c in enumerate(cases):
        if c in DECODE_FLOORS:
            ax.plot([i - 0.45, i + 0.45], [100 * DECODE_FLOORS[c]] * 2, color="black", lw=1.5)
    ax.set_xticks(range(len(cases)), [f"{m}\nB{b} P{p}" for m, b, p in cases])
    ax.set_ylabel("% of copy bandwidth")
    ax.set_ylim(0, 100)
    ax.set_title("GPT-2 decode step (bf16, H100): bytes read per step / time; black: the floor")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    out = RESULTS / "a08_decode_bandwidth.png"
    fig.savefig(out, dpi=120)
    print("wrote", out)


if __name__ == "__main__":
    main()
