"""Stage 3: the Triton bias kernel and the fused Linear (no host transfers)."""
import pytest
import torch

from common import DEVICE, HAS_CUDA
from common import reference as ref
from common.kernel_check import (BIAS_KERNEL, FUSED_LINEAR, FUSED_LINEAR_NO_BIAS, TORCH_ARITH, Forbidden, assert_is_kernel,
                                 forbidden_ops)
from common.profiling import fake_cuda, profile, trace_ops
from common.testing import assert_close, assert_fresh_each_call, non_contiguous, randn
from tests.ids import bias_id, dtype_id, linear_id, shape_id

BIAS = "a03_fused_linear.add_bias"
LINEAR = "a03_fused_linear.fused_linear"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# M (rows: the leading dims' product) above any row block a kernel may choose and a multiple of none: 201 and
# 1029 rows (a grid of M // BLOCK_M programs leaves the last rows unwritten, on a CPU too).
Y_SHAPES = [(1,), (1, 1), (7, 13), (3, 5, 1000), (2, 3, 257), (3, 67, 24), (1029, 5)] + (
    [(64, 4097), (4, 33, 3072)] if HAS_CUDA else [])
LINEAR_SHAPES = [(1, 7, (1,)), (7, 1000, (3,)), (96, 257, (2, 5)), (40, 4097, (3,))]     # in, out, leading dims


@pytest.fixture
def bias_mod(impl):
    return impl.load(BIAS)


@pytest.fixture
def lin_mod(impl):
    return impl.load(LINEAR)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", Y_SHAPES, ids=shape_id)
def test_add_bias(bias_mod, dtype, shape):
    y = randn(*shape, dtype=dtype)
    b = randn(shape[-1], dtype=dtype)
    y0 = y.clone()
    out = assert_is_kernel(lambda: bias_mod.add_bias(y, b), BIAS_KERNEL, "add_bias")
    assert_close(out, ref.add_bias(y, b), dtype=dtype, name="add_bias", inputs={"y": y, "b": b})
    assert torch.equal(y, y0), "add_bias (out of place) must not modify y"


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(7, 13), (3, 5, 1000), (1, 257), (3, 67, 24)], ids=shape_id)
def test_add_bias_inplace(bias_mod, dtype, shape):
    y = randn(*shape, dtype=dtype)
    b = randn(shape[-1], dtype=dtype)
    y0 = y.clone()              # the reference is computed after the call: nothing of it within the call's reach
    out = assert_is_kernel(lambda: bias_mod.add_bias_(y, b), BIAS_KERNEL, "add_bias_", kernels=False)  # once
    assert out is y, "add_bias_ must return y itself"
    assert_close(y, ref.add_bias(y0, b), dtype=dtype, name="add_bias_ (in place)", inputs={"y": y, "b": b})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_add_bias_non_contiguous(bias_mod, dtype):
    y = non_contiguous(randn(6, 11, 40, dtype=dtype))
    b = randn(40, dtype=dtype)
    assert_close(bias_mod.add_bias(y, b), ref.add_bias(y, b), dtype=dtype, name="add_bias, non-contiguous y",
                 inputs={"y": y, "b": b})
    cols = randn(9, 80, dtype=dtype)[:, 10:50]  # a column slice: strided rows, in place is possible
    cols0 = cols.clone()
    bias_mod.add_bias_(cols, b)
    assert_close(cols, ref.add_bias(cols0, b), dtype=dtype, name="in-place on a column slice")



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_add_bias_strided_b(bias_mod, dtype):
    """b may be non-contiguous (the contract): a strided b must not be read as if contiguous."""
    b = torch.arange(2 * 40, dtype=dtype, device=DEVICE)[::2]  # stride 2: read with stride 1, every value is wrong
    assert not b.is_contiguous()
    y = randn(5, 7, 40, dtype=dtype)
    assert_close(bias_mod.add_bias(y, b), ref.add_bias(y, b), dtype=dtype, name="add_bias, strided b")
    y0 = y.clone()
    out = bias_mod.add_bias_(y, b)
    assert out is y
    assert_close(y, ref.add_bias(y0, b), dtype=dtype, name="add_bias_, strided b")
    yt = randn(40, 5, 7, dtype=dtype).permute(1, 2, 0)  # leading dims that do not collapse into one
    assert_close(bias_mod.add_bias(yt, b), ref.add_bias(yt, b), dtype=dtype, name="add_bias, permuted y",
                 inputs={"y": yt, "b": b})

def test_add_bias_is_a_kernel(bias_mod):
    """The bias add must be the stage's own kernel, not torch arithmetic (the grader's check,
    common.kernel_check), and on a GPU one kernel per call."""
    y, b = randn(33, 70), randn(70)
    assert_is_kernel(lambda: bias_mod.add_bias(y, b), BIAS_KERNEL, "add_bias")
    if HAS_CUDA:
        rep = profile(lambda: bias_mod.add_bias(y, b))
        assert rep.n_kernels == 1, f"expected one Triton kernel per call, got {rep.kernels}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_add_bias_inplace_unviewable(bias_mod, dtype):
    """A y whose leading dims cannot be viewed as [rows, N] (rows of a taller tensor): add_bias_ either
    adds in place or raises ValueError (then add_bias takes it), as the contracts say; never a bias added
    into a copy, y unchanged."""
    y = randn(3, 5, 24, dtype=dtype)[:, :4]
    b = randn(24, dtype=dtype)
    y0 = y.clone()
    try:
        out = bias_mod.add_bias_(y, b)
    except ValueError:           # refused, as the contract allows: add_bias takes such a y
        assert torch.equal(y, y0), "add_bias_ raised ValueError after changing y"
        assert_close(bias_mod.add_bias(y, b), ref.add_bias(y0, b), dtype=dtype, name="add_bias on a y not viewable "
                     "as [rows, N]")
        return
    assert out is y, "add_bias_ must return y itself"
    assert not torch.equal(y, y0), ("add_bias_ left y unchanged: on a y that cannot be viewed as [rows, N], "
                                    "reshape copies it and the bias goes into the copy; raise ValueError instead")
    assert_close(y, ref.add_bias(y0, b), dtype=dtype, name="add_bias_ on a y not viewable as [rows, N]")


def test_add_bias_fresh_output_each_call(bias_mod):
    """New values in the same tensors give the new answer; the first output survives a second call."""
    assert_fresh_each_call(bias_mod.add_bias, {"y": randn(5, 70), "b": randn(70)}, ref.add_bias, name="add_bias")


def test_add_bias_bad_input(bias_mod):
    y = randn(4, 8)
    b = randn(8)
    assert_close(bias_mod.add_bias(y, b), ref.add_bias(y, b))  # valid input works; bad input raises:
    with pytest.raises(ValueError, match=r"\(8,\)"):
        bias_mod.add_bias(y, randn(9))
    with pytest.raises(TypeError, match="dtype"):
        bias_mod.add_bias(y.to(torch.int32), randn(8).to(torch.int32))
    with pytest.raises(TypeError, match="dtype"):
        bias_mod.add_bias(y, randn(8, dtype=torch.float16))
    with pytest.raises((ValueError, TypeError)):
        bias_mod.add_bias(y, randn(2, 4))


@pytest.mark.parametrize("backend", ["addmm", "triton"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("in_f,out_f,lead", LINEAR_SHAPES, ids=[linear_id(c) for c in LINEAR_SHAPES])
@pytest.mark.parametrize("bias", [True, False], ids=bias_id)
def test_fused_linear(lin_mod, backend, dtype, in_f, out_f, lead, bias):
    w = randn(out_f, in_f, dtype=dtype) / in_f**0.5
    b = randn(out_f, dtype=dtype) if bias else None
    layer = lin_mod.FusedLinear(w, b, backend=backend)
    x = randn(*lead, in_f, dtype=dtype)
    forbid = FUSED_LINEAR[backend] if bias else FUSED_LINEAR_NO_BIAS
    y = assert_is_kernel(lambda: layer(x), forbid, f"FusedLinear(backend={backend!r}, bias={bias})")
    y_strided = layer(non_contiguous(x))              # the reference after the calls: out of their reach
    expected, scale = ref.linear(x, w, b), ref.linear_scale(x, w, b)  # bias may be added after rounding
    assert_close(y, expected, dtype=dtype, scale=scale, name=f"FusedLinear({backend})", inputs={"x": x, "w": w})
    assert_close(y_strided, expected, dtype=dtype, scale=scale, name="non-contiguous x")


@pytest.mark.parametrize("backend", ["addmm", "triton"])
def test_fused_linear_fresh_output_each_call(lin_mod, backend):
    """New values in the same input tensor give the new answer; the first output survives a second call."""
    w, b = randn(50, 24) / 24**0.5, randn(50)
    layer = lin_mod.FusedLinear(w, b, backend)
    assert_fresh_each_call(layer, {"x": randn(3, 24)}, lambda x: ref.linear(x, w, b), dtype=torch.float32,
                           scale=lambda x: ref.linear_scale(x, w, b), name=f"FusedLinear({backend})")


def test_fused_linear_from_linear(lin_mod):
    lin = torch.nn.Linear(30, 50).to(DEVICE)
    x = randn(4, 30)
    assert_close(lin_mod.FusedLinear.from_linear(lin)(x), ref.linear(x, lin.weight, lin.bias))


@pytest.mark.parametrize("bias", [True, False], ids=bias_id)
def test_fused_linear_one_gemm_no_transfers(lin_mod, bias):
    """addmm backend on fake CUDA tensors: one GEMM with the bias fused, no host copy."""
    with fake_cuda():
        w = torch.randn(96, 64, device="cuda")
        b = torch.randn(96, device="cuda") if bias else None
        layer = lin_mod.FusedLinear(w, b, backend="addmm")
        x = torch.randn(4, 8, 64, device="cuda")
        with trace_ops() as t:
            y = layer(x)
    assert tuple(y.shape) == (4, 8, 96) and y.device.type == "cuda"
    assert t.host_transfers == 0, f"{t.host_transfers} host transfers per call; expected 0"
    gemms = t.count("aten.mm", "aten.bmm", "aten.addmm", "aten.matmul", "aten.linear")
    assert gemms == 1, f"expected exactly one GEMM, ops: {t.ops}"
    assert t.count("aten.add.", "aten.add_.", "aten.clone", "aten.contiguous", "aten._to_copy", "aten.copy_",
                   "aten.cat", "aten.stack") == 0, (
        f"bias add or a weight copy outside the GEMM: {t.ops}")


@pytest.mark.parametrize("backend", ["addmm", "triton"])
def test_fused_linear_is_not_the_baseline(lin_mod, backend):
    """F.linear is the baseline the stage is timed against, so calling it scores nothing. It
    leaves no aten op of its own (it decomposes into the same addmm), hence the function trace.
    "addmm": one torch.addmm, bias in its epilogue; "triton": the GEMM x @ W^T, then add_bias_."""
    w, b = randn(50, 40) / 40**0.5, randn(50)
    layer = lin_mod.FusedLinear(w, b, backend=backend)
    x = randn(3, 4, 40)
    with trace_ops(functions=True) as t:
        y = layer(x)
    assert_close(y, ref.linear(x, w, b), scale=ref.linear_scale(x, w, b))
    assert "torch.nn.functional.linear" not in t.functions, (
        f"backend {backend!r} called F.linear, the PyTorch baseline this stage replaces; "
        + ("use torch.addmm(bias, x2, weight_t)" if backend == "addmm" else "use x2 @ weight_t, then add_bias_"))
    if backend == "addmm":
        others = forbidden_ops(t.ops, [], Forbidden(("aten.mm", "aten.matmul", "aten.linear", "aten.bmm") + TORCH_ARITH))
        assert t.count("aten.addmm") == 1 and not others, (
            f"backend 'addmm' must be one torch.addmm with the bias in its epilogue; ops: {sorted(set(t.ops))}")
    else:
        bad = forbidden_ops(t.ops, [], Forbidden(("aten.addmm", "aten.linear") + TORCH_ARITH))
        assert not bad, f"backend 'triton' must add the bias with add_bias_, not torch ops: {bad}"


@pytest.mark.gpu
@pytest.mark.parametrize("backend,kernels", [("addmm", 1), ("triton", 2)])
def test_fused_linear_profile(lin_mod, backend, kernels):
    lin = torch.nn.Linear(768, 3072, device="cuda")
    layer = lin_mod.FusedLinear.from_linear(lin, backend=backend)
    x = torch.randn(8, 128, 768, device="cuda")
    rep = profile(lambda: layer(x))
    assert rep.host_transfers == 0, rep.table()
    assert rep.n_kernels == kernels, rep.table()


def test_fused_linear_bad_input(lin_mod):
    layer = lin_mod.FusedLinear(randn(8, 6), randn(8))
    with pytest.raises(ValueError, match=r"6"):
        layer(randn(2, 7))
    with pytest.raises(TypeError, match="dtype"):
        layer(randn(2, 6).to(torch.int64))
    with pytest.raises(TypeError, match="dtype"):
        layer(randn(2, 6, dtype=torch.float16))
    with pytest.raises(TypeError, match="dtype"):
        lin_mod.FusedLinear(randn(8, 6).to(torch.int32))
    with fake_cuda():
        layer = lin_mod.FusedLinear(torch.randn(8, 6, device="cuda"), torch.randn(8, device="cuda"))
        with pytest.raises(ValueError, match="cuda"):
            layer(torch.randn(2, 6))  # a CPU tensor where CUDA is required
