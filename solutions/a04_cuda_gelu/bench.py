"""Benchmark stages 4 and 5: GELU as plain torch ops, F.gelu, torch.compile, CUDA op, Triton op.

    python -m solutions.a04_cuda_gelu.bench                  # all sizes, fp32 + bf16
    python -m solutions.a04_cuda_gelu.bench --quick          # 2^20, 2^24, 2^26 only
    python -m solutions.a04_cuda_gelu.bench --out DIR        # where the table/CSV/PNG go
    python -m common.course.bench a04                # your work (same options)
    python -m solutions.a04_cuda_gelu.bench --impl path/to/submission

Benchmarks one impl's ops (``--impl``; default: the tree this command was run from)
against PyTorch in the same run, on a CUDA GPU:

* time: ``common.timing.bench`` (CUDA events, median, L2 flushed before every run),
  on fresh random inputs (never zeros);
* GB/s = (bytes read + bytes written) / time = 2·n·itemsize / time;
* "of copy": the op's time against a device-to-device copy of the same tensor
  (``dst.copy_(x)``, same bytes moved) measured in the same run: the ceiling for
  any elementwise op;
* kernels per call from ``common.profiling.profile``;
* the floors at 2^26 elements: CUDA and Triton op >= 90 % of copy and
  >= 0.97x F.gelu(approximate="tanh"), fp32 and bf16.

Writes ``a04_a05_gelu.md`` / ``.csv`` / ``.png`` (GB/s against size) under ``--out``
(default ``common.impl.results_dir``: ``lectures/results`` for the solutions,
``lectures/results/<impl folder>`` otherwise). ``measure()`` times one op.
"""
from __future__ import annotations

import argparse
import csv
import datetime
import platform
import sys
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers.activations import NewGELUActivation

from common import reference as ref
from common.impl import Impl, add_impl_argument, command_line, results_dir
from common.profiling import profile
from common.testing import max_abs_error, rel_error
from common.timing import bench

SIZES = [1 << k for k in range(20, 29)]
QUICK_SIZES = [1 << 20, 1 << 24, 1 << 26]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
FLOOR_N = 1 << 26
FLOOR_COPY, FLOOR_VS_TORCH = 0.90, 0.97
MODULE = __spec__.name if __spec__ is not None else __name__   # "__main__" under python -m
#: "plain ops": GPT-2's GELU as the model runs it, transformers' NewGELUActivation (the
#: ``act`` of every GPT2MLP): gelu_new as 8 torch ops, one kernel each.
gelu_new = NewGELUActivation()


def _compiled_plain_ops() -> Callable:
    import torch._dynamo
    for knob in ("recompile_limit", "cache_size_limit"):   # one graph per size and dtype
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 256)
    return torch.compile(gelu_new, dynamic=False)  # one static graph per size and dtype


def _ops(impl: Impl) -> tuple[Callable, Callable]:
    """The impl's CUDA op (stage 4) and Triton op (stage 5)."""
    return impl.load("a04_cuda_gelu.fused_gelu").fused_gelu, impl.load("a05_triton_gelu.gelu_triton").gelu


def impls(impl: Impl) -> dict[str, Callable[[torch.Tensor], torch.Tensor]]:
    """Name -> function, in table order."""
    fused_gelu, triton_gelu = _ops(impl)
    return {
        "plain ops": gelu_new,
        "F.gelu(tanh)": lambda x: F.gelu(x, approximate="tanh"),
        "torch.compile": _compiled_plain_ops(),
        "CUDA op": fused_gelu,
        "CUDA op fast-math": lambda x: fused_gelu(x, fast_math=True),
        "Triton op": triton_gelu,
    }


def measure(fn: Callable[[torch.Tensor], torch.Tensor], n: int, dtype: torch.dtype,
            copy_ms: float | None = None) -> dict:
    """ms, GB/s and fraction of the same-size device copy for ``fn`` on n random elements."""
    x = torch.randn(n, device="cuda", dtype=torch.float32).to(dtype)
    if copy_ms is None:
        dst = torch.empty_like(x)
        copy_ms = bench(lambda: dst.copy_(x)).median_ms
        del dst
    fn(x)  # warm-up: builds, autotunes, compiles outside the timed region
    ms = bench(lambda: fn(x)).median_ms
    nbytes = 2 * n * x.element_size()
    return {"ms": ms, "GBps": nbytes / ms / 1e6, "of_copy": copy_ms / ms, "copy_ms": copy_ms}


def numerics(impl: Impl, n: int = 1 << 24) -> list[dict]:
    """Error of each op against the float64 reference on N(0, 3^2) inputs."""
    fused_gelu, triton_gelu = _ops(impl)
    rows = []
    for dname, dt in (("fp32", torch.float32), ("fp16", torch.float16), ("bf16", torch.bfloat16)):
        x = (3 * torch.randn(n, device="cuda")).to(dt)
        r = ref.gelu_tanh(x)
        for name, fn in (("F.gelu(tanh)", lambda x: F.gelu(x, approximate="tanh")), ("plain ops", gelu_new),
                         ("CUDA op", fused_gelu), ("CUDA op fast-math", lambda x: fused_gelu(x, fast_math=True)),
                         ("Triton op", triton_gelu)):
            y = fn(x)
            rows.append({"dtype": dname, "impl": name, "rel_err": rel_error(y, r), "max_abs_err": max_abs_error(y, r)})
    return rows


def host_us_per_call(fn: Callable[[torch.Tensor], torch.Tensor], n: int = 4096, calls: int = 2000) -> float:
    """Wall-clock µs per call for back-to-back calls on a tiny tensor: the CPU cost of a
    call (Python, dispatcher, launch), which bounds small sizes however fast the kernel."""
    import time
    x = torch.randn(n, device="cuda")
    for _ in range(50):
        fn(x)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def kernel_listing(n: int = 1 << 26) -> str:
    """Per-kernel GPU time of the plain-ops GELU (fp32): the lecture's baseline profile."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile
    x = torch.randn(n, device="cuda")
    for _ in range(3):
        gelu_new(x)
    torch.cuda.synchronize()
    with tprofile(activities=[ProfilerActivity.CUDA]) as prof:
        gelu_new(x)
        torch.cuda.synchronize()
    lines = ["| # | kernel | us |", "|---|---|---|"]
    evs = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    for i, e in enumerate(evs, 1):
        lines.append(f"| {i} | `{e.name[:90]}` | {e.time_range.elapsed_us():.1f} |")
    total = sum(e.time_range.elapsed_us() for e in evs)
    lines.append(f"| | total ({len(evs)} kernels) | {total:.1f} |")
    return "\n".join(lines)


def _plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(DTYPES), figsize=(6 * len(DTYPES), 4.5), sharey=True)
    for ax, dname in zip(axes, DTYPES):
        sub = [r for r in rows if r["dtype"] == dname]
        names = ["device copy"] + list(dict.fromkeys(r["impl"] for r in sub if r["impl"] != "device copy"))
        for name in names:
            pts = sorted((r["n"], r["GBps"]) for r in sub if r["impl"] == name)
            style = dict(color="black", ls="--") if name == "device copy" else {}
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=name, **style)
        ax.set_xscale("log", base=2)
        ax.set_title(f"GELU {dname}")
        ax.set_xlabel("elements")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GB/s (bytes read + written)")
    axes[-1].legend(fontsize=8)
    fig.suptitle(torch.cuda.get_device_name())
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None, module: str = MODULE) -> int:
    """``module``: the command's module (a05's bench runs this one), for --impl's default and the record."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_impl_argument(p, module)
    p.add_argument("--out", default=None, help="default: common.impl.results_dir(impl)")
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench: needs a CUDA GPU (timings on the Triton interpreter mean nothing)", file=sys.stderr)
        return 2
    impl = Impl.get(args.impl)
    out = Path(args.out) if args.out else results_dir(impl)
    out.mkdir(parents=True, exist_ok=True)
    sizes = QUICK_SIZES if args.quick else SIZES
    fns = impls(impl)

    rows = []
    for dname, dt in DTYPES.items():
        for n in sizes:
            x = torch.randn(n, device="cuda").to(dt)
            dst = torch.empty_like(x)
            copy_ms = bench(lambda: dst.copy_(x)).median_ms
            del x, dst
            rows.append({"dtype": dname, "n": n, "impl": "device copy", "ms": copy_ms,
                         "GBps": 2 * n * dt.itemsize / copy_ms / 1e6, "of_copy": 1.0, "vs_F.gelu": float("nan")})
            here = []
            for name, fn in fns.items():
                m = measure(fn, n, dt, copy_ms=copy_ms)
                here.append({"dtype": dname, "n": n, "impl": name, "ms": m["ms"], "GBps": m["GBps"],
                             "of_copy": m["of_copy"]})
            f_ms = next(r["ms"] for r in here if r["impl"] == "F.gelu(tanh)")
            for r in here:
                r["vs_F.gelu"] = f_ms / r["ms"]
                print(f"{dname} n=2^{n.bit_length() - 1:<2} {r['impl']:<18} {r['ms']:.4f} ms {r['GBps']:7.1f} GB/s "
                      f"{100 * r['of_copy']:5.1f}% of copy {r['vs_F.gelu']:.3f}x F.gelu", flush=True)
            rows += here
            torch.cuda.empty_cache()

    kernels, host_us = {}, {}
    x = torch.randn(1 << 20, device="cuda")
    for name, fn in fns.items():
        kernels[name] = profile(lambda: fn(x)).n_kernels
        host_us[name] = host_us_per_call(fn)
    num = numerics(impl)
    listing = kernel_listing()

    with open(out / "a04_a05_gelu.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["dtype", "n", "impl", "ms", "GBps", "of_copy", "vs_F.gelu"])
        w.writeheader()
        w.writerows(rows)
    _plot(rows, out / "a04_a05_gelu.png")

    cmd = command_line(module, argv)
    lines = [
        "# Stages 4-5: fused GELU (CUDA op, Triton op) against PyTorch",
        "",
        f"- command: `{cmd}` (impl: `{impl}`)",
        f"- device: {torch.cuda.get_device_name()}; torch {torch.__version__}; "
        f"triton {__import__('triton').__version__}; python {platform.python_version()}; "
        f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        "- timing: CUDA events, median, L2 flushed before each run (`common.timing.bench`); fresh N(0,1) inputs",
        "- GB/s counts bytes read + written (2·n·itemsize); *of copy* = copy time / op time for the same tensor,"
        " *vs F.gelu* = F.gelu time / op time (>1 is faster), both measured in this run",
        "",
        f"## Floors at n = 2^{FLOOR_N.bit_length() - 1}: >= {FLOOR_COPY:.0%} of copy and >= {FLOOR_VS_TORCH}x F.gelu",
        "",
        "| dtype | op | GB/s | of copy | vs F.gelu | floor |",
        "|---|---|---|---|---|---|",
    ]
    # a speed counts only for an op whose output is right: the numerics below against float64
    # (bf16 rounding is ~4e-3 relative; an unwritten or wrong output is ~1 or NaN)
    wrong = sorted({r["impl"] for r in num if r["impl"] in ("CUDA op", "Triton op") and not r["rel_err"] <= 1e-2})
    floors_ok = not wrong
    for dname in DTYPES:
        for name in ("CUDA op", "Triton op", "CUDA op fast-math", "F.gelu(tanh)", "torch.compile"):
            r = next((r for r in rows if r["dtype"] == dname and r["n"] == FLOOR_N and r["impl"] == name), None)
            if r is None:
                continue
            ok = r["of_copy"] >= FLOOR_COPY and r["vs_F.gelu"] >= FLOOR_VS_TORCH and name not in wrong
            graded = name in ("CUDA op", "Triton op")
            floors_ok &= ok or not graded
            lines.append(f"| {dname} | {name} | {r['GBps']:.0f} | {100 * r['of_copy']:.1f}% | {r['vs_F.gelu']:.3f}x | "
                         f"{('PASS' if ok else 'FAIL') if graded else '-'} |")
    lines += ["", "## All sizes", ""]
    for dname in DTYPES:
        names = list(dict.fromkeys(r["impl"] for r in rows))
        lines += [f"### {dname}: GB/s (and % of copy)", "",
                  "| n | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for n in sizes:
            cells = []
            for name in names:
                r = next(r for r in rows if r["dtype"] == dname and r["n"] == n and r["impl"] == name)
                cells.append(f"{r['GBps']:.0f}" + ("" if name == "device copy" else f" ({100 * r['of_copy']:.0f}%)"))
            lines.append(f"| 2^{n.bit_length() - 1} | " + " | ".join(cells) + " |")
        lines += ["", "| n | " + " | ".join(f"{nm} ms" for nm in names) + " |", "|---" * (len(names) + 1) + "|"]
        for n in sizes:
            cells = [f"{next(r for r in rows if r['dtype'] == dname and r['n'] == n and r['impl'] == nm)['ms']:.4f}"
                     for nm in names]
            lines.append(f"| 2^{n.bit_length() - 1} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Kernels per call and host cost per call", "",
              "Kernels: `common.profiling.profile`, fp32, n = 2^20. Host µs: wall clock per call for 2000",
              "back-to-back calls on 4096 fp32 elements (GPU work negligible): the CPU cost of one call.", "",
              "| op | kernels per call | host µs per call |", "|---|---|---|"]
    lines += [f"| {k} | {kernels[k]} | {host_us[k]:.1f} |" for k in kernels]
    lines += ["", "## The plain-ops baseline, kernel by kernel (fp32, n = 2^26, one call)", "", listing]
    lines += ["", "## Numerics: error against the float64 reference, x ~ N(0, 3^2), n = 2^24", "",
              "| dtype | op | rel. error (‖y−ref‖/‖ref‖) | max abs error |", "|---|---|---|---|"]
    lines += [f"| {r['dtype']} | {r['impl']} | {r['rel_err']:.2e} | {r['max_abs_err']:.2e} |" for r in num]
    lines += ["", "![GB/s against size](a04_a05_gelu.png)", ""]
    (out / "a04_a05_gelu.md").write_text("\n".join(lines))

    print("\n".join(lines[:lines.index("## All sizes")]))
    print("kernels per call:", kernels)
    print("host us per call:", {k: round(v, 1) for k, v in host_us.items()})
    print("FLOORS:", "PASS" if floors_ok else "FAIL"
          + (f" (wrong results, relative error > 1e-2 against float64: {', '.join(wrong)})" if wrong else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
