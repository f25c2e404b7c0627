"""README.md's results table is the one computed from lectures/results/ (not graded).

    python lectures/_tools/results_table.py --write      # after committing new results
"""
from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "lectures" / "_tools"))
import results_table  # noqa: E402


def test_readme_table_is_generated_from_results():
    readme = (REPO / "README.md").read_text()
    old = results_table.readme_table(readme)
    assert old, "README.md lost its generated results table (the results-table markers)"
    assert old == results_table.table(), (
        "README.md's results table differs from lectures/results/; run: python lectures/_tools/results_table.py --write")


def test_table_has_a_row_per_track_and_computes_the_floors():
    rows = [ln for ln in results_table.table().splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert [r.split(" | ")[0] for r in rows] == ["| 1-3 Linear (GPT-2 shapes)", "| 4-5 GELU, 2^26 elements",
                                                 "| 6 matmul, 4096³",
                                                 "| 6 matmul, real shapes (GPT-2 small-XL, 512-16k tokens, decode, unaligned)",
                                                 "| 7 flash attention, S=4096", "| 7 flash attention, real shapes",
                                                 "| 7c flash attention forward, Hopper CUDA",
                                                 "| 8 GPT-2 inference (small, medium; bf16; prompts 128/960; batch 1/8/64)",
                                                 "| 8 decode at the memory wall (bf16, batch 1, prompt 100)"]
    floors = [r.rstrip(" |").split(" | ")[-1] for r in rows]
    assert all(f.split(": ", 1)[-1].startswith(("met", "**not met**")) for f in floors), floors


def test_check_mode_fails_on_a_hand_edit(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text((REPO / "README.md").read_text().replace("of cuBLAS bf16", "of cuBLAS bf16 (edited)", 1))
    monkeypatch.setattr(results_table, "README", readme)
    assert results_table.main(["--check"]) == 1
    assert results_table.main(["--write"]) == 0
    assert results_table.main(["--check"]) == 0


# --- lectures/results/ holds what the course cites, and lectures/ no code outside _tools/ -------

CODE = {".py", ".sh", ".cu", ".cuh", ".cpp", ".c", ".h"}
TEXT = {".md", ".py", ".ipynb", ".sh", ".txt", ".toml", ".cu", ".cuh", ".cpp", ".h", ".log", ".json", ".yml", ".csv"}


def _tracked() -> list[Path]:
    import subprocess
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
        files = [REPO / p for p in out.decode().split("\0") if p]
    except (OSError, subprocess.CalledProcessError):     # a copy without .git
        files = [p for p in REPO.rglob("*") if p.is_file() and ".git" not in p.parts and ".venv" not in p.parts]
    return [p for p in files if p.is_file()]


def test_no_code_in_lectures_outside_tools():
    lectures = REPO / "lectures"
    code = [str(p.relative_to(REPO)) for p in _tracked()
            if p.is_relative_to(lectures) and not p.is_relative_to(lectures / "_tools") and p.suffix in CODE]
    assert not code, f"code in lectures/ outside lectures/_tools/ (GPU scripts go to lectures/_tools/gpu/): {code}"


def test_every_file_in_results_is_cited():
    """Each file under lectures/results/ is named by another file of the course: by its path under
    lectures/results/ (``a07c/bench.log``), or, at the top level or from its own folder, by its name.
    What nothing cites is an old run: git history keeps it (EXPERIMENTS.md says where)."""
    results = REPO / "lectures" / "results"
    tracked = _tracked()
    # not citations: the regenerating tool's map and this test
    skip = {REPO / "lectures" / "_tools" / "results.py", Path(__file__).resolve()}
    texts = {p: p.read_text(errors="replace") for p in tracked
             if (p.suffix in TEXT or p.name == "Makefile") and p.stat().st_size < 5_000_000 and p not in skip}
    uncited = []
    for f in (p for p in tracked if p.is_relative_to(results)):
        rel = f.relative_to(results).as_posix()
        top = "/" not in rel
        if not any(g != f and (rel in t or ((top or g.parent == f.parent) and f.name in t))
                   for g, t in texts.items()):
            uncited.append(rel)
    assert not uncited, f"files in lectures/results/ that nothing cites (remove them, or cite them): {uncited}"
