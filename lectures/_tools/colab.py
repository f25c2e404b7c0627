"""The "Open in Colab" badge and the Colab setup cell of every lecture notebook.

    python lectures/_tools/colab.py --write      # (re)write both cells in lectures/*.ipynb
    python lectures/_tools/colab.py --check      # exit 1 where a notebook's cells differ from these

The repository URL is in ONE place, README.md's ``COURSE_REPOSITORY = "..."`` line (a placeholder
until the course is published): change it there and run ``--write``; ``tests/test_colab.py`` fails
while a notebook's badge or cell does not follow it. Each notebook gets, with fixed cell ids, a
markdown cell first (the badge, linking to the notebook on GitHub through Colab) and a code cell
before its first code cell (on Colab only: clone, ``common.course.colab.setup``; elsewhere nothing). Other
cells, their ids and the notebook metadata are left as they are; outputs stay stripped. Uses only
the json module.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LECTURES = ROOT / "lectures"
BADGE_ID, SETUP_ID = "colab-badge", "colab-setup"
_URL = re.compile(r'COURSE_REPOSITORY = "(https://github\.com/[^"/]+/[^"/]+?)/?"')


def repository(readme: Path = ROOT / "README.md") -> str:
    """The course's GitHub URL, from README.md's ``COURSE_REPOSITORY = "..."`` line."""
    m = _URL.search(readme.read_text())
    if not m:
        raise SystemExit(f'{readme}: no line COURSE_REPOSITORY = "https://github.com/OWNER/REPO"')
    return m.group(1)


def colab_url(repo: str, notebook: str, branch: str = "main") -> str:
    """colab.research.google.com/github/OWNER/REPO/blob/BRANCH/lectures/NOTEBOOK."""
    return f"https://colab.research.google.com/github/{repo.removeprefix('https://github.com/')}/blob/{branch}/lectures/{notebook}"


def badge_cell(repo: str, notebook: str) -> dict:
    return {"cell_type": "markdown", "id": BADGE_ID, "metadata": {},
            "source": [f"[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)]"
                       f"({colab_url(repo, notebook)})"]}


SETUP = '''# Google Colab only (nothing happens elsewhere): clone the course, install it beside Colab's own
# torch and work from its lectures/ folder (common/course/colab.py). Written by lectures/_tools/colab.py.
import sys

if "google.colab" in sys.modules:
    import os
    import subprocess
    from pathlib import Path

    COURSE = Path(os.environ.get("COURSE_DIR", "/content/gpu-kernels-course"))
    if not (COURSE / "common").is_dir():
        url = os.environ.get("COURSE_REPO_URL", "{repo}")
        subprocess.run(["git", "clone", "--depth", "1", url, str(COURSE)], check=True)
    sys.path.insert(0, str(COURSE))
    from common.course.colab import setup

    setup(COURSE)
'''


def setup_cell(repo: str) -> dict:
    lines = SETUP.replace("{repo}", repo).splitlines(keepends=True)
    lines[-1] = lines[-1].rstrip("\n")
    return {"cell_type": "code", "execution_count": None, "id": SETUP_ID, "metadata": {}, "outputs": [],
            "source": lines}


def with_cells(nb: dict, repo: str, notebook: str) -> dict:
    """``nb`` with the badge first and the setup cell before its first code cell (replacing earlier ones)."""
    cells = [c for c in nb["cells"] if c.get("id") not in (BADGE_ID, SETUP_ID)]
    first_code = next(i for i, c in enumerate(cells) if c["cell_type"] == "code")
    cells.insert(first_code, setup_cell(repo))
    cells.insert(0, badge_cell(repo, notebook))
    return {**nb, "cells": cells}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true")
    mode.add_argument("--check", action="store_true")
    a = ap.parse_args(argv)
    repo = repository()
    bad = 0
    for path in sorted(LECTURES.glob("*.ipynb")):
        nb = json.loads(path.read_text())
        want = with_cells(nb, repo, path.name)
        if want == nb:
            continue
        if a.check:
            print(f"{path.relative_to(ROOT)}: the Colab badge or setup cell is missing or does not follow "
                  f"README.md's COURSE_REPOSITORY ({repo}); run python lectures/_tools/colab.py --write")
            bad = 1
        else:
            path.write_text(json.dumps(want, indent=1, ensure_ascii=False) + "\n")
            print(f"wrote {path.relative_to(ROOT)}")
    return bad


if __name__ == "__main__":
    sys.exit(main())
