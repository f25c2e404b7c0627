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


def test_allowed_kernels_pass_the_kernel_check():
    """A Forbidden's ``allow`` exempts kernels its contract permits (a copy) from its ``kernels`` patterns; every
    other kernel those patterns match is still refused (kernel names as a GPU profile gives them)."""
    copy = "void at::native::elementwise_kernel<128, 4, direct_copy_kernel_cuda(at::TensorIteratorBase&)>(int)"
    exp = "void at::native::vectorized_elementwise_kernel<4, at::native::exp_kernel_cuda>(int)"
    gqa = kc.GQA_ATTENTION
    assert kc.forbidden_kernels([copy, exp, "_gqa_decode_split"], gqa) == [exp]
    assert kc.forbidden_kernels([copy], kc.Forbidden(kernels=kc.ATEN_KERNELS)) == [copy]


def test_functions_are_traced_where_no_aten_op_shows():
    """SDPA on inputs that require grad runs as its math composite (bmm, softmax: allowed in 7a):
    only the function trace names it."""
    q = torch.randn(1, 2, 8, 16, requires_grad=True)
    with pytest.raises(kc.NotAKernel, match="scaled_dot_product_attention"):
        kc.assert_is_kernel(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q), kc.ATTENTION_TILED, "7a")
    w = torch.randn(4, 7)
    with pytest.raises(kc.NotAKernel, match="'F.linear'"):
        kc.assert_is_kernel(lambda: torch.nn.functional.linear(torch.randn(2, 7), w), kc.FUSED_LINEAR["addmm"], "x")


def test_a_contract_that_names_an_op_says_which():
    """FusedLinear's "addmm" backend is one torch.addmm: its error names the op to use, not "a kernel"."""
    x, w, b = torch.randn(2, 7), torch.randn(7, 4), torch.randn(4)
    with pytest.raises(kc.NotAKernel, match=r"\['aten.add.Tensor', 'aten.mm.default'\], which its contract does not "
                                            r"allow: use one torch.addmm\(bias, x2, weight_t\)"):
        kc.assert_is_kernel(lambda: x @ w + b, kc.FUSED_LINEAR["addmm"], "FusedLinear(backend='addmm')")
    assert "use x2 @ weight_t (the GEMM), then the stage's add_bias_" in kc.ops_message(
        "t", ["aten.addmm"], kc.FUSED_LINEAR["triton"].use)


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


ALL_FORBIDDEN = [kc.BIAS_KERNEL, *kc.FUSED_LINEAR.values(), kc.GELU_KERNEL, kc.MATMUL_KERNEL, kc.ATTENTION_TILED,
                 kc.ATTENTION_KERNEL, kc.DECODE_ATTENTION, kc.LAYERNORM_KERNEL, kc.WRITE_KV, kc.ENGINE]


def test_views_in_a_wrapper_are_never_forbidden():
    """A wrapper's views and reshapes (expand, view, as_strided, transpose, ...) are not the work a kernel
    replaces: no stage's Forbidden refuses them. Op names are matched whole: "aten.exp" is exp and
    exp_, never aten.expand (once a prefix, it zeroed a stage for a harmless .expand())."""
    x = torch.randn(4, 6)
    with kc.watch() as t:
        x.expand(3, 4, 6)
        x[None].expand_as(torch.empty(2, 4, 6))
        x.view(6, 4)
        x.reshape(24)
        x.as_strided((2, 3), (6, 1))
        x.t().transpose(0, 1)
        x.unsqueeze(0).squeeze(0)
        x.permute(1, 0)
        x.narrow(0, 1, 2)
        x.flatten()
        x.unflatten(1, (2, 3))
        x.select(0, 1)
        x.detach()
    assert {"aten.expand.default", "aten.view.default", "aten.as_strided.default"} <= set(t.ops)
    for forbid in ALL_FORBIDDEN:
        assert kc.called(t, forbid) == [], (forbid, kc.called(t, forbid))


@pytest.mark.parametrize("op,patterns,hit", [
    ("aten.exp.default", ("aten.exp",), True), ("aten.exp_.default", ("aten.exp",), True),
    ("aten.expand.default", ("aten.exp",), False), ("aten.expm1.default", ("aten.exp",), False),
    ("aten.add.Tensor", ("aten.add",), True), ("aten.addmm.default", ("aten.add",), False),
    ("aten.mul.Tensor", ("aten.mul",), True), ("aten.multinomial.default", ("aten.mul",), False),
    ("aten.mv.default", ("aten.mv",), True), ("aten.mvlgamma.default", ("aten.mv",), False),
    ("aten.copy_.default", ("aten.copy",), True), ("aten._copy_from.default", ("aten.copy",), False),
    ("aten._scaled_dot_product_flash_attention.default", ("aten._scaled_dot_product*",), True),
])
def test_op_names_match_whole(op, patterns, hit):
    assert kc.op_matches(op, patterns) is hit


def test_custom_op_bodies_are_traced():
    """A torch.library.custom_op's Python body is the call's own code: the trace goes into it, so a body
    that calls the PyTorch op it stands for is seen on any device."""
    @torch.library.custom_op("course_test::fake_gelu", mutates_args=())
    def fake_gelu(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x, approximate="tanh")
    x = torch.randn(8)
    with pytest.raises(kc.NotAKernel, match="aten.gelu"):
        kc.assert_is_kernel(lambda: fake_gelu(x), kc.GELU_KERNEL, "gelu")


def test_input_copies_sees_copies_not_views():
    w = torch.randn(96, 48)
    x = torch.randn(5, 48)
    _, copies = kc.input_copies(lambda: x @ w.t(), weight=w)
    assert copies == []
    _, copies = kc.input_copies(lambda: x @ w.t().contiguous(), weight=w)
    assert copies and "'weight' [96, 48]" in copies[0]
    _, copies = kc.input_copies(lambda: x.double() @ w.double().t(), weight=w)
    assert copies and "_to_copy" in copies[0]
