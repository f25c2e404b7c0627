"""Google Colab: every lecture notebook's badge and setup cell, and the setup cell's install path.

    python -m pytest tests/test_colab.py

The setup cell is run as the notebooks hold it, in a fresh virtual environment, as Colab would run
it: a stand-in ``google.colab`` module, the course cloned with git from a local copy of this working
tree (instead of GitHub), ``pip install -e`` with no package index (every dependency is already
there: the course's own environment is visible to the new one, as Colab's packages are to its
kernel), so nothing is downloaded. Not graded (no ``impl`` fixture).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import venv
from pathlib import Path

import pytest

from common.impl import REPO

sys.path.insert(0, str(REPO / "lectures" / "_tools"))
import colab  # noqa: E402  (lectures/_tools/colab.py)

NOTEBOOKS = sorted(p.name for p in (REPO / "lectures").glob("*.ipynb"))


def _setup_source(name: str = NOTEBOOKS[0]) -> str:
    nb = json.loads((REPO / "lectures" / name).read_text())
    return "".join(next(c for c in nb["cells"] if c.get("id") == colab.SETUP_ID)["source"])


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_badge_and_setup_cell_follow_the_repository(name):
    """Badge first, setup cell before the first code cell, both as lectures/_tools/colab.py writes them from
    README.md's COURSE_REPOSITORY (one place for the URL)."""
    nb = json.loads((REPO / "lectures" / name).read_text())
    assert nb == colab.with_cells(nb, colab.repository(), name), (
        f"{name}: the Colab badge or setup cell is missing or stale; run python lectures/_tools/colab.py --write")
    cells = nb["cells"]
    assert cells[0]["id"] == colab.BADGE_ID
    assert colab.colab_url(colab.repository(), name) in "".join(cells[0]["source"])
    first_code = next(c for c in cells if c["cell_type"] == "code")
    assert first_code["id"] == colab.SETUP_ID and not first_code["outputs"]


def test_setup_cell_does_nothing_off_colab(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "google.colab", raising=False)
    before = dict(os.environ)
    exec(compile(_setup_source(), "colab-setup", "exec"), {})
    assert Path.cwd() == tmp_path and dict(os.environ) == before


def _working_tree_copy(dest: Path) -> None:
    """The files git would clone from this working tree (tracked and new, not ignored), committed in a
    fresh repository at ``dest``: what the published course would hold."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    for f in filter(None, files):
        src = REPO / f
        if src.is_file():
            (dest / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / f)
    git = ["git", "-c", "user.name=course", "-c", "user.email=course@localhost", "-c", "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "course"]):
        subprocess.run(git + args, cwd=dest, check=True, capture_output=True)


def _fresh_env(root: Path) -> Path:
    """A new virtual environment (no pip of its own) that sees this environment's packages, less the
    course itself, the way a Colab kernel sees Colab's: its python."""
    venv.create(root, with_pip=False, symlinks=True)
    py = root / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    ours = Path(sysconfig.get_paths()["purelib"])
    shown = root / "colab-packages"
    shown.mkdir()
    for entry in ours.iterdir():            # everything but this checkout's editable install of the course
        if not entry.name.startswith(("gpu_kernels_course", "__editable__", "_gpu_kernels_course")):
            (shown / entry.name).symlink_to(entry)
    (site / "colab-packages.pth").write_text(str(shown) + "\n")
    return py


def _unmet_pins() -> list[str]:
    """The course's dependencies (pyproject.toml) that this environment's packages do not satisfy."""
    import tomllib
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement
    unmet = []
    for spec in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(spec)
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            have = version(req.name)
        except PackageNotFoundError:
            have = None
        if have is None or not req.specifier.contains(have, prereleases=True):
            unmet.append(f"{req.name} {have or '(absent)'} against {spec!r}")
    return unmet


def test_setup_cell_installs_the_course_on_colab(tmp_path):
    """On "Colab": the cell clones the course, installs it editable beside the torch already there (left
    as it is), moves to lectures/ and sets COURSE_IMPL; the course then imports from the clone, in a new
    process too. The install has no package index here, so it needs this environment to satisfy the
    course's pins (on Colab pip downloads what is missing): where it does not, the test says which."""
    unmet = _unmet_pins()
    if unmet:
        pytest.skip("an offline install cannot satisfy the course's pins in this environment: " + "; ".join(unmet))
    t0 = time.perf_counter()
    remote, course = tmp_path / "remote", tmp_path / "content" / "gpu-kernels-course"
    remote.mkdir()
    _working_tree_copy(remote)
    py = _fresh_env(tmp_path / "venv")
    import torch
    probe = tmp_path / "colab_probe.py"
    probe.write_text(
        "import json, os, sys, types\n"
        "google = types.ModuleType('google'); google.colab = types.ModuleType('google.colab')\n"
        "sys.modules['google'] = google; sys.modules['google.colab'] = google.colab   # what Colab's kernel has\n"
        f"exec(compile(open({str(tmp_path / 'cell.py')!r}).read(), 'colab-setup', 'exec'), {{}})\n"
        "import common, torch\n"
        "print('PROBE ' + json.dumps({'cwd': os.getcwd(), 'impl': os.environ.get('COURSE_IMPL'),\n"
        "      'common': common.__file__, 'torch': torch.__version__}))\n")
    (tmp_path / "cell.py").write_text(_setup_source())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COURSE_", "PYTHON", "PIP_", "VIRTUAL_ENV"))}
    env.update(COURSE_DIR=str(course), COURSE_REPO_URL=f"file://{remote}",
               PIP_NO_INDEX="1", PIP_NO_BUILD_ISOLATION="0",   # nothing downloaded; setuptools from the environment
               PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_CACHE_DIR="1")
    r = subprocess.run([str(py), str(probe)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"the setup cell failed on 'Colab':\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    out = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("PROBE "))[6:])
    assert Path(out["cwd"]) == course / "lectures"
    assert out["impl"] == "assignments"
    assert Path(out["common"]).resolve() == (course / "common" / "__init__.py").resolve()
    assert out["torch"] == torch.__version__, "the install replaced the torch that was there"
    assert "COURSE_IMPL=assignments" in r.stdout and "course installed from" in r.stdout
    # the editable install works without the cell's sys.path: a new process elsewhere imports the clone
    r2 = subprocess.run([str(py), "-c", "import solutions.a03_fused_linear.add_bias as m, common; "
                         "print(m.__file__); print(common.__file__)"], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=300)
    assert r2.returncode == 0, r2.stderr[-3000:]
    assert all(Path(p).resolve().is_relative_to(course.resolve()) for p in r2.stdout.split()), r2.stdout
    print(f"\nColab setup cell: clone + pip install -e + checks in {time.perf_counter() - t0:.0f} s")
