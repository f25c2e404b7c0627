"""The grader alone on mutants, in one process: ``python -m mutants.grade OUT.json [--claims DIR] ID [ID ...]``
(tests/ on sys.path). For each mutant: copy solutions/, apply its edits, and grade its stage with the
grader's trials only, as ``python -m common.course.grade --no-tests`` does (common.course.grade.judge.run_stage: the
judge in this process, the submission in its worker processes), then score it. One judge process
grades many mutants, so torch, triton and transformers are imported once, not once per mutant; on a
CPU its workers are forked from a process that imported them once too (mutants/zygote.py).
"""
from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from common import HAS_CUDA
from common.course.grade.judge import run_stage
from common.course.grade.score import score
from common.course.stages import by_key
from mutants import all_mutants
from mutants.run import _claim, apply
from mutants.zygote import forked_workers


def grade(ids: list[str], claims: Path | None = None, timeout: float = 900) -> dict[str, dict]:
    with forked_workers():
        return _grade(ids, claims, timeout)


def _grade(ids: list[str], claims: Path | None, timeout: float) -> dict[str, dict]:
    wanted = {m.id: m for m in all_mutants()}
    results = {}
    for mid in ids:
        if not _claim(claims, mid):
            continue
        m = wanted[mid]
        stage = by_key(m.stage)
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            try:
                sub = apply(m, Path(tmp) / "mutant")
            except ValueError as e:
                results[mid] = {"error": str(e)}
                continue
            w = run_stage(sub, stage, timeout)
        s = score(tests_passed=0, tests_failed=0, trials=w.correctness, violations=bool(w.violations), run_tests=False,
                  timed=HAS_CUDA and stage.perf is not None, speedup=w.speedup, perf_target=stage.perf_target)
        results[mid] = {"score": s.score, "correctness": s.correctness, "report": "; ".join(w.violations + [w.message]),
                        "seconds": round(time.perf_counter() - t0, 1)}
        print(f"{mid}: grader {s.correctness} {s.score:g} in {results[mid]['seconds']} s", file=sys.stderr, flush=True)
    return results


if __name__ == "__main__":
    args = sys.argv[2:]
    claims = None
    if args[:1] == ["--claims"]:
        claims, args = Path(args[1]), args[2:]
    Path(sys.argv[1]).write_text(json.dumps(grade(args, claims), indent=1))
