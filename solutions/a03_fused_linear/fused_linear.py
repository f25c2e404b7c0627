"""Stage 3b: the fused Linear, y = x @ W^T + b in one GEMM, bias in the epilogue.

No host transfers at all. Two ways to get the bias onto the GPU:

* ``backend="addmm"``: ``torch.addmm(b, x, W^T)`` asks cuBLAS(Lt) for a GEMM whose
  epilogue adds the bias while the output tile is still in registers: one
  kernel, y written once.

W^T is passed as a *view* of the [out, in] weight (``weight.t()``): no data moves,
cuBLAS just reads the operand with the other transpose flag. A contiguous [in, out]
copy of W^T is no consistent win at GPT-2 shapes: faster at some, slower at others
(the rows "addmm, W^T contiguous copy" of lectures/results/a01_a03_linear.md). Stage 2's
lesson stands: never *copy* or move the weight per call; a transposed view costs nothing.
* ``backend="triton"``: the GEMM (``x @ W^T``), then :func:`add_bias_` in place:
  two kernels, y written by the GEMM and then read and written again by the
  bias kernel (2·M·N·itemsize extra bytes). Shown for comparison.
"""
from __future__ import annotations

import torch
from torch import nn

from common.checks import check_tensor

from .add_bias import _launch, add_bias_  # noqa: F401  (add_bias_: the public in-place op, as the handout names it)

BACKENDS = ("addmm", "triton")


class FusedLinear(nn.Module):
    """y = x @ W^T + b, all on the device.

    Args:
        weight: [out_features, in_features] (``nn.Linear`` layout), float
            (fp32/fp16/bf16), on the device the layer runs on.
        bias: [out_features] or None, same device and dtype as weight.
        backend: "addmm" (bias in the cuBLAS epilogue) or "triton" (GEMM, then
            the stage-3a bias kernel in place).

    Attributes: ``weight`` [out_features, in_features] as given; ``weight_t``, its
    transposed view [in_features, out_features] (no copy); ``bias``.

    forward(x): x [..., in_features] (any leading dims, may be non-contiguous),
    same device and dtype as the weight; returns [..., out_features]. Raises a
    ValueError/TypeError naming the expected shape, device or dtype otherwise.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, backend: str = "addmm"):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
        check_tensor(weight, "weight", device=None, ndim=2)
        if bias is not None:
            check_tensor(bias, "bias", device=weight.device.type, dtypes=[weight.dtype], ndim=1)
            if bias.shape[0] != weight.shape[0]:
                raise ValueError(f"bias: expected shape ({weight.shape[0]},) to match weight "
                                 f"{tuple(weight.shape)}, got {tuple(bias.shape)}")
        self.backend = backend
        self.weight = nn.Parameter(weight.detach().contiguous(), requires_grad=False)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    @property
    def weight_t(self) -> torch.Tensor:
        """W^T as a view: [in_features, out_features], no data moved."""
        return self.weight.t()

    @classmethod
    def from_linear(cls, linear: nn.Linear, backend: str = "addmm") -> FusedLinear:
        return cls(linear.weight, linear.bias, backend)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO(a03): check x (device, dtype, last dim), flatten the leading dims, one GEMM
        # with the bias in its epilogue (backend "addmm") or GEMM + add_bias_ ("triton").
        # STUB: raise NotImplementedError("a03: implement FusedLinear.forward")
        # SOLUTION
        # Host time is most of a small layer's call (lecture 3, "Host overhead"): self.weight would go
        # through nn.Module.__getattr__ (about a microsecond a read); the parameters' dict is one lookup.
        params = self._parameters
        weight, bias = params["weight"], params.get("bias")    # no bias: not a parameter (None)
        in_f = weight.shape[1]
        # One cheap test on the hot path (a small layer's GPU time is a few microseconds); the detailed
        # checks, with their messages, run only when something is off. Devices compare by index (an int;
        # .device makes an object), and by .device only off the GPU.
        if not isinstance(x, torch.Tensor) or x.dtype != weight.dtype or x.dim() < 1 or x.shape[-1] != in_f \
                or x.get_device() != weight.get_device() or not (x.is_cuda or x.device == weight.device):
            check_tensor(x, "x", device=weight.device.type, dtypes=[weight.dtype], min_ndim=1)
            if x.shape[-1] != in_f:
                raise ValueError(f"x: expected shape [..., {in_f}] (in_features), got {tuple(x.shape)}")
            raise ValueError(f"x: expected a tensor on {weight.device}, got one on {x.device}")
        flat = x.dim() == 2                  # [rows, in_features] already: no views to make (host time)
        x2 = x if flat else x.reshape(-1, in_f)
        w = weight.t()                       # W^T, a view
        if bias is None:
            y = torch.mm(x2, w)
        elif self.backend == "addmm":
            y = torch.addmm(bias, x2, w)
        else:
            y = torch.mm(x2, w)
            if y.numel():                    # add_bias_'s launch without its checks: this layer checked x, and
                _launch(y, bias.contiguous(), y)   # y is the GEMM's fresh [rows, out]; bias was checked at init
        return y if flat else y.view(*x.shape[:-1], weight.shape[0])
        # END TODO(a03)
