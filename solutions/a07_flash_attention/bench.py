"""Stage 7 benchmark: flash attention (Triton, tiled PyTorch) vs naive attention and SDPA.

    python -m solutions.a07_flash_attention.bench            # full table + plots (H100, ~5 min)
    python -m solutions.a07_flash_attention.bench --sweep    # per-config kernel times at S=4096
    python -m solutions.a07_flash_attention.bench --quick    # S = 1k, 4k only, no plots
    python -m solutions.a07_flash_attention.bench --tune     # S = 4096, Triton autotuned (launch_options(tune=True))
    python -m common.course.bench a07          # your work (same options)
    python -m solutions.a07_flash_attention.bench --impl path/to/submission
    python -m solutions.a07_flash_attention.bench --shapes real --out DIR   # real-shape sweep vs SDPA (~2 min)

bf16, B·H·S = 2^19 tokens (B·H = 128 at S = 4096, 32 at S = 16384; H = 16),
d = 64 and 128, causal and not. Times are CUDA-event medians with L2 flushed
(common.timing.bench). FLOPs: 4·B·H·S²·d forward (halved when causal), backward
2.5x forward (common.roofline.attention_flops). Backward is timed alone
(autograd.grad with retain_graph), so the floors compare like with like.
Writes a07_flash_attention.{md,csv} and a07_*.png (--tune: a07_flash_attention_tuned.{md,csv})
to common.impl.results_dir: lectures/results/ for the solutions, lectures/results/<impl folder>/ otherwise
(or to --out).

``--shapes real`` sweeps the shapes attention runs at instead: S = 512 ... 16384 and the odd 1000
and 1537, d = 64 (GPT-2's head size, 12 heads) and 128 (16 heads), causal and not, B·H·S about
2^18 tokens·heads (common.shapes.attention_batch: B·H = 512 at S = 512, 12 at S = 16384), bf16,
forward and forward+backward, Triton against SDPA (F.scaled_dot_product_attention) in the same
run, each checked against SDPA (output and gradients) before it is timed, each call timed as a
CUDA graph replay (the GPU's time: at S = 512 a forward is short enough that the host's launch
work for Triton's kernels is a share of it; eager timing let it show in some runs). Writes
a07_real_shapes.{md,csv,png}: the ratio to SDPA per shape, its minimum and geometric mean per
pass, and the floors (forward >= 0.9x, forward+backward >= 0.8x). The grader's speed case for
this stage is three of these shapes (stage.py).
"""
from __future__ import annotations

import argparse
import csv
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import common  # noqa: F401
from common import DEVICE
from common.impl import Impl, add_impl_argument, command_line, results_dir
from common.roofline import attention_flops
from common.shapes import ATTENTION_HEADS, attention_batch
from common.testing import rel_error
from common.timing import bench, bench_graph, fmt_ratio, geomean

#: Set once by main() from --impl: the impl's two modules, and where the results go.
flash_torch = flash_triton = None
RESULTS: Path = results_dir("solutions")
TOKENS = 1 << 19
HEADS = 16
DTYPE = torch.bfloat16


def naive_attention(q, k, v, is_causal=False):
    """Materialises the [.., S, S] score matrix (fp32 softmax)."""
    s = (q @ k.transpose(-1, -2)).float() * (1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        nq, nk = q.shape[-2], k.shape[-2]
        i = torch.arange(nq, device=q.device)[:, None]
        j = torch.arange(nk, device=q.device)[None, :]
        s = s.masked_fill(j > i + (nk - nq), float("-inf"))
    return torch.softmax(s, dim=-1).to(q.dtype) @ v


def sdpa(q, k, v, is_causal=False):
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


IMPLS: dict = {}   # name -> attention function, in table order (use_impl fills it)


def use_impl(impl: Impl) -> None:
    """Point the bench at one impl: its two modules, the IMPLS table and the results folder."""
    global flash_torch, flash_triton, RESULTS
    flash_torch = impl.load("a07_flash_attention.flash_torch")
    flash_triton = impl.load("a07_flash_attention.flash_triton")
    RESULTS = results_dir(impl)
    IMPLS.clear()
    IMPLS.update({"triton": flash_triton.flash_attention, "sdpa": sdpa, "naive": naive_attention,
                  "tiled_torch": flash_torch.flash_attention_torch})

#: Largest S each slow implementation is timed at (memory / time).
MAX_S = {"naive": 4096, "tiled_torch": 2048}


def inputs(bh: int, s: int, d: int, grad: bool = True):
    b = max(1, bh // HEADS)
    h = bh // b
    mk = lambda: torch.randn(b, h, s, d, device="cuda", dtype=DTYPE).requires_grad_(grad)
    return mk(), mk(), mk()


def time_impl(fn, q, k, v, causal, graph: bool = False):
    """(forward ms, backward ms): medians, L2 flushed. graph=True (a GPU): the forward, and the forward
    with its backward, each captured once in a CUDA graph and replayed (common.timing.bench_graph), so
    the time is the GPU's alone, not the host's launch work that issues it (which a call of a few tens
    of microseconds can take longer than); backward = the two medians' difference. (A backward alone
    cannot be captured: autograd runs it on the stream of its forward, which ran outside the capture.)"""
    if graph:
        fwd = bench_graph(lambda: fn(q, k, v, causal)).median_ms
        do = torch.randn_like(q)
        both = bench_graph(lambda: torch.autograd.grad(fn(q, k, v, causal), (q, k, v), do)).median_ms
        return fwd, both - fwd
    fwd = bench(lambda: fn(q, k, v, causal)).median_ms
    o = fn(q, k, v, causal)
    do = torch.randn_like(o)
    bwd = bench(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)).median_ms
    del o
    return fwd, bwd


def check_tuned(d: int, causal: bool) -> str:
    """Rel. error of the autotuned Triton path vs SDPA in fp32 at S=1024 (a sanity check)."""
    q, k, v = inputs(16, 1024, d)
    o = flash_triton.flash_attention(q, k, v, causal)
    do = torch.randn_like(o)
    g = torch.autograd.grad(o, (q, k, v), do)
    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    of = F.scaled_dot_product_attention(qf, kf, vf, is_causal=causal)
    gf = torch.autograd.grad(of, (qf, kf, vf), do.float())
    errs = [((a.float() - b).norm() / b.norm()).item() for a, b in zip((o, *g), (of, *gf))]
    return " ".join(f"{n}={e:.1e}" for n, e in zip(("O", "dQ", "dK", "dV"), errs))


def run_table(sizes, d_list, rows_out):
    for d in d_list:
        for causal in (False, True):
            print(f"[a07] d={d} causal={causal} tuned-path check: {check_tuned(d, causal)}", flush=True)
            for s in sizes:
                bh = TOKENS // s
                q, k, v = inputs(bh, s, d)
                f_fwd = attention_flops(bh, s, s, d, causal)
                f_bwd = attention_flops(bh, s, s, d, causal, backward=True)
                for name, fn in IMPLS.items():
                    if s > MAX_S.get(name, 1 << 30):
                        continue
                    try:
                        fwd, bwd = time_impl(fn, q, k, v, causal)
                    except torch.OutOfMemoryError:
                        torch.cuda.empty_cache()
                        print(f"[a07] {name} S={s} d={d}: out of memory", flush=True)
                        continue
                    row = dict(impl=name, d=d, causal=causal, S=s, BH=bh, fwd_ms=fwd, bwd_ms=bwd,
                               fwd_tflops=f_fwd / fwd / 1e9, bwd_tflops=f_bwd / bwd / 1e9,
                               fwdbwd_tflops=(f_fwd + f_bwd) / (fwd + bwd) / 1e9)
                    rows_out.append(row)
                    print(f"[a07] {name:12s} d={d:3d} causal={int(causal)} S={s:6d} BH={bh:4d}  "
                          f"fwd {row['fwd_tflops']:6.1f}  bwd {row['bwd_tflops']:6.1f}  "
                          f"fwd+bwd {row['fwdbwd_tflops']:6.1f} TFLOP/s", flush=True)
                del q, k, v
                torch.cuda.empty_cache()


def memory(sizes, d=128, bh=8):
    """Peak memory above the inputs for forward and forward+backward, in MiB."""
    out = []
    for s in sizes:
        for name in ("triton", "sdpa", "naive"):
            fn = IMPLS[name]
            q, k, v = inputs(bh, s, d)
            do = torch.randn_like(q)
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            try:
                o = fn(q, k, v, True)
                torch.cuda.synchronize()
                fwd_peak = torch.cuda.max_memory_allocated() - base
                g = torch.autograd.grad(o, (q, k, v), do)
                torch.cuda.synchronize()
                all_peak = torch.cuda.max_memory_allocated() - base
                del o, g
            except torch.OutOfMemoryError:
                fwd_peak = all_peak = float("nan")
            out.append(dict(impl=name, S=s, BH=bh, d=d, fwd_MiB=fwd_peak / 2**20, fwdbwd_MiB=all_peak / 2**20))
            print(f"[a07] memory {name:7s} S={s:6d}: fwd {fwd_peak / 2**20:9.1f} MiB  "
                  f"fwd+bwd {all_peak / 2**20:9.1f} MiB", flush=True)
            del q, k, v, do
            torch.cuda.empty_cache()
    return out


def sweep(s=4096, d_list=(64, 128)):
    """Time every candidate config of each kernel alone (no autotuner), print a table."""
    import triton
    FT = flash_triton
    fwd_c = [(128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4), (128, 128, 8, 3), (128, 128, 8, 2),
             (64, 64, 4, 3), (64, 64, 4, 4), (128, 32, 4, 3), (64, 128, 4, 3)]
    dkdv_c = [(32, 128, 4, 4), (32, 128, 4, 5), (64, 128, 8, 3), (64, 128, 4, 3), (64, 64, 4, 3),
              (32, 64, 4, 4), (128, 128, 8, 2)]
    dq_c = [(128, 32, 4, 4), (128, 32, 4, 5), (128, 64, 8, 3), (128, 64, 4, 3), (64, 64, 4, 3),
            (64, 32, 4, 4), (128, 128, 8, 2)]
    forced = {}   # the best config so far of each kind, used for the next kinds' runs
    rows = []
    for d in d_list:
        for causal in (False, True):
            bh = TOKENS // s
            q, k, v = inputs(bh, s, d, grad=False)
            o, lse = FT.attention_forward(q, k, v, causal)
            do = torch.randn_like(o)
            f_fwd = attention_flops(bh, s, s, d, causal)
            f_bwd = attention_flops(bh, s, s, d, causal, backward=True)
            for kind, cands in (("fwd", fwd_c), ("dkdv", dkdv_c), ("dq", dq_c)):
                for bm, bn, w, st in cands:
                    cfg = {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": w, "num_stages": st}
                    try:
                        with FT.launch_options(**{**forced, kind: cfg}):
                            if kind == "fwd":
                                ms = bench(lambda: FT.attention_forward(q, k, v, causal)).median_ms
                                tf = f_fwd / ms / 1e9
                            else:
                                ms = bench(lambda: FT.attention_backward(q, k, v, o, lse, do, causal)).median_ms
                                tf = f_bwd / ms / 1e9
                    except Exception as e:  # e.g. out of shared memory
                        print(f"[a07] sweep {kind} {cfg}: {type(e).__name__}: {str(e)[:100]}", flush=True)
                        continue
                    rows.append((d, causal, kind, bm, bn, w, st, ms, tf))
                    print(f"[a07] sweep d={d} causal={int(causal)} {kind:5s} BM={bm:3d} BN={bn:3d} w={w} s={st}: "
                          f"{ms:7.3f} ms {tf:6.1f} TFLOP/s (whole {'fwd' if kind == 'fwd' else 'bwd'})", flush=True)
                # keep the best of this kind for the next kind's runs
                best = max((r for r in rows if r[:3] == (d, causal, kind)), key=lambda r: r[-1])
                cfg = {"BLOCK_M": best[3], "BLOCK_N": best[4], "num_warps": best[5], "num_stages": best[6]}
                forced[kind] = cfg
                print(f"[a07] BEST d={d} causal={int(causal)} {kind}: {cfg} {best[-1]:.1f} TFLOP/s", flush=True)
            for name in ("sdpa",):
                qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
                fwd, bwd = time_impl(IMPLS[name], qq, kk, vv, causal)
                print(f"[a07] {name} d={d} causal={int(causal)} S={s}: fwd {f_fwd / fwd / 1e9:.1f} "
                      f"bwd {f_bwd / bwd / 1e9:.1f} TFLOP/s", flush=True)
    return rows


def write_results(rows, mem, cmd, name="a07_flash_attention"):
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / f"{name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()))
        w.writeheader()
        w.writerows(rows)
    if mem:
        with open(RESULTS / "a07_flash_attention_memory.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(mem[0].keys()))
            w.writeheader()
            w.writerows(mem)
    get = {(r["impl"], r["d"], r["causal"], r["S"]): r for r in rows}
    lines = [f"# Stage 7: flash attention on {torch.cuda.get_device_name()}", "",
             f"Command: `{cmd}`", "",
             f"torch {torch.__version__}, triton {__import__('triton').__version__}. bf16, H={HEADS}, "
             f"B·H·S = {TOKENS} tokens. TFLOP/s with 4·B·H·S²·d forward (halved when causal), backward 2.5x forward; "
             "backward timed alone. CUDA-event medians, L2 flushed.", "",
             "## Floors at S = 4096 (Triton / SDPA)", "",
             "| d | causal | fwd Triton | fwd SDPA | ratio (floor 0.8) | bwd Triton | bwd SDPA | ratio (floor 0.6) |",
             "|---|---|---|---|---|---|---|---|"]
    for d in sorted({r["d"] for r in rows}):
        for causal in (False, True):
            t, s = get.get(("triton", d, causal, 4096)), get.get(("sdpa", d, causal, 4096))
            if t and s:
                lines.append(f"| {d} | {causal} | {t['fwd_tflops']:.0f} | {s['fwd_tflops']:.0f} | "
                             f"{t['fwd_tflops'] / s['fwd_tflops']:.3f} | {t['bwd_tflops']:.0f} | {s['bwd_tflops']:.0f} | "
                             f"{t['bwd_tflops'] / s['bwd_tflops']:.3f} |")
    lines += ["", "## All sizes (TFLOP/s: forward / backward / forward+backward)", "",
              "| impl | d | causal | S | B·H | fwd | bwd | fwd+bwd | fwd ms | bwd ms |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['impl']} | {r['d']} | {r['causal']} | {r['S']} | {r['BH']} | {r['fwd_tflops']:.1f} | "
                     f"{r['bwd_tflops']:.1f} | {r['fwdbwd_tflops']:.1f} | {r['fwd_ms']:.3f} | {r['bwd_ms']:.3f} |")
    if mem:
        lines += ["", f"## Peak memory above the inputs (causal, d={mem[0]['d']}, B·H={mem[0]['BH']}), MiB", "",
                  "| impl | S | forward | forward+backward |", "|---|---|---|---|"]
        for m in mem:
            lines.append(f"| {m['impl']} | {m['S']} | {m['fwd_MiB']:.1f} | {m['fwdbwd_MiB']:.1f} |")
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:16]))


def plots(rows, mem):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    for metric, label in (("fwd_tflops", "forward"), ("fwdbwd_tflops", "forward+backward")):
        ds = sorted({r["d"] for r in rows})
        fig, axes = plt.subplots(len(ds), 2, figsize=(11, 4 * len(ds)), squeeze=False)
        for i, d in enumerate(ds):
            for j, causal in enumerate((False, True)):
                ax = axes[i][j]
                for impl in IMPLS:
                    pts = sorted((r["S"], r[metric]) for r in rows if r["impl"] == impl and r["d"] == d
                                 and r["causal"] == causal)
                    if pts:
                        ax.plot(*zip(*pts), marker="o", label=impl)
                ax.set_xscale("log", base=2)
                ax.set_yscale("log")
                ax.set_title(f"{label}, d={d}, causal={causal}")
                ax.set_xlabel("S")
                ax.set_ylabel("TFLOP/s")
                ax.grid(alpha=0.3)
                ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / f"a07_tflops_{'fwd' if metric == 'fwd_tflops' else 'fwdbwd'}.png", dpi=110)
        plt.close(fig)
    if mem:
        fig, ax = plt.subplots(figsize=(6, 4))
        for impl in ("triton", "sdpa", "naive"):
            pts = sorted((m["S"], m["fwdbwd_MiB"]) for m in mem if m["impl"] == impl)
            ax.plot(*zip(*pts), marker="o", label=impl)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("S")
        ax.set_ylabel("peak MiB above inputs (fwd+bwd)")
        ax.set_title("memory: linear (flash) vs quadratic (naive)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / "a07_memory.png", dpi=110)
        plt.close(fig)


# ------------------------------------------------------------------ real shapes (--shapes real)
#: S swept: powers of two and two odd lengths (a partial last tile, rows not a multiple of 16).
REAL_S = (512, 1024, 2048, 4096, 8192, 16384, 1000, 1537)
#: output and gradients against SDPA's before timing (bf16: ~1e-2 apart when right)
REAL_TOL = 3e-2
#: The course's floors at real shapes: the ratio to SDPA (SDPA time / Triton time) of each pass.
REAL_FLOORS = {"fwd": 0.9, "fwd+bwd": 0.8}
REAL_COLS = ["S", "d", "causal", "B", "H", "BH", "dtype", "triton_fwd_ms", "triton_bwd_ms", "sdpa_fwd_ms",
             "sdpa_bwd_ms", "triton_fwd_tflops", "sdpa_fwd_tflops", "triton_fwdbwd_tflops", "sdpa_fwdbwd_tflops",
             "ratio_fwd", "ratio_fwdbwd", "rel_err", "note", "device"]


def real_configs(tiny: bool = False) -> list[tuple[int, int, bool, int, int]]:
    """(S, d, causal, B, H) of the sweep. ``tiny``: two small ones for a CPU check under the interpreter."""
    if tiny:
        return [(16, 16, False, 1, 2), (33, 16, True, 1, 2)]
    return [(s, d, causal, attention_batch(s, h), h) for d, h in ATTENTION_HEADS.items() for causal in (False, True)
            for s in REAL_S]


def _fwd_bwd(fn, q, k, v, do, causal):
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    o = fn(q, k, v, causal)
    return (o, *torch.autograd.grad(o, (q, k, v), do))


def real_row(s, d, causal, b, h, dtype) -> dict:
    """One shape: Triton's output and gradients checked against SDPA's, then both timed (forward,
    and backward alone as time_impl does); a wrong output is not timed (note WRONG)."""
    q, k, v = (torch.randn(b, h, s, d, device=DEVICE, dtype=dtype).requires_grad_() for _ in range(3))
    do = torch.randn_like(q)
    ref = _fwd_bwd(sdpa, q, k, v, do, causal)
    err = max(rel_error(x, y) for x, y in zip(_fwd_bwd(IMPLS["triton"], q, k, v, do, causal), ref))
    del ref
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (Triton interpreter)"
    row = dict(S=s, d=d, causal=causal, B=b, H=h, BH=b * h, dtype=str(dtype).replace("torch.", ""), rel_err=err,
               note="", device=dev)
    nan = float("nan")
    if not err <= REAL_TOL:
        row.update(note=f"WRONG: relative error {err:.1e} to SDPA > {REAL_TOL:.0e}", ratio_fwd=nan, ratio_fwdbwd=nan)
        return row
    f_fwd = attention_flops(b * h, s, s, d, causal)
    f_all = f_fwd + attention_flops(b * h, s, s, d, causal, backward=True)
    for name in ("triton", "sdpa"):
        fwd, bwd = time_impl(IMPLS[name], q, k, v, causal, graph=torch.cuda.is_available())
        row.update({f"{name}_fwd_ms": fwd, f"{name}_bwd_ms": bwd, f"{name}_fwd_tflops": f_fwd / fwd / 1e9,
                    f"{name}_fwdbwd_tflops": f_all / (fwd + bwd) / 1e9})
    row["ratio_fwd"] = row["sdpa_fwd_ms"] / row["triton_fwd_ms"]
    row["ratio_fwdbwd"] = (row["sdpa_fwd_ms"] + row["sdpa_bwd_ms"]) / (row["triton_fwd_ms"] + row["triton_bwd_ms"])
    return row


def real_sweep(out: Path, tiny: bool = False) -> list[dict]:
    """Every shape of real_configs(), each row appended to a07_real_shapes.csv as it is measured."""
    dtype = torch.float32 if tiny and not torch.cuda.is_available() else DTYPE   # the interpreter: fp32
    path = out / "a07_real_shapes.csv"
    path.unlink(missing_ok=True)
    rows = []
    for s, d, causal, b, h in real_configs(tiny):
        try:
            row = real_row(s, d, causal, b, h, dtype)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            row = dict(S=s, d=d, causal=causal, B=b, H=h, BH=b * h, note="out of memory",
                       ratio_fwd=float("nan"), ratio_fwdbwd=float("nan"))
        rows.append(row)
        with open(path, "a", newline="") as f:
            w = csv.DictWriter(f, fieldnames=REAL_COLS, extrasaction="ignore")
            if len(rows) == 1:
                w.writeheader()
            w.writerow(row)
        print(f"[a07] real S={s:6d} d={d:3d} causal={int(causal)} B·H={b * h:4d}  fwd {row['ratio_fwd']:.2f}x  "
              f"fwd+bwd {row['ratio_fwdbwd']:.2f}x SDPA  err {row.get('rel_err', float('nan')):.1e} {row['note']}",
              flush=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def load_real(path: Path) -> list[dict]:
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            for c in ("S", "d", "B", "H", "BH"):
                r[c] = int(r[c])
            r["causal"] = r["causal"] == "True"
            for c in REAL_COLS[7:18]:
                r[c] = float(r[c]) if r.get(c) else float("nan")
            rows.append(r)
    return rows


def real_summary(rows, key):
    """Ratios of one pass (``key``: ratio_fwd or ratio_fwdbwd): min (and where), geomean, counts."""
    timed = [r for r in rows if r[key] == r[key]]
    low = min(timed, key=lambda r: r[key], default=None)
    return dict(n=len(timed), bad=len(rows) - len(timed), min=low[key] if low else float("nan"),
                at=f"S={low['S']} d={low['d']} causal={low['causal']} B·H={low['BH']}" if low else "",
                geomean=geomean([r[key] for r in timed]))


def report_real(rows, out: Path, cmd: str):
    """a07_real_shapes.md and .png."""
    dev = rows[0].get("device", "")
    lines = [f"# Stage 7: flash attention at real shapes vs SDPA, on {dev}", "",
             f"Made by `{cmd}` (torch {torch.__version__}, triton {__import__('triton').__version__}). "
             "Ratio = SDPA time / Triton time (above 1: faster than SDPA), both timed in the same run: CUDA-event "
             "medians with L2 flushed, each call captured once in a CUDA graph and replayed (common.timing.bench_graph: "
             "the GPU's time, not the host's launch work): the forward, and the forward with its backward "
             "(autograd.grad); backward = their difference. "
             "B·H·S ≈ 2^18 tokens·heads per point (common.shapes.attention_batch). Triton's output and gradients "
             f"were compared with SDPA's before timing (relative error <= {REAL_TOL:.0e}, else WRONG: not timed, "
             "and the floor is not met).", ""]
    if dev.startswith("cpu"):
        lines += ["**CPU smoke run (Triton interpreter, fp32, wall-clock times): these numbers say nothing "
                  "about speed.**", ""]
    lines += ["## Floors", "", "| pass | floor | shapes timed | min ratio | at | geomean | |",
              "|---|---|---|---|---|---|---|"]
    for (label, need), key in zip(REAL_FLOORS.items(), ("ratio_fwd", "ratio_fwdbwd")):
        s = real_summary(rows, key)
        ok = "met" if s["n"] and not s["bad"] and s["min"] >= need else "**NOT met**"
        ok += f" ({s['bad']} not timed: wrong or out of memory)" if s["bad"] else ""
        lines.append(f"| {label} | {need:.2f}x | {s['n']} | {fmt_ratio(s['min'])} | {s['at']} | "
                     f"{fmt_ratio(s['geomean'])} | {ok} |")
    lines += ["", "## Minimum and geometric mean per pass, head size and mask", "",
              "| d | causal | fwd min | fwd geomean | fwd+bwd min | fwd+bwd geomean |", "|---|---|---|---|---|---|"]
    for d in sorted({r["d"] for r in rows}):
        for causal in (False, True):
            rr = [r for r in rows if r["d"] == d and r["causal"] == causal]
            if rr:
                f, fb = real_summary(rr, "ratio_fwd"), real_summary(rr, "ratio_fwdbwd")
                lines.append(f"| {d} | {causal} | {fmt_ratio(f['min'])} | {fmt_ratio(f['geomean'])} | "
                             f"{fmt_ratio(fb['min'])} | {fmt_ratio(fb['geomean'])} |")
    lines += ["", "## Per shape (TFLOP/s; ms)", "",
              "| S | d | causal | B·H | fwd Triton | fwd SDPA | fwd ratio | fwd+bwd Triton | fwd+bwd SDPA | "
              "fwd+bwd ratio | Triton fwd / bwd ms | note |", "|---" * 12 + "|"]
    for r in rows:
        if r["ratio_fwd"] == r["ratio_fwd"]:
            lines.append(f"| {r['S']} | {r['d']} | {r['causal']} | {r['BH']} | {r['triton_fwd_tflops']:.1f} | "
                         f"{r['sdpa_fwd_tflops']:.1f} | {fmt_ratio(r['ratio_fwd'])} | "
                         f"{r['triton_fwdbwd_tflops']:.1f} | "
                         f"{r['sdpa_fwdbwd_tflops']:.1f} | {fmt_ratio(r['ratio_fwdbwd'])} | "
                         f"{r['triton_fwd_ms']:.3f} / {r['triton_bwd_ms']:.3f} | |")
        else:
            lines.append(f"| {r['S']} | {r['d']} | {r['causal']} | {r['BH']} |" + " |" * 7 + f" {r['note']} |")
    (out / "a07_real_shapes.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:12]))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[a07] matplotlib missing: no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(max(8.0, 0.3 * len(rows)), 5))
    xs = range(len(rows))
    for (label, need), key, color in zip(REAL_FLOORS.items(), ("ratio_fwd", "ratio_fwdbwd"), ("tab:blue", "tab:red")):
        ax.plot(xs, [r[key] for r in rows], ls="", marker="o", ms=4, color=color, label=label)
        ax.axhline(need, color=color, ls="--", lw=1, label=f"floor {need:.2f}x ({label})")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"S={r['S']} d={r['d']}{' causal' if r['causal'] else ''} BH={r['BH']}" for r in rows],
                       rotation=90, fontsize=6)
    ax.set_ylabel("SDPA time / Triton time")
    ax.set_title(f"Flash attention at real shapes vs SDPA on {dev}")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "a07_real_shapes.png", dpi=110)
    plt.close(fig)


def main(argv=None):
    global RESULTS
    ap = argparse.ArgumentParser()
    add_impl_argument(ap, __spec__.name if __spec__ else __name__)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tune", action="store_true")
    ap.add_argument("--shapes", choices=("default", "real"), default="default",
                    help="real: the real-shape sweep vs SDPA (a07_real_shapes.*), nothing else")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default: common.impl.results_dir)")
    ap.add_argument("--report-only", metavar="CMD", default=None,
                    help="--shapes real: rebuild the .md and plot from --out's CSV; CMD is the command that made it")
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)   # --shapes real, tiny, CPU check
    args = ap.parse_args(argv)
    cmd = command_line(__spec__.name if __spec__ else __name__, argv)
    if args.report_only:
        out = args.out or results_dir(Impl.get(args.impl))
        report_real(load_real(out / "a07_real_shapes.csv"), out, args.report_only)
        return
    if not torch.cuda.is_available() and not args.tiny:
        sys.exit("bench.py needs a CUDA GPU")
    use_impl(Impl.get(args.impl))
    RESULTS = args.out or RESULTS
    torch.manual_seed(0)
    if args.shapes == "real" or args.tiny:
        RESULTS.mkdir(parents=True, exist_ok=True)
        report_real(real_sweep(RESULTS, args.tiny), RESULTS, cmd)
        return
    if args.sweep:
        sweep()
        return
    if args.tune:
        IMPLS.pop("naive")
        IMPLS.pop("tiled_torch")
    sizes = [4096] if args.tune else [1024, 4096] if args.quick else [1024, 2048, 4096, 8192, 16384]
    rows = []
    with flash_triton.launch_options(tune=args.tune):
        run_table(sizes, (64, 128), rows)
    if args.tune:
        for fn, tuned in flash_triton._tuned.items():
            for key, cfg in tuned.cache.items():
                print(f"[a07] autotune {getattr(fn, '__name__', fn)} key={key}: {cfg}", flush=True)
    full = not (args.quick or args.tune)
    mem = memory([1024, 2048, 4096, 8192, 16384]) if full else []
    write_results(rows, mem, cmd, "a07_flash_attention_tuned" if args.tune else "a07_flash_attention")
    if full:
        plots(rows, mem)


if __name__ == "__main__":
    main()
