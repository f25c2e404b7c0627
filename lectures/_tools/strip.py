"""Strip outputs from lecture notebooks before committing them.

    python lectures/_tools/strip.py lectures/*.ipynb          # rewrite in place
    python lectures/_tools/strip.py --check lectures/*.ipynb  # exit 1 if any has outputs

Notebooks in ``lectures/`` are kept without outputs (small diffs, no stale numbers);
executed copies live in ``lectures/rendered/``. Uses only the json module.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

KEEP_NB_META = ("kernelspec", "language_info")


def strip(nb: dict) -> dict:
    nb["metadata"] = {k: v for k, v in nb.get("metadata", {}).items() if k in KEEP_NB_META}
    for cell in nb["cells"]:
        cell["metadata"] = {}
        if cell["cell_type"] == "code":
            cell["outputs"] = []
            cell["execution_count"] = None
    return nb


def dirty(nb: dict) -> list[str]:
    """Why a notebook is not stripped (empty when it is)."""
    why = [f"cell {i}: has outputs or an execution count" for i, c in enumerate(nb["cells"])
           if c["cell_type"] == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    extra = set(nb.get("metadata", {})) - set(KEEP_NB_META)
    if extra:
        why.append(f"notebook metadata {sorted(extra)}")
    return why


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("notebooks", nargs="+", type=Path)
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    bad = 0
    for p in a.notebooks:
        nb = json.loads(p.read_text())
        if a.check:
            for w in dirty(nb):
                print(f"{p}: {w}")
                bad = 1
        else:
            p.write_text(json.dumps(strip(nb), indent=1, ensure_ascii=False) + "\n")
    return bad


if __name__ == "__main__":
    sys.exit(main())
