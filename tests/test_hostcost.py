"""The host-cost bench (common.course.hostcost) and the launch helpers (common.launch) on a CPU (not graded).

The numbers are the GPU's (lectures/_tools/gpu/hostcost_run.sh); here: the helpers compute what Triton's do,
plain_eager sends every traced, fake or differentiable call through the registered op, and the bench's
stubbed mode runs a case and writes its table.
"""
from __future__ import annotations

import pytest
import torch
import triton

import common
from common.course import hostcost
from common.impl import Impl
from common.launch import cdiv, next_power_of_2, plain_eager
from common.profiling import trace_ops


def test_integer_helpers_match_triton():
    for n in (0, 1, 2, 3, 15, 16, 17, 1000, 4097):
        assert next_power_of_2(n) == triton.next_power_of_2(n)
        for b in (1, 16, 64):
            assert cdiv(n, b) == triton.cdiv(n, b)


def test_plain_eager_only_when_nothing_traces():
    x = torch.randn(4)
    assert plain_eager(x)
    assert not plain_eager(torch.randn(4, requires_grad=True))
    with torch.no_grad():
        assert plain_eager(torch.randn(4, requires_grad=True))
    with trace_ops():
        assert not plain_eager(x)
    assert not plain_eager(torch.nn.Parameter(torch.randn(4)))
    seen = []
    torch.compile(lambda t: (seen.append(plain_eager(t)), t + 1)[1], backend="eager", fullgraph=False)(x)
    assert seen == [False]


@pytest.mark.skipif(not common.TRITON_INTERPRET, reason="the stubbed mode needs the Triton interpreter")
def test_stubbed_bench_writes_its_table(tmp_path):
    rows = hostcost.run_cases(Impl.get("solutions"), ["a03_add_bias"], stub=True, log=lambda *a: None)
    assert [r["key"] for r in rows] == ["bare", "a03_add_bias"]
    assert all(r["course_us"] > 0 and r["torch_us"] > 0 for r in rows)
    hostcost.write(rows, tmp_path, "hc", "cmd", "CPU")
    assert "add_bias" in (tmp_path / "hc.md").read_text()
    assert hostcost.compare(tmp_path / "hc.csv", tmp_path / "hc.csv") == 0


# ----------------------------------------------------------------------------- the fast launcher
def _copy_kernel():
    import triton.language as tl

    @triton.jit
    def copy_scaled(X, Y, n, scale, BLOCK: tl.constexpr, DOUBLE: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + i, mask=i < n)
        y = x * scale
        if DOUBLE:
            y = y * 2
        tl.store(Y + i, y.to(Y.dtype.element_ty), mask=i < n)
    return copy_scaled


def test_launcher_launches_what_triton_launches():
    """Every key Triton specialises on gets its own compiled kernel: pointer alignment (a view one
    element in), integers equal to 1 or divisible by 16, dtypes, constexprs, options, a grid given as a
    function, another stream. On the CPU (interpreter) every call takes Triton's own path."""
    from common.launch import Launcher
    kernel = _copy_kernel()
    launch = Launcher(kernel)
    dev = common.DEVICE
    seen = set()
    for _ in range(2):                     # the second round hits the cache for every key
        for n in (1, 16, 17, 1000, 4096):
            for dtype in (torch.float32, torch.float16):
                for offset in (0, 1):
                    for double in (False, True):
                        x = torch.randn(n + offset, device=dev).to(dtype)[offset:]
                        y = torch.full_like(x, float("nan"))
                        block = 64 if n < 1000 else 256
                        grid = (cdiv(n, block),) if double else (lambda meta: (cdiv(n, meta["BLOCK"]),))
                        ck = launch[grid](x, y, n, 2.0, BLOCK=block, DOUBLE=double, num_warps=2 if double else 4)
                        seen.add(id(ck))
                        expect = (x.float() * 2.0 * (2 if double else 1)).to(dtype)   # exact: powers of 2
                        torch.testing.assert_close(y, expect, rtol=0, atol=0, msg=f"n={n} {dtype} +{offset} {double}")
    if common.HAS_CUDA:
        assert len(launch._cache) >= 2 * 2 * 2 * 3     # n: {1}, {16, 4096 (% 16)}, {17, 1000}... at least
        s = torch.cuda.Stream()
        x = torch.randn(4096, device=dev)
        y = torch.zeros_like(x)
        with torch.cuda.stream(s):
            torch.cuda._sleep(1_000_000)           # the launch below must queue behind this, on s
            launch[(16,)](x, y, 4096, 1.0, BLOCK=256, DOUBLE=False)
            assert torch.cuda.current_stream() == s
        s.synchronize()
        torch.testing.assert_close(y, x, rtol=0, atol=0)


def test_prepared_launch_launches_what_triton_launches():
    """A plan's prepared launch (common.launch.Prepared) gives the kernel Triton would pick for every call:
    its shortcut is taken only for integers, dtypes and 16-byte alignments (a view one element in, fp16
    after fp32) a call before it had; a float may change (Triton does not specialise it); another n is a
    kernel of its own; an int where a float was (2, then 2.0) is not taken for it; another stream is
    honoured. ``fast(kernel)[grid](...)`` with a grid of integers makes and keeps such launches itself."""
    from common.launch import fast
    kernel = _copy_kernel()
    dev = common.DEVICE
    prepared = {double: fast(kernel).prepare((cdiv(1000, 64),), BLOCK=64, DOUBLE=double) for double in (False, True)}
    run = fast(kernel)
    for _ in range(2):
        for n in (1000, 1000, 17):             # 17: not the integers the plan was first called with
            for dtype in (torch.float32, torch.float16):
                for offset in (0, 1, 0):
                    for double, scale in ((False, 2.0), (True, 1.0), (True, 4.0), (False, 2), (True, 2), (True, 2.0)):
                        x = torch.randn(n + offset, device=dev).to(dtype)[offset:]
                        y = torch.full_like(x, float("nan"))
                        if type(scale) is int or scale == 2.0:     # the launcher's own prepared launches
                            run[(cdiv(n, 64),)](x, y, n, scale, BLOCK=64, DOUBLE=double)
                        else:
                            prepared[double](x, y, n, scale)
                        expect = (x.float() * scale * (2 if double else 1)).to(dtype)   # exact: powers of 2
                        torch.testing.assert_close(y, expect, rtol=0, atol=0,
                                                   msg=f"n={n} {dtype} +{offset} {double} {scale}")
    inplace = fast(kernel).prepare((cdiv(1000, 64),), BLOCK=64, DOUBLE=False)
    for same in (True, True, False, True):     # one tensor at two positions (asked once), then two tensors
        x = torch.randn(1000, device=dev)
        y = x if same else torch.empty_like(x)
        expect = 2 * x
        inplace(x, y, 1000, 2.0)
        torch.testing.assert_close(y, expect, rtol=0, atol=0, msg=f"same={same}")
    if common.HAS_CUDA:
        assert inplace.same_at == [(1, 0)] and len(inplace.kernels) == 1
        from triton import knobs
        launcher, debug = fast(kernel), knobs.runtime.debug
        compiled = len(launcher._cache)
        try:                                   # Triton's debug knob set after the first call: not that kernel
            knobs.runtime.debug = True
            x = torch.randn(1000, device=dev)
            inplace(x, x, 1000, 2.0)
            assert len(launcher._cache) == compiled + 1, "the prepared launch ignored Triton's debug knob"
        finally:
            knobs.runtime.debug = debug
        p = prepared[True]                     # {1000, 17} x {fp32, fp16} x {aligned, not}
        assert p.ready and len(p.kernels) == 8 and {key[0] for key in p.kernels} == {(1000,), (17,)}
        assert len(run._prepared) == 4         # (grid: n 1000 or 17) x (DOUBLE False or True)
        s = torch.cuda.Stream()
        x = torch.randn(1000, device=dev)
        y = torch.zeros_like(x)
        with torch.cuda.stream(s):
            torch.cuda._sleep(1_000_000)           # the launch below must queue behind this, on s
            p(x, y, 1000, 1.0)
        s.synchronize()
        torch.testing.assert_close(y, 2 * x, rtol=0, atol=0)
    else:
        assert not prepared[True].ready            # the interpreter: every call goes through the launcher
