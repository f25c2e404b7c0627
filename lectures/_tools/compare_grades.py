"""Two grader reports side by side: per stage and per timed shape, the submission's and the
baseline's time and the speedup in each, and how much they moved.

    python lectures/_tools/compare_grades.py before.json after.json [--labels before after]

Both are ``python -m common.course.grade --json-out`` reports of the same implementation (for example the
grader before and after a change of its timing). Prints a markdown table; the last line says the
largest change of a speedup.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def cases(stage: dict) -> list[dict]:
    return stage.get("cases") or ([] if stage.get("ms") is None else [dict(
        label=stage.get("perf_label", ""), ms=stage["ms"], baseline_ms=stage["baseline_ms"], speedup=stage["speedup"])])


def compare(before: dict, after: dict, labels=("before", "after")) -> str:
    a, b = labels
    rows = [f"| stage | shape | {a} ms | {a} baseline ms | {a} speedup | {b} ms | {b} baseline ms | {b} speedup "
            "| speedup change | score |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    old = {s["stage"]: s for s in before["stages"]}
    worst = 0.0
    for s in after["stages"]:
        o = old.get(s["stage"])
        score = f"{o['score']:g}/{o['max_score']:g} -> {s['score']:g}/{s['max_score']:g}" if o else f"{s['score']:g}"
        oc = {c["label"]: c for c in cases(o)} if o else {}
        for c in cases(s) or [{}]:
            p = oc.get(c.get("label"), {})
            if c and p:
                change = c["speedup"] / p["speedup"] - 1
                worst = max(worst, abs(change))
                rows.append(f"| {s['stage']} | {c['label']} | {p['ms']:.4f} | {p['baseline_ms']:.4f} | {p['speedup']:.3f}x "
                            f"| {c['ms']:.4f} | {c['baseline_ms']:.4f} | {c['speedup']:.3f}x | {100 * change:+.1f}% | {score} |")
            else:
                rows.append(f"| {s['stage']} | {c.get('label', 'not timed')} | | | | | | | | {score} |")
    rows.append("")
    rows.append(f"largest change of a per-shape speedup: {100 * worst:.1f}%")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--labels", nargs=2, default=("before", "after"))
    args = ap.parse_args(argv)
    print(compare(json.loads(args.before.read_text()), json.loads(args.after.read_text()), tuple(args.labels)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
