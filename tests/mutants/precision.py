"""Precision faults that fixed tolerances let through: an fp32 accumulator rounded to 16 bits on
every K step (caught against PyTorch's own error at long K: common.testing.calibrated_tol), and
the erf GELU where GPT-2's tanh GELU is asked for (1e-4 apart: fp32 comparisons see it; on a
one-element input a 16-bit one may fail first, so pytest's first failure names no fixed dtype).
Each must be caught by the graded tests AND by the grader alone (``grader=``)."""
from . import Mutant

MUTANTS = [
    Mutant("a06_matmul", "matmul_triton.py", "accumulator rounded to the output dtype every K step",
           [("        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)\n",
             "        acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION)\n"
             "        acc = acc.to(c_ptr.dtype.element_ty).to(tl.float32)   # kept in bf16/fp16 between steps\n")],
           expect=("PyTorch's own error",), grader=("long K",)),
    Mutant("a05_triton_gelu", "gelu_triton.py", "erf GELU instead of the tanh GELU",
           [("    y = x / (1.0 + tl.exp(-2.0 * u))\n",
             "    y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))\n")],
           expect=("relative error", "exceeds"), grader=("torch.float32",)),
]
