"""Assignment 6: tiled matmul (CUDA versions 1-7 and an autotuned Triton kernel).

    pytest tests/test_a06_matmul.py                    # your work (assignments/)
    pytest tests/test_a06_matmul.py --impl solutions

Triton tests run everywhere (interpreted on a CPU, small sizes); CUDA tests need a GPU
(``gpu``), the compile check needs nvcc (``nvcc``). Every output buffer is filled with
NaN first, so an element the kernel never writes fails the test. Every call is checked to
be the stage's kernel (common.kernel_check: no torch matmul or epilogue arithmetic traced,
on a GPU no cuBLAS or PyTorch kernel profiled), as the grader checks it. At long K (4096;
8192 on a GPU) the error may be only a few times torch.matmul's own on the same inputs:
an accumulator rounded to 16 bits between K steps passes fixed tolerances, not that.
"""
from __future__ import annotations

import pytest
import torch

from common import DEVICE, HAS_CUDA, TRITON_INTERPRET, gpu, is_hopper
from common import reference as R
from common.impl import REPO
from common.kernel_check import MATMUL_KERNEL, assert_is_kernel, input_copies
from common.testing import (assert_as_accurate_as_torch, assert_close, assert_fresh_each_call, assert_fresh_in_graph,
                            non_contiguous, randn, rel_error, torch_matmul)
from tests.ids import dtype_id, mnk_id

STAGE = "a06_matmul"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (M, N, K) that divide no block. The second needs several programs and K steps, and its rows do not
# start on 16-byte boundaries (the PREFETCH path); the third's rows do in every dtype (M <= 64).
SHAPES = [(17, 33, 40), (70, 45, 100), (24, 40, 72)]
if HAS_CUDA:
    SHAPES += [(257, 383, 511), (512, 256, 1024)]
# Fixed Triton config for the tests (the autotuner would compile every config per shape).
TEST_CONFIG = (32, 32, 32, 4, 1) if TRITON_INTERPRET else (64, 64, 32, 4, 3)


def _poisoned(*shape, dtype, device=DEVICE):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def _triton(impl):
    return impl.load(f"{STAGE}.matmul_triton")


def _cuda(impl):
    return impl.load(f"{STAGE}.matmul_cuda")


def _kernel(call, what="matmul"):
    """call() once, checked to be the stage's kernel (no torch matmul / arithmetic; GPU: no cuBLAS or
    PyTorch kernel, so the output buffer is made outside ``call``: torch.full is a PyTorch kernel)."""
    return assert_is_kernel(call, MATMUL_KERNEL, what)


def _ref(a, b, bias=None, activation=None):
    y = R.matmul(a, b)
    if bias is not None:
        y = R.add_bias(y, bias)
    return R.gelu_tanh(y) if activation == "gelu_tanh" else y


# ----------------------------------------------------------------------------- Triton
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=mnk_id)
@pytest.mark.parametrize("epilogue", [None, "bias", "bias_gelu"], ids=["plain", "bias", "bias_gelu"])
def test_triton_matmul(impl, dtype, shape, epilogue):
    mod = _triton(impl)
    m, n, k = shape
    a, b = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype)
    bias = randn(n, dtype=dtype) if epilogue else None
    act = "gelu_tanh" if epilogue == "bias_gelu" else None
    out = _poisoned(m, n, dtype=dtype)
    got = _kernel(lambda: mod.matmul(a, b, bias, act, out=out, allow_tf32=False, config=TEST_CONFIG),
                  f"triton {epilogue or 'matmul'}")
    assert got is out, "matmul(..., out=out) must write into out and return it"
    assert_close(got, _ref(a, b, bias, act), dtype=dtype, name=f"triton {epilogue or 'matmul'}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_triton_autotuned_path(impl, dtype):
    """The default path goes through the autotuner (one small config when interpreted)."""
    mod = _triton(impl)
    m, n, k = (70, 45, 100) if TRITON_INTERPRET else (300, 520, 264)
    a, b, bias = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype), randn(n, dtype=dtype)
    out = _poisoned(m, n, dtype=dtype)
    got = _kernel(lambda: mod.matmul(a, b, bias, "gelu_tanh", out=out), "autotuned matmul")
    ref = _ref(a, b, bias, "gelu_tanh")
    if dtype == torch.float32:  # TF32 tensor cores on a GPU: ~3e-4 relative, checked loosely
        assert rel_error(got, ref) <= 2e-3, f"tf32 matmul: relative error {rel_error(got, ref):.2e}"
    else:
        assert_close(got, ref, dtype=dtype)


@pytest.mark.parametrize("b_layout", ["N-major", "K-major"])
@pytest.mark.parametrize("epilogue", [None, "bias_gelu"], ids=["plain", "bias_gelu"])
def test_triton_tf32_layouts(impl, b_layout, epilogue):
    """fp32 with TF32 allowed: b N-major (a row-major [K, N]) is launched swapped, C^T = B^T A^T
    (SWAP_AB: the bias then runs along the launch's rows); b K-major (weight.t()) is not."""
    mod = _triton(impl)
    m, n, k = (70, 36, 72) if TRITON_INTERPRET else (300, 264, 520)
    a = randn(m, k)
    b = randn(k, n) if b_layout == "N-major" else randn(n, k).t()
    bias = randn(n) if epilogue else None
    act = "gelu_tanh" if epilogue else None
    out = _poisoned(m, n, dtype=torch.float32)
    got = _kernel(lambda: mod.matmul(a, b, bias, act, out=out, config=TEST_CONFIG), f"tf32 matmul, b {b_layout}")
    err = rel_error(got, _ref(a, b, bias, act))
    assert err <= 2e-3, f"tf32 matmul, b {b_layout}, {epilogue or 'no epilogue'}: relative error {err:.2e} > 2e-3"


def test_triton_batched_and_strided(impl):
    """a [B, T, K] (batched), a strided 2-D a, b = weight.t() and a strided bias."""
    mod = _triton(impl)
    dt = torch.float16
    x = randn(2, 5, 40, dtype=dt)
    w = randn(33, 40, dtype=dt)           # nn.Linear weight [N, K]
    bias = non_contiguous(randn(33, dtype=dt))
    out = _poisoned(2, 5, 33, dtype=dt)
    got = _kernel(lambda: mod.matmul(x, w.t(), bias, out=out, config=TEST_CONFIG), "batched matmul")
    assert_close(got, R.linear(x, w, bias), dtype=dt, name="batched x @ w.t() + bias")
    a = non_contiguous(randn(17, 40, dtype=dt))
    got = mod.matmul(a, w.t(), out=_poisoned(17, 33, dtype=dt), config=TEST_CONFIG)
    assert_close(got, R.linear(a, w), dtype=dt, name="strided a")


def test_linear_gelu_gpt2_shaped(impl):
    """GPT-2 MLP up-projection in miniature: gelu(x @ W.T + b), W [4C, C]."""
    mod = _triton(impl)
    c = 48
    x, w, b = randn(2, 7, c, dtype=torch.bfloat16), randn(4 * c, c, dtype=torch.bfloat16, scale=0.2), \
        randn(4 * c, dtype=torch.bfloat16)
    got = _kernel(lambda: mod.linear_gelu(x, w, b), "linear_gelu")
    assert got.shape == (2, 7, 4 * c)
    assert_close(got, R.gelu_tanh(R.linear(x, w, b)), dtype=torch.bfloat16)


def test_triton_fresh_inputs_each_call(impl):
    """Two calls on different inputs give two different (correct) answers: nothing cached; the same
    tensors with new values give the new answer, and the first output survives a second call."""
    mod = _triton(impl)
    for _ in range(2):
        a, b = randn(17, 40), randn(40, 33)
        assert_close(mod.matmul(a, b, allow_tf32=False, config=TEST_CONFIG), R.matmul(a, b), dtype=torch.float32)
    assert_fresh_each_call(lambda a, b: mod.matmul(a, b, allow_tf32=False, config=TEST_CONFIG),
                           {"a": randn(17, 40), "b": randn(40, 33)}, R.matmul, dtype=torch.float32, name="matmul")


@pytest.mark.gpu
def test_triton_replays_from_a_cuda_graph(impl):
    """Captured once, replayed on new values in the same tensors: the new product (the grader times the
    matmul so; stage 8 replays it in the decode step)."""
    mod = _triton(impl)
    assert_fresh_in_graph(lambda a, b: mod.matmul(a, b), {"a": randn(300, 256, dtype=torch.bfloat16),
                                                         "b": randn(256, 192, dtype=torch.bfloat16)},
                          R.matmul, dtype=torch.bfloat16, name="matmul")


def test_linear_gelu_reads_the_weight_in_place(impl):
    """linear_gelu takes nn.Linear's weight [N, K] and reads it as the transposed view it is: a copy of
    the weight on every call (.contiguous(), .clone(), a cast) moves as many bytes as the GEMM reads."""
    mod = _triton(impl)
    x, w, b = randn(5, 48), randn(96, 48, scale=0.2), randn(96)
    got, copies = input_copies(lambda: mod.linear_gelu(x, w, b), weight=w)
    assert not copies, f"linear_gelu copied its weight on the call: {copies}; pass weight.t() to the kernel as is"
    err = rel_error(got, R.gelu_tanh(R.linear(x, w, b)))
    assert err <= 2e-3, f"linear_gelu: relative error {err:.2e} (fp32; TF32 on a GPU) exceeds 2e-3"


#: Long K: an fp32 accumulator rounded to bf16 between K steps is ~8x torch.matmul's error at
#: K = 4096 in steps of 32 (fp16: ~8x too), an honest one ~1x. (M, N, K); small M, N on a CPU.
LONG_K_SHAPES = [(40, 33, 4096)] if TRITON_INTERPRET else [(256, 320, 8192), (1000, 72, 4104)]


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", LONG_K_SHAPES, ids=mnk_id)
def test_triton_long_k_as_accurate_as_torch(impl, dtype, shape):
    """At long K the error against float64 is at most a few times torch.matmul's own on the same
    inputs (common.testing.calibrated_tol): accumulate in fp32 from the first K step to the last."""
    mod = _triton(impl)
    m, n, k = shape
    a, b = randn(m, k, dtype=dtype), randn(k, n, dtype=dtype)
    out = _poisoned(m, n, dtype=dtype)
    got = _kernel(lambda: mod.matmul(a, b, out=out, allow_tf32=False, config=TEST_CONFIG))
    assert_as_accurate_as_torch(got, R.matmul(a, b), torch_matmul(a, b), dtype=dtype,
                                name=f"triton matmul {m}x{n}x{k}")


def test_triton_bad_input(impl):
    mod = _triton(impl)
    a, b = randn(17, 40), randn(40, 33)
    assert_close(mod.matmul(a, b, allow_tf32=False, config=TEST_CONFIG), R.matmul(a, b))  # valid call works
    with pytest.raises(ValueError, match="inner dimensions"):
        mod.matmul(a, randn(41, 33))
    with pytest.raises(TypeError, match="dtype"):
        mod.matmul(a, b.half())
    with pytest.raises(TypeError, match="dtype"):
        mod.matmul(a.to(torch.int32), b.to(torch.int32))
    with pytest.raises(ValueError, match="activation"):
        mod.matmul(a, b, activation="relu")
    with pytest.raises(ValueError, match="bias"):
        mod.matmul(a, b, randn(32))
    with pytest.raises(ValueError, match="out"):
        mod.matmul(a, b, out=_poisoned(17, 34, dtype=torch.float32))
    wrong = "cpu" if DEVICE == "cuda" else "meta"
    with pytest.raises(ValueError, match="expected a tensor on"):
        mod.matmul(a.to(wrong), b.to(wrong))


# ----------------------------------------------------------------------------- CUDA
CUDA_SHAPES = [
    (1, 1, 1),
    (17, 33, 40),        # smaller than every tile
    (129, 257, 67),      # odd: scalar (non-vectorised, non-cp.async) paths
    (256, 384, 128),     # whole tiles: vectorised / cp.async paths
    (300, 264, 136),     # multiples of 8, partial tiles
    (72, 136, 2056),     # long K: many pipeline stages in flight
    (128, 264, 4096),    # longer K: error against torch.matmul's own (an accumulator kept in 16 bits shows)
]


def _cuda_case(mod, version, dtype, shape, **kw):
    m, n, k = shape
    a = randn(m, k, dtype=dtype, device="cuda")
    b = randn(k, n, dtype=dtype, device="cuda")
    out = _poisoned(m, n, dtype=dtype, device="cuda")
    got = _kernel(lambda: mod.matmul(a, b, version, out=out, **kw), f"CUDA matmul v{version}")
    torch.cuda.synchronize()
    assert got is out, "matmul(..., out=out) must write into out and return it"
    expected = R.matmul(a, b)
    assert_close(got, expected, dtype=dtype, name=f"v{version} {m}x{n}x{k}")
    assert_as_accurate_as_torch(got, expected, torch_matmul(a, b), dtype=dtype, name=f"v{version} {m}x{n}x{k}")
    return a, b, got


@pytest.mark.gpu
@pytest.mark.parametrize("shape", CUDA_SHAPES, ids=mnk_id)
@pytest.mark.parametrize("version", [1, 2, 3, 4])
def test_cuda_fp32_versions(impl, version, shape):
    _cuda_case(_cuda(impl), version, torch.float32, shape)


# Versions 5 and 6 (mma.sync m16n8k16, cp.async) need an sm_80+ GPU; on a T4 (sm_75) they skip, saying so.
SM80_MISSING = gpu.why_not("a06 v5") if HAS_CUDA else None
sm80_only = pytest.mark.skipif(SM80_MISSING is not None, reason=SM80_MISSING or "")


@pytest.mark.gpu
@sm80_only
@pytest.mark.parametrize("shape", CUDA_SHAPES, ids=mnk_id)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
@pytest.mark.parametrize("version", [5, 6])
def test_cuda_tensor_core_versions(impl, version, dtype, shape):
    _cuda_case(_cuda(impl), version, dtype, shape)


# Version 7 (TMA + wgmma) needs K and N multiples of 8; M is free.
V7_SHAPES = [
    (1, 8, 8),           # the smallest problem TMA can describe
    (17, 40, 56),        # smaller than a tile, K shorter than one slice
    (300, 264, 136),     # partial tiles in M and N (264 = 256 + 8), ragged last K slice
    (129, 512, 520),     # two N tiles, 9 K slices: the 4-slot ring wraps twice
    (72, 136, 2056),     # long K: the ring wraps many times
    (128, 264, 4096),    # longer K: error against torch.matmul's own
]
HOPPER = is_hopper()
V7_MISSING = gpu.why_not("a06 v7") if HAS_CUDA else None   # "... needs an sm_90 GPU ...; this GPU is ... (sm_XY)"
hopper_only = pytest.mark.skipif(not HOPPER, reason=V7_MISSING or "version 7 needs an sm_90 GPU (H100/H200)")


@pytest.mark.gpu
@hopper_only
@pytest.mark.parametrize("shape", V7_SHAPES, ids=mnk_id)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_cuda_v7_wgmma(impl, dtype, shape):
    _cuda_case(_cuda(impl), 7, dtype, shape)


# Persistent blocks: many more tiles than SMs for every tile shape (64x64: 37 x 73 tiles), ragged
# in M and N, and 3 K slices a tile, so the ring of stages wraps in the middle of tiles.
V7_MANY_TILES = (2344, 4616, 136)


@pytest.mark.gpu
@hopper_only
@pytest.mark.parametrize("tile", [(128, 256), (128, 128), (64, 128), (64, 64)], ids=lambda t: "x".join(map(str, t)))
def test_cuda_v7_every_tile_shape_many_tiles_per_block(impl, tile):
    mod = _cuda(impl)
    _cuda_case(mod, 7, torch.bfloat16, V7_MANY_TILES, tile=tile)
    _cuda_case(mod, 7, torch.float16, (300, 264, 4104), tile=tile)   # long K, partial tiles


@pytest.mark.gpu
@hopper_only
def test_cuda_v7_refuses_what_tma_cannot_describe(impl):
    mod = _cuda(impl)
    _cuda_case(mod, 7, torch.bfloat16, (64, 64, 32))   # the legal neighbour works
    a, b = randn(64, 30, dtype=torch.bfloat16, device="cuda"), randn(30, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="multiples of 8"):
        mod.matmul(a, b, 7)
    flat = randn(64 * 32 + 1, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="16-byte aligned"):
        mod.matmul(flat[1:].view(64, 32), randn(32, 64, dtype=torch.bfloat16, device="cuda"), 7)
    a = randn(64, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="tile"):
        mod.matmul(a, a, 7, tile=(256, 128))
    with pytest.raises(ValueError, match="tile"):
        mod.matmul(a, a, 6, tile=(128, 256))


@pytest.mark.gpu
@pytest.mark.skipif(HOPPER, reason="checks the message on GPUs other than sm_90")
def test_cuda_v7_off_hopper_says_so(impl):
    a = randn(64, 64, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(ValueError, match="sm_90") as e:
        _cuda(impl).matmul(a, a, 7)
    assert gpu.sm() in str(e.value), f"the refusal should name this GPU ({gpu.describe()}): {e.value}"


@pytest.mark.gpu
@pytest.mark.skipif(SM80_MISSING is None, reason="checks the message on GPUs older than sm_80 (a T4)")
def test_cuda_tensor_cores_before_sm80_say_so(impl):
    a = randn(64, 64, dtype=torch.bfloat16, device="cuda")
    for version in (5, 6):
        with pytest.raises(ValueError, match="sm_80") as e:
            _cuda(impl).matmul(a, a, version)
        assert gpu.sm() in str(e.value), f"the refusal should name this GPU ({gpu.describe()}): {e.value}"
    _cuda_case(_cuda(impl), 4, torch.float32, (129, 257, 67))   # versions 1-4 build and run there


@pytest.mark.gpu
@pytest.mark.parametrize("version", [4, 5, 6, 7])
def test_cuda_large_and_repeatable(impl, version):
    """A size with many tiles and waves; the same inputs twice give the same bits (no race)."""
    why = _cuda(impl).unsupported(version)
    if why:
        pytest.skip(why)
    mod = _cuda(impl)
    dt = torch.float32 if version == 4 else torch.bfloat16
    a, b, first = _cuda_case(mod, version, dt, (1000, 1544, 1032))
    again = mod.matmul(a, b, version, out=_poisoned(1000, 1544, dtype=dt, device="cuda"))
    assert torch.equal(first, again), "two runs on the same inputs differ: a race?"


@pytest.mark.gpu
def test_cuda_bad_input(impl):
    mod = _cuda(impl)
    a, b = randn(17, 40, device="cuda"), randn(40, 33, device="cuda")
    assert_close(mod.matmul(a, b, 3, out=_poisoned(17, 33, dtype=torch.float32, device="cuda")), R.matmul(a, b))
    with pytest.raises(ValueError, match="version"):
        mod.matmul(a, b, 8)
    with pytest.raises(TypeError, match="dtype"):
        mod.matmul(a, b, 5)                      # tensor-core versions take fp16/bf16
    with pytest.raises(TypeError, match="dtype"):
        mod.matmul(a.half(), b.half(), 4)        # versions 1-4 take fp32
    with pytest.raises(ValueError, match="contiguous"):
        mod.matmul(a, randn(33, 40, device="cuda").t(), 4)
    with pytest.raises(ValueError, match="inner dimensions"):
        mod.matmul(a, randn(41, 33, device="cuda"), 4)
    with pytest.raises(ValueError, match="expected a tensor on 'cuda'"):
        mod.matmul(a.cpu(), b.cpu(), 4)


@pytest.mark.given
def test_cuda_wrapper_rejects_cpu_tensors(impl):
    """The given wrapper checks inputs before building anything (runs without a GPU)."""
    mod = impl.load(f"{STAGE}.matmul_cuda")
    with pytest.raises(ValueError, match="expected a tensor on 'cuda'"):
        mod.matmul(torch.randn(3, 4), torch.randn(4, 5), 4)
    with pytest.raises(ValueError, match="version"):
        mod.matmul(torch.randn(3, 4), torch.randn(4, 5), 0)


@pytest.mark.nvcc
@pytest.mark.parametrize("tree", ["solutions"])
def test_cuda_sources_compile(tree):
    """nvcc (sm_90a) and the host compiler accept the kernels and the binding (no GPU needed)."""
    from common.cuda_ext import compile_check
    d = REPO / tree / STAGE
    compile_check([d / "matmul_kernels.cu", d / "matmul_v7_wgmma.cu"] + ([d / "binding.cpp"] if tree == "solutions" else []))
