"""Stage 5: GPT-2's GELU as one Triton kernel, a torch custom op that composes with torch.compile.

Runs on the GPU, and under the Triton interpreter on a CPU (small sizes there). Calls are
checked to be the kernel (common.kernel_check: no torch arithmetic or GELU traced; on a GPU
no PyTorch kernel profiled), as the grader checks them.
"""
import pytest
import torch
from transformers import GPT2LMHeadModel
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

from common import DEVICE, HAS_CUDA
from common import reference as ref
from common.kernel_check import GELU_KERNEL, assert_is_kernel
from common.profiling import profile, trace_ops
from common.testing import (assert_close, assert_fresh_each_call, assert_fresh_in_graph, non_contiguous, randn,
                            randomize_, tiny_gpt2_config)
from common.timing import left_unjoined
from tests.ids import dtype_id, shape_id

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # exp(-2u) -> inf, by design

MOD = "a05_triton_gelu.gelu_triton"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(1,), (7,), (1023,), (1025,), (3, 5, 257), (2, 3, 4, 65)]
if HAS_CUDA:
    SHAPES += [(4097,), (2, 1024, 3072), ((1 << 20) + 3,)]


@pytest.fixture
def mod(impl):
    return impl.load(MOD)


def _poison(n: int, dtype: torch.dtype) -> None:
    """Leave a freed NaN block of this size in the allocator (see test_a04)."""
    torch.full((max(n, 1),), float("nan"), dtype=dtype, device=DEVICE)


def _run(mod, x):
    """One call, checked to be the kernel (no torch arithmetic; on a GPU no PyTorch kernel, unless x
    is strided: then the given op's x.contiguous() is a PyTorch copy kernel)."""
    _poison(x.numel(), x.dtype)
    return assert_is_kernel(lambda: mod.gelu(x), GELU_KERNEL, "gelu", kernels=x.is_contiguous())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_same_shape_new_values(mod, dtype):
    """Calls with the same shape and new values give new (correct) outputs: nothing is cached. It runs
    first (pytest -x stops at the first failure), so a submission that caches its outputs is told so."""
    for i in range(3):
        x = randn(3, 257, dtype=dtype, scale=3.0)
        assert_close(_run(mod, x), ref.gelu_tanh(x), dtype=dtype, scale=x.abs(),
                     name=f"call {i + 1} with the same shape (3, 257) as call 1, new values")


def test_fresh_output_each_call(mod):
    """The same tensor with new values gives the new answer (nothing memoised by address), and the
    first call's output survives a second call (no output buffer shared by calls)."""
    assert_fresh_each_call(mod.gelu, {"x": randn(4, 300, scale=3.0)}, ref.gelu_tanh, dtype=torch.float32,
                           scale=lambda x: x.abs(), name="gelu")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_matches_reference(mod, dtype, shape):
    x = randn(*shape, dtype=dtype, scale=3.0)
    # Measured against |x| too, an output that is ~0 passes wherever x is far below 0 (GELU ~ 0 there).
    # On a CPU an output never written holds whatever malloc left, often 0 or ~1e-38 for a few bytes,
    # so a one-element x below -3 (1 draw in 6) let the untouched stub pass: one element in (0.5, 2).
    x.view(-1)[0] = torch.empty((), dtype=torch.float32).uniform_(0.5, 2.0).item()
    assert_close(_run(mod, x), ref.gelu_tanh(x), dtype=dtype, scale=x.abs())


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_strided_offset_and_empty(mod, dtype):
    base = randn(3, 2 * 301 + 1, dtype=dtype, scale=3.0)
    for x in (non_contiguous(base), base.t(), base.view(-1)[1:], base.view(-1)[3:500]):
        y = _run(mod, x)
        assert y.is_contiguous()
        assert_close(y, ref.gelu_tanh(x), dtype=dtype, scale=x.abs())
    y = _run(mod, torch.empty(0, 5, device=DEVICE, dtype=dtype))
    assert y.shape == (0, 5) and y.dtype == dtype


def test_underflow_tail_fp32(mod):
    """One-element fp32 inputs just below x = -10.1, where the tanh form's exp(-2u) overflows and a
    correct kernel returns -0.0 (as F.gelu does) for an exact value of 1e-38 to 1e-42. Measured
    against |x| (every GELU value check here is), that is no error; measured against the output
    alone it was, and one random draw in a few thousand failed a correct kernel."""
    for v in (1.5, -10.2, -10.3, -10.45):   # 1.5 first: an output never written fails here
        x = torch.tensor([v], dtype=torch.float32, device=DEVICE)
        assert_close(_run(mod, x), ref.gelu_tanh(x), dtype=torch.float32, scale=x.abs(), name=f"gelu({v})")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_extreme_values(mod, dtype):
    big = 6e4 if dtype == torch.float16 else 1e4
    x = torch.tensor([-big, -100.0, -30.0, -9.0, -1e-3, 0.0, 1e-3, 9.0, 30.0, 100.0, big] * 3).to(DEVICE, dtype)
    assert_close(_run(mod, x), ref.gelu_tanh(x), dtype=dtype)


def test_one_op_per_call(mod):
    """Through the dispatcher the call is one op, the custom op, with no aten math around it or in it
    (the trace goes into the op's Python body: its output allocation shows, nothing else)."""
    x = randn(4, 1000)
    mod.gelu(x)             # the autotuner's first call for this size benchmarks its configs (buffers, L2 flushes)
    with trace_ops() as t:
        y = mod.gelu(x)
    assert t.ops[0] == f"{mod.NS}.triton_gelu.default", t.ops
    assert all(op.startswith("aten.empty") for op in t.ops[1:]), t.ops
    assert_close(y, ref.gelu_tanh(x), scale=x.abs())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_torch_compile_fullgraph(mod, dtype):
    """torch.compile(fullgraph=True) keeps the op as one node and gets the same numbers."""
    import torch._dynamo
    torch._dynamo.reset()
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        from torch._dynamo.backends.common import aot_autograd
        return aot_autograd(fw_compiler=lambda g, _: g.forward)(gm, example_inputs)

    def f(x):
        return mod.gelu(x * 2.0) + 1.0

    x = randn(3, 1001, dtype=dtype)
    y = torch.compile(f, fullgraph=True, backend=capture)(x)
    torch._dynamo.reset()
    assert len(graphs) == 1
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum(f"{mod.NS}.triton_gelu" in t for t in targets) == 1, targets
    assert_close(y, ref.gelu_tanh(2.0 * x.double()) + 1.0, dtype=dtype)


def test_gpt2_mlp_with_triton_gelu(mod):
    """A tiny transformers GPT-2 whose MLP activation is the Triton op matches the float64 model."""
    class TritonGELU(torch.nn.Module):
        def forward(self, x):
            return mod.gelu(x)

    g = torch.Generator().manual_seed(0)
    cfg = tiny_gpt2_config()
    model = randomize_(GPT2LMHeadModel(cfg).eval(), generator=g)
    idx = torch.randint(0, cfg.vocab_size, (2, 19), generator=g)
    with torch.no_grad():
        expected = model.double()(idx).logits
        model.float().to(DEVICE)
        for m in model.modules():
            if isinstance(m, GPT2MLP):
                m.act = TritonGELU()
        out = model(idx.to(DEVICE)).logits
    assert_close(out, expected, dtype=torch.float32, rel_tol=1e-4, name="logits")


@pytest.mark.given
def test_rejects_bad_input(impl):
    """Given code: gelu() checks its input with a clear message."""
    m = impl.load(MOD)
    with pytest.raises(TypeError, match="dtype"):
        m.gelu(torch.ones(4, dtype=torch.float64, device=DEVICE))
    with pytest.raises(TypeError, match="dtype"):
        m.gelu(torch.ones(4, dtype=torch.int32, device=DEVICE))
    with pytest.raises(ValueError, match="expected a tensor on"):
        m.gelu(torch.ones(4, device="meta"))
    with pytest.raises(TypeError, match="Tensor"):
        m.gelu([1.0])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_one_kernel_per_call(mod, dtype):
    x = randn(1 << 20, dtype=dtype)
    mod.gelu(x)                          # autotune outside the profile
    rep = profile(lambda: mod.gelu(x))
    assert rep.n_kernels == 1, f"expected exactly one kernel per call:\n{rep.table()}"
    assert rep.host_transfers == 0
    assert_close(_run(mod, x), ref.gelu_tanh(x), dtype=dtype, scale=x.abs())


@pytest.mark.gpu
def test_output_joined_to_the_callers_stream(mod):
    """The output read on the caller's stream right after the call is the output: no work left on another
    stream (at 2^26 elements the kernel runs long enough for unjoined work to show), and the same after
    the caller's stream was kept busy (work on a side stream that waits on it starts with the read)."""
    x = randn(1 << 26, dtype=torch.bfloat16)
    assert_close(_run(mod, x), ref.gelu_tanh(x), dtype=torch.bfloat16, scale=x.abs())   # right (and tuned)
    # new values on every probe: a reused output buffer may still hold the answer of the call above
    found = left_unjoined(lambda: mod.gelu(randn(1 << 26, dtype=torch.bfloat16)))
    assert found is None, f"gelu: {found}"


@pytest.mark.gpu
def test_replays_in_a_cuda_graph(mod):
    """Captured in a CUDA graph and replayed on new values, the call computes the new GELU. Deterministic
    where the race above is not: work forked onto a private stream and never joined back fails the
    capture ("unjoined work"); work on a stream the capture never joined is missing from the replay."""
    x = randn(3, 4097, dtype=torch.bfloat16, scale=3.0)
    mod.gelu(x)                          # autotune outside the capture
    assert_fresh_in_graph(lambda x: mod.gelu(x), {"x": x}, lambda x: ref.gelu_tanh(x), name="gelu",
                          dtype=torch.bfloat16)


@pytest.mark.gpu
def test_torch_compile_inductor(mod):
    """The default (inductor) backend around the custom op, on the GPU."""
    import torch._dynamo
    torch._dynamo.reset()
    x = randn(4, 3001, dtype=torch.bfloat16)
    y = torch.compile(lambda t: mod.gelu(t * 0.5) * 3.0, fullgraph=True)(x)
    torch._dynamo.reset()
    assert_close(y, ref.gelu_tanh(0.5 * x.double()) * 3.0, dtype=torch.bfloat16)
