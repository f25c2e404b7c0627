"""The stages' benchmarks, on any tree: one per stage, written once in ``solutions/``.

    python -m common.course.bench a06 --quick                   # your work in assignments/ (COURSE_IMPL if set)
    python -m common.course.bench a06 --impl solutions          # the reference
    python -m common.course.bench a07c --impl path/to/submission
    make bench STAGE=a06 [IMPL=solutions] [ARGS="--quick"]

Options after the stage go to the stage's bench (``python -m common.course.bench a06 --help`` lists
them). Stages 1-3 share one bench (the Linear track), so do stages 4 and 5 (the GELU).
Benchmarks need a CUDA GPU; the H100's numbers are in ``lectures/results/``.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from common.impl import add_impl_argument

def benches() -> dict[str, str]:
    """stage -> the benchmark module under solutions/ (its main(argv) takes --impl): each stage's
    ``BENCHES`` (its spec module, solutions/aNN_name/stage.py, found by common.course.stages)."""
    from common.course.stages import STAGE_MODULES
    return {k: v for m in STAGE_MODULES for k, v in getattr(m, "BENCHES", {}).items()}


def __getattr__(name: str):
    if name == "BENCHES":                      # benches() as a table
        return benches()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main(argv: list[str] | None = None) -> int:
    from common.impl import StageError, stage_key
    argv = list(sys.argv[1:] if argv is None else argv)
    table = benches()
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + f"\n\nstages: {' '.join(table)}", file=sys.stderr)
        return 0 if argv else 2
    try:
        stage, rest = stage_key(argv[0], list(table)), argv[1:]     # a03, 3, 03 or a03_fused_linear
    except StageError as e:
        print(f"python -m common.course.bench: stage {e}", file=sys.stderr)
        return 2
    ap = argparse.ArgumentParser(add_help=False)
    add_impl_argument(ap)                          # COURSE_IMPL, else assignments
    args, rest = ap.parse_known_args(rest)
    rest = ["--impl", args.impl, *rest]
    module = importlib.import_module(f"solutions.{table[stage]}")
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
