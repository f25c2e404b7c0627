"""Regenerate the committed tables, CSVs and plots of ``lectures/results/`` on a GPU.

    python -m lectures._tools.results --stage a06            # every run behind stage 6's files
    python -m lectures._tools.results --stage a07 --dry-run  # print the commands, run nothing
    python -m lectures._tools.results --list                 # which run makes which file
    make results STAGE=a06

Each run is a stage's GPU script (``solutions/aNN_name/run.sh``, named with the files it makes by the
stage's ``results_runs()`` in its stage.py) or a shared one in ``lectures/_tools/gpu/`` (``bash <script> [mode]``, from
the repository root, each under 10 minutes on an H100), with ``OUT`` set to a fresh folder;
the files of ``lectures/results/`` it makes are then copied there (and only those: logs and
anything else the script writes stay in ``OUT``). Review ``git diff lectures/results`` and
``python lectures/_tools/results_table.py --write`` (README's table) before committing.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "lectures" / "results"
GPU = Path("lectures") / "_tools" / "gpu"


@dataclass(frozen=True)
class Run:
    """One device call: ``env bash <script> <args>`` with OUT=<folder>; ``script`` from the repository root
    (a stage's ``solutions/aNN_name/run.sh``, or a shared one in lectures/_tools/gpu/)."""
    script: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    #: name under OUT -> path under lectures/results (made by this run)
    files: dict[str, str] = field(default_factory=dict)

    def command(self) -> str:
        env = " ".join(f"{k}={v!r}" if " " in v else f"{k}={v}" for k, v in self.env.items())
        return " ".join(filter(None, [env, "bash", self.script, *self.args]))


def _same(*names: str) -> dict[str, str]:
    return {n: n for n in names}


SWEEP = Run(str(GPU / "sweep_run.sh"), files=_same(
    "a06_matmul_real_shapes.md", "a06_matmul_real_shapes.csv", "a06_matmul_real_shapes.png",
    "a07_real_shapes.md", "a07_real_shapes.csv", "a07_real_shapes.png"))
GAPS = Run(str(GPU / "gaps_ncu.sh"), files=_same("gaps_ncu.md"))


def ncu(stage: str) -> Run:
    return Run(str(GPU / "ncu_run.sh"), env={"STAGES": stage}, files=_same(f"ncu_{stage}.txt"))


def runs() -> dict[str, list[Run]]:
    """stage -> the runs behind its files in lectures/results/: each stage's ``results_runs()`` (its spec
    module, solutions/aNN_name/stage.py, found by common.course.stages), keyed as it says."""
    from common.course.stages import STAGE_MODULES
    return {k: v for m in STAGE_MODULES if hasattr(m, "results_runs") for k, v in m.results_runs().items()}


def run(r: Run, dry_run: bool = False) -> list[str]:
    """Run one script into a fresh OUT, copy the files it made into lectures/results/; the copied ones."""
    print(f"[results] {r.command()}", flush=True)
    if dry_run:
        return []
    out = Path(tempfile.mkdtemp(prefix="results_"))
    subprocess.run(["bash", r.script, *r.args], cwd=REPO, env={**os.environ, **r.env, "OUT": str(out)})
    copied = []
    for name, dest in r.files.items():
        found = [p for p in (out / name, *out.glob(f"*/{name}")) if p.is_file()]
        if found:
            (RESULTS / dest).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(found[0], RESULTS / dest)
            copied.append(dest)
        else:
            print(f"[results] {name}: not made by this run (logs in {out})", flush=True)
    return copied


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lectures._tools.results", description=__doc__.split("\n\n")[0])
    table = runs()
    ap.add_argument("--stage", action="append", choices=sorted(table), help="repeat for several (default: all)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--list", action="store_true", help="which run makes which file of lectures/results/")
    args = ap.parse_args(argv)
    stages = args.stage or sorted(table)
    if args.list:
        for s in stages:
            for r in table[s]:
                print(f"{s:5s} {r.command():55s} {' '.join(r.files.values())}")
        return 0
    done: list[Run] = []
    for s in stages:
        for r in table[s]:
            if r not in done:
                done.append(r)
                for dest in run(r, args.dry_run):
                    print(f"[results] wrote lectures/results/{dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
