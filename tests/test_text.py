"""The course's text (not graded): measured numbers live in lectures/results/, and the text says
what the course teaches, not how it was made.

* Code (the ``.py`` files of assignments/, solutions/ and common/) states no speed figure: no
  ``1.08x cuBLAS``, ``2.1 TB/s``, ``95% of copy``, ``0.27 ms``. Such numbers go stale with the next
  run; a docstring or comment says what and why, and cites the results file that holds the number.
  common/ is covered too: its docstrings (checks, timing, launch helpers) are what a student reads
  beside the stubs. A target (``>= 0.97x F.gelu``, ``at least 0.8x SDPA``, a floor) is not a
  measurement and may stay.
* Student-facing text (handouts, lectures, results, the ``.py`` files of assignments/ and
  solutions/) cites no issue number and no work session.

Both run on a CPU in well under a second.
"""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _tracked(*roots: str) -> list[Path]:
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--", *roots], cwd=REPO, capture_output=True,
                             check=True).stdout
        files = [REPO / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):     # a copy without .git
        files = [p for r in roots for p in (REPO / r).rglob("*")]
    return sorted(p for p in files if p.is_file() and "__pycache__" not in p.parts)


def _rel(p: Path) -> str:
    return p.relative_to(REPO).as_posix()


# ----------------------------------------------------------------------------- speed figures in code
#: a number or a range of them: 0.88, 0.88-0.99, 0.64x -> 0.74 (the last number carries the unit)
_NUM = r"(?<![\w.])\d+(?:\.\d+)?(?:x?\s*(?:-|–|to|→|->)\s*\d+(?:\.\d+)?)?"
SPEED = re.compile(_NUM + r"""\s*(?:
     x\s+(?:cuBLAS|SDPA|PyTorch|F\.\w+|transformers|torch\.\w+|eager|faster|slower|cheaper)\b
    |\s?%\s+(?:of\s+(?:the\s+)?(?:copy|cuBLAS|SDPA|peak|bandwidth)|faster|slower)\b
    |(?:TB/s|GB/s|TFLOP/s|TFLOPS|GFLOP/s)
    |(?:µs|us|ms)\b
)
|(?<![\w.])\d+\.\d+x?\s*(?:-|–|→|->)\s*\d+\.\d+x\b     # a measured range or change of ratios: 0.88-0.99x
""", re.X)
#: what a target says just before its figure: ">= 0.97x F.gelu", "at least 0.8x SDPA", "floor 0.8x SDPA"
TARGET = re.compile(r"(?:>=|≥|<=|≤|\bat least|\bat most|\bfloor:?)\s*$")


def speed_figures(text: str) -> list[tuple[int, str]]:
    """(line number, figure) of each speed figure in ``text`` that is not a target."""
    found = []
    for i, line in enumerate(text.splitlines(), 1):
        for m in SPEED.finditer(line):
            if not TARGET.search(line[max(0, m.start() - 16):m.start()]):
                found.append((i, m.group(0)))
    return found


CODE = [p for p in _tracked("assignments", "solutions", "common") if p.suffix == ".py"]


def test_the_figure_finder_finds_figures_and_passes_targets():
    bad = ("1.02-1.11x cuBLAS at GPT-2 XL's qkv", "reads at 2.1 TB/s", "(H100: 0.64x -> 0.74x cuBLAS",
           "99.4% of copy", "a forward takes 0.1 ms", "1693 GB/s", "0.95x SDPA (490 TFLOP/s)",
           "costs about 16 µs", "up to 5.5% slower", "11 % faster", "3.4x cheaper", "0.945x F.linear",
           "read the weight at 0.88-0.99x)", "4097^3 0.47x -> 0.78x")
    for s in bad:
        assert speed_figures(s), s
    good = (">= 0.97x F.gelu", "at least 0.8x SDPA's speed", "floor 0.8x SDPA", "≥ 90% of copy",
            "x @ w", "128x64 tiles", "f'{r:.2f}x cuBLAS'", "| a06 GB/s | cuBLAS GB/s |", "sm_90 TMA",
            "timeout_ms", "10 x the fraction", "backward counted as 2.5x forward", "1.5x the PyTorch op")
    for s in good:
        assert not speed_figures(s), s


@pytest.mark.parametrize("path", CODE, ids=_rel)
def test_no_speed_figure_in_code(path):
    """A docstring or comment says what and why; the measured number is in lectures/results/, cited by file."""
    found = speed_figures(path.read_text(errors="replace"))
    assert not found, (
        f"{_rel(path)} states measured speed figures (move them to lectures/results/ and cite the file): "
        + "; ".join(f"line {i}: {s!r}" for i, s in found))


# ----------------------------------------------------------------------------- history in the text
#: "issue #28", "issue 12", "PR #5", a bare "#28" (not a colour, not an anchor), "the eleventh session"
HISTORY = re.compile(r"""\b(?:issues?|pull\ request)(?:\s+\#?|\s*\#)\d+\b|\b(?-i:PR)\s*\#\d+\b
                        |(?<![\w&\#/"'])\#\d{1,2}\b(?![\w-])
                        |\bsessions?\b""", re.X | re.I)
#: "session" as pytest and Python mean it
NOT_HISTORY = re.compile(r"""(?:test|pytest)\ sessions?|scope=["']session|sessions?_?start|["']session["']""",
                         re.I | re.X)
STUDENT_TEXT = [p for p in _tracked("assignments", "solutions", "common", "lectures", "README.md", "INSTRUCTORS.md",
                                     "AUTHORING.md")
                if p.suffix in (".md", ".ipynb", ".py", ".sh", ".cu", ".cuh", ".cpp", ".h")]


def history(text: str) -> list[tuple[int, str]]:
    """(line number, phrase) of each issue number or work session ``text`` cites."""
    found = []
    for i, line in enumerate(text.splitlines(), 1):
        rest = NOT_HISTORY.sub("", line)
        found += [(i, m.group(0)) for m in HISTORY.finditer(rest)]
    return found


def test_the_history_finder():
    for s in ("decode changes of issue #28", "Issue 12's floors", "(#28; commit", "the eleventh session",
              "before this session's changes", "a GPU session can"):
        assert history(s), s
    for s in ("the consumer issues its GEMMs", "the test session's fixtures", 'scope="session"', "color #333",
              "a07c (#1f77b4)", "README.md#the-grader", "sm_90 has 132 SMs"):
        assert not history(s), s


@pytest.mark.parametrize("path", STUDENT_TEXT, ids=_rel)
def test_no_issue_number_or_session_in_the_text(path):
    """Handouts, lectures, results and code say what the course teaches, not how it was made
    (EXPERIMENTS.md may cite commits)."""
    found = history(path.read_text(errors="replace"))
    assert not found, (f"{_rel(path)} cites the project's history (say what the course teaches instead): "
                       + "; ".join(f"line {i}: {s!r}" for i, s in found))
