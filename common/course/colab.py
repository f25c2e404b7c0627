"""The course in Google Colab: what a lecture notebook's setup cell runs there.

Every lecture notebook opens with an "Open in Colab" badge and a setup cell (both written by
``lectures/_tools/colab.py`` from the repository URL in README.md). Off Colab the cell does
nothing. On Colab (``"google.colab" in sys.modules``) it clones the course into
``/content/gpu-kernels-course`` (``COURSE_DIR``) unless it is there, puts it on ``sys.path`` and
calls :func:`setup`, which

* installs the course with ``pip install -e`` and its dependencies, with Colab's own torch (and the
  Triton that came with it) pinned as a constraint, so pip never replaces them;
* makes ``lectures/`` the working folder (the notebooks find the course from there);
* picks the implementation the tests, grader and benches use: ``COURSE_IMPL`` if set (e.g. a folder of
  your work on Google Drive), else ``assignments`` in the clone;
* says which GPU Colab gave you and what of the course runs on it (a T4: no sm_80 tensor-core CUDA
  versions, no Hopper stage; README.md, "Which GPU").

``tests/test_colab.py`` runs the cell the notebooks hold, with a stand-in ``google.colab`` module,
in a fresh virtual environment: the clone (from a local copy of the course), the install (no index:
nothing is downloaded), the working folder and the implementation it leaves behind.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path


def _pins() -> list[str]:
    """``torch==<installed>`` (and triton's): what pip must leave as it is."""
    import torch
    pins = [f"torch=={torch.__version__}"]
    try:
        import triton
        pins.append(f"triton=={triton.__version__}")
    except ImportError:
        pass
    return pins


def setup(course: str | os.PathLike, *, quiet: bool = False) -> str:
    """Install the clone at ``course`` beside the installed torch, work from its lectures/, choose the
    implementation (COURSE_IMPL); returns the implementation chosen."""
    course = Path(course).resolve()
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="course-pins-", delete=False) as f:
        f.write("\n".join(_pins()) + "\n")
    try:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        "-e", str(course), "-c", f.name], check=True)
    finally:
        os.unlink(f.name)
    os.chdir(course / "lectures")
    impl = os.environ.setdefault("COURSE_IMPL", "assignments")
    if not quiet:
        print(f"course installed from {course} (pip install -e; torch and triton as Colab has them: "
              f"{', '.join(_pins())}); working folder {course / 'lectures'}")
        print(f"COURSE_IMPL={impl}: tests, grader and benches use {impl} (set COURSE_IMPL before this cell "
              "for another folder, e.g. your work on Google Drive)")
        print(what_runs_here())
    return impl


def what_runs_here() -> str:
    """One paragraph: the GPU found and what of the course it cannot run (common.gpu.NEEDS)."""
    from common import gpu
    if gpu.capability() is None:
        return ("no GPU in this runtime (Runtime > Change runtime type > T4 GPU for one): Triton kernels run "
                "under the interpreter, CUDA stages and timings skip")
    lines = [f"GPU: {gpu.describe()}, {gpu.shared_memory_per_block() // 1024} KB of shared memory a block"]
    lines += [f"  skips: {why}" for why in (gpu.why_not(f) for f in gpu.NEEDS) if why]
    if gpu.capability() < (8, 0):
        lines.append("  Triton's tl.dot runs on CUDA cores here (FMA; no tensor cores before sm_80 in Triton 3.6) and "
                     "bf16 is emulated: correct, slow")
    return "\n".join(lines)
