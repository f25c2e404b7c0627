"""The grade's renderings: the table, the JSON report, Gradescope's results.json, the plots.

:class:`StageResult` is one stage's row; its fields are the keys of each stage in the JSON
report (``--json``, ``--json-out``; committed examples: ``lectures/results/grader/README.md``).
"""
from __future__ import annotations

import shutil
import textwrap
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .result import WorkerResult
from .score import CORRECT_POINTS, SCORE_DECIMALS, UNGRADED


@dataclass
class StageResult(WorkerResult):
    """One stage's row: the worker's findings (:class:`~.result.WorkerResult`'s fields; ``correctness``
    and ``message`` here also count the tests: pass | partial (trials passed, a test failed) | fail |
    pass on CPU | partial on CPU (some graded tests need a GPU) | ungraded (its work runs on a GPU only,
    graded on a CPU: 0 / 0)), the stage's tests and its score."""
    stage: str
    title: str
    tests_passed: int = 0
    tests_failed: int = 0
    tests_skipped: int = 0
    score: float = 0.0
    max_score: float = CORRECT_POINTS
    seconds: float = 0.0
    #: stages taken from solutions/ where this one imports them (``--borrow``): it ran on those
    borrowed: list = field(default_factory=list)


TIMING_COLUMNS = ("ms", "baseline ms", "speedup", "achieved", "roofline", "kernels", "H<->D", "eager ms (base)")
#: timing columns given up first when the table is wider than the terminal
DROP_ORDER = ("achieved", "H<->D", "eager ms (base)", "kernels", "baseline ms")
NOT_IMPLEMENTED = "not implemented yet"
#: the widest line of the full notes under the table
NOTES_WIDTH = 100


def ungraded(results: list[StageResult]) -> list[str]:
    """The keys of the stages graded on a CPU whose work runs on a GPU only (0 / 0)."""
    return [r.stage[:3] for r in results if r.correctness == UNGRADED]


def cpu_limited(results: list[StageResult]) -> bool:
    """Whether some stage's maximum shrank to what a CPU could check (score.cpu_share), or is 0 (ungraded)."""
    return any(r.max_score < CORRECT_POINTS for r in results)


def total_line(results: list[StageResult]) -> str:
    """"total 40 / 40", or on a CPU that could not check everything "total 49.78 / 49.78 of what a CPU
    can check; a04 ungraded (needs a GPU)": never a full mark for work that did not run."""
    total = round(sum(r.score for r in results), SCORE_DECIMALS)
    top = round(sum(r.max_score for r in results), SCORE_DECIMALS)
    line = f"total {total:g} / {top:g}"
    skipped = ungraded(results)
    if skipped or cpu_limited(results):
        line += " of what a CPU can check"
        if skipped:
            line += f"; {', '.join(skipped)} ungraded (needs a GPU)"
    return line


def _tol(tolerance: float | None) -> str:
    """A trial's tolerance as the report shows it: 1e-05, or "exact" for a copy compared bit for bit (0)."""
    return "-" if tolerance is None else "exact" if tolerance == 0 else f"{tolerance:.0e}"


def _notes(r: StageResult, timed: bool) -> tuple[str, str]:
    """(short note for the table's notes column, the full note)."""
    if r.borrowed:
        lent = f"ran on {', '.join(r.borrowed)} borrowed from solutions/"
        short, full = _notes(StageResult(**{**asdict(r), "borrowed": []}), timed)
        return lent + (f"; {short}" if short else ""), lent + (f"; {full}" if full else "")
    if r.violations:
        full = "; ".join(r.violations + ([r.message] if r.message else []))
        return full, full
    if r.not_implemented and r.score == 0:
        return NOT_IMPLEMENTED, f"{NOT_IMPLEMENTED}: {'; '.join(r.not_implemented[:3])}"
    full = "; ".join(x for x in ([f"{NOT_IMPLEMENTED}: {r.not_implemented[0]}"] if r.not_implemented else [])
                     + [r.message, r.perf_note if timed and r.ms is None else ""] if x)
    return full, full


def _tol(tol: float | None) -> str:
    """A trial's tolerance as the report shows it: 1e-02, or "exact" (integers, tokens: 0 allowed)."""
    return "exact" if not tol else f"{tol:.0e}"


def table(results: list[StageResult], impl: str, gpu: str, width: int | None = None) -> str:
    """The grade as a table, as wide as the terminal allows. Without any timing (a CPU-only
    machine) the timing columns are left out and a line under the table says why."""
    width = width or shutil.get_terminal_size((120, 24)).columns
    timed = any(r.ms is not None for r in results)
    head = ["stage", "correct", "tests p/f/s", "trials", "worst err (tol)", *TIMING_COLUMNS, "score", "notes"]
    rows, fulls = [], []
    for r in results:
        err = "-" if r.worst_error is None else f"{r.worst_error:.1e} ({_tol(r.tolerance)})"
        if r.ms is None:
            perf = ["-"] * len(TIMING_COLUMNS)
        else:
            rate = (f"{r.bytes / r.ms / 1e6:.0f} GB/s" if r.bound == "memory" else f"{r.flops / r.ms / 1e9:.0f} TFLOP/s") \
                if r.flops and r.bytes else "-"
            perf = [f"{r.ms:.3f}", f"{r.baseline_ms:.3f}", f"{r.speedup:.2f}x", rate,
                    f"{100 * r.roofline_fraction:.0f}% {r.bound[:3]}", str(r.kernels_per_call),
                    str(r.host_transfers_per_call),
                    "-" if r.eager_ms is None else f"{r.eager_ms:.3f} ({r.baseline_eager_ms:.3f})"]
        short, full = _notes(r, timed)
        points = "-" if r.correctness == UNGRADED else f"{r.score:g}/{r.max_score:g}"
        rows.append([r.stage, r.correctness, f"{r.tests_passed}/{r.tests_failed}/{r.tests_skipped}",
                     f"{r.trials_passed}/{r.trials_total}", err, *perf, points, short])
        fulls.append(full)
    keep = [h for h in head if timed or h not in TIMING_COLUMNS]

    def widths(cols):
        return [max(len(h), *(len(row[head.index(h)]) for row in rows)) for h in cols]
    min_notes = len(NOT_IMPLEMENTED)
    for col in DROP_ORDER:       # too wide even with a short notes column: drop the least telling columns
        if sum(widths(keep[:-1])) + 2 * (len(keep) - 1) + min_notes <= width or col not in keep:
            continue
        keep.remove(col)
    ws = widths(keep)
    room = max(min_notes, width - sum(ws[:-1]) - 2 * (len(keep) - 1))
    ws[-1] = min(ws[-1], room)
    cut = []
    for row, full in zip(rows, fulls):
        n = row[-1]
        if len(n) > ws[-1]:
            row[-1] = n[:ws[-1] - 3] + "..."
        if full and full != row[-1]:
            cut.append(row[0])
    if not any(row[-1] for row in rows):     # nothing to note: no empty column
        keep, ws = keep[:-1], ws[:-1]
    pick = [head.index(h) for h in keep]
    out = [f"impl: {impl}    GPU: {gpu}", "  ".join(h.ljust(w) for h, w in zip(keep, ws)).rstrip(),
           "  ".join("-" * w for w in ws)]
    out += ["  ".join(row[i].ljust(w) for i, w in zip(pick, ws)).rstrip() for row in rows]
    out.append(total_line(results))
    if not timed:
        out.append("timing needs a GPU: no times or speedups here; scores count correctness only" if not any(r.max_score > CORRECT_POINTS for r in results) else
                   "no stage was timed: see the notes")
    notes = [textwrap.fill(full, min(width, NOTES_WIDTH), initial_indent=f"  {r.stage}: ", subsequent_indent="    ",
                           break_long_words=False, break_on_hyphens=False)
             for r, full in zip(results, fulls) if r.stage in cut]
    if notes:
        out += ["", "notes:", *notes]
    return "\n".join(out)


def gradescope(results: list[StageResult], seconds: float) -> dict:
    """Gradescope autograder results.json (https://gradescope-autograders.readthedocs.io)."""
    tests = []
    for r in results:
        lines = [f"correctness: {r.correctness}", f"tests passed/failed/skipped: {r.tests_passed}/{r.tests_failed}/{r.tests_skipped}",
                 f"trials passed: {r.trials_passed}/{r.trials_total}"]
        if r.worst_error is not None:
            lines.append(f"worst relative error {r.worst_error:.2e} (tolerance {_tol(r.tolerance)})")
        if r.ms is not None and len(r.cases) > 1:
            lines.append(f"speed: {r.speedup:.2f}x {r.baseline}, the geometric mean over {len(r.cases)} shapes:")
            lines += [f"  {c['label']}: {c['ms']:.4f} ms vs {c['baseline_ms']:.4f} ms ({c['speedup']:.2f}x), "
                      f"{100 * c['roofline_fraction']:.0f}% of the {c['bound']} roofline" for c in r.cases]
        if r.eager_ms is not None:
            lines.append(f"called eagerly (not scored: host work included): {r.eager_ms:.4f} ms per call vs "
                         f"{r.baseline_eager_ms:.4f} ms for {r.baseline}")
        elif r.ms is not None:
            lines.append(f"{r.perf_label}: {r.ms:.4f} ms vs {r.baseline} {r.baseline_ms:.4f} ms "
                         f"({r.speedup:.2f}x), {100 * r.roofline_fraction:.0f}% of the {r.bound} roofline")
        elif r.perf_note:
            lines.append(f"performance: {r.perf_note}")
        lines += r.violations + ([r.message] if r.message else [])
        if r.borrowed:
            lines.append(f"ran on {', '.join(r.borrowed)} borrowed from solutions/ (--borrow): graded as such")
        name = f"{r.stage}: {r.title}"
        if r.correctness == UNGRADED:       # nothing of it ran here: no points, none to earn, never "passed"
            name += " (ungraded: needs a GPU)"
        tests.append({"name": name, "score": r.score, "max_score": r.max_score,
                      "status": "passed" if r.score == r.max_score and r.correctness != UNGRADED else "failed",
                      "output": "\n".join(lines), "visibility": "visible"})
    board = [{"name": f"{r.stage} speedup", "value": round(r.speedup, 3)} for r in results if r.speedup is not None]
    return {"score": round(sum(r.score for r in results), SCORE_DECIMALS), "execution_time": round(seconds),
            "output": "Per-stage grade against PyTorch; see each test's output." + (
                f" Graded without a GPU: {total_line(results)}; work that only a GPU can run earns no points here."
                if cpu_limited(results) else ""),
            "visibility": "visible",
            "stdout_visibility": "visible", "tests": tests, "leaderboard": board}


def plots(results: list[StageResult], folder: Path) -> list[Path]:
    """speedup.png (per stage) and roofline.png (each stage's point), when GPU numbers exist."""
    timed = [r for r in results if r.ms is not None]
    if not timed:
        return []
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    folder.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar([r.stage[:3] for r in timed], [r.speedup for r in timed], color="tab:blue")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_ylabel("speed vs PyTorch baseline (x)")
    ax.set_title("Speedup per stage")
    fig.tight_layout()
    fig.savefig(folder / "speedup.png", dpi=120)
    plt.close(fig)
    import numpy as np
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    ceil = next((r.ceilings for r in timed if r.ceilings), None)
    if ceil:
        gbps, tflops = ceil["gbps"], ceil["tflops"]
        x = np.logspace(-1, 4, 200)
        ax.loglog(x, np.minimum(tflops, x * gbps / 1e3), "k-", lw=1.5,
                  label=f"roofline ({gbps:.0f} GB/s, {tflops:.0f} TFLOP/s, measured)")
    for r in timed:
        ax.loglog([r.flops / r.bytes], [r.flops / r.ms / 1e9], "o", label=r.stage[:3])
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("TFLOP/s")
    ax.legend(fontsize=8)
    ax.set_title("Each stage on the roofline")
    fig.tight_layout()
    fig.savefig(folder / "roofline.png", dpi=120)
    plt.close(fig)
    return [folder / "speedup.png", folder / "roofline.png"]


def report_json(results: list[StageResult], impl: str, gpu: str, seconds: float) -> dict:
    """The JSON report (``--json``, ``--json-out``)."""
    return {"impl": impl, "gpu": gpu, "seconds": round(seconds, 1),
            "total": round(sum(r.score for r in results), SCORE_DECIMALS),
            "max": round(sum(r.max_score for r in results), SCORE_DECIMALS), "ungraded": ungraded(results),
            "stages": [{"stage": r.stage, "title": r.title, **asdict(r)} for r in results]}  # stage and title first
