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
