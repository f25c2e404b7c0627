"""Autograder configuration, loaded as a plugin by the top-level conftest.py.

    pytest                      # grade assignments/ (your work)
    pytest --impl solutions     # grade the reference solutions
    pytest --impl path/to/sub   # grade a submission laid out like assignments/
    COURSE_IMPL=solutions pytest
    pytest --impl solutions --mutants   # also the slow course self-checks (make test, CI)

Tests that take the ``impl`` fixture are *graded* (marked automatically), except
those marked ``given``: they check given code (an input check, a binding) through the
impl and pass on the untouched stubs. The rest check the course itself. Tests marked ``gpu`` need a CUDA GPU and skip
elsewhere with the reason; ``nvcc`` tests need the CUDA compiler and run where there is no GPU (on a
GPU machine the GPU tests build the same sources). Tests marked
``mutants`` are the slow course self-checks (every buggy variant in tests/mutants/ is caught by
the graded tests and, where it says so, by the grader alone; the untouched stubs fail every
graded test; the grader, run on whole trees, scores solutions, stubs and cheats as it should): they skip unless ``--mutants`` is given. ``make test`` (and so CI) gives it; a
plain ``pytest`` on a GPU machine leaves them out.
"""
from __future__ import annotations

import os
from pathlib import Path

import common  # noqa: F401  (sets TRITON_INTERPRET before any kernel module imports triton)
import pytest

from common import HAS_CUDA
from common.cuda_ext import nvcc_path
from common.impl import ENV_VAR, Impl



def pytest_addoption(parser):
    parser.addoption("--impl", default=None,
                     help="what to grade: assignments (default), solutions, or a path laid out like assignments/")
    parser.addoption("--mutants", action="store_true", default=False,
                     help="also run the slow course self-checks (marked 'mutants': the mutation checks of "
                          "tests/mutants/, by pytest and by the grader, and the stub check); make test passes it")


def pytest_configure(config):
    impl = config.getoption("--impl")
    if impl is not None:
        os.environ[ENV_VAR] = str(impl)
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU")
    config.addinivalue_line("markers", "nvcc: needs the CUDA compiler (nvcc), not a GPU")
    config.addinivalue_line("markers", "graded: grades the selected impl (added to every test using the impl fixture "
                                       "and not marked given)")
    config.addinivalue_line("markers", "given: checks given code through the impl fixture; not graded")
    config.addinivalue_line("markers", "mutants: slow course self-check; runs only with --mutants (make test, CI)")


def pytest_report_header(config):
    return (f"impl: {Impl.get().root}  |  GPU: {'yes' if HAS_CUDA else 'no (GPU tests skip; Triton runs interpreted)'}"
            f"  |  nvcc: {nvcc_path() or 'not found'}")


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU: this machine has none (runs on a GPU machine)")
    no_nvcc = pytest.mark.skip(reason="needs nvcc (the CUDA compiler) to check CUDA sources")
    # nvcc checks are for machines without a GPU (CI): on a GPU the GPU tests build and run the same
    # sources, and the checks would add half a minute to every run there.
    nvcc_on_gpu = pytest.mark.skip(reason="CPU-only check of CUDA sources (CI runs it): on this GPU machine "
                                          "the GPU tests build and run them")
    no_mutants = pytest.mark.skip(reason="slow course self-check: runs with --mutants (make test, CI)")
    mutants = config.getoption("--mutants")
    for item in items:
        if "mutants" in item.keywords and not mutants:
            item.add_marker(no_mutants)
        if "impl" in getattr(item, "fixturenames", ()) and "given" not in item.keywords:
            item.add_marker(pytest.mark.graded)
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(no_gpu)
        if "nvcc" in item.keywords and HAS_CUDA:
            item.add_marker(nvcc_on_gpu)
        elif "nvcc" in item.keywords and nvcc_path() is None:
            item.add_marker(no_nvcc)


def pytest_collection_finish(session):
    """On a GPU machine, start building the CUDA extensions the selected tests need (stages 4, 6, 7c)
    in background processes, side by side, while the first tests run (common.cuda_ext.prebuild).
    A cached build makes that a few seconds of one CPU core. COURSE_PREBUILD=0 turns it off."""
    if not HAS_CUDA or session.config.option.collectonly or os.environ.get("COURSE_PREBUILD", "1") == "0":
        return
    files = {Path(str(item.fspath)).name for item in session.items
             if not any(m.name == "skip" for m in item.iter_markers())}
    from common.cuda_ext import cache_dir, course_ops_here, prebuild
    names = course_ops_here(files)
    if names:
        prebuild(names)
        session.config.get_terminal_writer().line(
            f"building CUDA extensions {', '.join(names)} in the background (logs: {cache_dir()}/prebuild-*.log)")


def pytest_runtest_logstart(nodeid, location):
    """For the grader (common/grade/run.py): the running test's id in a file, so that a test which
    kills the whole process (a segfault in a CUDA extension, an abort) is reported by name."""
    path = os.environ.get("COURSE_RUNNING_TEST_FILE")
    if path:
        Path(path).write_text(nodeid)


@pytest.fixture(scope="session")
def impl() -> Impl:
    """The implementation under test (``common.impl.Impl``): ``impl.load("a03_fused_linear.fused_linear")``,
    ``impl.path("a01_roundtrip_linear")``."""
    return Impl.get()


@pytest.fixture
def seed():
    """A fresh seed per test run (printed on failure) so no output can be cached."""
    import random

    import torch
    s = random.SystemRandom().randrange(2**31)
    torch.manual_seed(s)
    return s
