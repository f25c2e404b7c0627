"""Stage 1: the round-trip Linear, and the tools that show what it costs.

Given code: :class:`RoundTripLinear`, a Linear layer written the slow way on
purpose. Every call copies the weight GPU->CPU, transposes it on the CPU, copies
it back CPU->GPU, multiplies on the GPU, then copies the output GPU->CPU, adds
the bias there and copies the result back. How many host transfers is that per
call, with a bias and without? Your counter answers it (answers.toml).

Your work (see README.md):
1. :class:`HostTransferCounter.__torch_dispatch__`: count host<->device copies
   by watching aten ops. It must work on fake CUDA tensors, so you can check it
   on a laptop without a GPU.
2. :func:`transfer_report`: profile a call on a real GPU with torch.profiler and
   report the Memcpy HtoD/DtoH events per call and their share of GPU time.
3. ``answers.toml``: the numbers you measured.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode


class RoundTripLinear(nn.Module):
    """y = x @ W^T + b, with the transpose and the bias add done on the host (given code).

    ``weight`` is [out_features, in_features] (the ``nn.Linear`` layout) on the
    GPU. The bias is kept in host memory, where this layer adds it.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.weight = nn.Parameter(weight.detach().clone(), requires_grad=False)
        # The bias lives where it is used: on the host (a plain attribute, so .to() leaves it there).
        self.bias_host = None if bias is None else bias.detach().to("cpu").clone()

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> RoundTripLinear:
        return cls(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        device = x.device
        w_t = self.weight.to("cpu").t().contiguous()       # 1: weight GPU -> CPU, transpose on CPU
        y = x @ w_t.to(device)                              # 2: W^T CPU -> GPU, matmul on the GPU
        if self.bias_host is None:
            return y
        y = y.to("cpu") + self.bias_host                    # 3: output GPU -> CPU, bias add on CPU
        return y.to(device)                                 # 4: result CPU -> GPU


# --------------------------------------------------------------------------- your work
class HostTransferCounter(TorchDispatchMode):
    """Count copies between host memory and a device during a block of code.

        with HostTransferCounter() as c:
            layer(x)
        c.htod, c.dtoh, c.total

    A copy is an aten op that moves data from a tensor on one device type to a
    tensor on another: ``aten._to_copy`` (``.to()``, ``.cpu()``) from its input
    to its output, or ``aten.copy_`` (``dst.copy_(src)``) from ``src`` (args[1])
    to ``dst`` (args[0]). Copies within one device do not count. The counter must
    not change what the code computes: run every op and return its result.
    """

    def __init__(self) -> None:
        super().__init__()
        self.htod = 0   # host -> device copies
        self.dtoh = 0   # device -> host copies

    @property
    def total(self) -> int:
        return self.htod + self.dtoh

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # TODO(a01): run func(*args, **kwargs), look at the devices of the source and
        # destination of _to_copy / copy_, update self.htod / self.dtoh, return the result.
        raise NotImplementedError("a01: implement HostTransferCounter.__torch_dispatch__")


@dataclass
class TransferReport:
    """What one call of a function does on the GPU, averaged over several calls."""
    htod_per_call: float          # Memcpy HtoD events per call
    dtoh_per_call: float          # Memcpy DtoH events per call
    memcpy_us_per_call: float     # GPU time in those memcpys per call (microseconds)
    kernel_us_per_call: float     # GPU time in everything else (kernels, memsets, DtoD copies)

    @property
    def memcpy_share(self) -> float:
        """Share of GPU time spent copying between host and device, in [0, 1]."""
        total = self.memcpy_us_per_call + self.kernel_us_per_call
        return self.memcpy_us_per_call / total if total > 0 else 0.0


def transfer_report(fn: Callable[[], object], calls: int = 10, warmup: int = 3) -> TransferReport:
    """Profile ``fn()`` with torch.profiler on a CUDA GPU and summarise host transfers.

    Run ``warmup`` calls first (not profiled), then ``calls`` calls under
    ``torch.profiler.profile(activities=[CPU, CUDA])``, synchronising before the
    profiler stops. Among the profiler's events whose ``device_type`` is CUDA,
    "Memcpy HtoD ..." and "Memcpy DtoH ..." are the host transfers; every other
    CUDA event is kernel time. Use each event's ``time_range.elapsed_us()``.
    Return per-call averages. Raise RuntimeError if no CUDA GPU is present.
    """
    # TODO(a01): warm up, profile `calls` calls, sort the CUDA events into memcpys and kernels.
    raise NotImplementedError("a01: implement transfer_report")
