"""The nine lecture notebooks execute top to bottom, and are committed without outputs.

    make notebooks                                   # this file, verbose
    python -m pytest tests/test_notebooks.py -k strip

Each notebook runs in a fresh Jupyter kernel started from *this* Python (the
course's venv), through nbclient, with ``lectures/`` as its working directory: on a
CPU-only machine Triton runs interpreted and GPU-only cells print what they would
show. Not graded (no ``impl`` fixture). The executed H100 copies in
``lectures/rendered/`` are made with ``lectures/_tools/execute.py``.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

LECTURES = Path(__file__).resolve().parent.parent / "lectures"
NOTEBOOKS = [
    "01_resource_accounting.ipynb",
    "02_gpu_principles.ipynb",
    "03_benchmarking_profiling.ipynb",
    "04_operator_fusion.ipynb",
    "05_triton.ipynb",
    "06_tiled_matmul.ipynb",
    "07_flash_attention.ipynb",
    "08_gpt2_inference.ipynb",
    "09_llama_inference.ipynb",
]
KERNEL = "gpu-kernels-course"
sys.path.insert(0, str(LECTURES / "_tools"))
from strip import dirty  # noqa: E402


def _load(name: str) -> dict:
    return json.loads((LECTURES / name).read_text())


def test_the_nine_notebooks_are_there():
    assert sorted(p.name for p in LECTURES.glob("*.ipynb")) == sorted(NOTEBOOKS)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_without_outputs(name):
    why = dirty(_load(name))
    assert not why, f"{name} has outputs; run: python lectures/_tools/strip.py lectures/{name}\n" + "\n".join(why)


@pytest.fixture(scope="module")
def kernel_name(tmp_path_factory, monkeypatch_module):
    """A kernelspec that starts ipykernel with this interpreter, found first on JUPYTER_PATH."""
    root = tmp_path_factory.mktemp("jupyter")
    spec = root / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "gpu-kernels-course (test)", "language": "python"}))
    monkeypatch_module.setenv("JUPYTER_PATH", str(root))
    monkeypatch_module.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    return KERNEL


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_executes_and_plots(name, kernel_name):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(LECTURES / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=300, kernel_name=kernel_name,
                                     resources={"metadata": {"path": str(LECTURES)}})
    client.execute()    # raises CellExecutionError, with the cell and traceback, if a cell fails
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    pngs = sum("image/png" in o.get("data", {}) for o in outputs)
    assert pngs >= 1, f"{name}: no plot was drawn"


def _stale() -> dict[str, str]:
    """Notebooks whose rendered copy is known to be out of date: ``- NAME.ipynb: reason`` lines of
    lectures/rendered/STALE.md."""
    path = LECTURES / "rendered" / "STALE.md"
    lines = path.read_text().splitlines() if path.exists() else []
    return dict(m.groups() for m in (re.match(r"- (\S+\.ipynb):\s*(.+)", ln.strip()) for ln in lines) if m)


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_rendered_copy_has_outputs(name):
    if name in _stale():
        pytest.skip(f"rendered copy of {name} listed as out of date in lectures/rendered/STALE.md: {_stale()[name]}")
    path = LECTURES / "rendered" / name
    if not path.exists():
        pytest.skip(f"no GPU-rendered copy of {name} yet (lectures/rendered/)")
    nb = json.loads(path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(c.get("execution_count") for c in code), f"{name}: rendered copy has unexecuted cells"
    assert not [o for c in code for o in c["outputs"] if o["output_type"] == "error"]
    src = {"".join(c["source"]) for c in _load(name)["cells"]}
    assert {"".join(c["source"]) for c in nb["cells"]} == src, f"{name}: rendered copy is out of date with lectures/{name}"


@pytest.mark.parametrize("name", sorted(_stale()))
def test_stale_entry_is_still_stale(name):
    """An entry of lectures/rendered/STALE.md must not outlive the re-render that fixes it."""
    path = LECTURES / "rendered" / name
    assert (LECTURES / name).exists(), f"lectures/rendered/STALE.md lists {name}, which is not a lecture"
    if not path.exists():
        return                      # no rendered copy at all: test_rendered_copy_has_outputs skips it anyway
    src = {"".join(c["source"]) for c in _load(name)["cells"]}
    rendered = {"".join(c["source"]) for c in json.loads(path.read_text())["cells"]}
    assert rendered != src, (f"lectures/rendered/{name} is up to date with lectures/{name}: "
                             f"delete its line from lectures/rendered/STALE.md")


def test_executor_keeps_streams_results_figures_and_errors(tmp_path):
    """lectures/_tools/execute.py (used where Jupyter is absent) writes the outputs Jupyter would."""
    import execute
    cells = ["print('hello')\n6 * 7",
             "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\nprint('after')",
             "@__import__('functools').lru_cache\ndef f():\n    return 1\nimport inspect\nprint(inspect.getsource(f).splitlines()[1])",
             "raise ValueError('boom')",
             "print('still runs')"]
    nb = {"cells": [{"cell_type": "code", "id": f"c{i}", "metadata": {}, "source": s, "outputs": [],
                     "execution_count": None} for i, s in enumerate(cells)],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    src = tmp_path / "t.ipynb"
    src.write_text(json.dumps(nb))
    rc = execute.main([str(src), "--out", str(tmp_path / "out"), "--allow-errors"])
    assert rc == 1                                   # a cell raised
    out = json.loads((tmp_path / "out" / "t.ipynb").read_text())["cells"]
    assert "".join(out[0]["outputs"][0]["text"]) == "hello\n"
    assert out[0]["outputs"][1]["output_type"] == "execute_result"
    assert "".join(out[0]["outputs"][1]["data"]["text/plain"]) == "42"
    kinds = [o["output_type"] for o in out[1]["outputs"]]
    assert kinds == ["display_data", "stream"] and "image/png" in out[1]["outputs"][0]["data"]
    assert "def f():" in "".join(out[2]["outputs"][0]["text"])   # cell source visible to inspect (Triton needs it)
    assert out[3]["outputs"][0]["output_type"] == "error" and out[3]["outputs"][0]["ename"] == "ValueError"
    assert "".join(out[4]["outputs"][0]["text"]) == "still runs\n"


def test_executor_ignores_an_inline_backend_from_the_environment(tmp_path):
    """A GPU image may export MPLBACKEND=module://matplotlib_inline.backend_inline (Jupyter's);
    where matplotlib_inline is not installed, `import matplotlib` itself fails on it. The executor
    draws with Agg regardless. A fresh process (matplotlib reads MPLBACKEND once, on import), with
    a backend name no matplotlib accepts, so this fails without the fix here too."""
    import os
    import subprocess
    nb = {"cells": [{"cell_type": "code", "id": "c0", "metadata": {}, "outputs": [], "execution_count": None,
                     "source": "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()"}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    src = tmp_path / "t.ipynb"
    src.write_text(json.dumps(nb))
    tool = Path(__file__).resolve().parents[1] / "lectures" / "_tools" / "execute.py"
    env = {**os.environ, "MPLBACKEND": "no_such_backend"}
    r = subprocess.run([sys.executable, str(tool), str(src), "--out", str(tmp_path / "out")], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads((tmp_path / "out" / "t.ipynb").read_text())["cells"]
    assert "image/png" in out[0]["outputs"][0]["data"]
