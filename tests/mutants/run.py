"""Grade mutants in one process: ``python -m mutants.run OUT.json [--write-hints | --update-hints] [--claims DIR]
ID [ID ...]`` (tests/ on sys.path).

For each mutant: copy solutions/ to a temporary folder, apply the edits, and run the
stage's graded tests (``Mutant.marker``) on that copy with ``pytest.main`` (``-x``: the first failure is
enough), the test named in first_failures.json first and alone, then the other cases of its test
function, then the whole file, until one fails (``--write-hints`` regrades every
given mutant on its whole test file and records which test caught it first; ``--update-hints`` grades as
the check does and records the test that caught each mutant, at a check's cost; without IDs, either grades
every mutant this machine runs but those graded in a process of their own). Each copy imports under
its own package name (common.impl), so one process
can grade many mutants without reloading torch and triton every time. With ``--claims DIR``
several such processes share one list: each takes the next mutant no other has claimed (an
empty file per mutant in DIR, named by a hash of its id, created exclusively), so a slow stage does not leave one
process working while the other waits.
"""
from __future__ import annotations

import hashlib
import json
import os
import resource
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


#: The test that caught each mutant first when the hints were last written (``--write-hints``): it runs
#: first, alone, and only if it passes do the other cases of its test function and then the whole file
#: run (_targets: a mutant caught by the last test of a slow file costs one test, not the file). A stale
#: hint costs time, never a wrong verdict.
HINTS = Path(__file__).with_name("first_failures.json")


def _targets(path: str, hinted: str | None) -> list[str]:
    """What to run, in turn, until a test fails: the hinted test alone; where its id no longer names a test
    or it passes (a test's parameters renamed, a stale hint), every case of the same test function; then
    the whole file."""
    if not hinted:
        return [path]
    function = hinted.split("[")[0]
    return [f"{path}::{hinted}"] + ([f"{path}::{function}"] if function != hinted else []) + [path]


def _grade_with_pytest(target: str, sub: Path, marker: str) -> tuple[_Outcome, int]:
    # no:unraisableexception: that plugin ends every session with a full gc.collect(), twice, which in this
    # long-lived process (torch, triton, every mutant graded so far) took 0.3 s each, over half of a mutant
    # caught by one quick test; what it reports (exceptions in __del__) is a warning, never a failure here.
    out = _Outcome()
    code = pytest.main([target, "--impl", str(sub), "-m", marker, "-x", "-q", "--tb=no", "--no-header",
                        "-p", "no:cacheprovider", "-p", "no:unraisableexception"], plugins=[out])
    return out, int(code)


def cpu_seconds() -> float:
    """User and system CPU time of this process and of its children that ended (the wall time of a mutant
    says little on a machine shared with other work)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run(ids: list[str], claims: Path | None = None, hints: bool = True) -> dict[str, dict]:
    wanted = {m.id: m for m in all_mutants()}
    known = json.loads(HINTS.read_text()) if hints and HINTS.exists() else {}
    results = {}
    for mid in ids:
        if not _claim(claims, mid):
            continue
        m = wanted[mid]
        t0, c0 = time.perf_counter(), cpu_seconds()
        with tempfile.TemporaryDirectory() as tmp:
            try:
                sub = apply(m, Path(tmp) / "mutant")
            except ValueError as e:
                results[mid] = {"caught": False, "error": str(e)}
                continue
            path = str(REPO / "tests" / m.test_file)
            hinted = known.get(mid)
            out, code = None, 0
            for target in _targets(path, hinted):
                out, code = _grade_with_pytest(target, sub, m.marker)
                if out.failed:
                    break
            results[mid] = {"caught": bool(out.failed), "exit": code, "first_failure": out.failed[:1],
                            "message": out.message, "seconds": round(time.perf_counter() - t0, 1),
                            "cpu": round(cpu_seconds() - c0, 1),
                            "hint_used": bool(hinted and out.failed and out.failed[0] == hinted)}
        print(f"{mid}: {'caught' if results[mid]['caught'] else 'NOT CAUGHT'} in {results[mid]['seconds']} s "
              f"({results[mid]['cpu']} s of CPU)",
              file=sys.stderr, flush=True)
    return results


if __name__ == "__main__":
    args = sys.argv[2:]
    claims, write_hints, update_hints = None, False, False
    if args[:1] == ["--write-hints"]:           # grade every mutant on the whole file, record its first failure
        write_hints, args = True, args[1:]
    elif args[:1] == ["--update-hints"]:        # grade as the check does, record the test that caught it
        update_hints, args = True, args[1:]     # where that is not its hint (a stale one): a check's cost
    if args[:1] == ["--claims"]:
        claims, args = Path(args[1]), args[2:]
    if not args and (write_hints or update_hints):     # every mutant this machine grades that shares a process
        from common import HAS_CUDA
        args = [m.id for m in all_mutants() if (HAS_CUDA or not m.gpu) and not m.isolated]
    found = run(args, claims, hints=not write_hints)
    Path(sys.argv[1]).write_text(json.dumps(found, indent=1))
    if write_hints or update_hints:
        hints = json.loads(HINTS.read_text()) if HINTS.exists() else {}
        hints.update({mid: r["first_failure"][0] for mid, r in found.items() if r.get("first_failure")})
        HINTS.write_text(json.dumps(dict(sorted(hints.items())), indent=1) + "\n")
