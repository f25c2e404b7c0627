"""Native autograd (common.course.native): flash attention's forward and backward replayed from C++ (not graded).

On a GPU, once a key's backward has run from Python, stage 7's ``flash_attention`` replays that key's
launches from C++ (a torch::autograd::Function: no Python in the backward pass). These check that the
replay computes what the Python path computes, bit for bit, and that every call it was not made for
(another gradient layout, a misaligned input, a launch hook, other launch options) still gets the right
answer. On a CPU: the extension is not there and says why; its source compiles against the headers.
"""
from __future__ import annotations


import pytest
import torch

from common import HAS_CUDA
from common.course import native
from common.impl import Impl

FT = Impl.get("solutions").load("a07_flash_attention.flash_triton")


def test_without_a_gpu_there_is_no_extension():
    if HAS_CUDA:
        pytest.skip("a CPU check")
    assert native.ext() is None and "GPU" in native.reason


@pytest.mark.nvcc
def test_source_compiles():
    from common.cuda_ext import _cuda_include, compile_check
    if not _cuda_include():
        pytest.skip("no CUDA headers (cuda.h) here")
    compile_check([native.SOURCE], extra_flags=("-DTORCH_EXTENSION_NAME=course_native_check",))


def _inputs(shape, dtype, gpt2=False):
    b, h, s, d = shape
    if gpt2:       # GPT-2's layout: head views of one [B, S, 3·H·d] leaf
        qkv = torch.randn(b, s, 3 * h * d, device="cuda", dtype=dtype, requires_grad=True)
        return qkv, [t.view(b, s, h, d).transpose(1, 2) for t in qkv.split(h * d, dim=-1)]
    leaves = [torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3)]
    return leaves, leaves


def _grads(leaves, out, do):
    leaves = leaves if isinstance(leaves, list) else [leaves]
    for t in leaves:
        t.grad = None
    out.backward(do)
    return [t.grad.clone() for t in leaves]


def _record(leaves, q, k, v, do, causal=True):
    """Two steps, forward and backward: the first (from Python) makes the key's plan where it can."""
    for _ in range(2):
        _grads(leaves, FT.flash_attention(q, k, v, causal), do)


@pytest.fixture(scope="module")
def ext():
    if not HAS_CUDA:
        pytest.skip("needs a CUDA GPU")
    m = native.load(wait=True)
    if m is None:
        pytest.skip(f"native autograd unavailable: {native.reason}")
    return m


@pytest.mark.gpu
@pytest.mark.parametrize("shape,dtype,causal,gpt2", [((2, 3, 100, 64), torch.bfloat16, True, False),
                                                     ((1, 2, 77, 32), torch.float16, False, False),
                                                     ((2, 4, 129, 64), torch.bfloat16, True, True),
                                                     ((1, 2, 65, 32), torch.float32, True, False)])
def test_replay_matches_the_python_path(ext, shape, dtype, causal, gpt2):
    leaves, (q, k, v) = _inputs(shape, dtype, gpt2)
    do = torch.randn(shape, device="cuda", dtype=dtype)
    with native.disabled():
        ref = FT.flash_attention(q, k, v, causal)
        ref_g = _grads(leaves, ref, do)
        assert ref.grad_fn is not None and not native.replayed(ref)
    _record(leaves, q, k, v, do, causal)
    key = (FT.meta(q), FT.meta(k), FT.meta(v), causal)
    assert FT._NATIVE.get(key, -1) >= 0, "no native plan was made for this key"
    out = FT.flash_attention(q, k, v, causal)
    assert native.replayed(out), out.grad_fn
    g = _grads(leaves, out, do)
    assert torch.equal(out, ref)
    for a, b in zip(g, ref_g):
        assert torch.equal(a, b)
    # a gradient in another layout (transposed storage) is copied into the plan's: the same numbers
    do_t = do.transpose(-1, -2).contiguous().transpose(-1, -2)
    out = FT.flash_attention(q, k, v, causal)
    for a, b in zip(_grads(leaves, out, do_t), ref_g):
        assert torch.equal(a, b)
    # an input that is not 16-byte aligned is not the plan's call: the Python path, the same result
    if not gpt2:
        buf = torch.empty(q.numel() + 1, device="cuda", dtype=dtype)
        q2 = buf[1:].view(shape).copy_(q.detach()).requires_grad_()
        out = FT.flash_attention(q2, k, v, causal)
        assert out.grad_fn is not None and not native.replayed(out)
        assert torch.equal(out, ref)


@pytest.mark.gpu
def test_hooks_options_and_no_grad_take_the_python_path(ext):
    import triton
    leaves, (q, k, v) = _inputs((1, 2, 64, 64), torch.bfloat16)
    do = torch.randn_like(q)
    _record(leaves, q, k, v, do)
    assert native.replayed(FT.flash_attention(q, k, v, True))
    seen = []

    def hook(*args):
        seen.append(1)
    triton.knobs.runtime.launch_enter_hook.add(hook)
    try:
        out = FT.flash_attention(q, k, v, True)
    finally:
        triton.knobs.runtime.launch_enter_hook.remove(hook)
    assert seen and out.grad_fn is not None and not native.replayed(out)
    with FT.launch_options(poison=True):
        out = FT.flash_attention(q, k, v, True)
        assert out.grad_fn is not None and not native.replayed(out)
    with torch.no_grad():
        assert FT.flash_attention(q, k, v, True).grad_fn is None


@pytest.mark.gpu
def test_a_launch_fallen_back_to_smaller_tiles_is_not_replayed(ext):
    """fp32 at d = 128 does not fit the table's tiles on any GPU (smaller_configs): that key keeps the Python path,
    and a key after it (bf16) is still replayed."""
    leaves, (q, k, v) = _inputs((1, 2, 65, 128), torch.float32)
    do = torch.randn_like(q)
    with native.disabled():
        ref = FT.flash_attention(q, k, v, True)
        ref_g = _grads(leaves, ref, do)
    _record(leaves, q, k, v, do)
    assert FT._smaller, "fp32 at d = 128 ran without a fallback: pick another shape for this test"
    assert FT._NATIVE.get((FT.meta(q), FT.meta(k), FT.meta(v), True)) == -1
    out = FT.flash_attention(q, k, v, True)
    assert not native.replayed(out) and torch.equal(out, ref)
    for a, b in zip(_grads(leaves, out, do), ref_g):
        assert torch.equal(a, b)
    leaves, (q, k, v) = _inputs((1, 2, 70, 64), torch.bfloat16)
    do = torch.randn_like(q)
    _record(leaves, q, k, v, do)
    assert native.replayed(FT.flash_attention(q, k, v, True))


@pytest.mark.gpu
def test_a_launch_the_driver_refuses_falls_back_to_python(ext, monkeypatch):
    leaves, (q, k, v) = _inputs((1, 2, 48, 64), torch.bfloat16)
    do = torch.randn_like(q)
    _record(leaves, q, k, v, do)
    key = (FT.meta(q), FT.meta(k), FT.meta(v), True)
    assert FT._NATIVE[key] >= 0

    class Refuses:
        def apply(self, *args):
            raise RuntimeError("native autograd: cuLaunchKernelEx failed with CUresult 1")
    monkeypatch.setattr(native, "_module", Refuses())
    out = FT.flash_attention(q, k, v, True)
    assert out.grad_fn is not None and not native.replayed(out) and FT._NATIVE[key] == -1
    with native.disabled():
        assert torch.equal(out, FT.flash_attention(q, k, v, True))


@pytest.mark.gpu
def test_one_tensor_as_q_k_and_v_records_no_plan_for_other_calls(ext):
    """flash_attention(x, x, x) has the key of three separate tensors of x's shape: a plan recorded from it
    would read q at k's and v's places for them. No plan from it, and later separate calls of that key get
    their own answers (from the Python path: the key's prepared launches keep the first call's aliasing)."""
    x = torch.randn(1, 2, 40, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn_like(x)
    _record(x, x, x, x, do)
    key = (FT.meta(x),) * 3 + (True,)
    assert FT._NATIVE.get(key, -1) < 0
    leaves, (q, k, v) = _inputs(tuple(x.shape), torch.bfloat16)
    with native.disabled():
        ref = FT.flash_attention(q, k, v, True)
        ref_g = _grads(leaves, ref, do)
    for _ in range(3):
        out = FT.flash_attention(q, k, v, True)
        assert torch.equal(out, ref)
        for a, b in zip(_grads(leaves, out, do), ref_g):
            assert torch.equal(a, b)


@pytest.mark.gpu
def test_a_thread_that_never_used_cuda_replays(ext):
    """A new thread has no current CUDA context: the extension makes the device's primary one current (as
    Triton's launcher does) instead of failing the launch."""
    import threading
    leaves, (q, k, v) = _inputs((1, 2, 56, 64), torch.bfloat16)
    do = torch.randn_like(q)
    with native.disabled():
        ref = FT.flash_attention(q, k, v, True)
        ref_g = _grads(leaves, ref, do)
    _record(leaves, q, k, v, do)
    got = {}

    def work():
        try:
            out = FT.flash_attention(q, k, v, True)
            got["replayed"], got["out"] = native.replayed(out), out
            got["grads"] = _grads(leaves, out, do)
        except Exception as e:  # noqa: BLE001 - reported below
            got["error"] = repr(e)
    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert "error" not in got, got["error"]
    assert got["replayed"] and torch.equal(got["out"], ref)
    for a, b in zip(got["grads"], ref_g):
        assert torch.equal(a, b)


@pytest.mark.gpu
def test_a_plan_replays_one_tensor_as_q_k_and_v(ext):
    """The other way round: a plan recorded from separate q, k, v, replayed on flash_attention(x, x, x)."""
    leaves, (q, k, v) = _inputs((1, 2, 44, 64), torch.bfloat16)
    do = torch.randn_like(q)
    _record(leaves, q, k, v, do)
    x = q.detach().clone().requires_grad_()
    with native.disabled():
        ref = FT.flash_attention(x, x, x, True)
        (ref_g,) = _grads(x, ref, do)
    out = FT.flash_attention(x, x, x, True)
    assert native.replayed(out) and torch.equal(out, ref)
    (g,) = _grads(x, out, do)
    assert torch.equal(g, ref_g)
