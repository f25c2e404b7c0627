"""Stage 7: flash attention. 7a tiled PyTorch (flash_torch), 7b Triton (flash_triton).

Everything is checked against common.reference.attention / attention_backward
(float64, materialised matrix) on fresh random inputs: O, the saved L, dQ, dK, dV,
causal (bottom-right) and not, Nq != Nk, sizes that are no multiple of any block.
On the CPU the Triton kernels run under the interpreter at small sizes; the
``gpu`` tests add larger sizes and the memory check on a GPU. Every forward and backward is
checked to be the stage's work (common.kernel_check, as the grader checks it): 7b calls no
PyTorch attention, matmul or softmax (on a GPU: no cuBLAS or SDPA kernel), 7a no fused
attention op; and 7a's largest tensor is one [block_m, block_n] tile of scores, never the
Nq x Nk matrix (a dispatch trace of every tensor it creates, on any device).
"""
import pytest
import torch

from common import DEVICE, HAS_CUDA, TRITON_INTERPRET
from common import reference as ref
from common.kernel_check import (ATTENTION_KERNEL, ATTENTION_TILED, assert_is_kernel, attention_tile_bound,
                                 largest_new_tensor, tile_message)
from common.testing import (assert_as_accurate_as_torch, assert_close, assert_fresh_each_call, assert_fresh_in_graph,
                            non_contiguous, randn, rel_error, torch_attention)
from tests.ids import attention_id, dtype_id

TORCH_MOD = "a07_flash_attention.flash_torch"
TRITON_MOD = "a07_flash_attention.flash_triton"
#: bf16 gradients go through two bf16 roundings (P and dS) before the matmuls, as on
#: the tensor cores: measured 5e-3..8e-3 relative, so 2e-2 instead of the 1e-2 of one rounding.
GRAD_REL_TOL = {torch.bfloat16: 2e-2}


def check(out, expected, dtype, name, *, grad=False):
    """assert_close with the dtype's tolerance; fp32 on a GPU is tf32 (Triton's default dot)."""
    if dtype == torch.float32 and out.device.type == "cuda":
        tol = 5e-3 if grad else 2e-3   # tf32 operands (10-bit mantissa); measured up to 2.2e-3 on dQ
        err = rel_error(out, expected)
        assert err <= tol, f"{name}: relative error {err:.2e} exceeds {tol:.0e} (tf32)"
        return
    rel_tol = GRAD_REL_TOL.get(dtype) if grad else None
    if rel_tol is not None:
        err = rel_error(out, expected)
        assert err <= rel_tol, f"{name}: relative error {err:.2e} exceeds {rel_tol:.0e} for {dtype}"
        atol = 2e-2 * expected.abs().max().item()
        diff = (out.detach().double().cpu() - expected).abs()
        assert torch.isfinite(out).all() and (diff <= atol + 4e-2 * expected.abs()).all(), \
            f"{name}: {int((diff > atol + 4e-2 * expected.abs()).sum())} elements off"
        return
    assert_close(out, expected, dtype=dtype, name=name)


def check_lse(lse, expected, dtype):
    assert lse.dtype == torch.float32, f"L: dtype {lse.dtype}, expected float32"
    assert tuple(lse.shape) == tuple(expected.shape), f"L: shape {tuple(lse.shape)}, expected {tuple(expected.shape)}"
    if dtype == torch.float32 and lse.device.type == "cuda":
        assert rel_error(lse, expected) <= 1e-3, "L: too far from the reference (tf32)"
    else:
        assert_close(lse, expected, dtype=torch.float32, rel_tol=1e-5, name="L")


def qkv(lead, nq, nk, d, dtype, device=None, grad=True):
    q = randn(*lead, nq, d, dtype=dtype, device=device)
    k = randn(*lead, nk, d, dtype=dtype, device=device)
    v = randn(*lead, nk, d, dtype=dtype, device=device)
    return [t.requires_grad_(grad) for t in (q, k, v)]


def saved_lse(o):
    """The fp32 [..., Nq] tensor among what the autograd function saved."""
    saved = o.grad_fn.saved_tensors
    found = [t for t in saved if t.dtype == torch.float32 and tuple(t.shape) == tuple(o.shape[:-1])]
    assert found, f"no float32 tensor of shape {tuple(o.shape[:-1])} (L) among the saved tensors"
    return found[-1], saved


def forbid_of(apply):
    """What the implementation behind ``apply`` may not call: 7b its kernels' work, 7a a fused attention op."""
    owner = getattr(apply, "__self__", None)           # FlashAttentionTorch.apply: the class
    return ATTENTION_TILED if getattr(owner, "__name__", "") == "FlashAttentionTorch" else ATTENTION_KERNEL


def grads_of(o, q, k, v, do, forbid):
    """(dQ, dK, dV) by autograd, checked to be the stage's backward (the graph is kept: on a GPU the
    profiler runs it again)."""
    return assert_is_kernel(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), forbid, "backward")


def run_and_check(apply, q, k, v, causal, dtype, backward=True):
    forbid = forbid_of(apply)
    o = assert_is_kernel(lambda: apply(q, k, v, causal), forbid, "forward")
    r_o, r_l = ref.attention(q, k, v, causal)
    check(o, r_o, dtype, "O")
    lse, saved = saved_lse(o)
    check_lse(lse, r_l, dtype)
    nq, nk = q.shape[-2], k.shape[-2]
    for t in saved:
        assert nk == q.shape[-1] or tuple(t.shape[-2:]) != (nq, nk), \
            f"a saved tensor has the attention matrix's shape {tuple(t.shape)}: save L, not P"
    if backward:
        do = randn(*o.shape, dtype=dtype, device=o.device)
        dq, dk, dv = grads_of(o, q, k, v, do, forbid)
        for name, g, r in zip(("dQ", "dK", "dV"), (dq, dk, dv), ref.attention_backward(q, k, v, do, causal)):
            check(g, r, dtype, name, grad=True)


# ------------------------------------------------------------------------ 7a: tiled PyTorch
@pytest.fixture
def tiled(impl):
    return impl.load(TORCH_MOD)


# (leading dims, Nq, Nk, d): odd sizes, one and several tiles, Nq != Nk both ways
TORCH_CASES = [((2,), 37, 37, 16), ((2, 3), 130, 130, 32), ((3,), 70, 150, 64), ((1, 2), 150, 61, 32)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", TORCH_CASES, ids=attention_id)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_torch_forward_backward(tiled, case, causal, dtype):
    lead, nq, nk, d = case
    if causal and nq > nk:
        pytest.skip("rows with no key: see test_torch_rows_without_keys")
    q, k, v = qkv(lead, nq, nk, d, dtype, device="cpu")
    run_and_check(tiled.FlashAttentionTorch.apply, q, k, v, causal, dtype)


def test_torch_functions(tiled):
    """The two student functions, called directly with odd tile sizes."""
    q, k, v = qkv((2,), 45, 77, 32, torch.float32, device="cpu", grad=False)
    o, lse = tiled.flash_forward_torch(q, k, v, True, block_m=16, block_n=32)
    r_o, r_l = ref.attention(q, k, v, True)
    check(o, r_o, torch.float32, "O")
    check_lse(lse, r_l, torch.float32)
    do = randn(*o.shape, device="cpu")
    grads = tiled.flash_backward_torch(q, k, v, o, lse, do, True, block_m=32, block_n=16)
    for name, g, r in zip(("dQ", "dK", "dV"), grads, ref.attention_backward(q, k, v, do, True)):
        check(g, r, torch.float32, name)


def rows_without_keys(apply, dtype, device):
    """Causal with Nq > Nk: the first Nq - Nk queries see no key (O = 0, L = -inf, dQ = 0)."""
    nq, nk, d = 53, 21, 32
    q, k, v = qkv((2,), nq, nk, d, dtype, device=device)
    forbid = forbid_of(apply)
    o = assert_is_kernel(lambda: apply(q, k, v, True), forbid, "forward")
    lse, _ = saved_lse(o)
    e = nq - nk
    assert torch.isfinite(o).all(), "O has NaN/inf (rows that see no key must be 0)"
    assert (o[:, :e] == 0).all(), "rows that see no key must output 0"
    assert (lse[:, :e] == float("-inf")).all(), "rows that see no key must have L = -inf"
    r_o, r_l = ref.attention(q[:, e:], k, v, True)   # the rows that do see keys, same alignment
    check(o[:, e:], r_o, dtype, "O (rows with keys)")
    check_lse(lse[:, e:], r_l, dtype)
    do = randn(*o.shape, dtype=dtype, device=o.device)
    dq, dk, dv = grads_of(o, q, k, v, do, forbid)
    assert (dq[:, :e] == 0).all(), "dQ of rows that see no key must be 0"
    r_dq, r_dk, r_dv = ref.attention_backward(q[:, e:], k, v, do[:, e:], True)
    check(dq[:, e:], r_dq, dtype, "dQ", grad=True)
    check(dk, r_dk, dtype, "dK", grad=True)
    check(dv, r_dv, dtype, "dV", grad=True)


def test_torch_rows_without_keys(tiled):
    rows_without_keys(tiled.FlashAttentionTorch.apply, torch.float32, "cpu")


def _largest(what, call, bound, nq, nk, *given):
    out, big = largest_new_tensor(call, *given)
    assert big.elements <= bound, tile_message(what, big, bound, nq, nk)
    return out


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_torch_one_tile_at_a_time(tiled, causal):
    """The contract: never more than one [block_m, block_n] tile of S. Every tensor the forward and
    the backward create (dispatch trace) is at most a tile or an [N, d] tensor per head, on
    sequences many tiles long: a whole Nq x Nk matrix (or a [block_m, Nk] row of it) fails."""
    lead, nq, nk, d, bm, bn = (2,), 200, 240, 16, 32, 16
    q, k, v = qkv(lead, nq, nk, d, torch.float32, device="cpu", grad=False)
    do = randn(*q.shape, device="cpu")
    bound = attention_tile_bound(q, k, bm, bn)
    o, lse = _largest(f"flash_forward_torch(block_m={bm}, block_n={bn})",
                      lambda: tiled.flash_forward_torch(q, k, v, causal, bm, bn), bound, nq, nk, q, k, v)
    r_o, r_l = ref.attention(q, k, v, causal)
    check(o, r_o, torch.float32, "O")
    check_lse(lse, r_l, torch.float32)
    grads = _largest(f"flash_backward_torch(block_m={bm}, block_n={bn})",
                     lambda: tiled.flash_backward_torch(q, k, v, o, lse, do, causal, bm, bn), bound, nq, nk,
                     q, k, v, o, lse, do)
    for name, g, r in zip(("dQ", "dK", "dV"), grads, ref.attention_backward(q, k, v, do, causal)):
        check(g, r, torch.float32, name)
    # Through autograd, with the module's BLOCK_M x BLOCK_N tiles.
    n = 4 * max(tiled.BLOCK_M, tiled.BLOCK_N) + 3
    q, k, v = qkv(lead, n, n, d, torch.float32, device="cpu")
    bound = attention_tile_bound(q, k, tiled.BLOCK_M, tiled.BLOCK_N)
    o = _largest("FlashAttentionTorch forward", lambda: tiled.FlashAttentionTorch.apply(q, k, v, causal), bound,
                 n, n, q, k, v)
    _largest("FlashAttentionTorch backward", lambda: o.backward(randn(*o.shape, device="cpu")), bound, n, n,
             q, k, v, o)


# ------------------------------------------------------------------------ 7b: Triton
@pytest.fixture
def tri(impl):
    mod = impl.load(TRITON_MOD)
    with mod.launch_options(poison=True):   # unwritten outputs read as NaN; the fixed config table
        yield mod


# (leading dims, Nq, Nk, d, dtype)
TRITON_CASES = [
    ((2,), 37, 37, 16, torch.float32),
    ((1, 2), 70, 70, 32, torch.float16),
    ((3,), 37, 70, 64, torch.bfloat16),
    ((2,), 70, 37, 128, torch.float16),
    ((2, 1), 64, 64, 64, torch.float32),
    ((2,), 45, 45, 128, torch.bfloat16),
]
GPU_CASES = [((2, 3), 1000, 1000, 64, torch.bfloat16), ((1, 2), 777, 1537, 128, torch.float16),
             ((2, 2), 1024, 1024, 128, torch.bfloat16), ((4,), 513, 257, 32, torch.float32),
             ((1, 3), 2048, 2048, 16, torch.float16),
             # fp32 at d = 128: the table's tiles fit no GPU's shared memory (257 KB forward on an H100),
             # so every kernel runs the fallback of flash_triton.smaller_configs
             ((1, 2), 300, 333, 128, torch.float32)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", TRITON_CASES, ids=attention_id)
def test_triton_forward_backward(tri, case, causal):
    lead, nq, nk, d, dtype = case
    if causal and nq > nk:
        pytest.skip("rows with no key: see test_triton_rows_without_keys")
    q, k, v = qkv(lead, nq, nk, d, dtype)
    run_and_check(tri.FlashAttentionTriton.apply, q, k, v, causal, dtype)


@pytest.mark.parametrize("case", [((2,), 37, 45, 80, torch.float32), ((1, 2), 45, 45, 96, torch.bfloat16),
                                  ((2,), 20, 33, 24, torch.float16)], ids=attention_id)
def test_triton_forward_head_dims_not_a_power_of_two(tri, case):
    """Head dims 80, 96 (GPT-2-like models with n_embd / n_head not a power of two) and 24: the forward
    pads the head dim to a power of two with masks (BLOCK_D); causal and not, O and L against float64.
    (The backward kernels take the head dims of HEAD_DIMS only: test_bad_input.)"""
    lead, nq, nk, d, dtype = case
    q, k, v = qkv(lead, nq, nk, d, dtype, grad=False)
    for causal in (False, True):
        o, lse = assert_is_kernel(lambda: tri.attention_forward(q, k, v, causal), forbid_of(tri.attention_forward),
                                  f"attention_forward d={d}")
        r_o, r_l = ref.attention(q, k, v, causal)
        check(o, r_o, dtype, f"O, d={d}, causal={causal}")
        check_lse(lse, r_l, dtype)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", GPU_CASES, ids=attention_id)
def test_triton_gpu_sizes(tri, case, causal):
    lead, nq, nk, d, dtype = case
    if causal and nq > nk:
        pytest.skip("rows with no key: see test_triton_rows_without_keys")
    q, k, v = qkv(lead, nq, nk, d, dtype)
    run_and_check(tri.FlashAttentionTriton.apply, q, k, v, causal, dtype)


#: Long key sequences (lead, Nq, Nk, d), where an output accumulator (or row sum) kept in 16 bits
#: between key tiles shows: its error grows with the key tiles a row walks, PyTorch's does not.
#: Under the interpreter one query tile against 188 key tiles of 16 (Nk = 3001, a ragged last
#: tile; causal: bottom-right, every row sees >= 2970 keys): honest ~1.3x SDPA's error (bf16:
#: 2.2e-3 vs 1.7e-3), the bf16-rounded accumulator ~10x (fp16: ~10x too). ~3 s per case there.
LONG_CASES = ([((1,), 32, 3001, 64)] if TRITON_INTERPRET
              else [((2, 4), 4096, 4096, 64), ((1, 4), 1000, 8195, 128)])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dtype_id)
@pytest.mark.parametrize("case", LONG_CASES, ids=attention_id)
def test_triton_long_keys_as_accurate_as_torch(tri, case, dtype, causal):
    """At long Nk, O and dQ, dK, dV against float64 are at most a few times as far off as
    F.scaled_dot_product_attention's on the same inputs (common.testing.calibrated_tol): keep acc,
    l_i and the gradient accumulators in fp32 from the first key tile to the last."""
    lead, nq, nk, d = case
    q, k, v = qkv(lead, nq, nk, d, dtype)
    do = randn(*q.shape, dtype=dtype)
    o = tri.FlashAttentionTriton.apply(q, k, v, causal)
    r_o, _ = ref.attention(q, k, v, causal)
    t_o = torch_attention(q, k, v, causal)
    what = f"{tuple(lead)} Nq={nq} Nk={nk} d={d} causal={causal}"
    assert_as_accurate_as_torch(o, r_o, t_o, dtype=dtype, name=f"O, {what}")
    grads = torch.autograd.grad(o, (q, k, v), do)
    t_grads = torch.autograd.grad(t_o, (q, k, v), do)
    for name, g, r, t in zip(("dQ", "dK", "dV"), grads, ref.attention_backward(q, k, v, do, causal), t_grads):
        assert_as_accurate_as_torch(g, r, t, dtype=dtype, name=f"{name}, {what}")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=dtype_id)
def test_triton_rows_without_keys(tri, dtype):
    rows_without_keys(tri.FlashAttentionTriton.apply, dtype, DEVICE)


@pytest.mark.parametrize("layout", ["head_strided", "last_dim_strided"])
def test_triton_strided_inputs(tri, layout):
    """[B, S, H, d] memory seen as [B, H, S, d] (no copy), and a strided last dim."""
    b, h, nq, nk, d, dtype = 2, 2, 45, 70, 32, torch.float16
    if layout == "head_strided":
        mk = lambda n: randn(b, n, h, d, dtype=dtype).transpose(1, 2).requires_grad_()
        q, k, v = mk(nq), mk(nk), mk(nk)
    else:
        q, k, v = (non_contiguous(randn(b, h, n, d, dtype=dtype)).requires_grad_() for n in (nq, nk, nk))
    assert not q.is_contiguous()
    for causal in (False, True):
        run_and_check(tri.FlashAttentionTriton.apply, q, k, v, causal, dtype)


def test_triton_mixed_layouts(tri):
    """q, k and v each with its own strides: contiguous, head-strided, strided last dim."""
    b, h, nq, nk, d, dtype = 2, 2, 37, 53, 32, torch.bfloat16
    q = randn(b, h, nq, d, dtype=dtype).requires_grad_()
    k = randn(b, nk, h, d, dtype=dtype).transpose(1, 2).requires_grad_()
    v = non_contiguous(randn(b, h, nk, d, dtype=dtype)).requires_grad_()
    for causal in (False, True):
        run_and_check(tri.FlashAttentionTriton.apply, q, k, v, causal, dtype)


def test_triton_upstream_grad_strided(tri):
    """dO as autograd hands it over can be strided (here: from a transpose)."""
    q, k, v = qkv((2, 2), 37, 37, 32, torch.float16)
    o = tri.FlashAttentionTriton.apply(q, k, v, True)
    do_t = randn(2, 37, 2, 32, dtype=torch.float16)
    (o * 1).backward(do_t.transpose(1, 2))   # non-contiguous gradient reaches the backward
    r = ref.attention_backward(q, k, v, do_t.transpose(1, 2), True)
    for name, g, e in zip(("dQ", "dK", "dV"), (q.grad, k.grad, v.grad), r):
        check(g, e, torch.float16, name, grad=True)


def test_triton_grads_in_the_inputs_layout(tri):
    """GPT-2's q, k, v are head views of one [B, S, 3·H·d] tensor. dQ, dK, dV come back dense in that
    [B, S, H, d] memory order, so autograd takes them back through the views without a copy."""
    b, s, h, d, dtype = 2, 37, 3, 32, torch.bfloat16
    qkv_ = randn(b, s, 3 * h * d, dtype=dtype)
    q, k, v = (t.view(b, s, h, d).transpose(1, 2) for t in qkv_.split(h * d, dim=-1))
    o, lse = tri.attention_forward(q, k, v, True)
    do = randn(b, h, s, d, dtype=dtype)
    grads = tri.attention_backward(q, k, v, o, lse, do, True)
    for name, g, r in zip(("dQ", "dK", "dV"), grads, ref.attention_backward(q, k, v, do, True)):
        check(g, r, dtype, name, grad=True)
        assert g.transpose(1, 2).is_contiguous(), \
            f"{name}: strides {g.stride()}; expected dense memory in the input's [B, S, H, d] order"


@pytest.mark.gpu
def test_triton_memory_is_linear(tri):
    """Peak extra memory of forward+backward grows ~linearly in S (naive grows as S²)."""
    peaks = {}
    for s in (2048, 8192):
        q, k, v = qkv((1, 4), s, s, 64, torch.bfloat16)
        do = torch.randn_like(q)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        o = tri.FlashAttentionTriton.apply(q, k, v, True)
        torch.autograd.grad(o, (q, k, v), do)
        torch.cuda.synchronize()
        peaks[s] = torch.cuda.max_memory_allocated() - base
        expected = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
        assert rel_error(o, expected) < 1e-2, "wrong output"
    ratio = peaks[8192] / peaks[2048]
    assert ratio < 6, f"peak extra memory grew {ratio:.1f}x for 4x the sequence (linear: ~4x, quadratic: 16x)"
    assert peaks[8192] < 4 * 8192 * 8192, "peak extra memory is as large as the attention matrix"


# ------------------------------------------------------------------------ bad input (given code)
@pytest.mark.given
@pytest.mark.parametrize("module", [TORCH_MOD, TRITON_MOD])
def test_bad_input(impl, module):
    mod = impl.load(module)
    apply = (mod.FlashAttentionTorch if module == TORCH_MOD else mod.FlashAttentionTriton).apply
    dev = "cpu" if module == TORCH_MOD else DEVICE
    q, k, v = qkv((2,), 16, 16, 32, torch.float16, device=dev, grad=False)
    with pytest.raises(TypeError, match="dtype"):
        apply(q.to(torch.int32), k, v, False)
    with pytest.raises(TypeError, match="dtypes differ"):
        apply(q, k.float(), v, False)
    with pytest.raises(ValueError, match="same shape"):
        apply(q, k, v[:, :8], False)
    with pytest.raises(ValueError, match="leading dims"):
        apply(q[:1], k, v, False)
    with pytest.raises(ValueError, match="leading dims and d"):
        apply(q[..., :16], k, v, False)
    if module == TRITON_MOD:
        with pytest.raises(ValueError, match="head dim d=48 is not supported by the backward"):
            apply(*(randn(2, 16, 48, dtype=torch.float16).requires_grad_() for _ in range(3)), False)
        with pytest.raises(ValueError, match="head dim d=300"):
            mod.attention_forward(*(randn(2, 16, 300, dtype=torch.float16) for _ in range(3)), False)
        with pytest.raises(ValueError, match="expected a tensor on"):
            apply(*(torch.empty(2, 16, 32, device="meta", dtype=torch.float16) for _ in range(3)), False)


def test_triton_fresh_output_each_call(impl):
    """The same q, k, v tensors with new values give the new O (nothing memoised by address), and the
    first call's O survives a second call (no output buffer shared by calls)."""
    fx = impl.load(TRITON_MOD)
    dtype = torch.bfloat16 if HAS_CUDA else torch.float32
    q, k, v = qkv((1, 2), 37, 53, 32, dtype, grad=False)
    assert_fresh_each_call(lambda q, k, v: fx.flash_attention(q, k, v, True), {"q": q, "k": k, "v": v},
                           lambda q, k, v: ref.attention(q, k, v, True)[0], dtype=dtype, name="flash_attention")


@pytest.mark.gpu
def test_triton_forward_replays_from_a_cuda_graph(impl):
    """Captured once, replayed on new values in the same q, k, v: the new O (the grader times it so)."""
    fx = impl.load(TRITON_MOD)
    q, k, v = qkv((2, 3), 300, 300, 64, torch.bfloat16, grad=False)
    assert_fresh_in_graph(lambda q, k, v: fx.flash_attention(q, k, v, True), {"q": q, "k": k, "v": v},
                          lambda q, k, v: ref.attention(q, k, v, True)[0], dtype=torch.bfloat16, name="flash_attention")
