"""README.md's results list is the one computed from lectures/results/, and the handouts' figures are
the ones their results files hold (not graded).

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


def test_table_has_an_item_per_track_and_computes_the_floors():
    items = [ln for ln in results_table.table().splitlines() if ln.startswith("- **")]
    assert [ln[4:ln.index("**", 4)] for ln in items] == [
        "1-3 Linear (GPT-2 shapes)", "4-5 GELU, 2^26 elements", "6 matmul, 4096³",
        "6 matmul, real shapes (GPT-2 small-XL, 512-16k tokens, decode, unaligned)",
        "7 flash attention, S=4096", "7 flash attention, real shapes", "7c flash attention forward, Hopper CUDA",
        "8 GPT-2 inference (small, medium; bf16; prompts 128/960; batch 1/8/64)",
        "8 decode at the memory wall (bf16, batch 1, prompt 100)"]
    floors = [" ".join(item.split("  - floor: ", 1)[1].split()) for item in results_table.table().split("\n- ")[1:]]
    assert len(floors) == len(items)
    assert all(f.split(": ", 1)[-1].startswith(("met", "**not met**")) for f in floors), floors
    for item in results_table.table().split("\n- ")[1:]:        # every item cites its results file
        assert "](lectures/results/" in item.split("\n  - ")[0], item[:100]


def test_readme_lines_fit_120_characters():
    """The README reads in a terminal and a diff: no line over 120 characters (the results are a
    wrapped list, not a table, for that)."""
    long = [(i, len(ln)) for i, ln in enumerate((REPO / "README.md").read_text().splitlines(), 1) if len(ln) > 120]
    assert not long, f"README.md lines over 120 characters (line, length): {long}"
    assert max(len(ln) for ln in results_table.table().splitlines()) <= results_table.WIDTH == 120


# --- figures in the handouts and the README, read from the results file they cite ---------------

def test_marked_figures_agree_with_their_results_files():
    """``1.078x<!-- fig a01_a03_linear.csv vs_F_linear ... -->``: the text before each marker is what the
    file gives (python lectures/_tools/results_table.py --check)."""
    files = results_table.marked_files()
    marked = [f for f in files if "<!-- fig " in f.read_text()]
    for stage in ("a03_fused_linear", "a06_matmul", "a07_flash_attention"):
        assert REPO / "assignments" / stage / "README.md" in marked, stage
    assert results_table.check_figures(files) == []


def test_a_figure_that_disagrees_is_named(tmp_path):
    md = tmp_path / "README.md"
    md.write_text("the round trip takes 726x<!-- fig a01_a03_linear.csv roundtrip_bf16 --> F.linear's time\n"
                  "1.078x<!-- fig a01_a03_linear.csv vs_F_linear dtype=float32 tokens=1024 shape=768->3072 "
                  '"layer=addmm, W^T contiguous copy" fmt=.3f unit=x -->\n'
                  "5.5%<!-- fig a01_a03_linear.csv no_such_column -->\n")
    problems = results_table.check_figures([md])
    assert len(problems) == 2, problems
    assert "'726x'" in problems[0] and "'735x'" in problems[0] and ":1:" in problems[0]
    assert "bad marker" in problems[1] and ":3:" in problems[1]


def _agrees(written: str, value: float) -> bool:
    """'0.132 ms' / '14.6 µs' / '1.004x' / '404 ms' agrees with ``value`` (ms, or a ratio) at its own precision."""
    num, _, unit = written.strip().partition(" ")
    num = num.rstrip("x")
    v = value * 1000 if unit.startswith("µs") else value
    places = len(num.split(".")[1]) if "." in num else 0
    return f"{v:.{places}f}" == num


def test_a03_handout_table_is_the_results_file():
    """Each cell of a03's reference table is the value of lectures/results/a01_a03_linear.csv."""
    import csv
    with open(REPO / "lectures" / "results" / "a01_a03_linear.csv", newline="") as f:
        rows = {(r["dtype"], r["tokens"], r["shape"], r["layer"]): r for r in csv.DictReader(f)}
    text = (REPO / "assignments" / "a03_fused_linear" / "README.md").read_text()
    lines = [ln for ln in text.splitlines() if ln.startswith(("| fp32 |", "| bf16 |"))]
    assert len(lines) == 6, lines
    dtypes = {"fp32": "float32", "bf16": "bfloat16"}
    for ln in lines:
        dt, tokens, shape, flin, addmm, triton, roundtrip = [c.strip() for c in ln.strip("|").split("|")]
        key = (dtypes[dt], tokens, shape.replace("→", "->"))
        assert _agrees(flin, float(rows[(*key, "F.linear")]["ms"])), (ln, flin)
        for cell, layer in ((addmm, "FusedLinear(addmm)"), (triton, "FusedLinear(triton)")):
            eager, graph = cell.split(" / ")
            assert _agrees(eager, float(rows[(*key, layer)]["vs_F_linear"])), (ln, layer, eager)
            assert _agrees(graph, float(rows[(*key, layer)]["graph_vs_F_linear"])), (ln, layer, graph)
        rt = roundtrip.split(",")[0].split(" (")[0]
        assert _agrees(rt, float(rows[(*key, "RoundTripLinear")]["ms"])), (ln, rt)


def test_check_mode_fails_on_a_hand_edit(tmp_path, monkeypatch):
    readme = tmp_path / "README.md"
    readme.write_text((REPO / "README.md").read_text().replace("of cuBLAS bf16", "of cuBLAS bf16 (edited)", 1))
    assert "(edited)" in readme.read_text()
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


def test_a04_a05_handout_tables_are_the_results_file():
    """The reference table of stages 4 and 5 (n = 2^26) is lectures/results/a04_a05_gelu.csv, cell by cell."""
    import csv
    import math
    with open(REPO / "lectures" / "results" / "a04_a05_gelu.csv", newline="") as f:
        rows = {(r["dtype"], r["impl"]): r for r in csv.DictReader(f) if r["n"] == str(1 << 26)}
    for stage in ("a04_cuda_gelu", "a05_triton_gelu"):
        text = (REPO / "assignments" / stage / "README.md").read_text()
        lines = [ln for ln in text.splitlines() if ln.startswith(("| fp32 | ", "| bf16 | ")) and ln.count("|") == 8]
        assert len(lines) == 14, (stage, lines)
        for ln in lines:
            dtype, op, ms, gbps, of_copy, vs, _kernels = [c.strip() for c in ln.strip("|").split("|")]
            r = rows[(dtype, op)]
            vs_ref = float(r["vs_F.gelu"])
            assert ms == f"{float(r['ms']):.4f}", (stage, ln, "ms")
            assert gbps == f"{float(r['GBps']):.0f}", (stage, ln, "GB/s")
            assert of_copy == f"{100 * float(r['of_copy']):.1f}%", (stage, ln, "of copy")
            assert vs == ("-" if math.isnan(vs_ref) else f"{vs_ref:.3f}x"), (stage, ln, "vs F.gelu")
