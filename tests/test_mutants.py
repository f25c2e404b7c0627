"""Mutation checks (not graded): every buggy variant of a solution must fail its
stage's graded tests. Run with ``--impl solutions`` (make test) like the stub check."""
from __future__ import annotations

import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from common import HAS_CUDA
from common.impl import REPO, resolve
from mutants import all_mutants

MUTANTS = all_mutants()


@pytest.mark.parametrize("mutant", MUTANTS, ids=[m.id for m in MUTANTS])
def test_mutant_is_caught(mutant, tmp_path):
    if resolve() != REPO / "solutions":
        pytest.skip("course self-check: runs with --impl solutions (make test)")
    if mutant.gpu and not HAS_CUDA:
        pytest.skip("only a GPU run can catch this mutant")
    sub = tmp_path / "mutant"
    shutil.copytree(REPO / "solutions", sub, ignore=shutil.ignore_patterns("__pycache__"))
    path = sub / mutant.stage / mutant.file
    text = path.read_text()
    for old, new in mutant.edits:
        assert text.count(old) == 1, f"mutant {mutant.id}: {old!r} occurs {text.count(old)} times in {mutant.file}"
        text = text.replace(old, new)
    path.write_text(text)
    xml = tmp_path / "junit.xml"
    r = subprocess.run([sys.executable, "-m", "pytest", str(REPO / "tests" / f"test_{mutant.stage}.py"), "--impl", str(sub),
                        "-m", "graded", "-x", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}"],
                       cwd=REPO, capture_output=True, text=True, timeout=900)
    assert xml.exists(), f"no report for mutant {mutant.id}:\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
    root = ET.parse(xml).getroot()
    failed = [c.get("name") for c in root.iter("testcase") if any(ch.tag in ("failure", "error") for ch in c)]
    assert failed, f"mutant '{mutant.bug}' in {mutant.stage}/{mutant.file} was not caught by any graded test"
