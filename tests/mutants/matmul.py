"""Buggy variants of stage 6 (tiled matmul). Each must make at least one graded test fail.
The Triton kernel runs under the interpreter on a CPU; the CUDA versions need a GPU run.
Every test output is NaN-poisoned, so a tile or row that is never written fails."""
from . import Mutant

S, T, CU, CU7 = "a06_matmul", "matmul_triton.py", "matmul_kernels.cu", "matmul_v7_wgmma.cu"

MUTANTS = [
    # ---- Triton kernel: test_triton_matmul (sizes that divide no block, several K steps)
    Mutant(S, T, "group size not clamped at the last group",
           [("group_size_m = min(num_pid_m - first_pid_m, GROUP_M)", "group_size_m = GROUP_M")]),
    Mutant(S, T, "ragged K slice skipped",
           [("for k in range(0, tl.cdiv(K, BLOCK_K)):", "for k in range(0, K // BLOCK_K):")]),
    Mutant(S, T, "K mask off by one",
           [("a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)",
             "a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left - 1, other=0.0)")]),
    Mutant(S, T, "B advanced by BLOCK_K elements not rows",
           [("b_ptrs += BLOCK_K * stride_bk", "b_ptrs += BLOCK_K")]),
    Mutant(S, T, "store mask drops the last row",
           [("mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))", "mask=(offs_m[:, None] < M - 1) & (offs_n[None, :] < N))")]),
    Mutant(S, T, "B assumed row-major",
           [("b_ptrs = b_ptr + offs_k[:, None] * stride_bk + (offs_n % N)[None, :] * stride_bn",
             "b_ptrs = b_ptr + offs_k[:, None] * N + (offs_n % N)[None, :]")]),
    Mutant(S, T, "bias stride ignored",
           [("bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0)",
             "bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0)")]),
    Mutant(S, T, "bias added after the GELU",
           [("    elif HAS_BIAS:\n        bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0)\n"
             "        acc += bias.to(tl.float32)[None, :]\n    if ACTIVATION == \"gelu_tanh\":\n"
             "        acc = _gelu_tanh(acc, FAST_TANH)\n",
             "    if ACTIVATION == \"gelu_tanh\":\n        acc = _gelu_tanh(acc, FAST_TANH)\n"
             "    if HAS_BIAS and not SWAP_AB:\n"
             "        bias = tl.load(bias_ptr + offs_n * stride_bias, mask=offs_n < N, other=0.0)\n"
             "        acc += bias.to(tl.float32)[None, :]\n")]),
    Mutant(S, T, "bias broadcast along the wrong axis",
           [("acc += bias.to(tl.float32)[None, :]", "acc += bias.to(tl.float32)[:, None]")]),
    # the two layout paths: fp32 TF32 with b N-major (SWAP_AB), rows off 16-byte boundaries (PREFETCH)
    Mutant(S, T, "swapped launch adds the bias along N",
           [("    if HAS_BIAS and SWAP_AB:  # this launch computes C^T: bias[n] of C is bias[offs_m] here\n"
             "        bias = tl.load(bias_ptr + offs_m * stride_bias, mask=offs_m < M, other=0.0)\n"
             "        acc += bias.to(tl.float32)[:, None]\n    elif HAS_BIAS:\n",
             "    if HAS_BIAS:\n")]),
    Mutant(S, T, "prefetch reloads the current slice of A",
           [("a_next = tl.load(a_ptrs + BLOCK_K * stride_ak, mask=offs_k[None, :] < k_left - BLOCK_K, other=0.0)",
             "a_next = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)")]),
    # ---- CUDA kernels (GPU): test_cuda_fp32_versions / test_cuda_tensor_core_versions
    Mutant(S, CU, "v2 K loop stops one short",
           [("const int row = blockIdx.y * blockDim.y + threadIdx.y;\n    if (row < M && col < N) {\n"
             "        float acc = 0.f;\n        for (int k = 0; k < K; ++k)",
             "const int row = blockIdx.y * blockDim.y + threadIdx.y;\n    if (row < M && col < N) {\n"
             "        float acc = 0.f;\n        for (int k = 0; k < K - 1; ++k)")], gpu=True),
    Mutant(S, CU, "v3 ragged K tile skipped",
           [("for (int k0 = 0; k0 < K; k0 += V3_TILE) {", "for (int k0 = 0; k0 + V3_TILE <= K; k0 += V3_TILE) {")],
           gpu=True),
    Mutant(S, CU, "v4 next slice stored into the buffer being read",
           [("if (kt + 1 < KT) store_shared(s ^ 1);", "if (kt + 1 < KT) store_shared(s);")], gpu=True),
    Mutant(S, CU, "v5 group size not clamped",
           [("const int group_m = min(grid_m - first_m, TC_GROUP_M);", "const int group_m = TC_GROUP_M;")], gpu=True),
    Mutant(S, CU, "v5 accumulator rows 4 apart not 8",
           [("const int row = m0 + wm * WM + mt * 16 + lane / 4 + h * 8;",
             "const int row = m0 + wm * WM + mt * 16 + lane / 4 + h * 4;")], gpu=True),
    # ---- version 7 (Hopper GPU): test_cuda_v7_wgmma
    Mutant(S, CU7, "v7 both consumers multiply the first 64 rows of A",
           [("smem_desc(a_tile(s) + c * 64 * BK * 2 + k * 32, 16, 1024)", "smem_desc(a_tile(s) + k * 32, 16, 1024)")],
           gpu=True),
    Mutant(S, CU7, "v7 B advanced by 16 half-rows per k step",
           [("smem_desc(b_tile(s) + k * 16 * PANEL * 2, C::B_PANEL_BYTES, 1024)",
             "smem_desc(b_tile(s) + k * 16 * PANEL, C::B_PANEL_BYTES, 1024)")], gpu=True),
    Mutant(S, CU7, "v7 consumers store every tile of a block at its first tile's corner",
           [("tile_origin<C>(tile, grid_m, grid_n, m0, n0);\n            float acc[C::ACC];",
             "tile_origin<C>(blockIdx.x, grid_m, grid_n, m0, n0);\n            float acc[C::ACC];")], gpu=True),
    Mutant(S, CU7, "v7 epilogue rows 4 apart not 8",
           [("const int row = m0 + c * 64 + w * 16 + l / 4 + 8 * h;", "const int row = m0 + c * 64 + w * 16 + l / 4 + 4 * h;")],
           gpu=True),
]
