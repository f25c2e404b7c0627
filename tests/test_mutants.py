"""Mutation checks (not graded): every buggy variant of a solution (tests/mutants/)
must fail at least one graded test of its stage. Runs with ``--impl solutions``
(make test), like the stub check; the mutants are graded in worker processes: two
(CI's 2-core machine) unless COURSE_MUTANT_WORKERS says how many."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from common import HAS_CUDA
from common.impl import REPO, resolve
from mutants import all_mutants

MUTANTS = all_mutants()
WORKERS = int(os.environ.get("COURSE_MUTANT_WORKERS", "2"))


@pytest.fixture(scope="module")
def outcomes(request, tmp_path_factory):
    if resolve() != REPO / "solutions":
        pytest.skip("course self-check: runs with --impl solutions (make test)")
    # Grade only the mutants selected (pytest -k), so a long GPU run can be split by stage.
    chosen = {it.callspec.params["mutant"].id for it in request.session.items
              if "mutant" in getattr(getattr(it, "callspec", None), "params", {})}
    ids = [m.id for m in MUTANTS if (HAS_CUDA or not m.gpu) and m.id in chosen]
    tmp = tmp_path_factory.mktemp("mutants")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]))
    procs = []
    for w in range(WORKERS):
        part = ids[w::WORKERS]
        if part:
            out = tmp / f"w{w}.json"
            procs.append((out, subprocess.Popen([sys.executable, "-m", "mutants.run", str(out), *part], cwd=REPO,
                                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    results, logs = {}, []
    for out, p in procs:
        log, _ = p.communicate(timeout=3600)
        logs.append(log[-3000:])
        if out.exists():
            results.update(json.loads(out.read_text()))
    caught = sum(r["caught"] for r in results.values())
    not_run = sum(m.gpu and not HAS_CUDA and m.id in chosen for m in MUTANTS)
    print(f"\nmutation checks: {caught} of {len(ids)} mutants caught "
          f"({not_run} GPU-only mutants not run on this machine)")
    return results, "\n".join(logs)


def test_mutant_ids_are_unique():
    ids = [m.id for m in MUTANTS]
    assert len(ids) == len(set(ids)), sorted(i for i in ids if ids.count(i) > 1)


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
