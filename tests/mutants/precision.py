"""Precision faults, ones that fixed tolerances let through and ones only some dtypes show: an fp32
accumulator rounded to 16 bits on
every K step (matmul) or key tile (flash attention), caught against PyTorch's own error at long K
or Nk (common.testing.calibrated_tol), and
16-bit sums (LayerNorm's statistics, the backward's D = rowsum(dO * O): tl.sum keeps its input's
dtype), caught in the 16-bit dtypes the grader's trials now always draw, and
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
    # Flash attention's output accumulator kept in bf16/fp16 between key tiles: ~10x SDPA's error at
    # Nk = 3001 (188 key tiles of 16 under the interpreter), below the fixed 1e-2 / 2e-3 of the other tests.
    Mutant("a07_flash_attention", "flash_triton.py", "fwd accumulator rounded to the output dtype every key tile",
           [("        v = tl.load(v_ptrs + start_n * svn, mask=d_ok, other=0.0)\n        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])\n",
             "        v = tl.load(v_ptrs + start_n * svn, mask=d_ok, other=0.0)\n        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])\n"
             "        acc = acc.to(O.dtype.element_ty).to(tl.float32)   # kept in bf16/fp16 between key tiles\n"),
            ("        v = tl.load(v_ptrs + start_n * svn, mask=col_ok[:, None] & d_ok, other=0.0)\n"
             "        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])\n",
             "        v = tl.load(v_ptrs + start_n * svn, mask=col_ok[:, None] & d_ok, other=0.0)\n"
             "        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])\n"
             "        acc = acc.to(O.dtype.element_ty).to(tl.float32)\n")],
           expect=("PyTorch's own error", "O, "), grader=("long Nk",)),
    # LayerNorm's statistics summed in the input's dtype (no .to(tl.float32) on the load, no residual):
    # tl.sum does not widen 16-bit floats, so the mean and variance of a 16-bit row carry 16-bit
    # rounding. Invisible in fp32; the grader's trials draw every dtype (DTYPE_CYCLE), not one at random.
    Mutant("a08_gpt2_inference", "layernorm.py", "LayerNorm statistics summed in the storage dtype",
           [("    h = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)\n",
             "    h = tl.load(X + row * stride_x + cols, mask=ok, other=0.0)\n")], grader=()),
    # The backward's D = rowsum(dO * O) summed in 16 bits (tl.sum keeps the input's dtype).
    Mutant("a07_flash_attention", "flash_triton.py", "D summed in the storage dtype",
           [("delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)", "delta = tl.sum(o * do, 1).to(tl.float32)")],
           grader=()),
    Mutant("a05_triton_gelu", "gelu_triton.py", "erf GELU instead of the tanh GELU",
           [("    y = x / (1.0 + tl.exp(-2.0 * u))\n",
             "    y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))\n")],
           expect=("relative error", "exceeds"), grader=("torch.float32",)),
]
