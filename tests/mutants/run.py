"""Grade mutants in one process: ``python -m mutants.run OUT.json [--claims DIR] ID [ID ...]`` (tests/ on sys.path).

For each mutant: copy solutions/ to a temporary folder, apply the edits, and run the
stage's graded tests (``Mutant.marker``) on that copy with ``pytest.main`` (``-x``: the first failure is
enough). Each copy imports under its own package name (common.impl), so one process
can grade many mutants without reloading torch and triton every time. With ``--claims DIR``
several such processes share one list: each takes the next mutant no other has claimed (an
empty file per mutant in DIR, named by a hash of its id, created exclusively), so a slow stage does not leave one
process working while the other waits.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
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


def _claim(claims: Path | None, mid: str) -> bool:
    """True if this process is the one to grade ``mid`` (always, without a claims folder)."""
    if claims is None:
        return True
    try:
        name = hashlib.sha1(mid.encode()).hexdigest()   # ids hold '/' and other characters a file name may not
        os.close(os.open(claims / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        return True
    except FileExistsError:
        return False


def run(ids: list[str], claims: Path | None = None) -> dict[str, dict]:
    wanted = {m.id: m for m in all_mutants()}
    results = {}
    for mid in ids:
        if not _claim(claims, mid):
            continue
        m = wanted[mid]
        t0 = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            try:
                sub = apply(m, Path(tmp) / "mutant")
            except ValueError as e:
                results[mid] = {"caught": False, "error": str(e)}
                continue
            out = _Outcome()
            code = pytest.main([str(REPO / "tests" / m.test_file), "--impl", str(sub), "-m", m.marker, "-x",
                                "-q", "--tb=no", "--no-header", "-p", "no:cacheprovider"], plugins=[out])
            results[mid] = {"caught": bool(out.failed), "exit": int(code), "first_failure": out.failed[:1],
                            "message": out.message, "seconds": round(time.perf_counter() - t0, 1)}
        print(f"{mid}: {'caught' if results[mid]['caught'] else 'NOT CAUGHT'} in {results[mid]['seconds']} s",
              file=sys.stderr, flush=True)
    return results


if __name__ == "__main__":
    args = sys.argv[2:]
    claims = None
    if args[:1] == ["--claims"]:
        claims, args = Path(args[1]), args[2:]
    Path(sys.argv[1]).write_text(json.dumps(run(args, claims), indent=1))
