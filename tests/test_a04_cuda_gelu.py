"""Stage 4: GPT-2's GELU as a CUDA torch operator, its fake, torch.compile, the GPT-2 patch.

The model patched is Hugging Face transformers' GPT-2 (``GPT2LMHeadModel``, random
weights from a small ``GPT2Config``: ``common.testing.tiny_gpt2_config``).
CPU-only machines run the fake-tensor tests (the op's fake implementation, a
torch.compile(fullgraph=True) trace of a patched GPT-2, the op count of a patched
forward) and, with nvcc, a compile check of the solution's sources. Everything that
runs the kernel is marked gpu.
"""
import copy

import pytest
import torch
from transformers import GPT2LMHeadModel, GPT2Model
from transformers.activations import NewGELUActivation
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

from common import HAS_CUDA
from common import reference as ref
from common.cuda_ext import compile_check
from common.impl import stage_dir
from common.kernel_check import GELU_KERNEL, assert_is_kernel
from common.profiling import fake_cuda, profile, trace_ops
from common.testing import (REL_TOL, assert_close, assert_fresh_in_graph, max_abs_error, non_contiguous, randn,
                            randomize_, rel_error, tiny_gpt2_config)
from tests.ids import dtype_id, shape_id

MOD = "a04_cuda_gelu.fused_gelu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Odd sizes around the vector width (4 fp32 / 8 fp16 per 16 bytes) and the block's
# 256 threads x 4 packs; batched shapes; one GPT-2-small MLP activation.
SHAPES = [(1,), (3,), (7,), (8,), (9,), (1023,), (4097,), (3, 5, 1001), (2, 1024, 3072), ((1 << 20) + 3,)]
#: --use_fast_math (tanh.approx.f32) against the float64 reference. Measured on the H100:
#: fp32 7.6e-7 relative (precise build 2.8e-8); fp16/bf16 the same as the precise build.
#: The bound for fp32 is tanh.approx's documented worst case (2^-11 relative), not the
#: typical error, so another GPU or driver cannot make it flaky.
FAST_REL_TOL = {torch.float32: 1e-3, torch.float16: 2e-3, torch.bfloat16: 1e-2}
#: GPT-2's GELU as the model runs it before the patch: transformers' NewGELUActivation
#: (``gelu_new``, the tanh formula written as torch ops).
gelu_new = NewGELUActivation()


@pytest.fixture
def mod(impl):
    return impl.load(MOD)


def _poison(n: int, dtype: torch.dtype) -> None:
    """Leave a freed NaN block of this size in the CUDA caching allocator, so an output
    the kernel forgets to write is NaN (not the leftovers of an earlier correct result)."""
    torch.full((max(n, 1),), float("nan"), dtype=dtype, device="cuda")


def _run(mod, x, fast_math=False, kernel_check=True):
    """One call on a NaN-poisoned allocator; checked to be the op's kernel (no torch arithmetic traced,
    no PyTorch kernel profiled: common.kernel_check, as the grader checks it)."""
    _poison(x.numel(), x.dtype)
    if not kernel_check:
        return mod.fused_gelu(x, fast_math=fast_math)
    return assert_is_kernel(lambda: mod.fused_gelu(x, fast_math=fast_math), GELU_KERNEL, "fused_gelu",
                            kernels=x.is_contiguous())       # (a strided x: the wrapper's copy is PyTorch's)


# --------------------------------------------------------------------- CPU: fake tensors
def test_plain_ops_baseline_is_eight_ops():
    """The lecture baseline: transformers' gelu_new (NewGELUActivation) is 8 separate elementwise ops."""
    x = torch.randn(10)
    with trace_ops() as t:
        gelu_new(x)
    assert len(t.ops) == 8 and t.count("aten.tanh") == 1, t.ops


@pytest.mark.parametrize("fast_math", [False, True], ids=["precise", "fast_math"])
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_fake_impl(mod, dtype, fast_math):
    """The fake (meta) implementation gives the output's metadata without a GPU or a build."""
    op = mod.op(fast_math)
    with fake_cuda():
        for x in (torch.randn(3, 5, 1001, device="cuda", dtype=dtype),
                  torch.randn(7, device="cuda", dtype=dtype),
                  torch.randn(0, 4, device="cuda", dtype=dtype),
                  torch.randn(64, 48, device="cuda", dtype=dtype).t()):   # strided
            y = op(x)
            assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device, (y, x)
            assert y.is_contiguous(), "the op returns a contiguous tensor; the fake must say so"


def _tiny_fake_model(mod, fast_math=False):
    """A patched transformers GPT-2 on fake CUDA tensors; call inside fake_cuda(). The model is
    made under torch.device("cuda"), so its parameters are fake CUDA tensors like the input
    (a model made on the CPU outside the block holds real tensors, which the fake mode refuses)."""
    cfg = tiny_gpt2_config()
    idx = torch.randint(0, cfg.vocab_size, (2, 16), device="cuda")
    with torch.device("cuda"):
        model = GPT2LMHeadModel(cfg).eval().requires_grad_(False)   # inference: no autograd
    return mod.patch_model(model, fast_math=fast_math), idx, cfg


@pytest.mark.parametrize("fast_math", [False, True], ids=["precise", "fast_math"])
def test_patched_forward_calls_op_once_per_block(mod, fast_math):
    """On fake CUDA tensors: a patched forward calls the op (the fast-math one when asked)
    once per block, and no tanh."""
    with fake_cuda(), torch.no_grad():   # (autograd on fake CUDA tensors needs a CUDA build)
        model, idx, cfg = _tiny_fake_model(mod, fast_math)
        with trace_ops() as t:
            logits = model(idx).logits
    assert logits.shape == (2, 16, cfg.vocab_size)
    op = f"{mod.NS}.{mod.OP_NAMES[fast_math]}."    # e.g. course_solutions.fused_gelu_fast.default
    assert t.count(op) == cfg.n_layer, f"expected {cfg.n_layer} calls of {op}*: {t.counts()}"
    assert t.count("aten.tanh", "aten.pow") == 0, "the plain-ops GELU is still in the model"


def test_torch_compile_fullgraph_traces_op(mod):
    """torch.compile(fullgraph=True) of a patched GPT-2 traces with the fake: no graph break,
    one op node per block in the captured graph, run end to end through AOTAutograd."""
    import torch._dynamo
    torch._dynamo.reset()
    graphs = []

    def capture(gm, example_inputs):
        graphs.append(gm)
        from torch._dynamo.backends.common import aot_autograd
        return aot_autograd(fw_compiler=lambda g, _: g.forward)(gm, example_inputs)

    with fake_cuda(), torch.no_grad():
        model, idx, cfg = _tiny_fake_model(mod)
        logits = torch.compile(model, fullgraph=True, backend=capture)(idx).logits
    torch._dynamo.reset()
    assert logits.shape == (2, 16, cfg.vocab_size)
    assert len(graphs) == 1, f"expected one graph, got {len(graphs)}"
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum(f"{mod.NS}.fused_gelu" in t for t in targets) == cfg.n_layer, targets
    assert not any("tanh" in t for t in targets), targets


@pytest.mark.parametrize("cls", [GPT2LMHeadModel, GPT2Model])
def test_patch_model_structure(mod, cls):
    """patch_model swaps every transformer.h[i].mlp.act (and only that), in place, and returns the
    model: the LM model and the bare GPT2Model alike."""
    model = cls(tiny_gpt2_config()).eval()
    blocks = model.transformer.h if cls is GPT2LMHeadModel else model.h
    weights = {n: p for n, p in model.named_parameters()}
    others = {n: m for n, m in model.named_modules() if not n.endswith("mlp.act")}
    out = mod.patch_model(model)
    assert out is model
    acts = [b.mlp.act for b in blocks]
    assert len(acts) == model.config.n_layer
    assert [m.act for m in model.modules() if isinstance(m, GPT2MLP)] == acts
    assert all(isinstance(a, mod.FusedGELU) and not a.fast_math for a in acts), acts
    assert not any(isinstance(m, NewGELUActivation) for m in model.modules())
    assert {n: m for n, m in model.named_modules() if not n.endswith("mlp.act")} == others, "only mlp.act may change"
    assert {n: p for n, p in model.named_parameters()}.keys() == weights.keys()
    assert all(p is weights[n] for n, p in model.named_parameters()), "weights must be kept"
    fast = mod.patch_model(cls(tiny_gpt2_config()).eval(), fast_math=True)
    fast_acts = [m.act for m in fast.modules() if isinstance(m, GPT2MLP)]
    assert len(fast_acts) == fast.config.n_layer and all(a.fast_math for a in fast_acts), \
        "fast_math=True must reach every FusedGELU"


def test_patch_model_rejects_model_without_mlp(mod):
    """No GPT2MLP in the model: a ValueError that names the model's type."""
    with pytest.raises(ValueError, match="Linear"):
        mod.patch_model(torch.nn.Linear(4, 4))


@pytest.mark.given
def test_wrapper_rejects_bad_input(impl):
    """Given code: fused_gelu checks its input before building anything."""
    m = impl.load(MOD)
    with pytest.raises(ValueError, match="cuda"):
        m.fused_gelu(torch.randn(4))                      # a CPU tensor
    with pytest.raises(TypeError, match="Tensor"):
        m.fused_gelu([1.0, 2.0])
    with fake_cuda():
        for dt in (torch.float64, torch.int32):
            x = torch.ones(4, device="cuda", dtype=dt)
            with pytest.raises(TypeError, match="dtype"):
                m.fused_gelu(x)


@pytest.mark.nvcc
def test_solution_sources_compile():
    """nvcc (kernels) and the host compiler with the torch headers (binding) accept the sources."""
    d = stage_dir("a04_cuda_gelu", "solutions")
    compile_check([d / "gelu_kernel.cu", d / "binding.cpp"])


# --------------------------------------------------------------------------- GPU: runs
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
def test_matches_reference(mod, dtype, shape):
    x = randn(*shape, dtype=dtype, scale=3.0)
    assert_close(_run(mod, x), ref.gelu_tanh(x), dtype=dtype, scale=x.abs())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_strided_misaligned_and_empty(mod, dtype):
    base = randn(3, 2 * 1001 + 1, dtype=dtype, scale=3.0)
    for x in (non_contiguous(base), base.t(), base.view(-1)[1:], base.view(-1)[3:1000]):
        assert_close(_run(mod, x), ref.gelu_tanh(x), dtype=dtype, scale=x.abs())
    y = _run(mod, torch.empty(0, 5, device="cuda", dtype=dtype))
    assert y.shape == (0, 5) and y.dtype == dtype


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_extreme_values(mod, dtype):
    big = 6e4 if dtype == torch.float16 else 1e4
    x = torch.tensor([-big, -100.0, -30.0, -9.0, -1e-3, 0.0, 1e-3, 9.0, 30.0, 100.0, big] * 3,
                     device="cuda").to(dtype)
    assert_close(_run(mod, x), ref.gelu_tanh(x), dtype=dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_fast_math(mod, dtype):
    """The --use_fast_math build computes the same function, to tanh.approx accuracy."""
    x = randn(3, 5, 4097, dtype=dtype, scale=3.0)
    fast = _run(mod, x, fast_math=True)
    r = ref.gelu_tanh(x)                 # after the call: out of its reach
    assert torch.isfinite(fast).all()
    err = rel_error(fast, r)
    assert err <= FAST_REL_TOL[dtype], f"fast-math rel error {err:.2e} > {FAST_REL_TOL[dtype]:.0e}"
    assert max_abs_error(fast, r) <= 2e-3 * r.abs().max().item() + (4e-2 if dtype != torch.float32 else 0)
    if dtype == torch.float32:  # both builds are loaded in one process, and they differ
        precise = _run(mod, x)
        assert rel_error(precise, r) <= REL_TOL[dtype]
        assert not torch.equal(fast, precise), "fast_math=True ran the same code as the precise build"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_one_kernel_per_call(mod, dtype):
    x = randn(1 << 20, dtype=dtype)
    mod.fused_gelu(x)                    # build outside the profile
    rep = profile(lambda: mod.fused_gelu(x))
    assert rep.n_kernels == 1, f"expected exactly one kernel per call:\n{rep.table()}"
    assert rep.host_transfers == 0
    assert_close(_run(mod, x), ref.gelu_tanh(x), dtype=dtype, scale=x.abs())


@pytest.mark.gpu
def test_runs_on_current_stream(mod):
    x = randn(4, 4099)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(1_000_000)         # keep s busy: the op must queue behind it
        y = _run(mod, x, kernel_check=False)   # (the profiler would synchronise)
    s.synchronize()
    assert_close(y, ref.gelu_tanh(x), scale=x.abs())


@pytest.mark.gpu
def test_replays_in_a_cuda_graph(mod):
    """Captured in a CUDA graph and replayed on new values, the call computes the new GELU: no work on
    a stream of its own (never joined back, the capture fails with "unjoined work")."""
    x = randn(3, 4097, dtype=torch.bfloat16, scale=3.0)
    assert_fresh_in_graph(lambda x: mod.fused_gelu(x), {"x": x}, lambda x: ref.gelu_tanh(x), name="fused_gelu",
                          dtype=torch.bfloat16)


def _gpt2_pair(dtype, seed=0):
    """transformers' GPT-2 with random weights (biases and LayerNorms too) on the GPU in ``dtype``,
    token ids, and its float64 logits computed on the CPU."""
    g = torch.Generator().manual_seed(seed)
    cfg = tiny_gpt2_config()
    model = randomize_(GPT2LMHeadModel(cfg).eval(), generator=g)
    idx = torch.randint(0, cfg.vocab_size, (3, 37), generator=g)
    with torch.no_grad():
        expected64 = model.double()(idx).logits
    return model.to("cuda", dtype), idx.cuda(), expected64


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
def test_gpt2_patched_logits(mod, dtype):
    """Patched and original GPT-2 give the same logits within the dtype's tolerance."""
    model, idx, expected64 = _gpt2_pair(dtype)
    original = copy.deepcopy(model)                        # unpatched, same weights
    with torch.no_grad():
        patched_logits = mod.patch_model(model)(idx).logits   # first, so nothing is left to reuse
        original_logits = original(idx).logits
    assert isinstance(original.transformer.h[0].mlp.act, NewGELUActivation)
    assert_close(patched_logits, original_logits.float(), dtype=dtype, name="patched vs original logits")
    if dtype == torch.float32:
        assert_close(patched_logits, expected64, dtype=dtype, rel_tol=1e-4, name="patched vs float64")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_torch_compile_gpu(mod, dtype):
    """torch.compile(fullgraph=True, inductor) of the patched model runs the op and matches."""
    import torch._dynamo
    torch._dynamo.reset()
    model, idx, expected64 = _gpt2_pair(dtype, seed=1)
    mod.patch_model(model)
    with torch.no_grad():
        compiled = torch.compile(model, fullgraph=True)(idx).logits
        eager = model(idx).logits
    torch._dynamo.reset()
    assert_close(compiled, eager.float(), dtype=dtype, name="compiled vs eager")
    if dtype == torch.float32:
        assert_close(compiled, expected64, dtype=dtype, rel_tol=1e-4, name="compiled vs float64")


@pytest.mark.gpu
@pytest.mark.given
def test_op_rejects_bad_input(impl):
    """Given code: the C++ binding checks dtype itself (direct torch.ops calls skip the wrapper)."""
    m = impl.load(MOD)
    m.build()
    with pytest.raises(RuntimeError, match="dtype"):
        m.op()(torch.randn(8, device="cuda", dtype=torch.float64))


@pytest.mark.gpu
def test_plain_ops_baseline_launches_many_kernels():
    """The lecture baseline (transformers' gelu_new) on the GPU: one kernel per torch op."""
    x = randn(1 << 20)
    rep = profile(lambda: gelu_new(x))
    assert rep.n_kernels >= 6, rep.table()
