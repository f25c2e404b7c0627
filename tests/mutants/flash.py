"""Buggy variants of stage 7 (tiled PyTorch 7a, Triton forward and backward 7b, Hopper CUDA
forward 7c). Each must make at least one graded test of tests/test_a07_flash_attention.py
(7c: tests/test_a07c_flash_hopper.py, on an sm_90 GPU) fail."""
from . import Mutant

S, T, P, H = "a07_flash_attention", "flash_triton.py", "flash_torch.py", "flash_fwd_hopper.cu"
H_TESTS = "test_a07c_flash_hopper.py"
MUTANTS = [
    # a head size that is no power of two (issue #30): the forward pads it to BLOCK_D and masks the padding
    Mutant(S, T, "fwd head padding not masked",
           [("    d_ok = dim_mask(HEAD_DIM, BLOCK_D)[None, :]             # constant True when HEAD_DIM == BLOCK_D",
             "    d_ok = (tl.arange(0, BLOCK_D) < BLOCK_D)[None, :]")], grader=()),
    # ---- 7a, tiled PyTorch
    Mutant(S, P, "7a running sum not rescaled", [("acc = acc * alpha[..., None] + p @ v", "acc = acc + p @ v")]),
    Mutant(S, P, "7a causal mask top-left", [("s = s.masked_fill(cols > rows + shift, neg_inf)",
                                               "s = s.masked_fill(cols > rows, neg_inf)")]),
    Mutant(S, P, "7a L without the max", [("m_i + torch.log(l_safe), neg_inf)", "torch.log(l_safe), neg_inf)")]),
    Mutant(S, P, "7a dK unscaled", [("dk[..., n0:n1, :] += (ds.transpose(-1, -2) @ qi) * scale",
                                     "dk[..., n0:n1, :] += ds.transpose(-1, -2) @ qi")]),
    Mutant(S, P, "7a D from dO only", [("delta = (do.float() * o.float()).sum(dim=-1)", "delta = do.float().sum(dim=-1)")]),
    # ---- 7b forward
    Mutant(S, T, "fwd acc not rescaled", [("        v = tl.load(v_ptrs + start_n * svn, mask=d_ok, other=0.0)\n        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])",
                                           "        v = tl.load(v_ptrs + start_n * svn, mask=d_ok, other=0.0)\n        acc = tl.dot(p.to(v.dtype), v, acc)")]),
    Mutant(S, T, "fwd causal diagonal off by one", [("        qk = tl.dot(q, tl.trans(k))\n        keep = col_ok[None, :]\n        if CAUSAL:\n            keep = keep & (cols[None, :] <= offs_m[:, None] + shift)",
                                                     "        qk = tl.dot(q, tl.trans(k))\n        keep = col_ok[None, :]\n        if CAUSAL:\n            keep = keep & (cols[None, :] < offs_m[:, None] + shift)")]),
    Mutant(S, T, "fwd causal top-left", [("    # the ragged last key tile. Causal: query i sees keys j <= i + (N_K - N_Q).\n    shift = N_K - N_Q",
                                          "    # the ragged last key tile. Causal: query i sees keys j <= i + (N_K - N_Q).\n    shift = 0")]),
    Mutant(S, T, "fwd L in log2 units", [("(m_i + tl.math.log2(l_safe)) / 1.4426950408889634", "(m_i + tl.math.log2(l_safe))")]),
    Mutant(S, T, "fwd ragged key tile unmasked", [("        hi = N_K\n        n_full = n_even\n\n    for start_n in range(0, n_full, BLOCK_N):              # full tiles, no mask",
                                                   "        hi = N_K\n        n_full = hi\n\n    for start_n in range(0, n_full, BLOCK_N):              # full tiles, no mask")]),
    Mutant(S, T, "fwd key row stride from q", [("    k_ptrs = K + offs_n[:, None] * skn + offs_d[None, :] * skd\n    v_ptrs = V + offs_n[:, None] * svn + offs_d[None, :] * svd\n\n    m_i",
                                                "    k_ptrs = K + offs_n[:, None] * sqm + offs_d[None, :] * skd\n    v_ptrs = V + offs_n[:, None] * svn + offs_d[None, :] * svd\n\n    m_i")]),
    # ---- 7b backward
    Mutant(S, T, "D from dO only", [("delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)", "delta = tl.sum(do.to(tl.float32), 1)")]),
    Mutant(S, T, "dK unscaled", [("    dk = dk * sm_scale\n", "")]),
    Mutant(S, T, "dQ unscaled", [("    dq = dq * sm_scale\n", "")]),
    Mutant(S, T, "dkdv band not masked", [("        pT = tl.where(offs_n[:, None] <= rows[None, :] + shift, pT, 0.0)\n", "")]),
    Mutant(S, T, "dkdv skips the band", [("    for start_m in range(lo, mid, BLOCK_M):", "    for start_m in range(mid, mid, BLOCK_M):")]),
    Mutant(S, T, "dq ignores D", [("        dp = tl.dot(do, tl.trans(v))\n        ds = p * (dp - delta[:, None])\n        dq = tl.dot(ds.to(k.dtype), k, dq)\n\n    for",
                                   "        dp = tl.dot(do, tl.trans(v))\n        ds = p * dp\n        dq = tl.dot(ds.to(k.dtype), k, dq)\n\n    for")]),
    Mutant(S, T, "dQ stored as if contiguous (its strides ignored)",
           [("    out = z * sgz + h * sgh + offs_m[:, None] * sgm + offs_d[None, :]",
             "    out = zh.to(tl.int64) * N_Q * HEAD_DIM + offs_m[:, None] * HEAD_DIM + offs_d[None, :]")]),
    Mutant(S, T, "dO strides taken from q", [("    ints = (*q4.stride(), *k4.stride(), *v4.stride(), *do4.stride())",
                                              "    ints = (*q4.stride(), *k4.stride(), *v4.stride(), *q4.stride())")]),
    # ---- 7c, Hopper CUDA forward (sm_90 GPU only)
    Mutant(S, H, "7c O not rescaled when the row max grows", [("o[i] *= alpha[(i / 2) % 2];", "o[i] *= 1.f;")],
           gpu=True, tests=H_TESTS),
    Mutant(S, H, "7c causal diagonal masked", [("if (col >= S || (CAUSAL && col > row)) sc[i] = -CUDART_INF_F;",
                                                "if (col >= S || (CAUSAL && col >= row)) sc[i] = -CUDART_INF_F;")], gpu=True, tests=H_TESTS),
    Mutant(S, H, "7c ragged last key tile unmasked", [("if (col >= S || (CAUSAL && col > row)) sc[i] = -CUDART_INF_F;",
                                                       "if (CAUSAL && col > row) sc[i] = -CUDART_INF_F;")], gpu=True, tests=H_TESTS),
    Mutant(S, H, "7c L in log2 units", [("(m_run[h] + __log2f(lt)) * LN2", "(m_run[h] + __log2f(lt))")], gpu=True, tests=H_TESTS),
    Mutant(S, H, "7c tile counter not reset after a launch", [("if (f == total - 1) atomicExch(tile_counter, 0);", "")],
           gpu=True, tests=H_TESTS),
    Mutant(S, H, "7c row max over 2 of its 4 lanes",
           [("mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));", "")], gpu=True, tests=H_TESTS),
]
