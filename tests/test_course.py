"""Checks of the course itself (not graded): the two trees mirror each other, and
the untouched stubs fail every graded test."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from common.course.grade import junit_outcomes
from common.impl import REPO, resolve

SKIP_PARTS = {"__pycache__", ".ipynb_checkpoints"}


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if p.is_file() and not SKIP_PARTS & set(p.parts) and p.suffix not in (".pyc",)}


def _stages() -> list[str]:
    return sorted(p.name for p in (REPO / "assignments").iterdir() if p.is_dir() and p.name[:1] == "a")


def test_solutions_mirror_assignments_file_for_file():
    """assignments/ holds what solutions/ generates (the files with TODOs and the bindings; not the
    benches, which stay in solutions/) and the handouts, one beside each stage's solution notes."""
    from common.course.make_stubs import generated
    a = _files(REPO / "assignments")
    want = {str(rel) for rel in generated()} | {f for f in _files(REPO / "solutions") if Path(f).name == "README.md"}
    assert a == want, f"only in assignments: {sorted(a - want)}; missing there: {sorted(want - a)}"
    assert _stages(), "no stages found"


def _sig(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    ret = f" -> {ast.unparse(fn.returns)}" if fn.returns else ""
    return f"({ast.unparse(fn.args)}){ret}"


def _public_api(path: Path) -> dict[str, str]:
    """Public top-level names of a module's source, with signatures (classes: their methods too).

    Read from the source (ast), not from the imported module, so names that running a
    kernel adds at run time (the Triton interpreter injects globals) do not count.
    """
    api = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("_"):
            api[node.name] = _sig(node)
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            api[node.name] = "class(" + ", ".join(ast.unparse(b) for b in node.bases) + ")"
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
                        not item.name.startswith("_") or item.name in ("__init__", "__call__")):
                    api[f"{node.name}.{item.name}"] = _sig(item)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and not t.id.startswith("_"):
                    api[t.id] = "value"
    return api


def _modules() -> list[str]:
    """The stage modules both trees have (the benches are solutions/' alone)."""
    return sorted(f"{p.parent.name}.{p.stem}" for p in (REPO / "solutions").glob("a*/*.py")
                  if p.stem != "__init__" and (REPO / "assignments" / p.parent.name / p.name).exists())


@pytest.mark.parametrize("module", _modules())
def test_same_public_api(module):
    rel = Path(*module.split(".")).with_suffix(".py")
    sol = _public_api(REPO / "solutions" / rel)
    others = [("assignments", _public_api(REPO / "assignments" / rel))]
    if resolve().name not in ("assignments", "solutions"):
        sub = resolve() / rel
        others.append((str(resolve()), _public_api(sub) if sub.exists() else {}))
    for label, api in others:
        missing = sorted(set(sol) - set(api))
        extra = sorted(set(api) - set(sol))
        changed = sorted(k for k in set(sol) & set(api) if sol[k] != api[k])
        assert not (missing or extra or changed), (
            f"{label}.{module} differs from solutions: missing {missing}, extra {extra}, "
            f"changed {[(k, api[k], sol[k]) for k in changed]}")


@pytest.mark.mutants
def test_untouched_stubs_fail_every_graded_test(tmp_path):
    """Run the graded tests against assignments/: none may pass. ``--tb=no``: the verdicts (and each failure's
    message, in the report and the summary lines) are all this reads; formatting some 400 full tracebacks
    took two thirds of the run (71 s of 77 on one core)."""
    if resolve() != REPO / "solutions":
        pytest.skip("course self-check: runs with --impl solutions (make test), where assignments/ are the stubs")
    xml = tmp_path / "stubs.xml"
    env = dict(os.environ, COURSE_IMPL="assignments")
    r = subprocess.run([sys.executable, "-m", "pytest", str(REPO / "tests"), "-m", "graded", "--impl", "assignments",
                        "-q", "-p", "no:cacheprovider", "--tb=no", f"--junitxml={xml}"],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert xml.exists(), f"the stub run produced no report:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    out = junit_outcomes(xml)
    passed, failed, skipped = out["passed"], len(out["failed"]), len(out["skipped"])
    print(f"stub run: {failed} failed, {skipped} skipped, {len(passed)} passed")
    assert failed > 0, f"no graded test failed on the stubs:\n{r.stdout[-3000:]}"
    assert not passed, f"{len(passed)} graded tests pass on the untouched stubs: {passed}"


GIVEN = ("binding.cpp",)   # every given file is generated from solutions/ (tests/test_make_stubs.py)


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO / "solutions")) for p in (REPO / "solutions").glob("a*/*")
                                        if p.name in GIVEN))
def test_given_code_is_identical(path):
    """Benchmarks and bindings are given code: the same file in both trees."""
    assert (REPO / "assignments" / path).read_bytes() == (REPO / "solutions" / path).read_bytes(), (
        f"assignments/{path} and solutions/{path} differ; given code must be identical")


def test_load_op_builds_and_hashes_once_per_process(monkeypatch, tmp_path):
    """Wrappers call common.cuda_ext.load_op on every kernel call: after the first, it must
    neither read the sources again nor call the builder (no GPU needed: both are stubbed)."""
    import torch
    import torch.utils.cpp_extension as cpp

    from common import cuda_ext
    src = tmp_path / "k.cu"
    src.write_text("// kernel\n")
    calls = {"load": 0, "digest": 0}
    real_digest = cuda_ext._digest

    def digest(sources, flags):
        calls["digest"] += 1
        return real_digest(sources, flags)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(cpp, "load", lambda **kw: calls.__setitem__("load", calls["load"] + 1))
    monkeypatch.setattr(cuda_ext, "_digest", digest)
    monkeypatch.setattr(cuda_ext, "_LOADED", {})
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    names = {cuda_ext.load_op("k", [src], namespace="ns_test") for _ in range(3)}
    assert calls == {"load": 1, "digest": 1} and len(names) == 1
    cuda_ext.load_op("k", [src], namespace="ns_test", extra_cuda_cflags=["-DX"])   # other flags: another build
    assert calls == {"load": 2, "digest": 2}


def test_fake_cuda_indexing_matches_torch():
    """common.profiling.fake_cuda routes ``x[...]`` through aten ops (a CPU-only build cannot index
    a CUDA tensor, even a fake one): the same values as torch's indexing on real tensors, the
    same shapes on fake CUDA tensors."""
    import torch

    from common.profiling import _index_ops, fake_cuda

    def cases(i, j, k):
        return [(slice(None), 1), (None, ..., 2), (1, slice(1, 4, 2)), (-1,), (slice(-2, None),), (..., None),
                (i,), (i, j), (slice(None), i, j), (i, slice(None), j), (1, j), (..., i), (None, i, None, slice(2)),
                (j, 2, i), (k,)]
    x = torch.randn(3, 4, 5, 6)
    real = cases(torch.tensor([0, 2, 1]), torch.tensor([[1], [2]]), torch.tensor(2))
    for c in real:
        got = _index_ops(x, c)
        assert got is not None and torch.equal(got, x[c]), c
    assert _index_ops(x, x > 0) is None and _index_ops(x, [0, 1]) is None   # left to torch
    shapes = [x[c].shape for c in real]
    with fake_cuda():
        xf = torch.empty(3, 4, 5, 6, device="cuda")
        fake = cases(*(torch.zeros(s, dtype=torch.long, device="cuda") for s in ((3,), (2, 1), ())))
        for c, shape in zip(fake, shapes):
            assert xf[c].shape == shape and xf[c].device == xf.device, c
        w = torch.empty(4, 8, device="cuda").uniform_(-1, 1)   # nn.Linear's init
        assert w.shape == (4, 8) and w.device.type == "cuda"


# ----------------------------------------------------------------- worker processes (tests/autograder.py)
class _Config:
    """What auto_workers reads of a pytest config."""
    def __init__(self, args, mutants=False, n=None, xdist=True):
        from types import SimpleNamespace
        self.args, self._mutants = [str(a) for a in args], mutants
        self.option = SimpleNamespace(numprocesses=n, collectonly=False)
        self.pluginmanager = SimpleNamespace(hasplugin=lambda name: xdist)

    def getoption(self, name, default=None):
        return {"--mutants": self._mutants, "usepdb": False}.get(name, default)


def test_workers_only_for_a_first_run_over_whole_folders_on_a_gpu(monkeypatch, tmp_path):
    """A GPU run over whole folders with an empty Triton cache gets workers; named files, --mutants,
    -n, a filled cache and a CPU-only machine stay in one process; COURSE_WORKERS overrides. On a
    CPU-only machine a --mutants run over whole folders (make test, CI) gets one worker per core, up to 4."""
    import tests.autograder as ag
    tests_dir, one_file = REPO / "tests", REPO / "tests" / "test_course.py"
    monkeypatch.delenv("COURSE_WORKERS", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))           # empty: a first run
    monkeypatch.setattr(ag, "HAS_CUDA", True)
    assert ag.auto_workers(_Config([tests_dir]))[0] == 4
    assert ag.auto_workers(_Config([one_file]))[0] == 0
    assert ag.auto_workers(_Config([tests_dir], mutants=True))[0] == 0
    assert ag.auto_workers(_Config([tests_dir], n=0))[0] == 0
    assert ag.auto_workers(_Config([tests_dir], xdist=False))[0] == 0
    for i in range(ag.COLD_CACHE):
        (tmp_path / f"k{i}").mkdir()
    assert ag.auto_workers(_Config([tests_dir]))[0] == 0            # cache filled: one process
    monkeypatch.setenv("COURSE_WORKERS", "3")
    assert ag.auto_workers(_Config([one_file])) == (3, "COURSE_WORKERS=3")
    monkeypatch.setenv("COURSE_WORKERS", "1")
    assert ag.auto_workers(_Config([tests_dir]))[0] == 0
    monkeypatch.setenv("COURSE_WORKERS", "four")
    with pytest.raises(pytest.UsageError, match="COURSE_WORKERS='four'"):
        ag.auto_workers(_Config([tests_dir]))
    monkeypatch.delenv("COURSE_WORKERS")
    monkeypatch.setattr(ag, "HAS_CUDA", False)
    (tmp_path / "k0").rmdir()
    assert ag.auto_workers(_Config([tests_dir]))[0] == 0            # no GPU: nothing to compile for
    assert ag.auto_workers(_Config([tests_dir], mutants=True)) == (4, ag.CPU_SELF_CHECK)   # make test on a CPU
    assert ag.auto_workers(_Config([one_file], mutants=True))[0] == 0
    assert ag.auto_workers(_Config([tests_dir], mutants=True, n=0))[0] == 0
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert ag.auto_workers(_Config([tests_dir], mutants=True))[0] == 2                      # CI's 2 cores
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    assert ag.auto_workers(_Config([tests_dir], mutants=True))[0] == 0


def test_cpu_self_check_runs_one_thread_per_process():
    """make test's processes on a CPU (a process per core already) use one thread for torch's and NumPy's
    operations, unless the environment sets a number."""
    import tests.autograder as ag
    env = {"OMP_NUM_THREADS": "3"}
    ag.one_thread_per_process(env)
    assert env == {"OMP_NUM_THREADS": "3", **{v: "1" for v in ag.THREAD_VARS if v != "OMP_NUM_THREADS"}}


def test_cpu_self_check_hands_out_the_slowest_work_first():
    """make test's workers on a CPU (tests/autograder.py): a file at a time, the grader's and the notebooks'
    tests one at a time, the slowest files first, the others after them; every file named exists."""
    import tests.autograder as ag
    assert ag.xdist_scope("tests/test_a03_fused_linear.py::test_add_bias[1]") == "tests/test_a03_fused_linear.py"
    assert ag.xdist_scope("tests/test_mutants.py::test_mutant_is_caught[a01-x]") == "tests/test_mutants.py"
    one = "tests/test_grader.py::test_many_submissions"
    assert ag.xdist_scope(one) == one
    scopes = ["tests/test_a01_roundtrip_linear.py", "tests/test_notebooks.py::test_executes_and_plots[x]",
              "tests/test_mutants.py", one]
    assert [s for s in sorted(scopes, key=ag.xdist_rank)] == scopes[2:] + scopes[1:2] + scopes[:1]
    assert set(ag.SPLIT_FILES) <= set(ag.SLOW_FILES)
    assert all((REPO / "tests" / f).is_file() for f in ag.SLOW_FILES), ag.SLOW_FILES


def test_every_stage_has_one_bench_that_takes_impl():
    """`make bench STAGE=aNN` (common/course/bench.py): a bench in solutions/ for every stage, run on any tree."""
    import importlib
    import inspect

    from common.course.bench import BENCHES
    assert {s[:3] for s in BENCHES} >= {s[:3] for s in _stages()}
    for stage, module in BENCHES.items():
        main = importlib.import_module(f"solutions.{module}").main
        assert "argv" in inspect.signature(main).parameters, f"{module}.main takes no argv"
        assert "--impl" in (REPO / "solutions" / (module.replace(".", "/") + ".py")).read_text() or \
            "add_impl_argument" in (REPO / "solutions" / (module.replace(".", "/") + ".py")).read_text()
