"""The shared checks of common.kernel_check and common.testing.calibrated_tol (not graded):
what they catch and what they let through, on plain torch calls."""
from __future__ import annotations

import pytest
import torch

from common import kernel_check as kc
from common.testing import (CALIBRATION, ERROR_FLOOR, assert_as_accurate_as_torch, calibrated_tol, rel_error,
                            torch_matmul)


def test_assert_is_kernel_names_the_forbidden_ops():
    a, b = torch.randn(5, 7), torch.randn(7, 3)
    with pytest.raises(kc.NotAKernel, match=r"matmul: called PyTorch ops \['aten.mm.default'\]"):
        kc.assert_is_kernel(lambda: torch.matmul(a, b), kc.MATMUL_KERNEL, "matmul")
    out = kc.assert_is_kernel(lambda: a.clone(), kc.MATMUL_KERNEL, "copy")       # allowed: returns the result
    assert torch.equal(out, a)


def test_functions_are_traced_where_no_aten_op_shows():
    """SDPA on inputs that require grad runs as its math composite (bmm, softmax: allowed in 7a):
    only the function trace names it."""
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    with pytest.raises(kc.NotAKernel, match="scaled_dot_product_attention"):
        kc.assert_is_kernel(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q), kc.ATTENTION_TILED, "7a")
    w = torch.randn(4, 7)
    with pytest.raises(kc.NotAKernel, match="'F.linear'"):
        kc.assert_is_kernel(lambda: torch.nn.functional.linear(torch.randn(2, 7), w), kc.FUSED_LINEAR["addmm"], "x")


def test_largest_new_tensor_skips_inputs_and_counts_storage():
    q = torch.randn(2, 64, 16)
    _, big = kc.largest_new_tensor(lambda: (q[:, :8] * 2, q.transpose(-1, -2)), q)
    assert big.elements == 2 * 8 * 16 and "mul" in big.op          # the view of q is not new
    _, big = kc.largest_new_tensor(lambda: (q @ q.transpose(-1, -2))[:, :4, :4], q)
    assert big.elements == 2 * 64 * 64                               # a slice keeps its whole storage
    assert kc.attention_tile_bound(q, q, 32, 16) == 2 * max(32 * 16, 64 * 16)


def test_calibrated_tolerance():
    assert calibrated_tol(0.0, torch.bfloat16) == ERROR_FLOOR[torch.bfloat16]
    assert calibrated_tol(1e-2, torch.float16) == CALIBRATION[torch.float16] * 1e-2
    a, b = torch.randn(32, 4096).bfloat16(), torch.randn(4096, 24).bfloat16()
    ref = a.double() @ b.double()
    base = torch_matmul(a, b)
    assert_as_accurate_as_torch(base, ref, base, dtype=torch.bfloat16)                     # PyTorch itself passes
    acc = torch.zeros(32, 24)
    for k in range(0, 4096, 32):          # an fp32 accumulator rounded to bf16 on every K step
        acc = (acc + a[:, k:k + 32].float() @ b[k:k + 32].float()).bfloat16().float()
    assert rel_error(acc, ref) > CALIBRATION[torch.bfloat16] * rel_error(base, ref)
    with pytest.raises(AssertionError, match="PyTorch's own error"):
        assert_as_accurate_as_torch(acc.bfloat16(), ref, base, dtype=torch.bfloat16)
