"""Mutation checks: buggy variants of the reference solutions that the graded tests must catch.

A :class:`Mutant` is a copy of ``solutions/`` with a few exact text edits in one
stage (each ``old`` must occur exactly once, so a mutant cannot silently stop
applying when a solution changes). ``tests/test_mutants.py`` grades each one and
expects at least one graded test of its stage to fail; where ``expect`` is given,
the first failure's message must also contain each of those strings (a bug the
student should be told about in plain words, e.g. the kernel name and "out of bounds").
Where ``grader`` is given, the grader alone (its trials, no tests) must reject the mutant as
well: the grader must never accept what the graded tests reject (cheat.py, precision.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Mutant:
    stage: str
    file: str
    bug: str
    edits: list[tuple[str, str]] = field(default_factory=list)
    gpu: bool = False          # only a GPU run can catch it (CUDA kernels, profiler)
    expect: tuple[str, ...] = ()   # substrings the first failure's message must contain
    #: None: checked with the graded tests only. A tuple: the grader alone (``common.course.grade --no-tests``,
    #: its trials) must reject it too, and its report (violations and message) must contain these.
    grader: tuple[str, ...] | None = None
    #: The test file (in tests/) whose graded tests must catch it; None: test_<stage>.py.
    tests: str | None = None
    #: The pytest marker expression that selects the tests that must catch it: the graded tests, or
    #: for a fault in given code checked by given tests ("given": tests/test_portability.py's
    #: cross-compile of the launch configs) those.
    marker: str = "graded"
    #: Graded in a process of its own: it patches torch or the harness, which would change what the
    #: next mutants graded in a shared process see.
    isolated: bool = False

    @property
    def test_file(self) -> str:
        return self.tests or f"test_{self.stage}.py"

    @property
    def id(self) -> str:
        return f"{self.stage[:3]}-{self.bug.replace(' ', '_')}"


def all_mutants() -> list[Mutant]:
    import importlib
    import pkgutil
    out = []
    for info in pkgutil.iter_modules(__path__):
        if info.name not in ("run", "grade", "zygote"):          # the runners, not mutants
            out += getattr(importlib.import_module(f"{__name__}.{info.name}"), "MUTANTS", [])
    return out
