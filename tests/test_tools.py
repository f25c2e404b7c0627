"""The tools students reach for (not graded): `make lab`, traces they can open, Nsight Compute.

Everything here runs on a CPU: `make -n` shows what a target would run, the trace is of CPU
ops, and the ncu front end is checked on a recorded CSV and on a machine without ncu.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


# ----------------------------------------------------------------------------- make lab
def _make_n(target: str, tmp_path: Path, **env: str) -> str:
    if not shutil.which("make"):
        pytest.skip("no make on this machine")
    e = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "SSH_CONNECTION", "LAB_ARGS")}
    e.update(env)
    out = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}"], cwd=REPO, env=e,
                         capture_output=True, text=True, check=True)
    return out.stdout


def test_make_lab_installs_the_notebooks_extra_once_then_serves_lectures(tmp_path):
    out = _make_n("lab", tmp_path)
    assert "-e '.[dev,notebooks]'" in out                    # first run: the extra
    assert "cd lectures && " in out and "/python -m jupyterlab" in out
    assert "--no-browser" in out                             # no DISPLAY here: print the URL
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(r.startswith("jupyterlab") for r in extras["notebooks"])
    # installed: the second run goes straight to JupyterLab
    stamps = [ln.split("touch ")[-1].strip() for ln in out.splitlines() if "touch " in ln]
    for s in stamps:
        Path(s).parent.mkdir(parents=True, exist_ok=True)
        Path(s).touch()
    again = _make_n("lab", tmp_path)
    assert "pip install" not in again and "/python -m jupyterlab" in again


def test_make_lab_opens_a_browser_where_there_is_a_display(tmp_path):
    out = _make_n("lab", tmp_path, DISPLAY=":0")
    if os.uname().sysname == "Linux":
        assert "--no-browser" not in out
    assert "--no-browser" in _make_n("lab", tmp_path, DISPLAY=":0", SSH_CONNECTION="1.2.3.4 5 6.7.8.9 22")


# ----------------------------------------------------------------------------- traces
def test_export_trace_writes_a_gzipped_chrome_trace_of_the_call(tmp_path):
    import gzip
    import json

    import torch

    from common.impl import load
    from common.profiling import export_trace, load_trace, trace_spans
    fl = load("a03_fused_linear.fused_linear", "solutions")
    rt = load("a01_roundtrip_linear.roundtrip_linear", "solutions")
    w, b, x = torch.randn(48, 32), torch.randn(48), torch.randn(5, 32)
    fused, slow = fl.FusedLinear(w, b), rt.RoundTripLinear(w, b)
    path = export_trace(lambda: fused(x), tmp_path / "traces" / "fused.json.gz", calls=2)
    assert path.read_bytes()[:2] == b"\x1f\x8b"                       # gzip, as named
    doc = json.loads(gzip.decompress(path.read_bytes()))               # what Perfetto reads
    assert doc["traceEvents"] == load_trace(path)
    spans = trace_spans(path)
    assert [s.name for s in spans if s.row == "calls"] == ["call 0", "call 1"]
    cpu = [s.name for s in spans if s.row == "CPU ops"]
    assert cpu.count("aten::addmm") == 2 and "aten::add" not in cpu   # one op does GEMM + bias
    assert all(s.start_us >= 0 and s.dur_us >= 0 for s in spans) and min(s.start_us for s in spans) == 0
    plain = export_trace(lambda: slow(x), tmp_path / "slow.json")      # no .gz: plain JSON
    assert json.loads(plain.read_text())["traceEvents"]
    cpu = [s.name for s in trace_spans(plain) if s.row == "CPU ops"]
    assert {"aten::contiguous", "aten::matmul", "aten::add"} <= set(cpu)   # W^T copy, GEMM, bias apart


def test_trace_spans_rows_of_a_gpu_trace():
    """A GPU trace as torch.profiler (Kineto) writes it: nested CPU ops keep the outermost,
    host<->device memcpys get their own row, device-to-device copies go with the kernels."""
    from common.profiling import trace_spans
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": 1, "tid": 7, "ts": 1000.0, "dur": 30.0},
          {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 7, "ts": 1005.0, "dur": 20.0},
          {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": 1, "tid": 7, "ts": 1040.0, "dur": 5.0},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 7, "ts": 1010.0, "dur": 4.0},
          {"ph": "X", "cat": "kernel", "name": "sm90_xmma_gemm_bf16", "pid": 0, "tid": 7, "ts": 1020.0, "dur": 14.0},
          {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pageable)", "pid": 0, "tid": 7,
           "ts": 1041.0, "dur": 9.0},
          {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "pid": 0, "tid": 7,
           "ts": 1051.0, "dur": 1.0},
          {"ph": "f", "cat": "ac2g", "name": "ac2g", "id": 3, "ts": 1020.0},       # flow arrow: not a bar
          {"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "GPU 0"}}]
    rows = [(s.row, s.name, s.start_us) for s in trace_spans(ev)]
    assert rows == [("CPU ops", "aten::linear", 0.0), ("CUDA API", "cudaLaunchKernel", 10.0),
                    ("GPU kernels", "sm90_xmma_gemm_bf16", 20.0), ("CPU ops", "aten::copy_", 40.0),
                    ("memcpy H<->D", "Memcpy DtoH (Device -> Pageable)", 41.0),
                    ("GPU kernels", "Memcpy DtoD (Device -> Device)", 51.0)]
