"""Buggy variants of stages 4 (CUDA GELU op) and 5 (Triton GELU). Each must make at least one
graded test fail. Stage 4's CPU tests cover the fake, patch_model and the torch.compile trace;
its kernel mutants (gelu_kernel.cu) need a GPU run. Stage 5 runs under the Triton interpreter."""
from . import Mutant

S4, S5 = "a04_cuda_gelu", "a05_triton_gelu"
PY4, CU4, PY5 = "fused_gelu.py", "gelu_kernel.cu", "gelu_triton.py"
FAKE = "    return torch.empty(x.shape, dtype=x.dtype, device=x.device)\n    # END TODO(a04)\n\n\nfor _name"

MUTANTS = [
    # ---- a04, the fake (meta) implementation: test_fake_impl
    Mutant(S4, PY4, "fake always float32",
           [(FAKE, FAKE.replace("dtype=x.dtype", "dtype=torch.float32"))]),
    Mutant(S4, PY4, "fake keeps the strides of x",
           [(FAKE, "    return torch.empty_like(x)\n    # END TODO(a04)\n\n\nfor _name")]),
    Mutant(S4, PY4, "fake on the CPU",
           [(FAKE, FAKE.replace(", device=x.device", ""))]),
    # ---- a04, patch_model: test_patch_model_structure, the fake forward / compile traces
    Mutant(S4, PY4, "patch rebinds a local",
           [("        mlp.act = FusedGELU(fast_math)", "        act = FusedGELU(fast_math)  # noqa: F841")]),
    Mutant(S4, PY4, "patch ignores fast_math",
           [("        mlp.act = FusedGELU(fast_math)", "        mlp.act = FusedGELU()")]),
    Mutant(S4, PY4, "patch searches direct children only",
           [("mlps = [m for m in model.modules() if isinstance(m, GPT2MLP)]",
             "mlps = [m for m in model.children() if isinstance(m, GPT2MLP)]")]),
    Mutant(S4, PY4, "patch accepts a model without MLP",
           [("    if not mlps:\n        raise ValueError", "    if False:\n        raise ValueError")]),
    # ---- a04, the CUDA kernel (GPU): test_matches_reference (NaN-poisoned outputs)
    Mutant(S4, CU4, "tail off by one",
           [("if (blockIdx.x == 0 && threadIdx.x < tail) {", "if (blockIdx.x == 0 && threadIdx.x < tail - 1) {")],
           gpu=True),
    Mutant(S4, CU4, "tail index without the pack width",
           [("const int64_t i = npack * P::N + threadIdx.x;", "const int64_t i = npack + threadIdx.x;")], gpu=True),
    Mutant(S4, CU4, "block base without kUnroll",
           [("static_cast<int64_t>(blockIdx.x) * (kThreads * kUnroll) + threadIdx.x;",
             "static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;")], gpu=True),
    Mutant(S4, CU4, "grid rounds down",
           [("npack > 0 ? (npack + per_block - 1) / per_block : 1;", "npack > 0 ? npack / per_block : 1;")], gpu=True),
    Mutant(S4, CU4, "sigmoid(u) instead of sigmoid(2u)",
           [("return 0.5f * x * (1.0f + tanhf(inner));", "return x / (1.0f + expf(-inner));")], gpu=True),
    Mutant(S4, CU4, "2 over pi without the square root",
           [("kSqrt2OverPi = 0.7978845608028654f;", "kSqrt2OverPi = 0.6366197723675814f;")], gpu=True),

    # ---- a05, the Triton kernel (interpreted on a CPU)
    Mutant(S5, PY5, "mask drops the last element", [("mask = offs < n ", "mask = offs < n - 1 ")]),
    Mutant(S5, PY5, "block offset without BLOCK",
           [("start = tl.program_id(0).to(tl.int64) * BLOCK", "start = tl.program_id(0).to(tl.int64)")]),
    Mutant(S5, PY5, "cubic coefficient 0.0044715",
           [("(x + 0.044715 * x * x * x)", "(x + 0.0044715 * x * x * x)")]),
    Mutant(S5, PY5, "x squared instead of cubed", [("(x + 0.044715 * x * x * x)", "(x + 0.044715 * x * x)")]),
    Mutant(S5, PY5, "2 over pi without the square root",
           [("u = 0.7978845608028654 * (", "u = 0.6366197723675814 * (")]),
    Mutant(S5, PY5, "sigmoid(u) instead of sigmoid(2u)",
           [("y = x / (1.0 + tl.exp(-2.0 * u))", "y = x / (1.0 + tl.exp(-u))")]),
    Mutant(S5, PY5, "tanh from exp(2u) overflows",
           [("y = x / (1.0 + tl.exp(-2.0 * u))",
             "e = tl.exp(2.0 * u)\n    y = 0.5 * x * (1.0 + (e - 1.0) / (e + 1.0))")]),
    Mutant(S5, PY5, "computed in the storage dtype",
           [("    x = x.to(tl.float32)\n", "")]),
    Mutant(S5, PY5, "last block stored without its mask",
           [("        tl.store(y_ptr + offs, y, mask=mask)\n", "        tl.store(y_ptr + offs, y)\n")]),
]
