"""python -m common.course.ncu (not graded): the raw-page parser on a recorded CSV, the report, and the
front end's messages, all on a CPU. tests/data/ncu_raw_a05.csv is laid out as
``ncu --import REPORT --csv --page raw`` prints it: a header (launch columns, then one column per
metric, alphabetical), a row of units (empty under the launch columns), one row per kernel
launch (here stage 5's Triton GELU, then F.gelu's kernel, whose name holds commas); values in
ncu's display units ("Mbyte", "Tbyte/second", "usecond"), with thousands separators and "n/a".
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from common import HAS_CUDA
from common.course import ncu

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "tests" / "data" / "ncu_raw_a05.csv"
A05_CASE = {"label": "Triton gelu 2^26 bf16", "baseline": 'F.gelu(approximate="tanh")',
            "flops": 8.0 * 2**26, "bytes": 4.0 * 2**26}


def test_parse_raw_csv_reads_kernels_in_base_units():
    kernels = ncu.parse_raw_csv(SAMPLE.read_text())
    assert [k.id for k in kernels] == [0, 1]
    gelu, torch_gelu = kernels
    assert gelu.name == "gelu_kernel" and gelu.block == "(128, 1, 1)" and gelu.grid == "(65536, 1, 1)"
    assert torch_gelu.name.startswith("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl")
    assert torch_gelu.name.endswith("std::array<char *, 2>>(int, T2, T3)")            # commas inside quotes
    assert gelu.get("gpu__time_duration.sum") == pytest.approx(99.04e-6)               # usecond -> s
    assert gelu.get("dram__bytes.sum") == pytest.approx(268.45e6)                       # Mbyte -> byte (decimal)
    assert gelu.get("dram__bytes.sum.per_second") == pytest.approx(2.71e12)             # Tbyte/second
    assert gelu.get("dram__throughput.avg.pct_of_peak_sustained_elapsed") == pytest.approx(81.63)
    assert gelu.get("sm__cycles_elapsed.avg") == pytest.approx(173353.33)               # "173,353.33"
    assert gelu.get("launch__registers_per_thread") == 16
    assert torch_gelu.get("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum") is None  # "n/a"
    assert gelu.get("device__attribute_display_name") is None                          # a string, not a number
    assert gelu.units["dram__bytes.sum.per_second"] == "byte/second"


def test_parse_raw_csv_without_units_row_and_without_a_table():
    lines = SAMPLE.read_text().splitlines()
    no_units = "\n".join([lines[1]] + lines[3:])
    k = ncu.parse_raw_csv(no_units)[0]
    assert k.get("gpu__time_duration.sum") == pytest.approx(99.04)   # no unit known: the number as printed
    with pytest.raises(ValueError, match="no ncu raw-page CSV header"):
        ncu.parse_raw_csv("==PROF== Connected to process 1\n==WARNING== No kernels were profiled.\n")


@pytest.mark.parametrize("value,unit,want", [
    (1.5, "Gbyte", (1.5e9, "byte")), (2.0, "Kbyte/second", (2e3, "byte/second")), (3.0, "byte", (3.0, "byte")),
    (7.0, "msecond", (7e-3, "second")), (9.0, "nsecond", (9e-9, "second")), (50.0, "%", (50.0, "%")),
    (4.0, "cycle", (4.0, "cycle"))])
def test_to_base(value, unit, want):
    v, u = ncu.to_base(value, unit)
    assert (pytest.approx(v), u) == (pytest.approx(want[0]), want[1])


def test_query_metrics_listing_filters_what_the_gpu_lacks():
    listing = ("Device GH100 (GH100)\n------------------\nMetric Name  Metric Type  Metric Unit  Metric Description\n"
               + "\n".join(f"{m.split('.')[0]}  Counter  byte  # of things" for m in ncu.METRICS if "gmma" not in m)
               + "\n" + "\n".join(f"sm__filler_{i}  Counter    # filler" for i in range(60)))
    listed = ncu.parse_metric_list(listing)
    assert "dram__bytes" in listed and "Device" not in listed
    keep, dropped = ncu.available(list(ncu.METRICS), listed)
    assert dropped == ["sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active"]
    assert "launch__registers_per_thread" in keep
    assert ncu.available(["a__b.sum"], set()) == (["a__b.sum"], [])      # no listing understood: keep all


def test_report_memory_bound_stage_shows_dram_against_the_roofline():
    k = ncu.parse_raw_csv(SAMPLE.read_text())
    text = ncu.report({"submission": k[:1], "baseline": k[1:]}, A05_CASE, 3000.0, 754.0, "test ceilings")
    assert "memory-bound" in text and ">= 89.5 us per call" in text            # 268 MB / 3000 GB/s
    assert "DRAM % of peak" in text and "DRAM GB/s" in text and "tensor" not in text.split("columns:")[0]
    assert "DRAM 268.4 MB = 1.00x the fewest bytes" in text
    sub = text.split("\nbaseline:")[0]
    assert "gelu_kernel" in sub and "81.6" in sub and "2711" in sub            # 268.45 MB / 99.04 us


def test_report_compute_bound_stage_shows_the_tensor_pipes():
    k = ncu.parse_raw_csv(SAMPLE.read_text())
    case = dict(A05_CASE, label="a GEMM", flops=2.0 * 4096**3, bytes=3 * 2.0 * 4096**2)
    text = ncu.report({"submission": k[:1]}, case, 3000.0, 754.0, "test")
    assert "compute-bound" in text
    head = text.split("columns:")[0]
    assert all(c in head for c in ("SM % of peak", "tensor HMMA %", "occupancy %", "L2 hit %", "smem bank conflicts"))


def test_summarize_weights_percentages_by_time_and_sums_bytes():
    k0, k1 = ncu.parse_raw_csv(SAMPLE.read_text())
    k1.name = k0.name
    (row,) = ncu.summarize([k0, k1])
    t0, t1 = 99.04e-6, 99.52e-6
    assert row.count == 2 and row.time_s == pytest.approx(t0 + t1)
    assert row.metrics["dram__bytes.sum"] == pytest.approx(268.45e6 + 268.47e6)
    assert row.metrics["dram__throughput.avg.pct_of_peak_sustained_elapsed"] == pytest.approx(
        (81.63 * t0 + 81.25 * t1) / (t0 + t1))
    assert row.metrics["dram__bytes.sum.per_second"] == pytest.approx((268.45e6 + 268.47e6) / (t0 + t1))
    assert row.metrics["launch__registers_per_thread"] == 22


# ----------------------------------------------------------------------------- the front end
def _cli(*args, **env) -> subprocess.CompletedProcess:
    e = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-m", "common.course.ncu", *args], cwd=REPO, env=e, capture_output=True,
                          text=True, timeout=120)


def _front_end(monkeypatch, capsys, *args, **env) -> tuple[int, str]:
    """``python -m common.course.ncu ARGS`` with ``env`` (its front end, main(), in this process: what it answers before
    any profiling needs no process of its own): (exit code, stderr)."""
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    code = ncu.main(list(args))
    return code, capsys.readouterr().err


def test_missing_ncu_says_where_to_get_it(tmp_path, monkeypatch, capsys):
    if Path("/usr/local/cuda/bin/ncu").exists():
        pytest.skip("this machine has /usr/local/cuda/bin/ncu")
    with monkeypatch.context() as m:
        code, err = _front_end(m, capsys, "a05", PATH=str(tmp_path), CUDA_HOME=str(tmp_path))
    assert code == 2
    assert "ncu (Nsight Compute) was not found on PATH" in err and "NCU=/path/to/ncu" in err
    code, err = _front_end(monkeypatch, capsys, "a05", NCU=str(tmp_path / "nope"))
    assert code == 2 and "is not an executable" in err


def test_stage_without_a_case_and_unknown_stage(monkeypatch, capsys):
    code, err = _front_end(monkeypatch, capsys, "a01")
    assert code == 1 and "has no benchmark case" in err
    code, err = _front_end(monkeypatch, capsys, "a42")
    assert code == 2 and "stage 'a42': no such stage. Stages: a01" in err
    code, err = _front_end(monkeypatch, capsys, "1")         # stage 1 by its number: the same stage
    assert code == 1 and "has no benchmark case" in err


FAKE_NCU = r'''#!{python}
"""Stands in for ncu: --query-metrics lists metrics (no GMMA), a profile run prints what the
child would and writes an empty report, --import prints the recorded raw page's row for it."""
import json, pathlib, sys
args = sys.argv[1:]
log = pathlib.Path({log!r})
log.write_text(log.read_text() + json.dumps(args) + "\n" if log.exists() else json.dumps(args) + "\n")
if {perm!r}:
    print("==PROF== Connected to process 4242 (python3)")
    print("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
          "Counters on the target device 0. For instructions on enabling permissions and to get more "
          "information see https://developer.nvidia.com/ERR_NVGPUCTRPERM")
    sys.exit(1)
if "--query-metrics" in args:
    print("Device GH100 (GH100)")
    print("Metric Name        Metric Type   Metric Unit   Metric Description")
    for m in {metrics!r}:
        print(m.split(".")[0] + "   Counter   byte   # of things")
    for i in range(60):
        print(f"sm__filler_{{i}}   Counter      # filler")
    sys.exit(0)
if "--import" in args:
    which = "baseline" if "baseline" in args[args.index("--import") + 1] else "submission"
    lines = pathlib.Path({sample!r}).read_text().splitlines()
    print("\n".join(lines[1:3] + [lines[3] if which == "submission" else lines[4]]))
    sys.exit(0)
pathlib.Path(args[args.index("-o") + 1] + ".ncu-rep").write_text("report")
print("==PROF== Connected to process 4242 (python3)")
print("@@NCU-CASE@@" + json.dumps({case!r}))
print("==PROF== Disconnected from process 4242")
'''


def _fake_ncu(tmp_path, perm=False) -> tuple[Path, Path]:
    log = tmp_path / "calls.jsonl"
    fake = tmp_path / "ncu"
    fake.write_text(FAKE_NCU.format(python=sys.executable, log=str(log), perm=perm, sample=str(SAMPLE),
                                    metrics=[m for m in ncu.METRICS if "gmma" not in m], case=A05_CASE))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    return fake, log


def test_front_end_runs_ncu_twice_and_prints_the_report(tmp_path, monkeypatch, capsys):
    fake, log = _fake_ncu(tmp_path)
    monkeypatch.setenv("NCU", str(fake))
    monkeypatch.setattr(ncu, "has_gpu", lambda: True)
    monkeypatch.setattr(ncu, "ceilings_for_report", lambda: (3000.0, 754.0, "test ceilings"))
    out = tmp_path / "ncu_a05.txt"
    assert ncu.main(["a05", "--impl", "solutions", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.strip() == out.read_text().strip()
    assert text.startswith("Nsight Compute: stage a05 (Fused GELU (Triton)), impl solutions")
    assert "submission: Triton gelu 2^26 bf16" in text and 'baseline: F.gelu(approximate="tanh")' in text
    assert "not collected (this GPU's ncu does not list them): sm__pipe_tensor_op_gmma" in text
    calls = [json.loads(ln) for ln in log.read_text().splitlines()]
    assert calls[0] == ["--query-metrics"]
    runs = [c for c in calls if "-o" in c]
    assert [c[c.index("--which") + 1] for c in runs] == ["submission", "baseline"]
    for c in runs:
        assert c[c.index("--profile-from-start") + 1] == "off" and c[c.index("--set") + 1] == "basic"
        assert "gmma" not in c[c.index("--metrics") + 1] and "dram__bytes.sum.per_second" in c[c.index("--metrics") + 1]
        assert c[c.index(sys.executable):][:5] == [sys.executable, "-m", "common.course.ncu", "--child", "a05"]
    imports = [c for c in calls if "--import" in c]
    assert len(imports) == 2 and all(c[-3:] == ["--csv", "--page", "raw"] for c in imports)


def test_front_end_explains_missing_counter_permission(tmp_path, monkeypatch, capsys):
    fake, _ = _fake_ncu(tmp_path, perm=True)
    monkeypatch.setenv("NCU", str(fake))
    monkeypatch.setattr(ncu, "has_gpu", lambda: True)
    assert ncu.main(["a05", "--impl", "solutions"]) == 3
    err = capsys.readouterr().err
    assert "ERR_NVGPUCTRPERM" in err and "NVreg_RestrictProfilingToAdminUsers=0" in err and "sudo" in err


def test_front_end_without_a_gpu(tmp_path, monkeypatch, capsys):
    fake, _ = _fake_ncu(tmp_path)
    monkeypatch.setenv("NCU", str(fake))
    monkeypatch.setattr(ncu, "has_gpu", lambda: False)
    assert ncu.main(["a05"]) == 4
    assert "there is no CUDA GPU" in capsys.readouterr().err


@pytest.mark.skipif(HAS_CUDA, reason="the CPU path: on a GPU the case builds (ncu_run.sh profiles it)")
def test_child_reports_a_case_that_cannot_run():
    """The process ncu starts: on a CPU the case cannot be built (CUDA tensors); it says why
    on the line the front end reads, instead of profiling nothing."""
    p = _cli("a05", "--child", "--impl", "solutions", "--which", "baseline")
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith(ncu.CASE_MARK))
    assert p.returncode == 1 and "error" in json.loads(line[len(ncu.CASE_MARK):])


def test_front_end_passes_ncu_options_and_says_how_clocks_ran(tmp_path, monkeypatch, capsys):
    fake, log = _fake_ncu(tmp_path)
    monkeypatch.setenv("NCU", str(fake))
    monkeypatch.setattr(ncu, "has_gpu", lambda: True)
    monkeypatch.setattr(ncu, "ceilings_for_report", lambda: (3000.0, 754.0, "test ceilings"))
    monkeypatch.delenv("COURSE_IMPL", raising=False)        # pytest --impl sets it; the default is assignments
    assert ncu.main(["a05", "--no-baseline", "--set", "none", "--kernel", "gelu", "--ncu-args", "--clock-control none"]) == 0
    text = capsys.readouterr().out
    assert "clocks not locked (--clock-control none)" in text and "\nbaseline:" not in text
    (run,) = [json.loads(ln) for ln in log.read_text().splitlines() if '"-o"' in ln]
    child = run.index(sys.executable)
    assert run[child - 2:child] == ["--clock-control", "none"] and "--set" not in run
    assert run[run.index("-k") + 1] == "regex:gelu" and run[run.index("--impl") + 1] == "assignments"
