"""The course's bounds check for the Triton interpreter (common/interpreter_patch.py).

Plain Triton's interpreter reads and writes past the end of a tensor's host buffer
without a word and the process may abort later; with ``import common`` an access
outside every tensor argument raises OutOfBoundsError naming the kernel, the
argument and the offsets. Not graded (course self-check); CPU/interpreter only.
"""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import common
from common.interpreter_patch import OutOfBoundsError, patch_bounds_check

pytestmark = pytest.mark.skipif(not common.TRITON_INTERPRET, reason="checks the Triton interpreter (TRITON_INTERPRET=1)")


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, LOAD_LE: tl.constexpr, STORE_LE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    load_mask = (offs <= n) if LOAD_LE else (offs < n)       # <=: the off-by-one bug
    store_mask = (offs <= n) if STORE_LE else (offs < n)
    x = tl.load(x_ptr + offs, mask=load_mask, other=0.0)
    tl.store(out_ptr + offs, x, mask=store_mask)


@triton.jit
def copy_unmasked_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs))


@triton.jit
def shifted_kernel(x_ptr, out_ptr, n, shift, stride, BLOCK: tl.constexpr):
    """out[i] = x[(i + shift) * stride] for i < n: offsets may be negative or past numel on purpose."""
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + (offs + shift) * stride, mask=mask, other=0.0)
    tl.store(out_ptr + offs, x, mask=mask)


@triton.jit
def _load_helper(ptr, offs, mask):
    return tl.load(ptr + offs, mask=mask, other=0.0)


@triton.jit
def nested_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, _load_helper(x_ptr, offs, offs <= n), mask=offs < n)


@triton.jit
def concat_kernel(a_ptr, b_ptr, out_ptr, na, n, BLOCK: tl.constexpr):
    """out = cat(a, b): each lane's pointer comes from one of two tensors (tl.where)."""
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    src = tl.where(offs < na, a_ptr + offs, b_ptr + (offs - na))
    tl.store(out_ptr + offs, tl.load(src, mask=mask, other=0.0), mask=mask)


@triton.jit
def block_ptr_kernel(x_ptr, out_ptr, M, N, BLOCK: tl.constexpr, CHECK: tl.constexpr):
    src = tl.make_block_ptr(x_ptr, (M, N), (N, 1), (0, 0), (BLOCK, BLOCK), (1, 0))
    dst = tl.make_block_ptr(out_ptr, (M, N), (N, 1), (0, 0), (BLOCK, BLOCK), (1, 0))
    if CHECK:
        tl.store(dst, tl.load(src, boundary_check=(0, 1), padding_option="zero"), boundary_check=(0, 1))
    else:
        tl.store(dst, tl.load(src))


def _copy(n=1000, block=256, load_le=False, store_le=False):
    x = torch.randn(n)
    out = torch.zeros(n)
    copy_kernel[(triton.cdiv(n, block),)](x, out, n, BLOCK=block, LOAD_LE=load_le, STORE_LE=store_le)
    return x, out


def test_correct_mask_passes():
    x, out = _copy()                   # 4 programs x 256 lanes = 1024 offsets for 1000 elements, masked
    assert torch.equal(out, x)


def test_off_by_one_load_raises_with_a_clear_message():
    with pytest.raises(OutOfBoundsError) as ei:
        _copy(load_le=True)
    msg = str(ei.value)
    first = msg.splitlines()[0]
    assert first.startswith("copy_kernel: tl.load from argument 'x_ptr' out of bounds:"), msg
    assert "element offsets [1000] lie outside the tensor's 1000 elements (shape (1000,))" in first, msg
    assert "first bad lane: lane 232, offset 1000, mask was True" in first, msg
    assert "program_id (3, 0, 0)" in first, msg
    assert "not `offs <= n`" in msg


def test_off_by_one_store_raises_before_writing():
    with pytest.raises(OutOfBoundsError, match=r"copy_kernel: tl\.store to argument 'out_ptr' out of bounds: "
                                               r"element offsets \[1000\] lie outside the tensor's 1000 elements"):
        _copy(store_le=True)


def test_error_is_an_interpreter_error_and_the_next_launch_works():
    from triton.runtime.errors import InterpreterError
    with pytest.raises(InterpreterError):
        _copy(load_le=True)
    with pytest.raises(IndexError):
        _copy(load_le=True)
    x, out = _copy()
    assert torch.equal(out, x)


def test_unmasked_access_past_the_end():
    x, out = torch.randn(100), torch.zeros(100)
    with pytest.raises(OutOfBoundsError) as ei:
        copy_unmasked_kernel[(1,)](x, out, BLOCK=128)
    msg = str(ei.value)
    assert "tl.load from argument 'x_ptr'" in msg and "no mask given" in msg
    assert "element offsets [100, 101, 102, 103, 104, 105, 106, 107, ...]" in msg and "(28 bad lanes;" in msg
    big_x, big_out = torch.randn(128), torch.zeros(128)    # the same kernel on tensors that hold the block: fine
    copy_unmasked_kernel[(1,)](big_x, big_out, BLOCK=128)
    assert torch.equal(big_out, big_x)


def test_view_with_storage_offset_may_reach_back_into_its_storage():
    base = torch.arange(20, dtype=torch.float32)
    view = base[5:15]                   # storage_offset 5, numel 10, storage of 20 elements
    out = torch.zeros(4)
    shifted_kernel[(1,)](view, out, 4, -5, 1, BLOCK=4)          # view[-5..-2]: inside the storage, legal
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0]
    shifted_kernel[(1,)](view, out, 4, 11, 1, BLOCK=4)          # view[11..14] = base[16..19], past numel: legal
    assert out.tolist() == [16.0, 17.0, 18.0, 19.0]
    with pytest.raises(OutOfBoundsError) as ei:
        shifted_kernel[(1,)](view, out, 4, -6, 1, BLOCK=4)      # base[-1]: before the storage
    msg = str(ei.value)
    assert "shifted_kernel: tl.load from argument 'x_ptr' out of bounds: element offsets [-6]" in msg
    assert "storage spans element offsets -5 to 14 from its first element" in msg
    with pytest.raises(OutOfBoundsError, match=r"element offsets \[15\]"):
        shifted_kernel[(1,)](view, out, 4, 12, 1, BLOCK=4)      # base[20]: past the storage


def test_strided_view():
    base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    col = base[:, 3]                    # stride 6, storage offset 3
    out = torch.zeros(4)
    shifted_kernel[(1,)](col, out, 4, 0, 6, BLOCK=4)
    assert out.tolist() == col.tolist()
    with pytest.raises(OutOfBoundsError, match=r"element offsets \[24\] lie outside the tensor's memory "
                                               r"\(shape \(4,\), strides \(6,\)"):
        shifted_kernel[(1,)](col, out, 4, 1, 6, BLOCK=4)        # rows 1..4: row 4 is past the storage


def test_device_function_error_is_unwrapped():
    x, out = torch.randn(10), torch.zeros(10)
    with pytest.raises(OutOfBoundsError, match=r"^nested_kernel: tl\.load from argument 'x_ptr' out of bounds"):
        nested_kernel[(1,)](x, out, 10, BLOCK=16)


def test_lanes_may_come_from_different_tensors():
    a, b = torch.randn(5), torch.randn(7)
    out = torch.zeros(12)
    concat_kernel[(1,)](a, b, out, 5, 12, BLOCK=16)
    assert torch.equal(out, torch.cat([a, b]))


def test_block_pointers():
    x, out = torch.randn(10, 10), torch.zeros(10, 10)
    block_ptr_kernel[(1,)](x, out, 10, 10, BLOCK=16, CHECK=True)
    assert torch.equal(out, x)
    with pytest.raises(OutOfBoundsError, match=r"block_ptr_kernel: tl\.load from argument 'x_ptr' out of bounds"):
        block_ptr_kernel[(1,)](x, out, 10, 10, BLOCK=16, CHECK=False)


def test_patch_is_idempotent():
    from triton.runtime import interpreter as it
    before = (it.GridExecutor.__call__, it.InterpreterBuilder.create_masked_load)
    patch_bounds_check()
    assert (it.GridExecutor.__call__, it.InterpreterBuilder.create_masked_load) == before


def test_reinterpreted_tensor_counts_bytes():
    x = torch.arange(8, dtype=torch.int32)               # 32 bytes, read as uint8
    out = torch.zeros(32, dtype=torch.uint8)
    shifted_kernel[(1,)](triton.reinterpret(x, tl.uint8), out, 32, 0, 1, BLOCK=32)
    assert torch.equal(out, x.view(torch.uint8))
    with pytest.raises(OutOfBoundsError, match=r"byte offsets \[32\] lie outside the tensor's memory"):
        shifted_kernel[(1,)](triton.reinterpret(x, tl.uint8), out, 32, 1, 1, BLOCK=32)


@triton.jit
def scalar_and_tile_mask_kernel(start_ptr, out_ptr, S_MAX, H, BLOCK_H: tl.constexpr, D: tl.constexpr):
    # the KV-cache write's mask: a scalar condition (from a loaded value) & a tile condition
    t = tl.program_id(0)
    pos = tl.load(start_ptr) + t
    hs = tl.arange(0, BLOCK_H)
    ok = (hs[:, None] < H) & (pos < S_MAX)
    tl.store(out_ptr + hs[:, None] * S_MAX * D + pos * D + tl.arange(0, D)[None, :], 1.0, mask=ok)


@pytest.mark.parametrize("h,block_h", [(3, 4), (1, 1)])
def test_mask_from_a_scalar_and_a_tile(h, block_h):
    """A mask built from a scalar (0-d) comparison and a tile; some programs fully masked off.
    With H = 1 (an argument Triton specialises) the interpreter hands the mask over as int32."""
    out = torch.zeros(h, 5, 4)
    scalar_and_tile_mask_kernel[(3,)](torch.tensor([3], dtype=torch.int32), out, 5, h, BLOCK_H=block_h, D=4)
    want = torch.zeros(h, 5, 4)
    want[:, 3:5] = 1.0
    assert torch.equal(out, want)


@triton.jit
def to_bf16_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs).to(tl.bfloat16))


def test_fp32_to_bf16_rounds_to_nearest_even():
    """Plain Triton's interpreter truncates float32 -> bfloat16 (about half of all values one ulp
    off); patched, the cast rounds to nearest even as a GPU does, and as torch's .to(bfloat16)."""
    from common.interpreter_patch import patch_bf16_round
    x = torch.randn(4096) * 100
    x[:4] = torch.tensor([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, -(1.0 + 2.0**-8), 1.0 - 2.0**-10])   # ties, both ways
    out = torch.empty(4096, dtype=torch.bfloat16)
    to_bf16_kernel[(1,)](x, out, BLOCK=4096)
    assert torch.equal(out.view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
    from triton.runtime import interpreter as it
    before = it.InterpreterBuilder.cast_impl
    patch_bf16_round()
    assert it.InterpreterBuilder.cast_impl is before


@triton.jit
def row_sums_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    """ROWS calls of tl.sum (a device function of triton.language.standard, whose module sees tl.core)
    and of _load_helper (this module's, which sees tl) per program."""
    offs = tl.arange(0, BLOCK)
    for r in range(ROWS):
        tl.store(out_ptr + r, tl.sum(_load_helper(x_ptr + r * n, offs, offs < n), axis=0))


def test_device_calls_reuse_the_launch_patches(monkeypatch):
    """Speed only (common.interpreter_patch._patch_device_calls): inside a launch, a device function whose
    modules are already patched does not walk triton.language again (plain Triton re-patches on every
    call): the patch runs for the launch and for the first call that sees a module the launch did not
    patch (tl.core, which Triton then leaves patched), not once per call. The results are plain Triton's
    and the launch's patches are undone when it ends (tl.load is a builtin again)."""
    from triton.runtime import interpreter as it
    assert getattr(it._patch_lang, "_course_device_calls", False)
    patched = []                 # one entry per module a _patch_lang call patched (tl, tl.core)
    core = it._patch_lang_core
    monkeypatch.setattr(it, "_patch_lang_core", lambda lang, scope: (patched.append(lang.__name__), core(lang, scope)))
    x = torch.randn(6, 37)
    out = torch.zeros(6)
    row_sums_kernel[(1,)](x, out, 37, BLOCK=64, ROWS=6)
    first = list(patched)
    patched.clear()
    row_sums_kernel[(1,)](x, out, 37, BLOCK=64, ROWS=6)
    assert torch.allclose(out, x.sum(dim=1), rtol=1e-6, atol=1e-5), (out, x.sum(dim=1))
    # plain Triton: 13 (the launch, then each of the 6 rows' _load_helper and tl.sum calls)
    assert first.count("triton.language") == 1 and set(first) <= {"triton.language", "triton.language.core"}, first
    assert patched == ["triton.language"], patched                              # the launch's own patch only
    assert tl.core.is_builtin(tl.load) and tl.core.is_builtin(tl.tensor.__add__)  # undone at the launch's end


def test_traceback_shows_the_kernel_line_not_triton_internals(tmp_path):
    """A failing interpreted kernel under pytest: the kernel's own line, then the course's message,
    with none of the dozen frames of Triton's interpreter and language in between (their modules
    carry ``__tracebackhide__``; the kernel's module does not get it from the interpreter)."""
    import subprocess
    import sys

    from common.impl import REPO
    test = tmp_path / "test_oob.py"
    test.write_text("from tests.test_interpreter_patch import _copy\n\n\ndef test_oob():\n    _copy(load_le=True)\n")
    r = subprocess.run([sys.executable, "-m", "pytest", str(test), "-q", "--tb=short", "-p", "no:cacheprovider",
                        "--rootdir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    out = r.stdout
    assert r.returncode == 1 and "OutOfBoundsError: copy_kernel: tl.load" in out, out[-3000:]
    assert "x = tl.load(x_ptr + offs, mask=load_mask, other=0.0)" in out, out[-3000:]      # the kernel's line
    assert "site-packages/triton" not in out and "interpreter.py" not in out, out[-3000:]
    assert "__tracebackhide__" not in copy_kernel.fn.__globals__
