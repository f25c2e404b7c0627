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

The first run on a GPU machine is bound by compiling some 600 Triton kernel variants on the CPU.
When Triton's kernel cache is empty there, a run over whole folders (``pytest``, ``pytest --impl
solutions``, ``pytest tests/``) goes to several worker processes, a test file at a time each
(pytest-xdist, ``--dist loadfile``), so that files compile side by side. Once the cache is
filled, runs stay in one process: there the GPU is the shared resource, and processes that share
one GPU take turns on it (on the H100 a warm run took 164 s in 4 workers, 116 s in one).
Named files (``pytest tests/test_a03_fused_linear.py``, the grader) and ``--mutants`` runs stay in
one process too. On a CPU-only machine the other way round: a ``--mutants`` run over whole folders
(``make test``, CI's 2 cores) goes to one worker per core (up to 4), since the Triton interpreter, nvcc
and the graders' subprocesses each keep one core busy; a test file at a time (the tests of
``SPLIT_FILES`` one at a time), the slowest first (``SLOW_FILES``), so that the run ends on short ones;
each of its processes uses one thread for torch's and NumPy's operations (``THREAD_VARS``, unless set).
Other CPU-only runs stay in one process. ``COURSE_WORKERS=N`` sets the number of workers for any run
(``0`` or ``1``: one process); ``-n`` wins over both.
"""
from __future__ import annotations

import os
from pathlib import Path

import common  # noqa: F401  (sets TRITON_INTERPRET before any kernel module imports triton)
import pytest

from common import HAS_CUDA, TRITON_INTERPRET
from common.cuda_ext import nvcc_path
from common.impl import BORROW_VAR, ENV_VAR, Impl, add_impl_argument, borrowed



def pytest_addoption(parser):
    add_impl_argument(parser)
    parser.addoption("--borrow", default=None,
                     help="stages to take from solutions/ where another stage imports them, e.g. a06,a07: try "
                          "stage 8 (which runs on your a06 matmul and a07 attention) before those are done; the "
                          "borrowed stages' own tests are skipped")
    parser.addoption("--mutants", action="store_true", default=False,
                     help="also run the slow course self-checks (marked 'mutants': the mutation checks of "
                          "tests/mutants/, by pytest and by the grader, and the stub check); make test passes it")


def auto_workers(config) -> tuple[int, str]:
    """How many xdist workers a run gets when ``-n`` is not given (0: run in this process), and why."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not config.pluginmanager.hasplugin("xdist"):
        return 0, ""
    if config.option.numprocesses is not None or config.getoption("usepdb", False) or config.option.collectonly:
        return 0, ""
    env = os.environ.get("COURSE_WORKERS", "").strip()
    if env:
        try:
            n = int(env)
        except ValueError:
            raise pytest.UsageError(f"COURSE_WORKERS={env!r}: expected a whole number of worker processes "
                                    "(0 or 1 for one process)") from None
        return (n, f"COURSE_WORKERS={n}") if n > 1 else (0, "")
    whole_folders = all(Path(str(a).split("::")[0]).is_dir() for a in config.args)
    if not HAS_CUDA:
        if not (config.getoption("--mutants") and whole_folders):
            return 0, ""
        n = min(4, os.cpu_count() or 1)
        return (n, CPU_SELF_CHECK) if n > 1 else (0, "")
    if config.getoption("--mutants") or not whole_folders or triton_cache_entries() >= COLD_CACHE:
        return 0, ""
    n = min(4, (os.cpu_count() or 1) // 4)   # each worker compiles with threads of its own
    return (n, "Triton's kernel cache is empty: a first run") if n > 1 else (0, "")


#: Fewer compiled kernels than this in Triton's cache: a first run (a full one leaves about 600).
COLD_CACHE = 100

#: Why a CPU-only run gets workers: the whole suite with the self-checks (make test, CI's 2 cores), where the
#: Triton interpreter, nvcc and the graders' subprocesses each keep one core busy.
CPU_SELF_CHECK = "CPU-only run of the whole suite with --mutants"

#: The test files that take longest on a 2-core CPU machine, slowest first (the mutation pools, one unit of
#: work; the grader's whole-tree runs and the notebooks, a test at a time; stages 8 and 9; the nvcc compiles; the
#: mutation check's summary gives its CPU time), started first so that the last to finish are short.
SLOW_FILES = ("test_mutants.py", "test_grader.py", "test_notebooks.py", "test_a08_gpt2_inference.py",
              "test_a09_llama_inference.py",
              "test_a07c_flash_hopper.py", "test_a06_matmul.py", "test_a07_flash_attention.py", "test_course.py",
              "test_portability.py", "test_ncu.py", "test_colab.py", "test_a04_cuda_gelu.py")
#: Files whose tests share no state worth keeping in one process (each grades or executes on its own, in
#: subprocesses): spread a test at a time. The others go to one worker a file at a time (module fixtures,
#: the mutation pools of test_mutants.py).
SPLIT_FILES = ("test_grader.py", "test_notebooks.py")


#: Set to 1 (where not set already) for a CPU_SELF_CHECK run, before its workers and their subprocesses start:
#: the run has a process per core already, and each process's torch (OpenMP, MKL) and NumPy (OpenBLAS, the
#: Triton interpreter's tl.dot) thread pools of one thread per core only contended for the cores, spinning
#: while they waited: more CPU time for the same work, and no shorter a run.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def one_thread_per_process(environ=os.environ) -> None:
    """A CPU_SELF_CHECK run's processes (workers, the mutation pools, the graders' subprocesses) each use one
    thread for torch's and NumPy's operations, unless the environment says otherwise."""
    for var in THREAD_VARS:
        environ.setdefault(var, "1")


def xdist_scope(nodeid: str) -> str:
    """The unit of work a CPU_SELF_CHECK worker takes at a time: a test of SPLIT_FILES, else its file."""
    file = nodeid.split("::")[0]
    return nodeid if Path(file).name in SPLIT_FILES else file


def xdist_rank(scope: str) -> int:
    """Where a unit of work comes in the queue: SLOW_FILES in their order, then the rest (by their number of
    tests, xdist's own order)."""
    name = Path(scope.split("::")[0]).name
    return SLOW_FILES.index(name) if name in SLOW_FILES else len(SLOW_FILES)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """For CPU_SELF_CHECK runs: xdist's load-scope scheduling, the scopes of xdist_scope handed out in
    xdist_rank's order."""
    if getattr(config, "course_workers_why", None) != CPU_SELF_CHECK:
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SlowFirst(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            first = min(self.workqueue, key=xdist_rank)        # min: the first of the lowest rank
            self.workqueue.move_to_end(first, last=False)
            super()._assign_work_unit(node)
    return SlowFirst(config, log)


def triton_cache_entries() -> int:
    """Kernels in Triton's on-disk cache (TRITON_CACHE_DIR, else ~/.triton/cache): a folder each.
    Without Triton (it installs on Linux only) nothing compiles: counted as a filled cache."""
    try:
        from triton import knobs
    except ImportError:
        return COLD_CACHE
    try:
        return sum(1 for _ in os.scandir(knobs.cache.dir))
    except OSError:
        return 0


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """Before pytest-xdist reads its options (its own hook is tryfirst too; this plugin registers
    after it, so runs first): a GPU run over whole folders gets workers (see the module docstring)."""
    n, why = auto_workers(config)
    if n:
        config.option.numprocesses = n
        config.course_workers_why = why
        if why == CPU_SELF_CHECK:
            one_thread_per_process()
        if config.option.dist == "no":
            config.option.dist = "loadscope" if why == CPU_SELF_CHECK else "loadfile"


def pytest_configure(config):
    impl = config.getoption("--impl")
    if impl is not None:
        os.environ[ENV_VAR] = str(impl)
    if config.getoption("--borrow"):
        os.environ[BORROW_VAR] = config.getoption("--borrow")
        borrowed()                          # a stage that does not exist: the usage error, now
    # The harness and torch as they are before any submission is imported (graded tests are checked
    # against it when they end: see _harness_untouched).
    from common.course import guard
    from common.course.grade.worker import _import_harness
    _import_harness()
    config.course_guard = guard.snapshot()
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU")
    config.addinivalue_line("markers", "nvcc: needs the CUDA compiler (nvcc), not a GPU")
    config.addinivalue_line("markers", "graded: grades the selected impl (added to every test using the impl fixture "
                                       "and not marked given)")
    config.addinivalue_line("markers", "given: checks given code through the impl fixture; not graded")
    config.addinivalue_line("markers", "mutants: slow course self-check; runs only with --mutants (make test, CI)")


def pytest_report_header(config):
    why = getattr(config, "course_workers_why", None)
    each = "a test file (or a test of " + ", ".join(SPLIT_FILES) + ") each, slowest first" if why == CPU_SELF_CHECK \
        else "a test file each"
    workers = (f"  |  {config.option.numprocesses} worker processes, {each} ({why}; "
               "COURSE_WORKERS=0: one process)" if why else "")
    lent = f"  |  borrowed from solutions/: {os.environ[BORROW_VAR]}" if os.environ.get(BORROW_VAR) else ""
    return (f"impl: {Impl.get().root}{lent}  |  GPU: {'yes' if HAS_CUDA else 'no (GPU tests skip; Triton runs interpreted)'}"
            f"  |  nvcc: {nvcc_path() or 'not found'}" + workers)


def pytest_collection_modifyitems(config, items):
    no_gpu = pytest.mark.skip(reason="needs a CUDA GPU: this machine has none (runs on a GPU machine)")
    no_nvcc = pytest.mark.skip(reason="needs nvcc (the CUDA compiler) to check CUDA sources")
    # nvcc checks are for machines without a GPU (CI): on a GPU the GPU tests build and run the same
    # sources, and the checks would add half a minute to every run there.
    nvcc_on_gpu = pytest.mark.skip(reason="CPU-only check of CUDA sources (CI runs it): on this GPU machine "
                                          "the GPU tests build and run them")
    no_mutants = pytest.mark.skip(reason="slow course self-check: runs with --mutants (make test, CI)")
    mutants = config.getoption("--mutants")
    lent = borrowed() if Impl.get().package != "solutions" else []
    for item in items:
        if any(Path(str(item.fspath)).name.startswith(f"test_{folder}") for folder in lent):
            item.add_marker(pytest.mark.skip(reason=f"borrowed from solutions/ ({os.environ.get(BORROW_VAR)}): "
                                                    "not your code, not tested"))
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
    if os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return      # xdist: every worker collects the whole selection; the first starts the builds
    files = {Path(str(item.fspath)).name for item in session.items
             if not any(m.name == "skip" for m in item.iter_markers())}
    from common.cuda_ext import cache_dir, course_ops_here, prebuild
    names = course_ops_here(files)
    if names:
        prebuild(names)
        session.config.get_terminal_writer().line(
            f"building CUDA extensions {', '.join(names)} in the background (logs: {cache_dir()}/prebuild-*.log)")


def pytest_runtest_logstart(nodeid, location):
    """For the grader (common/course/grade/run.py): the running test's id in a file, so that a test which
    kills the whole process (a segfault in a CUDA extension, an abort) is reported by name."""
    path = os.environ.get("COURSE_RUNNING_TEST_FILE")
    if path:
        Path(path).write_text(nodeid)


@pytest.fixture(scope="session")
def impl() -> Impl:
    """The implementation under test (``common.impl.Impl``): ``impl.load("a03_fused_linear.fused_linear")``,
    ``impl.path("a01_roundtrip_linear")``."""
    return Impl.get()


@pytest.fixture(autouse=True)
def _triton_env_kept():
    """Every test ends with the TRITON_* environment and Triton's NVIDIA knobs it started with.
    When torch.compile compiles (stages 4 and 5 test it; a cold inductor cache) it sets Triton's
    libdevice knob in Python and TRITON_LIBDEVICE_PATH. The libdevice is a compile option that
    Triton keys its on-disk cache on, so a process that had compiled with inductor keyed every
    later kernel differently from one that had not: on the H100 a warm run's worker that ran stage
    4 first recompiled the 154 GELU and matmul kernels of the next two files (71 s) that the cold
    run had cached. With the knobs restored after each test, that worker recompiled nothing."""
    before = {k: v for k, v in os.environ.items() if k.startswith("TRITON_")}
    try:
        from triton import knobs
    except ImportError:                 # no Triton (it installs on Linux only): nothing to keep
        knobs = None
    if TRITON_INTERPRET or knobs is None:
        yield
    else:
        with knobs.nvidia.scope():      # also the knobs set in Python (libdevice_path), not only the env
            yield
    for k in [k for k in os.environ if k.startswith("TRITON_") and k not in before]:
        del os.environ[k]
    os.environ.update(before)


@pytest.fixture(autouse=True)
def _harness_untouched(request):
    """A graded test fails if, by its end, torch or a harness module differs from what it was before the
    submission was imported (common.course.guard: a function replaced or its code swapped, a tolerance table
    edited, a module replaced in sys.modules). Every graded test after such a patch fails too: the
    checks it relies on are no longer the course's."""
    yield
    if "graded" not in request.node.keywords:
        return
    from common.course import guard
    found = guard.changed(request.config.course_guard)
    if found:
        pytest.fail(f"the submission patched the harness or torch: {', '.join(found[:6])}"
                    f"{' ...' if len(found) > 6 else ''} (common/course/guard.py); no test result counts after that",
                    pytrace=False)


@pytest.fixture
def seed():
    """A fresh seed per test run (printed on failure) so no output can be cached."""
    import random

    import torch
    s = random.SystemRandom().randrange(2**31)
    torch.manual_seed(s)
    return s
