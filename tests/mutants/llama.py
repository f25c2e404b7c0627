"""Buggy variants of stage 9's kernels (RMSNorm with the residual add, RoPE with Qwen 3's q/k norm, SwiGLU).
Each must make at least one graded test of tests/test_a09_llama_inference.py fail, under the Triton interpreter on
a CPU: the kernels against float64 references that round where transformers rounds, and against transformers'
own modules."""
from . import Mutant

S = "a09_llama_inference"
RMS, ROPE, SWI = "rmsnorm.py", "rope.py", "swiglu.py"

MUTANTS = [
    # ---- kernel 1, RMSNorm: test_rmsnorm*, test_add_rmsnorm
    Mutant(S, RMS, "mean subtracted as LayerNorm does",
           [("    ms = tl.sum(h * h, axis=0) / N\n",
             "    h = tl.where(ok, h - tl.sum(h, axis=0) / N, 0.0)\n    ms = tl.sum(h * h, axis=0) / N\n")]),
    Mutant(S, RMS, "mean of squares over the block not the row",
           [("ms = tl.sum(h * h, axis=0) / N", "ms = tl.sum(h * h, axis=0) / BLOCK_N")]),
    Mutant(S, RMS, "eps ignored in the rms", [("rstd = 1.0 / tl.sqrt(ms + eps)", "rstd = 1.0 / tl.sqrt(ms)")]),
    Mutant(S, RMS, "weight applied before rounding",
           [("    n = (h * rstd).to(Y.dtype.element_ty).to(tl.float32)     # rounded before the weight, as transformers\n",
             "    n = h * rstd\n")],
           grader=("rounded as transformers rounds",)),
    Mutant(S, RMS, "residual stream not rounded before the norm",
           [("        h = h_out.to(tl.float32)            # normalise what the residual stream holds\n", "")],
           grader=("rounded as transformers rounds",)),
    Mutant(S, RMS, "residual not stored",
           [("        tl.store(H + row * stride_h + cols, h_out, mask=ok)\n", "")]),

    # ---- kernel 2, RoPE: test_apply_rope*
    Mutant(S, ROPE, "rope rotates adjacent pairs",
           [("    p1 = QKV + b.to(tl.int64) * s_b + t.to(tl.int64) * s_t + hs[:, None] * (2 * HALF) + i[None, :]\n"
             "    x1 = tl.load(p1, mask=ok, other=0.0).to(tl.float32)\n"
             "    x2 = tl.load(p1 + HALF, mask=ok, other=0.0).to(tl.float32)\n",
             "    p1 = QKV + b.to(tl.int64) * s_b + t.to(tl.int64) * s_t + hs[:, None] * (2 * HALF) + 2 * i[None, :]\n"
             "    x1 = tl.load(p1, mask=ok, other=0.0).to(tl.float32)\n"
             "    x2 = tl.load(p1 + 1, mask=ok, other=0.0).to(tl.float32)\n"),
            ("    tl.store(p1 + HALF, (x2 * c + x1 * s).to(QKV.dtype.element_ty), mask=ok)",
             "    tl.store(p1 + 1, (x2 * c + x1 * s).to(QKV.dtype.element_ty), mask=ok)")]),
    Mutant(S, ROPE, "rotation the wrong way",
           [("    tl.store(p1, (x1 * c - x2 * s).to(QKV.dtype.element_ty), mask=ok)\n"
             "    tl.store(p1 + HALF, (x2 * c + x1 * s).to(QKV.dtype.element_ty), mask=ok)",
             "    tl.store(p1, (x1 * c + x2 * s).to(QKV.dtype.element_ty), mask=ok)\n"
             "    tl.store(p1 + HALF, (x2 * c - x1 * s).to(QKV.dtype.element_ty), mask=ok)")]),
    Mutant(S, ROPE, "position ignores the start", [("pos = tl.load(START + b) + t", "pos = t")]),
    Mutant(S, ROPE, "every sequence at the start of sequence 0", [("pos = tl.load(START + b) + t", "pos = tl.load(START) + t")]),
    Mutant(S, ROPE, "k heads not rotated",
           [("ok = (hs[:, None] < N_HEAD + N_KV_HEAD) & i_ok[None, :] & (pos < N_POS)",
             "ok = (hs[:, None] < N_HEAD) & i_ok[None, :] & (pos < N_POS)")]),
    Mutant(S, ROPE, "v heads rotated too",
           [("ok = (hs[:, None] < N_HEAD + N_KV_HEAD) & i_ok[None, :] & (pos < N_POS)",
             "ok = (hs[:, None] < N_HEAD + 2 * N_KV_HEAD) & i_ok[None, :] & (pos < N_POS)"),
            ("    hs = tl.arange(0, BLOCK_H)\n", "    hs = tl.arange(0, 2 * BLOCK_H)\n")]),
    Mutant(S, ROPE, "head padding not masked in rope",
           [("    i_ok = dim_mask(HALF, BLOCK_HALF)\n", "    i_ok = tl.arange(0, BLOCK_HALF) < BLOCK_HALF\n")],
           grader=("d=80",)),
    Mutant(S, ROPE, "q/k norm skipped",
           [("        x1 = tl.where(normed, n1, x1)\n        x2 = tl.where(normed, n2, x2)\n", "")]),
    Mutant(S, ROPE, "q_norm weights used for the k heads too",
           [("        w1 = tl.where(is_q, wq1, wk1)\n        w2 = tl.where(is_q, wq2, wk2)\n",
             "        w1 = wq1\n        w2 = wq2\n")]),
    Mutant(S, ROPE, "q/k norm over half the head",
           [("ms = (tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / (2 * HALF)",
             "ms = tl.sum(x1 * x1, axis=1) / HALF")]),

    # ---- kernel 3, SwiGLU: test_swiglu*
    Mutant(S, SWI, "gate and up swapped",
           [("    g = tl.load(GU + row * stride_gu + c, mask=ok, other=0.0).to(tl.float32)\n"
             "    u = tl.load(GU + row * stride_gu + F + c, mask=ok, other=0.0).to(tl.float32)\n",
             "    u = tl.load(GU + row * stride_gu + c, mask=ok, other=0.0).to(tl.float32)\n"
             "    g = tl.load(GU + row * stride_gu + F + c, mask=ok, other=0.0).to(tl.float32)\n")]),
    Mutant(S, SWI, "sigmoid instead of silu",
           [("a = (g / (1.0 + tl.exp(-g)))", "a = (1.0 / (1.0 + tl.exp(-g)))")]),
    Mutant(S, SWI, "silu not rounded before the product",
           [("a = (g / (1.0 + tl.exp(-g))).to(OUT.dtype.element_ty).to(tl.float32)", "a = g / (1.0 + tl.exp(-g))")],
           grader=("rounded as transformers rounds",)),
    Mutant(S, SWI, "only the first column block of each row",
           [("c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)", "c = tl.arange(0, BLOCK)")]),
    Mutant(S, SWI, "rows assumed contiguous in swiglu",
           [("    g = tl.load(GU + row * stride_gu + c,", "    g = tl.load(GU + row * 2 * F + c,"),
            ("    u = tl.load(GU + row * stride_gu + F + c,", "    u = tl.load(GU + row * 2 * F + F + c,")]),
]
