"""Stage 3a: broadcast a bias over the rows of y, on the GPU, in Triton.

y is [..., N] and b is [N]. View y as a matrix of M = prod(leading dims) rows and
N columns; each program adds b to one BLOCK_M x BLOCK_N tile. The bias tile is
loaded once per program and broadcast down the rows, so b is read from memory
M / BLOCK_M times instead of M times, and y is read once and written once:
the op moves about 2·M·N·itemsize bytes, the floor for it.

Run the benchmark:  python -m common.course.bench a03
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from common.checks import FLOAT_DTYPES, check_same, check_tensor
from common.launch import cdiv, fast, next_power_of_2


@triton.jit
def add_bias_kernel(y_ptr, b_ptr, out_ptr, M, N,
                    stride_ym, stride_yn, stride_om, stride_on,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # TODO(a03): one program per BLOCK_M x BLOCK_N tile of y: load the bias tile once,
    # load the y tile (masked at the edges), add in fp32, store in out's dtype.
    pass


def _launch(y2: torch.Tensor, b: torch.Tensor, out2: torch.Tensor) -> None:
    # TODO(a03): choose BLOCK_M and BLOCK_N, compute the grid, launch add_bias_kernel.
    raise NotImplementedError("a03: launch add_bias_kernel in _launch")


def _check(y: torch.Tensor, b: torch.Tensor) -> None:
    # The common case first, in one expression of cheap attributes (host time on every call: lecture 3,
    # "Host overhead"); anything else runs the checks below, which say what is wrong.
    if isinstance(y, torch.Tensor) and isinstance(b, torch.Tensor) and y.is_cuda and b.is_cuda \
            and y.get_device() == b.get_device() and y.dtype == b.dtype and y.dtype in FLOAT_DTYPES \
            and b.dim() == 1 and y.dim() >= 1 and b.shape[0] == y.shape[-1]:
        return
    check_tensor(y, "y", min_ndim=1)
    check_tensor(b, "b", ndim=1)
    check_same(y, b, "add_bias(y, b)")
    if b.shape[0] != y.shape[-1]:
        raise ValueError(f"add_bias: b has shape {tuple(b.shape)} but y's last dim is {y.shape[-1]}; "
                         f"expected b of shape ({y.shape[-1]},)")


def add_bias(y: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Return y + b (a new tensor), broadcasting b [N] over y [..., N].

    y and b are on the kernel device (CUDA; CPU under the Triton interpreter),
    share a float dtype (fp32, fp16, bf16) and may be non-contiguous. The
    kernel reads b with unit stride, so this wrapper passes ``b.contiguous()``
    (a copy of N elements when b is strided, none otherwise); y's rows and
    columns may have any strides (``y.reshape(-1, N)`` copies y only when its
    leading dims cannot be collapsed into one). The result is contiguous with
    y's shape and dtype; the add is done in fp32.
    """
    _check(y, b)
    N = y.shape[-1]
    # empty_like, not torch.empty(y.shape, ...): a torch.Size argument costs the parser more than the
    # allocation itself (lecture 3, "Host overhead")
    out = torch.empty_like(y) if y.is_contiguous() else torch.empty_like(y, memory_format=torch.contiguous_format)
    if out.numel():
        # [rows, N] views; a 2-D y already is one (a view object costs host time: lecture 3, "Host overhead")
        y2, out2 = (y, out) if y.dim() == 2 else (y.reshape(-1, N), out.view(-1, N))
        _launch(y2, b.contiguous(), out2)
    return out


def add_bias_(y: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """In place: y += b, broadcasting b [N] over y [..., N]; returns y.

    Same contract as :func:`add_bias` (b may be strided: it is made contiguous
    first), except that y's leading dims must collapse into one without a copy
    (true for contiguous y and for column slices of it); otherwise a ValueError
    says to pass a contiguous y.
    """
    _check(y, b)
    N = y.shape[-1]
    if y.numel() == 0:
        return y
    try:
        y2 = y if y.dim() == 2 else y.view(-1, N)   # a 2-D y is its own [rows, N] view, whatever its strides
    except RuntimeError:
        raise ValueError(f"add_bias_: y with shape {tuple(y.shape)} and strides {y.stride()} cannot be "
                         "viewed as [rows, N] without a copy; pass a contiguous y") from None
    _launch(y2, b.contiguous(), y2)
    return y
