"""Input validation with messages that say what was wrong and what is expected."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from . import DEVICE

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def kernel_device() -> str:
    """Device type kernels accept: 'cuda', or 'cpu' when Triton runs interpreted."""
    return DEVICE


def check_tensor(
    x: object,
    name: str,
    *,
    device: str | None = "kernel",
    dtypes: Iterable[torch.dtype] | None = FLOAT_DTYPES,
    ndim: int | Sequence[int] | None = None,
    min_ndim: int | None = None,
    contiguous: bool = False,
) -> torch.Tensor:
    """Raise a readable error unless ``x`` is a tensor of the expected kind.

    device="kernel" means the device kernels run on (see :func:`kernel_device`).
    The common case, a tensor that passes, costs a few attribute reads (wrappers call this on
    every launch: lecture 3, "Host overhead"); the messages are built only for one that fails.
    """
    if isinstance(x, torch.Tensor):               # fast path: every test passes, nothing is formatted
        dev = DEVICE if device == "kernel" else device
        if ((dev is None or (x.is_cuda if dev == "cuda" else x.device.type == dev))
                and (dtypes is None or x.dtype in dtypes)
                and (ndim is None or (x.dim() == ndim if isinstance(ndim, int) else x.dim() in ndim))
                and (min_ndim is None or x.dim() >= min_ndim)
                and (not contiguous or x.is_contiguous())):
            return x
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if device == "kernel":
        device = kernel_device()
    if device is not None and x.device.type != device:
        raise ValueError(
            f"{name}: expected a tensor on {device!r}, got one on {str(x.device)!r}"
            + (" (move it with .to('cuda'))" if device == "cuda" else "")
        )
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if x.dtype not in dtypes:
            names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            raise TypeError(f"{name}: expected dtype in ({names}), got {str(x.dtype).replace('torch.', '')}")
    if ndim is not None:
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if x.dim() not in allowed:
            raise ValueError(f"{name}: expected {' or '.join(map(str, allowed))} dims, got shape {tuple(x.shape)}")
    if min_ndim is not None and x.dim() < min_ndim:
        raise ValueError(f"{name}: expected at least {min_ndim} dims, got shape {tuple(x.shape)}")
    if contiguous and not x.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor (call .contiguous()), got strides {x.stride()}")
    return x


def meta(x: torch.Tensor | None) -> tuple | None:
    """What a call's checks and decisions read of a tensor: (shape, strides, dtype, device); None for None.

    A wrapper keys its checked plan on these (lecture 3, "Host overhead"): a call whose inputs match a key
    that passed the checks before passes them again, so it looks the plan up instead of checking and
    deciding. That pays where the plan holds many checks and decisions (stage 8's gemv), not for a few
    checks (add_bias's three cost what the key costs): EXPERIMENTS.md, "hostcost checked keys".
    Anything else raises AttributeError or TypeError, and the wrapper runs its checks, which say what is
    wrong."""
    return None if x is None else (x.shape, x.stride(), x.dtype, x.device)


def check_same(a: torch.Tensor, b: torch.Tensor, names: str, *, dtype: bool = True, device: bool = True) -> None:
    """Both tensors share dtype and device."""
    # two CUDA tensors compare by their device indices (plain ints); ``.device`` makes a torch.device
    # object for each (host time on every launch: lecture 3, "Host overhead")
    if device and not (a.is_cuda and b.is_cuda and a.get_device() == b.get_device()) and a.device != b.device:
        raise ValueError(f"{names}: tensors on different devices ({a.device} vs {b.device})")
    if dtype and a.dtype != b.dtype:
        raise TypeError(f"{names}: dtypes differ ({a.dtype} vs {b.dtype}); expected the same dtype")
