"""README.md's "Results at a glance" table is the one computed from lectures/results/ (not graded).

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
                                                 "| 8 GPT-2 inference (small, medium; bf16; prompts 128/960; batch 1/8/64)"]
    floors = [r.rstrip(" |").split(" | ")[-1] for r in rows]
    assert all(f.split(": ", 1)[-1].startswith(("met", "**not met**")) for f in floors), floors


def test_check_mode_fails_on_a_hand_edit(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text((REPO / "README.md").read_text().replace("of cuBLAS bf16", "of cuBLAS bf16 (edited)", 1))
    monkeypatch.setattr(results_table, "README", readme)
    assert results_table.main(["--check"]) == 1
    assert results_table.main(["--write"]) == 0
    assert results_table.main(["--check"]) == 0
