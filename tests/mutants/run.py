"""Grade mutants in one process: ``python -m mutants.run OUT.json ID [ID ...]`` (tests/ on sys.path).

For each mutant: copy solutions/ to a temporary folder, apply the edits, and run the
stage's graded tests on that copy with ``pytest.main`` (``-x``: the first failure is
enough). Each copy imports under its own package name (common.impl), so one process
can grade many mutants without reloading torch and triton every time.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from common.impl import REPO
from mutants import Mutant, all_mutants


def apply(mutant: Mutant, dest: Path) -> Path:
    shutil.copytree(REPO / "solutions", dest, ignore=shutil.ignore_patterns("__pycache__"))
    path = dest / mutant.stage / mutant.file
    text = path.read_text()
    for old, new in mutant.edits:
        if text.count(old) != 1:
            raise ValueError(f"mutant {mutant.id}: {old!r} occurs {text.count(old)} times in {mutant.file}")
        text = text.replace(old, new)
    path.write_text(text)
    return dest


class _Outcome:
    def __init__(self):
        self.failed: list[str] = []
        self.message = ""          # the first failure's exception line(s), for Mutant.expect
        self.passed = 0

    def pytest_runtest_logreport(self, report):
        if report.failed:
            self.failed.append(report.nodeid.split("::")[-1])
            if not self.message:
                crash = getattr(report.longrepr, "reprcrash", None)
                self.message = (crash.message if crash is not None else report.longreprtext)[-2000:]
        elif report.passed and report.when == "call":
            self.passed += 1


def run(ids: list[str]) -> dict[str, dict]:
    wanted = {m.id: m for m in all_mutants()}
    results = {}
    for mid in ids:
        m = wanted[mid]
        with tempfile.TemporaryDirectory() as tmp:
            try:
                sub = apply(m, Path(tmp) / "mutant")
            except ValueError as e:
                results[mid] = {"caught": False, "error": str(e)}
                continue
            out = _Outcome()
            code = pytest.main([str(REPO / "tests" / f"test_{m.stage}.py"), "--impl", str(sub), "-m", "graded", "-x",
                                "-q", "--tb=no", "--no-header", "-p", "no:cacheprovider"], plugins=[out])
            results[mid] = {"caught": bool(out.failed), "exit": int(code), "first_failure": out.failed[:1],
                            "message": out.message}
        print(f"{mid}: {'caught' if results[mid]['caught'] else 'NOT CAUGHT'}", file=sys.stderr, flush=True)
    return results


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps(run(sys.argv[2:]), indent=1))
