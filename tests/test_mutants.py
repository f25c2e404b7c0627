"""Mutation checks (not graded): every buggy variant of a solution (tests/mutants/)
must fail at least one graded test of its stage, and a variant that names ``grader=``
(cheats, precision faults: tests/mutants/cheat.py, precision.py) must also be rejected by
the grader alone (``python -m common.course.grade --no-tests``: its trials, no tests), since the
grader may never accept what the tests reject. Slow: marked ``mutants``, so they run only
with ``--mutants`` (make test and CI pass it; a plain ``pytest`` on a GPU machine skips
them). Runs with ``--impl solutions``, like the stub check; the mutants are graded in worker
processes that share one list (each takes the next mutant not yet taken): two (CI's 2-core
machine) unless COURSE_MUTANT_WORKERS says how many."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from common import HAS_CUDA
from common.impl import REPO, resolve
from mutants import all_mutants
from tests.autograder import one_thread_per_process

MUTANTS = all_mutants()
GRADER_MUTANTS = [m for m in MUTANTS if m.grader is not None]
WORKERS = int(os.environ.get("COURSE_MUTANT_WORKERS", "2"))
#: The test files whose mutants take the most CPU (a cross-compile; GPT-2 and attention under the Triton
#: interpreter, in the tests and in the grader's trials): their mutants are handed out first, so that the
#: processes sharing one list end together, on quick ones.
HEAVY_FIRST = ("test_portability.py", "test_a08_gpt2_inference.py", "test_a07_flash_attention.py")


def _heavy_first(mutants: list) -> list:
    return sorted(mutants, key=lambda m: HEAVY_FIRST.index(m.test_file) if m.test_file in HEAVY_FIRST
                  else len(HEAVY_FIRST))


def _chosen(request, param: str) -> set[str]:
    """The mutants selected (pytest -k) for ``param``, so a long GPU run can be split by stage."""
    return {it.callspec.params[param].id for it in request.session.items
            if param in getattr(getattr(it, "callspec", None), "params", {})}


def _env() -> dict:
    """The grading processes' environment: tests/ importable, and one thread each for torch's and NumPy's
    operations (WORKERS of them side by side; tests/autograder.py's one_thread_per_process)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]))
    one_thread_per_process(env)
    return env


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory):
    if resolve() != REPO / "solutions":
        pytest.skip("course self-check: runs with --impl solutions (make test)")
    chosen = _chosen(request, "mutant")
    run = _heavy_first([m for m in MUTANTS if (HAS_CUDA or not m.gpu) and m.id in chosen])
    ids = [m.id for m in run]
    shared = [m.id for m in run if not m.isolated]
    tmp = tmp_path_factory.mktemp("mutants")
    claims = tmp / "claims"
    claims.mkdir()
    # WORKERS processes share one list of mutants; a mutant that patches torch or the harness gets a
    # process of its own (before the shared ones, WORKERS at a time, so that the run ends on the shared
    # list, whose processes end together).
    jobs = [(tmp / f"iso{n}.json", [m.id]) for n, m in enumerate(run) if m.isolated]
    jobs += [(tmp / f"w{w}.json", ["--claims", str(claims), *shared]) for w in range(min(WORKERS, len(shared)))]

    def grade(job):
        out, args = job
        p = subprocess.run([sys.executable, "-m", "mutants.run", str(out), *args], cwd=REPO, env=_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)
        return out, p.stdout
    results, logs = {}, []
    with ThreadPoolExecutor(max_workers=max(1, WORKERS)) as pool:
        for out, log in pool.map(grade, jobs):
            logs.append(log[-3000:])
            if out.exists():
                results.update(json.loads(out.read_text()))
    caught = sum(r["caught"] for r in results.values())
    not_run = sum(m.gpu and not HAS_CUDA and m.id in chosen for m in MUTANTS)
    slow = sorted(results.items(), key=lambda kv: -kv[1].get("cpu", 0))[:5]
    stale = sorted(k for k, r in results.items() if r.get("caught") and not r.get("hint_used"))
    print(f"\nmutation checks: {caught} of {len(ids)} mutants caught "
          f"({not_run} GPU-only mutants not run on this machine) in "
          f"{sum(r.get('cpu', 0) for r in results.values()):.0f} s of CPU; the most CPU: "
          + ", ".join(f"{k} {r.get('cpu', '?')} s ({r.get('seconds', '?')} s of wall time)" for k, r in slow)
          + (f"; {len(stale)} caught by another test than tests/mutants/first_failures.json names (refresh it: "
             f"PYTHONPATH=.:tests python -m mutants.run /tmp/m.json --update-hints ID ...): {stale[:5]}" if stale else ""))
    return results, "\n".join(logs)


def test_every_mutant_applies():
    """Each mutant's edits still match the solution they edit, GPU-only ones too (a CPU run never grades
    those, so an edit a change of the solution broke would otherwise show only on the GPU machine)."""
    from mutants.run import apply
    broken = []
    with tempfile.TemporaryDirectory() as tmp:
        for n, m in enumerate(MUTANTS):
            try:
                apply(m, Path(tmp) / str(n))
            except ValueError as e:
                broken.append(str(e)[:200])
    assert not broken, "\n".join(broken)


def test_a_stale_hint_tries_its_test_function_then_the_whole_file():
    """mutants.run grades a mutant on the hinted test, then (where that passes or no longer exists: ids
    renamed) every case of the same test function, then the whole file, until one fails."""
    from mutants.run import _targets
    assert _targets("t.py", "test_x[M15-fp32]") == ["t.py::test_x[M15-fp32]", "t.py::test_x", "t.py"]
    assert _targets("t.py", "test_x") == ["t.py::test_x", "t.py"]
    assert _targets("t.py", None) == ["t.py"]


def test_heavy_mutants_are_handed_out_first():
    """The files HEAVY_FIRST names exist, and their mutants lead the shared lists in that order."""
    assert all((REPO / "tests" / f).is_file() for f in HEAVY_FIRST), HEAVY_FIRST
    files = [m.test_file for m in _heavy_first(MUTANTS)]
    heavy = [f for f in files if f in HEAVY_FIRST]
    assert files[:len(heavy)] == sorted(heavy, key=HEAVY_FIRST.index)


def test_mutant_ids_are_unique():
    ids = [m.id for m in MUTANTS]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


@pytest.mark.mutants
@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_mutant_is_caught(mutant, outcomes):
    if mutant.gpu and not HAS_CUDA:
        pytest.skip("only a GPU run can catch this mutant")
    results, logs = outcomes
    assert mutant.id in results, f"mutant {mutant.id} was not graded (worker crashed?):\n{logs}"
    r = results[mutant.id]
    assert "error" not in r, r["error"]
    assert r["caught"], f"mutant '{mutant.bug}' in {mutant.stage}/{mutant.file} was not caught by any graded test"
    missing = [s for s in mutant.expect if s not in r.get("message", "")]
    assert not missing, (f"mutant '{mutant.bug}' was caught by {r['first_failure']}, but the failure message lacks "
                         f"{missing}; it reads:\n{r.get('message', '')}")


@pytest.fixture(scope="module")
def grader_outcomes(request, tmp_path_factory):
    """Every chosen mutant graded by the grader alone (its trials, no tests), WORKERS judge processes
    sharing one list (tests/mutants/grade.py: one judge imports torch and triton once for many mutants;
    the submission runs in the judge's worker processes, as in ``common.course.grade --no-tests``)."""
    if resolve() != REPO / "solutions":
        pytest.skip("course self-check: runs with --impl solutions (make test)")
    chosen = _chosen(request, "gmutant")
    ids = [m.id for m in _heavy_first(GRADER_MUTANTS) if m.id in chosen and (HAS_CUDA or not m.gpu)]
    tmp = tmp_path_factory.mktemp("grader_mutants")
    claims = tmp / "claims"
    claims.mkdir()

    def grade(w):
        out = tmp / f"g{w}.json"
        p = subprocess.run([sys.executable, "-m", "mutants.grade", str(out), "--claims", str(claims), *ids], cwd=REPO,
                           env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=3600)
        return (json.loads(out.read_text()) if out.exists() else {}), p.stdout[-3000:]
    results, logs = {}, []
    with ThreadPoolExecutor(max_workers=max(1, WORKERS)) as pool:
        for found, log in pool.map(grade, range(max(1, min(WORKERS, len(ids))))):
            results.update(found)
            logs.append(log)
    return {mid: results.get(mid, {"error": "not graded (a judge process crashed?):\n" + "\n".join(logs)})
            for mid in ids}


@pytest.mark.mutants
@pytest.mark.skipif(HAS_CUDA, reason="the zygote serves CPU runs only (CUDA is not fork-safe)")
def test_zygote_workers_pass_crash_and_time_out_as_processes_do(tmp_path):
    """The grader-alone checks run their workers forked from mutants/zygote.py: a worker that passes, exits
    at import, aborts (a signal) or hangs past the time limit gets the judge's verdict of a new process."""
    import shutil

    from common.course.grade import judge
    from common.course.stages import by_key
    from mutants.zygote import forked_workers
    sub = tmp_path / "sub"
    shutil.copytree(REPO / "solutions", sub, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, at_import in (("a02_pretransposed_linear/pretransposed_linear.py", "__import__('os')._exit(3)\n"),
                           ("a03_fused_linear/fused_linear.py", "__import__('time').sleep(600)\n"),
                           ("a05_triton_gelu/gelu_triton.py", "__import__('os').abort()\n")):
        path = sub / rel
        path.write_text(path.read_text().replace("import torch\n", "import torch\n" + at_import, 1))
    with forked_workers() as zygote:
        assert zygote.ready, "the zygote did not start: its workers would be new processes"
        got = {key: judge.run_stage(sub, by_key(key), 5) for key in ("a01", "a02", "a03", "a05")}
    assert zygote.forked == 4, f"{4 - zygote.forked} of the 4 workers were new processes, not forks"
    assert got["a01"].correctness == "pass", got["a01"].message
    assert got["a02"].message.startswith("crashed (exit 3)"), got["a02"].message
    assert got["a03"].message == "timed out after 5 s", got["a03"].message
    assert got["a05"].message.startswith("crashed with SIGABRT (signal 6)"), got["a05"].message


@pytest.mark.mutants
@pytest.mark.parametrize("gmutant", GRADER_MUTANTS, ids=[m.id for m in GRADER_MUTANTS])
def test_grader_alone_rejects_mutant(gmutant, grader_outcomes):
    """Cheats and precision faults: the grader's trials alone (no tests) score the stage 0."""
    if gmutant.gpu and not HAS_CUDA:
        pytest.skip("only a GPU run can catch this mutant")
    r = grader_outcomes[gmutant.id]
    assert "error" not in r, r["error"]
    assert r["correctness"] == "fail" and r["score"] == 0, (
        f"the grader alone (--no-tests) accepted mutant '{gmutant.bug}' in {gmutant.stage}/{gmutant.file}: "
        f"{r['correctness']}, {r['score']} points; {r['report']}")
    missing = [s for s in gmutant.grader if s not in r["report"]]
    assert not missing, f"the grader rejected '{gmutant.bug}', but its report lacks {missing}; it reads:\n{r['report']}"
