"""Benchmark stage 5 (with stage 4): one run times both ops against PyTorch.

    python -m solutions.a05_triton_gelu.bench [--quick] [--out DIR] [--impl X]
    python -m assignments.a05_triton_gelu.bench [--quick] [--out DIR]   # your work

Same as ``python -m solutions.a04_cuda_gelu.bench``: see that file. Writes
a04_a05_gelu.{md,csv,png} (for the solutions: to lectures/results/).
"""
import sys

from ..a04_cuda_gelu.bench import main

if __name__ == "__main__":
    sys.exit(main(module=__spec__.name))
