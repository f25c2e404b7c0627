"""Regenerate the committed tables, CSVs and plots of ``lectures/results/`` on a GPU.

    python -m lectures._tools.results --stage a06            # every run behind stage 6's files
    python -m lectures._tools.results --stage a07 --dry-run  # print the commands, run nothing
    python -m lectures._tools.results --list                 # which run makes which file
    make results STAGE=a06

Each run is one of the GPU scripts in ``lectures/_tools/gpu/`` (``bash <script> [mode]``, from
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
    """One device call: ``env bash lectures/_tools/gpu/<script> <args>`` with OUT=<folder>."""
    script: str
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    #: name under OUT -> path under lectures/results (made by this run)
    files: dict[str, str] = field(default_factory=dict)

    def command(self) -> str:
        env = " ".join(f"{k}={v!r}" if " " in v else f"{k}={v}" for k, v in self.env.items())
        return " ".join(filter(None, [env, "bash", str(GPU / self.script), *self.args]))


def _same(*names: str) -> dict[str, str]:
    return {n: n for n in names}


LINEAR = Run("linear_run.sh", files=_same("a01_a03_linear.md", "a01_a03_linear.csv"))
GELU = Run("a04_a05_run.sh", env={"SKIP_TESTS": "1"},
           files=_same("a04_a05_gelu.md", "a04_a05_gelu.csv", "a04_a05_gelu.png"))
SWEEP = Run("sweep_run.sh", files=_same(
    "a06_matmul_real_shapes.md", "a06_matmul_real_shapes.csv", "a06_matmul_real_shapes.png",
    "a07_real_shapes.md", "a07_real_shapes.csv", "a07_real_shapes.png"))
GAPS = Run("gaps_ncu.sh", files=_same("gaps_ncu.md"))


def _ncu(stage: str) -> Run:
    return Run("ncu_run.sh", env={"STAGES": stage}, files=_same(f"ncu_{stage}.txt"))


#: stage -> the runs behind its files in lectures/results/
RUNS: dict[str, list[Run]] = {
    "a01": [LINEAR], "a02": [LINEAR],
    "a03": [LINEAR, _ncu("a03")],
    "a04": [GELU], "a05": [GELU, _ncu("a05")],
    "a06": [Run("a06_run.sh", files=_same("a06_matmul.md", "a06_matmul.csv", "a06_matmul_tflops.png",
                                          "a06_matmul_quantization.png")),
            SWEEP, Run("a06_v7_run.sh", files=_same("a06_v7_tiles.md")), _ncu("a06"), GAPS],
    "a07": [Run("a07_run.sh", ("final",), files=_same(
                "a07_flash_attention.md", "a07_flash_attention.csv", "a07_flash_attention_memory.csv",
                "a07_memory.png", "a07_tflops_fwd.png", "a07_flash_attention_tuned.md")),
            Run("a07_run.sh", ("sweep",), files={"sweep.log": "a07_sweep.log"}),
            SWEEP, _ncu("a07"), GAPS],
    "a07c": [Run("a07c_run.sh", files={"a07c_flash_hopper.md": "a07c/a07c_flash_hopper.md",
                                       "a07c_flash_hopper.csv": "a07c/a07c_flash_hopper.csv",
                                       "bench.log": "a07c/bench.log",
                                       "ncu_s4096_d128.txt": "a07c/ncu_s4096_d128.txt"})],
    "a08": [Run("a08_run.sh", ("bench",), files={
                "a08_gpt2_inference.md": "a08_gpt2_inference.md", "a08_gpt2_inference.csv": "a08_gpt2_inference.csv",
                "a08_decode_speedup.png": "a08_decode_speedup.png", "bench.log": "a08_h100_bench.log",
                "a08_profile_small.txt": "a08_profile_small.txt"}),
            Run("a08_run.sh", ("gemv",), files=_same("a08_gemv.md", "a08_gemv.csv", "a08_gemv_sweep.csv")),
            Run("a08_run.sh", ("step",), files=_same("a08_decode_step.md", "a08_decode_step.csv")),
            Run("a08_run.sh", ("tests",), files={"pytest_a08.log": "a08_h100_tests.log"}),
            Run("a08_run.sh", ("profile",), files=_same("a08_decode_profile.md", "a08_decode_timeline.png"))],
}


def run(r: Run, dry_run: bool = False) -> list[str]:
    """Run one script into a fresh OUT, copy the files it made into lectures/results/; the copied ones."""
    print(f"[results] {r.command()}", flush=True)
    if dry_run:
        return []
    out = Path(tempfile.mkdtemp(prefix="results_"))
    subprocess.run(["bash", str(GPU / r.script), *r.args], cwd=REPO, env={**os.environ, **r.env, "OUT": str(out)})
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
    ap.add_argument("--stage", action="append", choices=sorted(RUNS), help="repeat for several (default: all)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--list", action="store_true", help="which run makes which file of lectures/results/")
    args = ap.parse_args(argv)
    stages = args.stage or sorted(RUNS)
    if args.list:
        for s in stages:
            for r in RUNS[s]:
                print(f"{s:5s} {r.command():55s} {' '.join(r.files.values())}")
        return 0
    done: list[Run] = []
    for s in stages:
        for r in RUNS[s]:
            if r not in done:
                done.append(r)
                for dest in run(r, args.dry_run):
                    print(f"[results] wrote lectures/results/{dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
