"""Stage 2: W^T stored once; no transpose and no weight transfer per call."""
import pytest
import torch

from common import DEVICE
from common import reference as ref
from common.profiling import fake_cuda, trace_ops
from common.testing import assert_close, assert_fresh_each_call, non_contiguous, randn
from tests.ids import bias_id, dtype_id, linear_id

MOD = "a02_pretransposed_linear.pretransposed_linear"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(1, 1, (1,)), (7, 5, (3,)), (64, 1000, (2, 7)), (33, 4097, (5,))]  # in, out, leading dims


@pytest.fixture
def mod(impl):
    return impl.load(MOD)


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("in_f,out_f,lead", SHAPES, ids=[linear_id(c) for c in SHAPES])
@pytest.mark.parametrize("bias", [True, False], ids=bias_id)
def test_numerics(mod, dtype, in_f, out_f, lead, bias):
    w = randn(out_f, in_f, dtype=dtype) / in_f**0.5
    b = randn(out_f, dtype=dtype) if bias else None
    x = randn(*lead, in_f, dtype=dtype)
    layer = mod.PretransposedLinear(w, b)
    y, y_strided = layer(x), layer(non_contiguous(x))    # the reference after the calls: out of their reach
    expected, scale = ref.linear(x, w, b), ref.linear_scale(x, w, b)  # bias may be added after rounding
    assert_close(y, expected, dtype=dtype, scale=scale)
    assert_close(y_strided, expected, dtype=dtype, scale=scale, name="non-contiguous x")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_fresh_output_each_call(mod, dtype):
    """The same input tensor with new values gives the new answer, and a second call leaves the
    first call's output alone: nothing memoised by address, no output buffer shared by calls."""
    w, b = randn(40, 24, dtype=dtype) / 24**0.5, randn(40, dtype=dtype)
    layer = mod.PretransposedLinear(w, b)
    assert_fresh_each_call(layer, {"x": randn(3, 24, dtype=dtype)}, lambda x: ref.linear(x, w, b), dtype=dtype,
                           scale=lambda x: ref.linear_scale(x, w, b), name="PretransposedLinear")


def test_weight_stored_transposed_once(mod):
    lin = torch.nn.Linear(24, 40).to(DEVICE)
    layer = mod.PretransposedLinear.from_linear(lin)
    wt = layer.weight_t
    assert tuple(wt.shape) == (24, 40), f"weight_t: expected [in, out] = (24, 40), got {tuple(wt.shape)}"
    assert wt.is_contiguous(), "weight_t must be contiguous (transposed once, at construction)"
    torch.testing.assert_close(wt.detach(), lin.weight.detach().T)
    ptr = wt.data_ptr()
    layer(randn(3, 24))
    layer(randn(5, 24))
    assert layer.weight_t.data_ptr() == ptr, "weight_t must be made once, not rebuilt per call"



def test_weight_t_is_a_frozen_parameter(mod):
    """The contract: weight_t is an nn.Parameter (requires_grad=False), so it is in state_dict()
    and parameters() and .to() moves and casts it; bias_host is a plain attribute: not in
    state_dict, left on the host by .to()."""
    w, b = randn(40, 24), randn(40)
    layer = mod.PretransposedLinear(w, b)
    assert isinstance(layer.weight_t, torch.nn.Parameter), (
        f"weight_t must be an nn.Parameter, got {type(layer.weight_t).__name__}")
    assert not layer.weight_t.requires_grad, "weight_t is an inference weight: requires_grad=False"
    assert list(layer.state_dict()) == ["weight_t"], f"state_dict keys: {list(layer.state_dict())}"
    assert [p is layer.weight_t for p in layer.parameters()] == [True]
    layer.to(torch.float64)
    assert layer.weight_t.dtype == torch.float64 and isinstance(layer.weight_t, torch.nn.Parameter)
    assert layer.weight_t.is_contiguous() and tuple(layer.weight_t.shape) == (24, 40)
    assert layer.bias_host.device.type == "cpu" and layer.bias_host.dtype == torch.float32, (
        "bias_host is not a buffer: .to() leaves it as it was")
    clone = mod.PretransposedLinear(torch.zeros(40, 24, device=w.device), b)
    clone.load_state_dict({"weight_t": w.t().contiguous()})
    torch.testing.assert_close(clone.weight_t.detach(), w.t())

@pytest.mark.parametrize("bias,expected", [(True, 2), (False, 0)])
def test_host_transfers(mod, bias, expected):
    with fake_cuda():
        w = torch.randn(96, 64, device="cuda")
        b = torch.randn(96, device="cuda") if bias else None
        layer = mod.PretransposedLinear(w, b)
        x = torch.randn(4, 8, 64, device="cuda")
        with trace_ops() as t:
            y = layer(x)
    assert tuple(y.shape) == (4, 8, 96) and y.device.type == "cuda"
    assert t.host_transfers == expected, f"{t.host_transfers} host transfers per call (htod {t.htod}, dtoh {t.dtoh}); expected {expected}"
    transposes = t.count("aten.t.", "aten.transpose", "aten.permute", "aten.clone", "aten.contiguous")
    assert transposes == 0, f"the forward transposes or copies the weight: {[o for o in t.ops if 'mm' not in o]}"
    assert t.count("aten.mm", "aten.bmm", "aten.addmm", "aten.matmul") == 1, f"expected one GEMM, ops: {t.ops}"


def test_bad_input(mod):
    layer = mod.PretransposedLinear(randn(8, 6))
    with pytest.raises(ValueError, match="6"):
        layer(randn(2, 7))
