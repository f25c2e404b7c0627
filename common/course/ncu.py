"""Nsight Compute on a stage's benchmark case: the few metrics that matter, beside the roofline.

    python -m common.course.ncu a05                        # your Triton GELU (assignments/), then F.gelu
    python -m common.course.ncu a06 --impl solutions       # the reference Triton matmul, GPT-2 small's MLP-up, bf16
    python -m common.course.ncu a07 --export /tmp/a07      # also keep /tmp/a07.ncu-rep for the ncu GUI
    make ncu STAGE=a05 [IMPL=solutions]

The case is the grader's performance case of the stage (its ``solutions/aNN_name/stage.py``: the same
shapes, dtypes and PyTorch baseline), so what ncu measures is what ``make grade`` times; a
stage timed at several shapes (stages 4-7) is profiled at the first of them.
The case runs in a child process under ``ncu``: it is built and called a few times first
(Triton compiles and autotunes, cuBLAS picks its kernel), then one call is profiled between
``cudaProfilerStart`` and ``cudaProfilerStop`` (``ncu --profile-from-start off``), once for the
submission and once for the baseline. ncu writes a report; ``ncu --import ... --csv --page raw``
turns it into one CSV row per kernel, which :func:`parse_raw_csv` reads.

What is printed depends on where the stage sits on the roofline (its FLOPs and bytes against
the measured ceilings, as the grader places it):

* memory-bound (GELU, the GPT-2 decode step): DRAM throughput as % of its peak, the GB/s
  achieved, and the DRAM bytes moved against the fewest the op must move;
* compute-bound (the Linear's GEMM, matmul, attention): SM throughput, tensor-pipe
  utilisation (``mma.sync`` = HMMA, Hopper's ``wgmma`` = GMMA), achieved occupancy, L2 hit
  rate, shared-memory bank conflicts.

``--all`` prints every metric for every kernel. ncu locks the clocks to base by default
(``--clock-control base``), so its durations are longer than the benchmark's: compare ratios
(the % columns, submission against baseline), not the microseconds, with ``bench.py``.

Needs ``ncu`` (Nsight Compute, shipped with the CUDA toolkit; ``$NCU`` names another binary)
and permission to read the GPU's performance counters (ERR_NVGPUCTRPERM otherwise: both
print what to do).
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from common.impl import add_impl_argument

REPO = Path(__file__).resolve().parents[2]
CASE_MARK = "@@NCU-CASE@@"
WHICH = ("submission", "baseline")

# (metric, label, kind): kind "pct" is a percentage, "time" seconds, "bytes", "rate" bytes/s,
# "count" a number. Names as Nsight Compute 2023-2025 spells them on Hopper (sm_90); a name the
# GPU's ncu does not list (ncu --query-metrics) is left out of the run, and said so.
MEMORY = [
    ("gpu__time_duration.sum", "time", "time"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM % of peak", "pct"),
    ("dram__bytes.sum.per_second", "DRAM GB/s", "rate"),
    ("dram__bytes_read.sum", "DRAM read", "bytes"),
    ("dram__bytes_write.sum", "DRAM written", "bytes"),
    ("lts__t_sector_hit_rate.pct", "L2 hit %", "pct"),
]
COMPUTE = [
    ("gpu__time_duration.sum", "time", "time"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "SM % of peak", "pct"),
    ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor HMMA %", "pct"),
    ("sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active", "tensor GMMA %", "pct"),
    ("sm__warps_active.avg.pct_of_peak_sustained_active", "occupancy %", "pct"),
    ("lts__t_sector_hit_rate.pct", "L2 hit %", "pct"),
    ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum", "smem bank conflicts", "count"),
    ("dram__throughput.avg.pct_of_peak_sustained_elapsed", "DRAM % of peak", "pct"),
]
EXTRA = [("dram__bytes.sum", "DRAM bytes", "bytes"), ("launch__registers_per_thread", "registers/thread", "count")]
METRICS: dict[str, tuple[str, str]] = {m: (label, kind) for m, label, kind in MEMORY + COMPUTE + EXTRA}
#: Metrics ncu computes from the launch itself; --query-metrics need not list them.
ALWAYS = ("launch__", "gpu__time_duration")

NO_NCU = """\
ncu (Nsight Compute) was not found{where}.
It ships with the CUDA toolkit (/usr/local/cuda/bin/ncu) and as the nsight-compute package;
put it on PATH or name it: NCU=/path/to/ncu python -m common.course.ncu {stage}.
It also needs an NVIDIA GPU. Without one: common.profiling.trace_ops / fake_cuda count ops and
host transfers, and lectures/results/ncu_*.txt show what ncu measured on the course's H100."""
NO_PERMISSION = """\
ncu cannot read this GPU's performance counters (ERR_NVGPUCTRPERM): profiling is restricted to
administrators on this machine. Either
  * run as root, with this Python: sudo -E env PATH="$PATH" {python} -m common.course.ncu {args}
  * or, once, as an administrator: options nvidia NVreg_RestrictProfilingToAdminUsers=0 in a
    file under /etc/modprobe.d/, then reload the driver (or reboot);
  * in a container: start it with --cap-add=SYS_ADMIN (many cloud sandboxes do not allow it).
See https://developer.nvidia.com/ERR_NVGPUCTRPERM"""


class NcuError(RuntimeError):
    """ncu could not run or profile; ``code`` is the exit status main() returns."""

    def __init__(self, message: str, code: int = 1):
        super().__init__(message)
        self.code = code


# ============================================================================ the raw page
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_TIME = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3,
         "second": 1.0, "s": 1.0}


def to_base(value: float, unit: str) -> tuple[float, str]:
    """A value in ncu's display unit -> (value, base unit): bytes, byte/second, second; others as is.

    ncu scales units for display ("Gbyte/second", "Mbyte", "usecond"); its prefixes are
    decimal (1 Kbyte = 1000 bytes).
    """
    u = unit.strip()
    if u in _TIME:
        return value * _TIME[u], "second"
    m = re.fullmatch(r"([KMGTP]?)byte(/second|/s)?", u)
    if m:
        return value * _PREFIX[m.group(1)], "byte/second" if m.group(2) else "byte"
    return value, u


def _number(text: str) -> float | None:
    t = text.strip().replace(",", "")
    if t in ("", "n/a", "N/A", "nan"):
        return None
    try:
        return float(t)
    except ValueError:
        return None


@dataclass
class Kernel:
    """One profiled kernel launch: its name, launch shape and metrics in base units."""
    id: int
    name: str
    block: str = ""
    grid: str = ""
    metrics: dict[str, float | None] = field(default_factory=dict)
    units: dict[str, str] = field(default_factory=dict)

    def get(self, metric: str) -> float | None:
        return self.metrics.get(metric)


def parse_raw_csv(text: str) -> list[Kernel]:
    """Kernels of ``ncu --csv --page raw`` output (``ncu --import REPORT --csv --page raw``).

    The raw page is one table: a header row (``"ID","Process ID","Process Name","Host Name",
    "Kernel Name",...`` then one column per metric, e.g. ``dram__bytes.sum.per_second``), a
    row of units for those columns (empty for the launch columns), then one row per profiled
    kernel launch. Values may carry thousands separators ("1,234.5") and "n/a". Lines around
    the table (``==PROF==`` messages, the application's own output) are skipped. Values are
    converted to base units (:func:`to_base`): bytes, bytes/s, seconds.
    """
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID","')), None)
    if start is None:
        raise ValueError("no ncu raw-page CSV header (a line starting with \"ID\",) in the output")
    table = [ln for ln in lines[start:] if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(table))))
    header = rows[0]
    col = {name: i for i, name in enumerate(header)}
    for needed in ("ID", "Kernel Name"):
        if needed not in col:
            raise ValueError(f"ncu raw-page CSV has no {needed!r} column: {header[:12]}")
    units = [""] * len(header)
    body = rows[1:]
    if body and body[0][col["ID"]].strip() == "":          # the units row
        units, body = body[0] + [""] * (len(header) - len(body[0])), body[1:]
    launch_cols = {"ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream",
                   "Block Size", "Grid Size", "Device", "CC", "Kernel Time", "Function Name"}
    kernels = []
    for row in body:
        if len(row) < len(header) or _number(row[col["ID"]]) is None:
            continue
        k = Kernel(int(_number(row[col["ID"]])), row[col["Kernel Name"]],
                   row[col["Block Size"]] if "Block Size" in col else "",
                   row[col["Grid Size"]] if "Grid Size" in col else "")
        for name, i in col.items():
            if name in launch_cols or "__" not in name:
                continue
            v = _number(row[i])
            if v is not None:
                v, u = to_base(v, units[i])
            else:
                u = units[i]
            k.metrics[name], k.units[name] = v, u
        kernels.append(k)
    return kernels


def parse_metric_list(text: str) -> set[str]:
    """Base metric names in ``ncu --query-metrics`` output (``dram__bytes``, ``sm__throughput``, ...)."""
    return {m.group(1) for m in re.finditer(r"^\s*([a-z0-9]+__[a-z0-9_]+)\b", text, re.M)}


def available(metrics: list[str], listed: set[str]) -> tuple[list[str], list[str]]:
    """(kept, dropped): metrics whose base name (before the first '.') the GPU's ncu lists."""
    if len(listed) < 50:                      # not a metric list we understand: keep them all
        return list(metrics), []
    keep = [m for m in metrics if m.startswith(ALWAYS) or m.split(".")[0] in listed]
    return keep, [m for m in metrics if m not in keep]


# ============================================================================ summaries
@dataclass
class Row:
    """Kernels of one name in one profiled call, metrics combined (see :func:`summarize`)."""
    name: str
    count: int
    time_s: float
    metrics: dict[str, float]


def summarize(kernels: list[Kernel]) -> list[Row]:
    """One row per kernel name, by total time: times, bytes and counts summed, GB/s recomputed
    (bytes / time), percentages time-weighted, registers the largest."""
    groups: dict[str, list[Kernel]] = {}
    for k in kernels:
        groups.setdefault(k.name, []).append(k)
    rows = []
    for name, ks in groups.items():
        times = [k.get("gpu__time_duration.sum") or 0.0 for k in ks]
        total = sum(times)
        out: dict[str, float] = {}
        for m in {m for k in ks for m, v in k.metrics.items() if v is not None}:
            vals = [(k.get(m), t) for k, t in zip(ks, times) if k.get(m) is not None]
            kind = METRICS.get(m, ("", "pct" if m.endswith(".pct") or "pct_of" in m else "count"))[1]
            if m == "launch__registers_per_thread":
                out[m] = max(v for v, _ in vals)
            elif kind in ("time", "bytes", "count"):
                out[m] = sum(v for v, _ in vals)
            elif kind == "rate":
                b = sum(k.get("dram__bytes.sum") or 0.0 for k in ks)
                out[m] = b / total if b and total else sum(v * t for v, t in vals) / max(total, 1e-30)
            else:                             # percentages: weighted by each launch's time
                w = sum(t for _, t in vals)
                out[m] = sum(v * t for v, t in vals) / w if w else sum(v for v, _ in vals) / len(vals)
        rows.append(Row(name, len(ks), total, out))
    return sorted(rows, key=lambda r: -r.time_s)


def _fmt(v: float | None, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "pct":
        return f"{v:.1f}"
    if kind == "time":
        return f"{v * 1e6:.1f} us"
    if kind == "rate":
        return f"{v / 1e9:.0f}"
    if kind == "bytes":
        return f"{v / 1e6:.1f} MB"
    return f"{v:,.0f}"


def _short(name: str, n: int = 44) -> str:
    name = name.removeprefix("void ")
    return name if len(name) <= n else name[:n - 3] + "..."


def table(rows: list[Row], columns: list[tuple[str, str, str]], limit: int = 12) -> str:
    """Fixed-width table: kernel, calls, then one column per (metric, label, kind)."""
    cols = [c for c in columns if c[0] != "gpu__time_duration.sum"
            and any(r.metrics.get(c[0]) is not None for r in rows)]       # a metric no kernel has: no column
    head = ["kernel", "n", "time"] + [c[1] for c in cols]
    body = [[_short(r.name), str(r.count), _fmt(r.time_s, "time")] + [_fmt(r.metrics.get(m), k) for m, _, k in cols]
            for r in rows[:limit]]
    if len(rows) > limit:
        rest = rows[limit:]
        body.append([f"({len(rest)} more kernels)", str(sum(r.count for r in rest)),
                     _fmt(sum(r.time_s for r in rest), "time")] + [""] * len(cols))
    widths = [max(len(x[i]) for x in [head] + body) for i in range(len(head))]
    fmt = lambda cells: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))  # noqa: E731
    return "\n".join([fmt(head), fmt(["-" * w for w in widths])] + [fmt(b) for b in body])


# ============================================================================ the roofline
def ceilings_for_report() -> tuple[float, float, str]:
    """(GB/s, TFLOP/s, where from): the grader's cached measurement for this GPU, a fresh
    measurement, or (no GPU) the course's H100 reference."""
    from common.roofline import H100_REFERENCE
    try:
        import torch
        if torch.cuda.is_available():
            from common.cuda_ext import cache_dir
            name = torch.cuda.get_device_name()
            cached = json.loads((cache_dir() / "ceilings.json").read_text()).get(name) \
                if (cache_dir() / "ceilings.json").exists() else None
            if cached:
                return cached["gbps"], cached["tflops"], f"measured on {name} (cached by the grader)"
            from common.roofline import measure_ceilings
            c = measure_ceilings()
            return c.gbps, c.tflops, f"measured on {c.source}"
    except Exception:  # noqa: BLE001 - the report falls back to the reference figures
        pass
    return H100_REFERENCE["copy_GBps"], H100_REFERENCE["bf16_TFLOPs"], "the course's H100 reference (no GPU here)"


def roofline_lines(case: dict, gbps: float, tflops: float, source: str) -> list[str]:
    flops, nbytes = case["flops"], case["bytes"]
    intensity = flops / nbytes if nbytes else float("inf")
    ridge = tflops * 1e3 / gbps
    bound = "compute" if intensity >= ridge else "memory"
    t_mem, t_flop = nbytes / (gbps * 1e9), flops / (tflops * 1e12)
    return [f"case: {case['label']} (baseline: {case['baseline']})",
            f"roofline: {flops / 1e9:,.2f} GFLOP, {nbytes / 1e6:,.1f} MB at least -> {intensity:,.1f} FLOP/byte; "
            f"ridge {ridge:.0f} FLOP/byte at {gbps:,.0f} GB/s and {tflops:,.0f} TFLOP/s ({source}) -> {bound}-bound, "
            f">= {max(t_mem, t_flop) * 1e6:,.1f} us per call"]


def bound_of(case: dict, gbps: float, tflops: float) -> str:
    return "compute" if case["flops"] / max(case["bytes"], 1) >= tflops * 1e3 / gbps else "memory"


def report(results: dict[str, list[Kernel]], case: dict, gbps: float, tflops: float, source: str,
           show_all: bool = False, dropped: list[str] = (), clocks_locked: bool = True) -> str:
    """The printed report: roofline line, then per profiled call a table of its kernels."""
    bound = bound_of(case, gbps, tflops)
    columns = MEMORY if bound == "memory" else COMPUTE
    if show_all:
        seen = {m for ks in results.values() for k in ks for m in k.metrics}
        columns = [(m, METRICS.get(m, (m, ""))[0], METRICS.get(m, ("", "count"))[1]) for m in sorted(seen)]
    out = roofline_lines(case, gbps, tflops, source)
    floor_s = max(case["bytes"] / (gbps * 1e9), case["flops"] / (tflops * 1e12))
    for which, kernels in results.items():
        rows = summarize(kernels)
        total = sum(r.time_s for r in rows)
        dram = sum(k.get("dram__bytes.sum") or 0.0 for k in kernels)
        name = case["label"] if which == "submission" else case["baseline"]
        out += ["", f"{which}: {name}"]
        if not rows:
            out.append("  no kernel was profiled")
            continue
        out.append(f"  {sum(r.count for r in rows)} kernel(s), {total * 1e6:,.1f} us under ncu "
                   f"= {100 * floor_s / total:.0f}% of the roofline" + (" (at base clocks)" if clocks_locked else "")
                   + (f"; DRAM {dram / 1e6:,.1f} MB = {dram / case['bytes']:.2f}x the fewest bytes, "
                      f"{dram / total / 1e9:,.0f} GB/s = {100 * dram / total / 1e9 / gbps:.0f}% of the copy bandwidth"
                      if dram and total else ""))
        out += ["  " + ln for ln in table(rows, columns).splitlines()]
    out.append("")
    out.append("columns: " + ("DRAM % of peak = dram__throughput (% of peak sustained), DRAM GB/s = dram__bytes.sum"
                              ".per_second, L2 hit % = lts__t_sector_hit_rate" if bound == "memory" else
                              "SM % = sm__throughput, tensor HMMA/GMMA % = sm__pipe_tensor_op_{hmma,gmma}_cycles_active "
                              "(mma.sync / Hopper wgmma, % of active cycles), occupancy % = sm__warps_active, "
                              "L2 hit % = lts__t_sector_hit_rate, smem bank conflicts = "
                              "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"))
    if dropped:
        out.append("not collected (this GPU's ncu does not list them): " + ", ".join(dropped))
    out.append("ncu locked the clocks to base (its default --clock-control base): compare % and ratios with bench.py, "
               "not microseconds." if clocks_locked else
               "clocks not locked (--clock-control none): times are at the GPU's own clocks, as bench.py sees them.")
    return "\n".join(out)


# ============================================================================ running ncu
def find_ncu() -> str | None:
    env = os.environ.get("NCU")
    if env:
        return env if (Path(env).is_file() and os.access(env, os.X_OK)) or shutil.which(env) else None
    found = shutil.which("ncu")
    if found:
        return found
    for base in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if base and (Path(base) / "bin" / "ncu").is_file():
            return str(Path(base) / "bin" / "ncu")
    found = sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu")) if Path("/opt/nvidia").is_dir() else []
    return str(found[-1]) if found else None


def has_gpu() -> bool:
    try:
        import torch
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


def _run(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


def _check_permission(text: str, args: list[str]) -> None:
    if "ERR_NVGPUCTRPERM" in text:
        raise NcuError(NO_PERMISSION.format(python=sys.executable, args=" ".join(args)), 3)


def query_metrics(ncu: str) -> set[str]:
    try:
        p = _run([ncu, "--query-metrics"], 120)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return parse_metric_list(p.stdout)


def profile_case(ncu: str, stage: str, impl: str, which: str, metrics: list[str], *, sections: list[str],
                 section_set: str | None, kernel: str | None, max_kernels: int, extra: list[str],
                 export: Path | None, timeout: float, args: list[str]) -> tuple[list[Kernel], dict]:
    """Profile one call of the case's submission or baseline; (kernels, case info)."""
    with tempfile.TemporaryDirectory() as tmp:
        rep = (export.parent / f"{export.name}-{which}") if export else Path(tmp) / which
        rep.parent.mkdir(parents=True, exist_ok=True)
        cmd = [ncu, "--target-processes", "application-only", "--profile-from-start", "off",
               "--launch-count", str(max_kernels), "-f", "-o", str(rep),
               "--metrics", ",".join(metrics)]
        cmd += ["--set", section_set] if section_set else []
        for s in sections:
            cmd += ["--section", s]
        cmd += ["-k", f"regex:{kernel}"] if kernel else []
        cmd += extra + [sys.executable, "-m", "common.course.ncu", "--child", stage, "--impl", impl, "--which", which]
        p = _run(cmd, timeout)
        out = p.stdout + "\n" + p.stderr
        _check_permission(out, args)
        case = next((json.loads(ln.split(CASE_MARK, 1)[1]) for ln in out.splitlines() if CASE_MARK in ln), None)
        if case is None or case.get("error"):
            why = case["error"] if case else "\n".join(out.strip().splitlines()[-15:])
            raise NcuError(f"the {which} case did not run under ncu:\n{why}")
        report_file = rep.with_name(rep.name + ".ncu-rep")
        if not report_file.exists():
            raise NcuError(f"ncu wrote no report ({report_file.name}); its output:\n"
                           + "\n".join(out.strip().splitlines()[-15:]))
        q = _run([ncu, "--import", str(report_file), "--csv", "--page", "raw"], 300)
        _check_permission(q.stdout + q.stderr, args)
        try:
            kernels = parse_raw_csv(q.stdout)
        except ValueError as e:
            raise NcuError(f"{e}; ncu --import printed:\n" + "\n".join((q.stdout + q.stderr).strip().splitlines()[-10:]))
        if export:
            print(f"[ncu] report for the ncu GUI: {report_file}", file=sys.stderr)
        return kernels, case


def _child(stage_key: str, impl: str, which: str, warmup: int) -> int:
    """Runs under ncu: build the stage's performance case, warm up, profile one call."""
    import torch

    from common.impl import load
    from common.course.stages import by_key, perf_cases
    try:
        stage = by_key(stage_key)
        if stage.perf is None:
            raise NcuError(f"stage {stage.key} has no performance case")
        p = perf_cases(stage, lambda m: load(m, impl))[0]     # a stage timed at several shapes: the first
        inp = p.inputs(torch.Generator(device="cuda").manual_seed(0))
        call = p.submission if which == "submission" else p.baseline

        def fn():
            return call(inp)
        for _ in range(warmup):
            fn()
        torch.cuda.synchronize()
        info = dict(label=p.label, baseline=p.baseline_name, flops=float(p.flops), bytes=float(p.bytes))
    except Exception as e:  # noqa: BLE001 - reported by the parent
        print(CASE_MARK + json.dumps({"error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    print(CASE_MARK + json.dumps(info), flush=True)
    return 0


def run(stage_key: str, impl: str = "assignments", *, baseline: bool = True, sections=(), section_set="basic",
        kernel=None, max_kernels=200, extra=(), export=None, show_all=False, timeout=600.0,
        args: list[str] = ()) -> str:
    extra = list(extra)
    from common.course.stages import by_key
    stage = by_key(stage_key)
    if stage.perf is None:
        raise NcuError(f"stage {stage.key} ({stage.title}) has no benchmark case to profile: its work is "
                       "counting host transfers. common.profiling.profile / export_trace show what a call does.", 1)
    ncu = find_ncu()
    if ncu is None:
        where = f" (NCU={os.environ['NCU']} is not an executable)" if os.environ.get("NCU") else " on PATH"
        raise NcuError(NO_NCU.format(where=where, stage=stage.key), 2)
    if not has_gpu():
        raise NcuError(f"ncu is here ({ncu}) but there is no CUDA GPU: the case runs on one. "
                       "lectures/results/ncu_*.txt show what it measured on the course's H100.", 4)
    wanted = list(METRICS)
    metrics, dropped = available(wanted, query_metrics(ncu))
    results, case = {}, None
    for which in WHICH if baseline else WHICH[:1]:
        print(f"[ncu] profiling the {which} of {stage.key} ({impl}) ...", file=sys.stderr, flush=True)
        results[which], case = profile_case(ncu, stage.key, str(impl), which, metrics, sections=list(sections),
                                            section_set=section_set, kernel=kernel, max_kernels=max_kernels,
                                            extra=list(extra), export=export, timeout=timeout, args=list(args))
    gbps, tflops, source = ceilings_for_report()
    head = f"Nsight Compute: stage {stage.key} ({stage.title}), impl {impl}"
    locked = not any(a == "none" and i and extra[i - 1] == "--clock-control" or a == "--clock-control=none"
                     for i, a in enumerate(extra))
    return head + "\n" + report(results, case, gbps, tflops, source, show_all, dropped, locked)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser(prog="python -m common.course.ncu", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("stage", help="a02 ... a09, or 2 ... 9 (the stage's grader performance case)")
    add_impl_argument(ap)
    ap.add_argument("--no-baseline", action="store_true", help="profile the submission only")
    ap.add_argument("--set", dest="section_set", default="basic",
                    help="ncu section set collected besides the metrics (basic, detailed, full; 'none' for the "
                         "metrics only); matters for the report --export keeps")
    ap.add_argument("--section", action="append", default=[], help="an extra ncu section (repeatable)")
    ap.add_argument("--kernel", help="profile only kernels whose name matches this regex")
    ap.add_argument("--max-kernels", type=int, default=200, help="profile at most this many launches per call")
    ap.add_argument("--export", type=Path, help="keep the reports: EXPORT-submission.ncu-rep, EXPORT-baseline.ncu-rep")
    ap.add_argument("--all", action="store_true", help="every collected metric, not the stage's few")
    ap.add_argument("--ncu-args", default="", help='more ncu options, e.g. "--clock-control none"')
    ap.add_argument("--timeout", type=float, default=600, help="seconds per profiled call")
    ap.add_argument("--out", type=Path, help="also write the report to this file")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--which", choices=WHICH, default="submission", help=argparse.SUPPRESS)
    ap.add_argument("--warmup", type=int, default=3, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    from common.impl import StageError, stage_key
    from .stages import STAGES
    try:
        a.stage = stage_key(a.stage, [s.key for s in STAGES])     # a05, 5, 05 or a05_triton_gelu
    except StageError as e:            # the message alone: it lists the stages
        print(f"{ap.prog}: stage {e}", file=sys.stderr)
        return 2
    if a.child:
        return _child(a.stage, a.impl, a.which, a.warmup)
    try:
        text = run(a.stage, a.impl, baseline=not a.no_baseline, sections=a.section,
                   section_set=None if a.section_set == "none" else a.section_set, kernel=a.kernel,
                   max_kernels=a.max_kernels, extra=a.ncu_args.split(), export=a.export, show_all=a.all,
                   timeout=a.timeout, args=argv)
    except NcuError as e:
        print(str(e), file=sys.stderr)
        return e.code
    except KeyError as e:
        print(e.args[0], file=sys.stderr)
        return 1
    print(text)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
