"""Benchmark assignment 6 against cuBLAS (torch.matmul) in the same run.

    python -m solutions.a06_matmul.bench            # full run on a GPU (~4 minutes)
    python -m solutions.a06_matmul.bench --quick    # fewer sizes
    python -m common.course.bench a06 --out /tmp/mine
    python -m solutions.a06_matmul.bench --impl path/to/submission
    python -m solutions.a06_matmul.bench --shapes real   # the GEMMs GPT-2 runs (~3-4 minutes)

Writes ``a06_matmul.md`` (tables, floors, the command), ``a06_matmul.csv`` and two plots
(``a06_matmul_tflops.png``: TFLOP/s against size per version; ``a06_matmul_quantization.png``:
the tile/wave-quantization sweep) to ``--out`` (default ``common.impl.results_dir``: lectures/results/ for
solutions/, lectures/results/<impl folder>/ otherwise).

``--shapes real`` times instead the GEMMs GPT-2 really runs (common.shapes: QKV, attention
projection, MLP up and down, LM head of GPT-2 small to XL at 512 to 16384 tokens; decode-sized and
odd token counts; unaligned cubes), bf16 and, for a subset, fp32 with TF32 against cuBLAS TF32:
Triton, CUDA v7 (Hopper, K and N multiples of 8) and cuBLAS in the same run, and writes
``a06_matmul_real_shapes.md`` (per-shape ratios to cuBLAS, the minimum and geometric mean per
implementation, the floors), ``a06_matmul_real_shapes.csv`` and ``a06_matmul_real_shapes.png``.
The grader's speed case for this stage is three of these shapes (stage.py).

Timing: common.timing.bench (CUDA events through triton.testing.do_bench, median, L2
flushed before every run), after a warm-up call; each kernel's output is checked against
cuBLAS before it is timed. cuBLAS fp32 runs with TF32 off (the fp32 floor) and, in a
separate column, with TF32 on. A CUDA version that crashes a probe process is skipped
(and reported), so one broken kernel cannot take the whole run down.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import math
import subprocess
import sys
from pathlib import Path

import torch

from common import DEVICE, gpu
from common.impl import REPO, Impl, add_impl_argument, command_line, results_dir
from common.roofline import matmul_flops
from common.shapes import GPT2_MODELS, gpt2_gemms
from common.testing import rel_error
from common.timing import bench, bench_graph, fmt_ratio, geomean

STAGE = "a06_matmul"
SQUARE = [512, 1024, 2048, 3072, 4096, 6144, 8192]
SQUARE_QUICK = [512, 1024, 2048, 4096]
GPT2 = {  # GPT-2 small, batch 8 x 1024 tokens: (M, K, N)
    "qkv 8192x768->2304": (8192, 768, 2304),
    "attn-proj 8192x768->768": (8192, 768, 768),
    "mlp-up 8192x768->3072": (8192, 768, 3072),
    "mlp-down 8192x3072->768": (8192, 3072, 768),
    "lm-head 8192x768->50257": (8192, 768, 50257),
}
CSV_COLS = ["section", "shape", "M", "N", "K", "dtype", "impl", "ms", "tflops", "rel_err", "tiles", "eager_ms",
            "device", "sms"]
REAL_COLS = CSV_COLS + ["ratio", "note"]   # --shapes real: the ratio to cuBLAS, why a kernel was skipped
MAX_SIZE = {1: 2048, 2: 4096}  # the slowest versions stop early (seconds per call above)
SM_TILE = 128  # v5 and Triton's sweep config both use 128x128 tiles


def tflops(m: int, n: int, k: int, ms: float) -> float:
    return matmul_flops(m, n, k) / ms / 1e9


def _timed(fn, graph: bool = True) -> float:
    """Median ms of fn(), after one warm-up call (compile / autotune / build outside the timing).
    graph=True: common.timing.bench_graph (replays of a CUDA graph of fn, so the Python and launch
    overhead of a call, tens of µs for a Triton launch, is not counted: kernel time);
    graph=False: common.timing.bench (eager calls)."""
    fn()
    if not torch.cuda.is_available():   # the CPU smoke run (--tiny): wall clock, the CSV's device says cpu
        return bench(fn).median_ms
    torch.cuda.synchronize()
    return (bench_graph(fn) if graph else bench(fn)).median_ms


# ------------------------------------------------------------------ probe CUDA versions
PROBE = """
import sys, torch, common
from common.impl import load
mod = load("{stage}.matmul_cuda", {impl!r})
for v in {versions}:
    print("probe", v, flush=True)
    dt = torch.float32 if v <= 4 else torch.bfloat16
    shapes = ((129, 264, 72) if v == 7 else (129, 257, 67), (1000, 1544, 1032), (1024, 1024, 1024))
    for m, n, k in shapes:  # version 7 (TMA) needs K and N multiples of 8
        a = torch.randn(m, k, device="cuda").to(dt); b = torch.randn(k, n, device="cuda").to(dt)
        c = mod.matmul(a, b, v); torch.cuda.synchronize()
        ref = a.double() @ b.double()
        err = ((c.double() - ref).norm() / ref.norm()).item()
        assert err < 2e-2, (v, m, n, k, err)
    print("ok", v, flush=True)
"""


def _wave_example(sms: int) -> str:
    """An n of the sweep where 128k -> 128k + 8 crosses a wave of 128x128 tiles on ``sms`` SMs (132 on an
    H100: 1408 -> 1416, 121 -> 144 tiles)."""
    for k in range(8, 20):
        if sms and -(-k * k // sms) < -(-(k + 1) ** 2 // sms):
            return f"e.g. {128 * k} -> {128 * k + 8}: {k * k} -> {(k + 1) ** 2} tiles, past {sms * -(-k * k // sms)}"
    return "none in this sweep"


def probe_cuda(impl: Impl, versions: list[int]) -> tuple[list[int], dict[int, str]]:
    """Run each version on small problems in child processes; return (good, {bad: why})."""
    good, bad, todo = [], {}, list(versions)
    while todo:
        code = PROBE.format(stage=STAGE, impl=str(impl.root), versions=todo)
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
        oks = [int(line.split()[1]) for line in r.stdout.splitlines() if line.startswith("ok ")]
        good += oks
        rest = [v for v in todo if v not in oks]
        if not rest:
            break
        if r.returncode == 0:  # should not happen
            bad.update({v: "no result" for v in rest})
            break
        bad[rest[0]] = (r.stderr.strip().splitlines() or ["failed"])[-1][:200]
        print(f"[bench] CUDA v{rest[0]} failed its probe: {bad[rest[0]]}", file=sys.stderr)
        todo = rest[1:]
    return good, bad


# ------------------------------------------------------------------ measurement
class Runner:
    def __init__(self, impl: Impl, cuda_versions: list[int], csv_path: Path | None = None, cols=CSV_COLS):
        self.csv_path, self.cols = csv_path, cols
        has_gpu = torch.cuda.is_available()
        self.device = torch.cuda.get_device_name() if has_gpu else "cpu (Triton interpreter)"
        self.sms = torch.cuda.get_device_properties(0).multi_processor_count if has_gpu else 0
        self.tri = impl.load(f"{STAGE}.matmul_triton")
        self.cu = impl.load(f"{STAGE}.matmul_cuda") if cuda_versions else None
        self.versions = cuda_versions
        self.v7_missing = "" if 7 in cuda_versions else "not available"   # --shapes real: why v7 is not timed
        self.rows: list[dict] = []

    def add(self, section, shape_name, m, n, k, dtype, impl, ms, err=float("nan"), **extra):
        row = dict(section=section, shape=shape_name, M=m, N=n, K=k, dtype=str(dtype).replace("torch.", ""),
                   impl=impl, ms=ms, tflops=tflops(m, n, k, ms) if ms == ms else float("nan"), rel_err=err,
                   tiles="", eager_ms="", device=self.device, sms=self.sms)
        row.update(extra)
        self.rows.append(row)
        if self.csv_path is not None:  # append as we go: a run cut short still leaves its numbers
            new = not self.csv_path.exists()
            with open(self.csv_path, "a", newline="") as f:
                w = csv.DictWriter(f, fieldnames=self.cols, extrasaction="ignore")
                if new:
                    w.writeheader()
                w.writerow(row)
        more = f"  {extra['ratio']:.2f}x cuBLAS" if extra.get("ratio", "") != "" else ""
        more += f"  {extra['note']}" if extra.get("note") else ""
        print(f"{section:>9} {shape_name:>26} {row['dtype']:>8} {impl:>22} {ms:9.4f} ms {row['tflops']:8.1f} TFLOP/s"
              f"  err {err:.1e}{more}", flush=True)

    def gemm_set(self, section: str, name: str, m: int, n: int, k: int, dtype: torch.dtype, versions):
        a = torch.randn(m, k, device="cuda").to(dtype)
        b = torch.randn(k, n, device="cuda").to(dtype)
        if dtype == torch.float32:
            torch.backends.cuda.matmul.allow_tf32 = True
            ref_tf32 = torch.matmul(a, b)
            self.add(section, name, m, n, k, dtype, "cuBLAS tf32", _timed(lambda: torch.matmul(a, b)))
            torch.backends.cuda.matmul.allow_tf32 = False
        ref = torch.matmul(a, b)
        self.add(section, name, m, n, k, dtype, "cuBLAS", _timed(lambda: torch.matmul(a, b)))
        if dtype == torch.float32:
            c = self.tri.matmul(a, b)  # tf32
            self.add(section, name, m, n, k, dtype, "Triton tf32", _timed(lambda: self.tri.matmul(a, b)),
                     rel_error(c, ref_tf32))
        else:
            c = self.tri.matmul(a, b)
            self.add(section, name, m, n, k, dtype, "Triton", _timed(lambda: self.tri.matmul(a, b)), rel_error(c, ref))
        for v in versions:
            if v not in self.versions or max(m, n, k) > MAX_SIZE.get(v, 1 << 30):
                continue
            if v == 7 and (n % 8 or k % 8):  # TMA needs 16-byte row strides
                continue
            out = torch.empty(m, n, device="cuda", dtype=dtype)
            c = self.cu.matmul(a, b, v, out=out)
            self.add(section, name, m, n, k, dtype, f"CUDA v{v}",
                     _timed(lambda: self.cu.matmul(a, b, v, out=out)), rel_error(c, ref))
        del a, b

    def sweep(self, sizes: list[int]):
        cfg = self.tri.SWEEP_CONFIG
        for s in sizes:
            a = torch.randn(s, s, device="cuda").to(torch.bfloat16)
            b = torch.randn(s, s, device="cuda").to(torch.bfloat16)
            ref = torch.matmul(a, b)
            tiles = math.ceil(s / SM_TILE) ** 2
            extra = dict(tiles=tiles)
            self.add("sweep", f"{s}^3", s, s, s, torch.bfloat16, "cuBLAS", _timed(lambda: torch.matmul(a, b)), **extra)
            c = self.tri.matmul(a, b, config=cfg)
            self.add("sweep", f"{s}^3", s, s, s, torch.bfloat16, "Triton 128x128 fixed",
                     _timed(lambda: self.tri.matmul(a, b, config=cfg)), rel_error(c, ref), **extra)
            if 5 in self.versions:
                c = self.cu.matmul(a, b, 5)
                self.add("sweep", f"{s}^3", s, s, s, torch.bfloat16, "CUDA v5",
                         _timed(lambda: self.cu.matmul(a, b, 5)), rel_error(c, ref), **extra)

    def fusion(self, shapes: dict[str, tuple[int, int, int]]):
        import torch.nn.functional as F
        for name, (m, k, n) in shapes.items():
            x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
            w = (torch.randn(k, n, device="cuda") / math.sqrt(k)).to(torch.bfloat16)
            bias = torch.randn(n, device="cuda").to(torch.bfloat16)
            ref = F.gelu(torch.addmm(bias, x, w), approximate="tanh")
            variants = {
                "cuBLAS GEMM only": lambda: torch.matmul(x, w),
                "Triton GEMM only": lambda: self.tri.matmul(x, w),
                "Triton GEMM+bias+GELU fused": lambda: self.tri.matmul(x, w, bias, "gelu_tanh"),
                "Triton GEMM+bias, torch GELU": lambda: F.gelu(self.tri.matmul(x, w, bias), approximate="tanh"),
                "Triton GEMM, torch bias+GELU": lambda: F.gelu(self.tri.matmul(x, w) + bias, approximate="tanh"),
                "cuBLAS addmm, torch GELU": lambda: F.gelu(torch.addmm(bias, x, w), approximate="tanh"),
            }
            for label, fn in variants.items():
                out = fn()
                err = rel_error(out, ref) if "only" not in label else float("nan")
                self.add("fusion", name, m, n, k, torch.bfloat16, label, _timed(fn), err,
                         eager_ms=_timed(fn, graph=False))
            fn = lambda: self.tri.matmul(x, w, bias, "gelu_tanh", fast_tanh=False)  # noqa: E731
            self.add("fusion", name, m, n, k, torch.bfloat16, "Triton fused, precise tanh", _timed(fn),
                     rel_error(fn(), ref), eager_ms=_timed(fn, graph=False))
            del x, w, bias

    def real(self, section: str, name: str, m: int, k: int, n: int, dtype: torch.dtype):
        """One real shape x [m, k] @ W [k, n]: cuBLAS, then each kernel checked against it and timed,
        with its ratio to cuBLAS (cuBLAS time / kernel time: above 1 is faster). fp32 runs TF32 on
        both sides (Triton's default, cuBLAS with allow_tf32)."""
        a = torch.randn(m, k, device=DEVICE).to(dtype)
        b = torch.randn(k, n, device=DEVICE).to(dtype)
        tf32 = dtype == torch.float32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            ref = torch.matmul(a, b)
            base = _timed(lambda: torch.matmul(a, b))
            self.add(section, name, m, n, k, dtype, "cuBLAS tf32" if tf32 else "cuBLAS", base)
            kernels = {"Triton tf32" if tf32 else "Triton": lambda: self.tri.matmul(a, b)}
            if not tf32:
                why = self.v7_missing or ("v7 (TMA) needs K and N multiples of 8" if n % 8 or k % 8 else "")
                if why:
                    self.add(section, name, m, n, k, dtype, "CUDA v7", float("nan"), note=f"skipped: {why}")
                else:
                    out = torch.empty(m, n, device=DEVICE, dtype=dtype)
                    kernels["CUDA v7"] = lambda: self.cu.matmul(a, b, 7, out=out)
            for label, fn in kernels.items():
                err = rel_error(fn(), ref)
                if not err <= REAL_TOL:   # a wrong output is not timed: it fails its floor
                    self.add(section, name, m, n, k, dtype, label, float("nan"), err,
                             note=f"WRONG: relative error {err:.1e} to cuBLAS > {REAL_TOL:.0e}")
                    continue
                ms = _timed(fn)
                self.add(section, name, m, n, k, dtype, label, ms, err, ratio=base / ms)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = False
            del a, b


# ------------------------------------------------------------------ real shapes (--shapes real)
#: (GPT-2 size, tokens B·T): every size at 8192 tokens, small and XL at more token counts. Each new
#: shape costs one Triton autotune (~1-2 s on the H100): 40 GEMMs here.
REAL_GPT2 = [("small", 512), ("small", 2048), ("small", 8192), ("small", 16384), ("medium", 8192),
             ("large", 8192), ("xl", 2048), ("xl", 8192)]
#: GPT-2 small at decode-sized and odd token counts (one to 64 sequences decoding; prompts one
#: token short of or past a power of two), three of its GEMMs: 18 shapes.
REAL_DECODE_T = (1, 8, 64, 511, 1023, 4097)
REAL_DECODE_GEMMS = ("qkv", "mlp-down", "lm-head")
#: Unaligned cubes, (M, K, N): rows of 1793 or 4097 bf16 are not a multiple of 16 bytes.
REAL_CUBES = {"1793^3": (1793, 1793, 1793), "4097^3": (4097, 4097, 4097), "3000x1000x777": (3000, 1000, 777)}
#: fp32 (TF32) for a subset: GPT-2 small's GEMMs at 2048 tokens and one unaligned cube.
REAL_FP32 = {("gpt2", f"small {g} T=2048") for g in ("qkv", "attn-proj", "mlp-up", "mlp-down", "lm-head")} | {
    ("cube", "1793^3")}
#: each kernel's output against cuBLAS's before it is timed (bf16 outputs: ~4e-3 apart when right)
REAL_TOL = 2e-2
#: The course's floors at real shapes: (kernel, dtype, its baseline, floor), judged at the GPT-2 shapes.
REAL_FLOORS = [("Triton", "bfloat16", "cuBLAS", 0.85), ("Triton tf32", "float32", "cuBLAS tf32", 0.8),
               ("CUDA v7", "bfloat16", "cuBLAS", 0.8)]
REAL_SECTIONS = {"gpt2": "GPT-2 shapes (512-16384 tokens)", "decode": "GPT-2 small, decode-sized and odd T",
                 "cube": "unaligned cubes"}


def real_shapes(tiny: bool = False) -> list[tuple[str, str, int, int, int, tuple[torch.dtype, ...]]]:
    """The sweep: (section, name, M, K, N, dtypes) per shape. ``tiny``: three small shapes that
    run in seconds under the Triton interpreter (a CPU check of the code path, no numbers)."""
    both, bf16 = (torch.bfloat16, torch.float32), (torch.bfloat16,)
    if tiny:
        return [("gpt2", "tiny qkv T=24", 24, 16, 48, both), ("decode", "tiny lm-head T=1", 1, 16, 40, bf16),
                ("cube", "17^3", 17, 17, 17, bf16)]
    out = []
    for model, t in REAL_GPT2:
        for g, (m, k, n) in gpt2_gemms(GPT2_MODELS[model][0], t).items():
            out.append(("gpt2", f"{model} {g} T={t}", m, k, n))
    for t in REAL_DECODE_T:
        for g, (m, k, n) in gpt2_gemms(GPT2_MODELS["small"][0], t).items():
            if g in REAL_DECODE_GEMMS:
                out.append(("decode", f"small {g} T={t}", m, k, n))
    out += [("cube", name, m, k, n) for name, (m, k, n) in REAL_CUBES.items()]
    return [(sec, name, m, k, n, both if (sec, name) in REAL_FP32 else bf16) for sec, name, m, k, n in out]


def _ratio(r: dict) -> float:
    """A row's ratio to cuBLAS; NaN for cuBLAS itself and for a kernel skipped or not timed."""
    x = r.get("ratio", "")
    return float("nan") if x == "" else x


def real_summary(rows: list[dict], impl: str, dtype: str, sections) -> dict:
    """Ratios to cuBLAS of one kernel over the shapes of ``sections``: the minimum (and where),
    the geometric mean, how many were timed, wrong (failed the check) or skipped."""
    rs = [r for r in rows if r["impl"] == impl and r["dtype"] == dtype and r["section"] in sections]
    timed = [r for r in rs if _ratio(r) == _ratio(r)]
    wrong = [r for r in rs if str(r.get("note", "")).startswith("WRONG")]
    low = min(timed, key=lambda r: r["ratio"], default=None)
    return dict(n=len(timed), wrong=len(wrong), skipped=len(rs) - len(timed) - len(wrong),
                min=low["ratio"] if low else float("nan"), at=low["shape"] if low else "",
                geomean=geomean([r["ratio"] for r in timed]),
                skip_note=next((r["note"] for r in rs if str(r.get("note", "")).startswith("skipped")), ""))


def report_real(rows: list[dict], out: Path, cmd: str, versions: str = ""):
    """a06_matmul_real_shapes.md and .png from the rows of a --shapes real run."""
    out.mkdir(parents=True, exist_ok=True)
    dev = rows[0]["device"]
    md = [f"# Assignment 6: matmul at the shapes GPT-2 runs, on {dev}", "",
          f"Made by `{cmd}` on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC "
          f"({versions or f'torch {torch.__version__}'}). Ratio = cuBLAS time / kernel time (above 1: faster "
          "than cuBLAS), both timed in the same run by CUDA-graph replay (CUDA events, median, L2 flushed "
          "before each run). Every kernel's output was compared with cuBLAS's before it was timed "
          f"(relative error <= {REAL_TOL:.0e}, else it is marked WRONG, not timed, and fails its floor). "
          "fp32 runs TF32 on both sides (cuBLAS with allow_tf32). Shapes are x [M, K] @ W [K, N] "
          "(common.shapes.gpt2_gemms: QKV [T, d]x[d, 3d], attn-proj [T, d]x[d, d], MLP-up [T, d]x[d, 4d], "
          "MLP-down [T, 4d]x[4d, d], LM-head [T, d]x[d, 50257]).", ""]
    if dev.startswith("cpu"):
        md += ["**CPU smoke run (Triton interpreter, wall-clock times): these numbers say nothing about "
               "speed.**", ""]
    md += ["## Floors, judged at the GPT-2 shapes", "",
           "| kernel | dtype | vs | floor | shapes timed | min ratio | at | geomean | |",
           "|---|---|---|---|---|---|---|---|---|"]
    for impl, dt, base, need in REAL_FLOORS:
        s = real_summary(rows, impl, dt, ("gpt2",))
        if s["n"] == 0 and not s["wrong"]:
            verdict = f"not measured ({s['skip_note'] or 'no rows'})"
        else:
            verdict = "met" if s["wrong"] == 0 and s["min"] >= need else "**NOT met**"
            if s["wrong"]:
                verdict += f" ({s['wrong']} wrong outputs)"
        md.append(f"| {impl} | {dt} | {base} | {need:.2f}x | {s['n']} | {fmt_ratio(s['min'])} | {s['at']} | "
                  f"{fmt_ratio(s['geomean'])} | {verdict} |")
    md += ["", "## Minimum and geometric mean of the ratio to cuBLAS, per kernel, dtype and shape set", "",
           "| kernel | dtype | shapes | timed | wrong | skipped | min ratio | at | geomean |",
           "|---|---|---|---|---|---|---|---|---|"]
    for impl, dt, _, _ in REAL_FLOORS:
        for secs, label in [((k,), v) for k, v in REAL_SECTIONS.items()] + [(tuple(REAL_SECTIONS), "all")]:
            s = real_summary(rows, impl, dt, secs)
            if s["n"] or s["wrong"] or s["skipped"]:
                md.append(f"| {impl} | {dt} | {label} | {s['n']} | {s['wrong']} | {s['skipped']} | "
                          f"{fmt_ratio(s['min'])} | {s['at']} | {fmt_ratio(s['geomean'])} |")
    for dt, base, kernels in (("bfloat16", "cuBLAS", ("Triton", "CUDA v7")),
                              ("float32", "cuBLAS tf32", ("Triton tf32",))):
        rs = [r for r in rows if r["dtype"] == dt]
        if not rs:
            continue
        md += ["", f"## Per shape, {dt} (TFLOP/s, ratio to {base})", "",
               "| set | shape | M | K | N | " + base + " | " + " | ".join(f"{k} | ratio" for k in kernels) + " |",
               "|---" * (6 + 2 * len(kernels)) + "|"]
        for sec, shape in dict.fromkeys((r["section"], r["shape"]) for r in rs):
            rr = {r["impl"]: r for r in rs if r["section"] == sec and r["shape"] == shape}
            b = rr.get(base)
            if b is None:
                continue
            cells = []
            for k in kernels:
                r = rr.get(k)
                if r is None:
                    cells += ["", ""]
                elif _ratio(r) != _ratio(r):
                    cells += [r.get("note", ""), ""]
                else:
                    cells += [f"{r['tflops']:.1f}", f"{r['ratio']:.2f}x"]
            md.append(f"| {sec} | {shape} | {b['M']} | {b['K']} | {b['N']} | {b['tflops']:.1f} | "
                      + " | ".join(cells) + " |")
    (out / "a06_matmul_real_shapes.md").write_text("\n".join(md) + "\n")
    _plot_real(rows, out, dev)


def _plot_real(rows: list[dict], out: Path, dev: str):
    """a06_matmul_real_shapes.png: the ratio to cuBLAS per shape, one series per kernel, the floors."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[bench] matplotlib missing: no plot", file=sys.stderr)
        return
    keys = list(dict.fromkeys((r["dtype"], r["shape"]) for r in rows))
    fig, ax = plt.subplots(figsize=(max(8.0, 0.22 * len(keys)), 5.5))
    for (impl, dt, _, need), color in zip(REAL_FLOORS, ("tab:blue", "tab:orange", "tab:green")):
        pts = [(keys.index((r["dtype"], r["shape"])), r["ratio"]) for r in rows
               if r["impl"] == impl and r["dtype"] == dt and _ratio(r) == _ratio(r)]
        if pts:
            ax.plot(*zip(*pts), ls="", marker="o", ms=4, color=color, label=f"{impl} {dt}")
        ax.axhline(need, color=color, ls="--", lw=1, label=f"floor {need:.2f}x ({impl} {dt})")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(keys)))
    ax.set_xticklabels([f"{s} {'fp32' if d == 'float32' else 'bf16'}" for d, s in keys], rotation=90, fontsize=6)
    ax.set_ylabel("cuBLAS time / kernel time")
    ax.set_title(f"Matmul at GPT-2's shapes vs cuBLAS on {dev}")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "a06_matmul_real_shapes.png", dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------ report
def _table(rows, key_col, impls, fmt="{:.1f}", val="tflops"):
    keys = list(dict.fromkeys(r[key_col] for r in rows))
    lines = [f"| {key_col} | " + " | ".join(impls) + " |", "|---" * (len(impls) + 1) + "|"]
    for kv in keys:
        cells = []
        for imp in impls:
            hit = [r for r in rows if r[key_col] == kv and r["impl"] == imp]
            cells.append(fmt.format(hit[0][val]) if hit else "")
        lines.append(f"| {kv} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _get(rows, section, shape, dtype, impl):
    hit = [r for r in rows if r["section"] == section and r["shape"] == shape and r["dtype"] == dtype
           and r["impl"] == impl]
    return hit[0]["tflops"] if hit else float("nan")


def load_csv(path: Path) -> list[dict]:
    rows = []
    with open(path) as f:
        for r in csv.DictReader(f):
            for c in ("M", "N", "K", "sms"):
                r[c] = int(r[c])
            for c in ("ms", "tflops", "rel_err"):
                r[c] = float(r[c])
            r["tiles"] = int(r["tiles"]) if r["tiles"] else ""
            r["eager_ms"] = float(r["eager_ms"]) if r.get("eager_ms") else ""
            if "ratio" in r:
                r["ratio"] = float(r["ratio"]) if r["ratio"] else ""
            rows.append(r)
    return rows


def report(rows, out: Path, cmd: str, bad: dict[int, str], autotune_note: str, versions: str = ""):
    out.mkdir(parents=True, exist_ok=True)
    dev, sms = rows[0]["device"], int(rows[0]["sms"])
    md = [f"# Assignment 6: tiled matmul on {dev}", "",
          f"Made by `{cmd}` on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC "
          f"({versions or f'torch {torch.__version__}'}, {sms} SMs). "
          "TFLOP/s = 2·M·N·K / median time of a CUDA-graph replay of the call (CUDA events, L2 flushed before each run; launch overhead excluded). "
          "cuBLAS is `torch.matmul` measured in the same run; fp32 cuBLAS with TF32 off unless marked tf32.", ""]
    sq = [r for r in rows if r["section"] == "square"]

    def floor(label, num, den, need):
        ratio = num / den if den == den and den > 0 else float("nan")
        ok = "met" if ratio >= need else "**below**"
        return f"| {label} | {num:.1f} | {den:.1f} | {ratio:.0%} | {need:.0%} | {ok} |"

    md += ["## Floors (4096³)", "", "| kernel | TFLOP/s | cuBLAS TFLOP/s | ratio | floor | |", "|---|---|---|---|---|---|"]
    s4 = "4096"
    cub16 = _get(sq, "square", s4, "bfloat16", "cuBLAS")
    md.append(floor("Triton bf16 vs cuBLAS bf16", _get(sq, "square", s4, "bfloat16", "Triton"), cub16, 0.9))
    for v, how in ((5, "mma.sync"), (6, "mma.sync"), (7, "wgmma + TMA")):
        md.append(floor(f"CUDA v{v} ({how}) bf16 vs cuBLAS bf16", _get(sq, "square", s4, "bfloat16", f"CUDA v{v}"),
                        cub16, 0.5))
    md.append(floor("CUDA v4 fp32 vs cuBLAS fp32 (TF32 off)", _get(sq, "square", s4, "float32", "CUDA v4"),
                    _get(sq, "square", s4, "float32", "cuBLAS"), 0.7))
    if bad:
        md += ["", "Skipped CUDA versions (failed their probe): " + "; ".join(f"v{v}: {w}" for v, w in bad.items())]
    for dt, imps in (("float32", ["cuBLAS", "cuBLAS tf32", "Triton tf32", "CUDA v1", "CUDA v2", "CUDA v3", "CUDA v4"]),
                     ("bfloat16", ["cuBLAS", "Triton", "CUDA v5", "CUDA v6", "CUDA v7"])):
        rs = [r for r in sq if r["dtype"] == dt]
        if rs:
            md += ["", f"## Square sizes, {dt} (TFLOP/s; rows are M = N = K)", "", _table(rs, "shape", imps)]
    g = [r for r in rows if r["section"] == "gpt2"]
    for dt, imps in (("float32", ["cuBLAS", "cuBLAS tf32", "Triton tf32", "CUDA v4"]),
                     ("bfloat16", ["cuBLAS", "Triton", "CUDA v5", "CUDA v6", "CUDA v7"])):
        rs = [r for r in g if r["dtype"] == dt]
        if rs:
            md += ["", f"## GPT-2 small shapes (B·T = 8192 tokens), {dt}, TFLOP/s", "", _table(rs, "shape", imps)]
    sw = [r for r in rows if r["section"] == "sweep"]
    if sw:
        def at(n, imp):
            hit = [r for r in sw if r["M"] == n and r["impl"] == imp]
            return hit[0]["tflops"] if hit else float("nan")
        md += ["", "## Tile and wave quantization (bf16, M = N = K = n)", "",
               f"128x128 output tiles: tiles = ceil(n/128)². One wave = {sms} tiles when one block runs per SM "
               f"(Triton's fixed 128x128x64 config: 4 stages, 128 KB of shared memory on an H100, so one block "
               f"per SM there); v5 (64 KB, 127 registers) runs two blocks per SM, {2 * sms} tiles a wave. "
               "n = 128k + 8 adds a row and a column of tiles that are 1/16 full: the work grows by ~2%, the "
               "time by the extra tiles, and by a whole wave where the tile count crosses a multiple of the "
               f"SMs ({_wave_example(sms)}). Triton's drop at 128k + 8 is larger than "
               "quantization: it specializes integer arguments on divisibility by 16, and a stride of 128k + 8 "
               "elements is not, so it loses its 16-byte loads (sweep 128k + 16 to see Triton's own step).", "",
               "n = 1793 is a different effect: its rows are 3586 bytes, not a multiple of 16, so 16-byte "
               "vector loads, cp.async/TMA and cuBLAS's fast kernels are all off. That costs far more than "
               "the quantization step:", "",
               "| impl | 1792 | 1800 (one more tile row/col) | 1793 (unaligned) |", "|---|---|---|---|"]
        for imp in ("cuBLAS", "Triton 128x128 fixed", "CUDA v5"):
            md.append(f"| {imp} | {at(1792, imp):.0f} | {at(1800, imp):.0f} | {at(1793, imp):.0f} |")
        md += ["", "| n | tiles | tiles/SMs | cuBLAS | Triton 128x128 fixed | CUDA v5 |", "|---|---|---|---|---|---|"]
        for shape in dict.fromkeys(r["shape"] for r in sw):
            rr = {r["impl"]: r for r in sw if r["shape"] == shape}
            any_r = next(iter(rr.values()))
            md.append(f"| {any_r['M']} | {any_r['tiles']} | {any_r['tiles'] / sms:.2f} | " + " | ".join(
                f"{rr[i]['tflops']:.0f}" if i in rr else "" for i in ("cuBLAS", "Triton 128x128 fixed", "CUDA v5"))
                + " |")
    fu = [r for r in rows if r["section"] == "fusion"]
    if fu:
        md += ["", "## Fusion: GPT-2 MLP up-projection, gelu(x @ W + b), bf16", "",
               "Time in µs (median); the fused kernel does the bias and GELU on the fp32 accumulator before its "
               "single store; the others write the GEMM result and read it back in elementwise kernels.", "",
               "Kernel time is a CUDA-graph replay (no launch overhead); eager is the same call from Python, "
               "launch overhead included (what a plain PyTorch program pays at small sizes).", "",
               "| shape | variant | kernel µs | vs fused | eager µs | eager vs fused |", "|---|---|---|---|---|---|"]
        for shape in dict.fromkeys(r["shape"] for r in fu):
            rr = [r for r in fu if r["shape"] == shape]
            fz = [r for r in rr if r["impl"] == "Triton GEMM+bias+GELU fused"][0]
            for r in rr:
                e = r["eager_ms"]
                md.append(f"| {shape} | {r['impl']} | {r['ms'] * 1e3:.1f} | {r['ms'] / fz['ms']:.2f}x | "
                          + (f"{e * 1e3:.1f} | {e / fz['eager_ms']:.2f}x |" if e != "" else " | |"))
    if autotune_note:
        md += ["", "## Autotuner choices (Triton)", "", "```", autotune_note, "```"]
    md += ["", "Correctness: every kernel's output was compared with cuBLAS before timing "
           "(relative error in the CSV's rel_err column)."]
    (out / "a06_matmul.md").write_text("\n".join(md) + "\n")
    _plots(rows, out, dev, sms)


def _plots(rows, out: Path, dev: str, sms: int):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[bench] matplotlib missing: no plots", file=sys.stderr)
        return
    sq = [r for r in rows if r["section"] == "square"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for ax, dt in zip(axes, ("float32", "bfloat16")):
        rs = [r for r in sq if r["dtype"] == dt]
        for imp in dict.fromkeys(r["impl"] for r in rs):
            pts = sorted((r["M"], r["tflops"]) for r in rs if r["impl"] == imp)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=imp,
                    ls="--" if "cuBLAS" in imp else "-")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("M = N = K")
        ax.set_ylabel("TFLOP/s")
        ax.set_title(f"{dt} on {dev}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "a06_matmul_tflops.png", dpi=110)
    plt.close(fig)
    sw = [r for r in rows if r["section"] == "sweep"]
    if sw:
        fig, ax = plt.subplots(figsize=(11, 5))
        for imp in dict.fromkeys(r["impl"] for r in sw):
            pts = sorted((r["M"], r["tflops"]) for r in sw if r["impl"] == imp and r["M"] % 8 == 0)
            line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=".", label=imp)
            odd = sorted((r["M"], r["tflops"]) for r in sw if r["impl"] == imp and r["M"] % 8)
            if odd:
                ax.plot([p[0] for p in odd], [p[1] for p in odd], ls="", marker="x", color=line.get_color(),
                        label=f"{imp}, n % 8 != 0")
        ax.set_xlabel("n (M = N = K), bf16")
        ax.set_ylabel("TFLOP/s")
        ax2 = ax.twinx()
        ns = sorted({r["M"] for r in sw if r["M"] % 8 == 0})
        ax2.step(ns, [math.ceil(n / SM_TILE) ** 2 / sms for n in ns], where="post", color="gray", alpha=0.5,
                 label=f"128x128 tiles / {sms} SMs")
        ax2.set_ylabel(f"tiles / {sms} SMs (waves at one block per SM)")
        for w in range(1, 6):
            ax2.axhline(w, color="gray", ls=":", lw=0.8)
        ax.legend(loc="upper left", fontsize=8)
        ax2.legend(loc="lower right", fontsize=8)
        ax.set_title("Tile / wave quantization: n = 64j and n = 128k + 8 (x: n = 1793, rows not 16-byte aligned)")
        ax.grid(True, alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "a06_matmul_quantization.png", dpi=110)
        plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_impl_argument(ap, __spec__.name if __spec__ else __name__)
    ap.add_argument("--quick", action="store_true", help="fewer sizes, no sweep")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--versions", default="1,2,3,4,5,6,7", help="CUDA versions to time (comma-separated)")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--report-only", metavar="CMD", default=None,
                    help="rebuild the .md and plots from --out's CSV (no GPU needed); CMD is the command that made it")
    ap.add_argument("--shapes", choices=("square", "real"), default="square",
                    help="real: the GEMMs GPT-2 runs against cuBLAS (a06_matmul_real_shapes.*), nothing else")
    ap.add_argument("--tiny", action="store_true", help=argparse.SUPPRESS)  # --shapes real, 3 tiny shapes: a CPU check
    args = ap.parse_args(argv)
    if not torch.cuda.is_available() and not (args.report_only or args.tiny):
        sys.exit("bench.py times kernels on a CUDA GPU; this machine has none")
    impl = Impl.get(args.impl)
    out = args.out or results_dir(impl)
    cmd = command_line(__spec__.name if __spec__ else __name__, argv)
    versions = [int(v) for v in args.versions.split(",") if v.strip()]
    if args.shapes == "real" or args.tiny:
        main_real(impl, out, cmd, 7 in versions, args.report_only, args.tiny)
        return
    csv_path = out / "a06_matmul.csv"
    out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        report(load_csv(csv_path), out, args.report_only, {}, "")
        return
    csv_path.unlink(missing_ok=True)
    bad = {}
    for v in [v for v in versions if f"a06 v{v}" in gpu.NEEDS and gpu.why_not(f"a06 v{v}")]:
        versions.remove(v)           # 5-6 need sm_80+, 7 an sm_90 GPU: the reason names this one
        bad[v] = gpu.why_not(f"a06 v{v}")
    good, probe_bad = probe_cuda(impl, versions) if versions else ([], {})
    bad.update(probe_bad)
    run = Runner(impl, sorted(good), csv_path)
    torch.backends.cuda.matmul.allow_tf32 = False
    sizes = SQUARE_QUICK if args.quick else SQUARE
    for s in sizes:
        run.gemm_set("square", str(s), s, s, s, torch.bfloat16, [5, 6, 7])
        run.gemm_set("square", str(s), s, s, s, torch.float32, [1, 2, 3, 4])
    run.fusion({"8192x768->3072": (8192, 768, 3072), "1024x768->3072": (1024, 768, 3072)})
    if not (args.quick or args.no_sweep):
        sweep = sorted(set(range(1024, 2561, 64)) | {128 * k + 8 for k in range(8, 20)} | {1793})
        run.sweep(sweep)
    for name, (m, k, n) in (list(GPT2.items())[:2] if args.quick else GPT2.items()):
        run.gemm_set("gpt2", name, m, n, k, torch.bfloat16, [5, 6, 7])
        run.gemm_set("gpt2", name, m, n, k, torch.float32, [4])
    note = "\n".join(f"{k}: {v}" for k, v in run.tri._matmul_autotuned.cache.items())
    import triton
    report(run.rows, out, cmd, bad, note, f"torch {torch.__version__}, triton {triton.__version__}")
    print(f"[bench] wrote {out}/a06_matmul.md, .csv and plots")
    print((out / "a06_matmul.md").read_text())


def main_real(impl: Impl, out: Path, cmd: str, v7: bool, report_only: str | None, tiny: bool) -> None:
    """--shapes real: every shape of real_shapes(), its report and plot."""
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / "a06_matmul_real_shapes.csv"
    if report_only:
        report_real(load_csv(csv_path), out, report_only)
        return
    csv_path.unlink(missing_ok=True)
    why = "" if v7 else "not asked for (--versions)"
    if v7 and gpu.why_not("a06 v7"):
        why = gpu.why_not("a06 v7")
    elif v7:
        _, bad = probe_cuda(impl, [7])
        why = f"failed its probe: {bad[7]}" if 7 in bad else ""
    run = Runner(impl, [] if why else [7], csv_path, cols=REAL_COLS)
    run.v7_missing = why
    torch.manual_seed(0)
    for section, name, m, k, n, dtypes in real_shapes(tiny):
        for dt in dtypes:
            run.real(section, name, m, k, n, dt)
    import triton
    report_real(run.rows, out, cmd, f"torch {torch.__version__}, triton {triton.__version__}")
    print(f"[bench] wrote {out}/a06_matmul_real_shapes.md, .csv and .png")
    print((out / "a06_matmul_real_shapes.md").read_text())


if __name__ == "__main__":
    main()
