"""The stages' benchmarks, on any tree: one per stage, written once in ``solutions/``.

    python -m common.bench a06 --quick                   # your work in assignments/ (COURSE_IMPL if set)
    python -m common.bench a06 --impl solutions          # the reference
    python -m common.bench a07c --impl path/to/submission
    make bench STAGE=a06 [IMPL=solutions] [ARGS="--quick"]

Options after the stage go to the stage's bench (``python -m common.bench a06 --help`` lists
them). Stages 1-3 share one bench (the Linear track), so do stages 4 and 5 (the GELU).
Benchmarks need a CUDA GPU; the H100's numbers are in ``lectures/results/``.
"""
from __future__ import annotations

import importlib
import sys

from common.impl import add_impl_argument

#: stage -> the benchmark module under solutions/ (its main(argv) takes --impl)
BENCHES = {
    "a01": "a03_fused_linear.bench", "a02": "a03_fused_linear.bench", "a03": "a03_fused_linear.bench",
    "a04": "a04_cuda_gelu.bench", "a05": "a04_cuda_gelu.bench",
    "a06": "a06_matmul.bench",
    "a07": "a07_flash_attention.bench", "a07c": "a07_flash_attention.bench_hopper",
    "a08": "a08_gpt2_inference.bench",
}


def main(argv: list[str] | None = None) -> int:
    from common.impl import StageError, stage_key
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + f"\n\nstages: {' '.join(BENCHES)}", file=sys.stderr)
        return 0 if argv else 2
    try:
        stage, rest = stage_key(argv[0], list(BENCHES)), argv[1:]     # a03, 3, 03 or a03_fused_linear
    except StageError as e:
        print(f"python -m common.bench: stage {e}", file=sys.stderr)
        return 2
    if not any(a == "--impl" or a.startswith("--impl=") for a in rest):
        import argparse
        ap = argparse.ArgumentParser()
        add_impl_argument(ap)                      # COURSE_IMPL, else assignments
        rest = ["--impl", ap.get_default("impl"), *rest]
    module = importlib.import_module(f"solutions.{BENCHES[stage]}")
    return module.main(rest) or 0


if __name__ == "__main__":
    sys.exit(main())
