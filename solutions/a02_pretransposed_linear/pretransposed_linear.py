"""Stage 2: store W^T once, at construction.

The round-trip layer of stage 1 moved and transposed the weight on every call.
The weight never changes during inference, so transpose it once, keep W^T
([in_features, out_features], contiguous) on the device, and the forward is a
plain ``x @ W^T``: no transpose, no weight transfer. The bias still takes the
host path at this stage (output GPU->CPU, add, result CPU->GPU): 2 transfers per
call with a bias, 0 without. Stage 3 moves the bias onto the GPU.
"""
from __future__ import annotations

import torch
from torch import nn


class PretransposedLinear(nn.Module):
    """y = x @ W^T + b with W^T stored once.

    Args:
        weight: [out_features, in_features], the ``nn.Linear`` layout, on the device
            the layer runs on (so ``nn.Linear`` weights load unchanged).
        bias: [out_features] or None; kept in host memory (``self.bias_host``).

    Attributes:
        weight_t: [in_features, out_features], contiguous, on ``weight``'s device,
            made once here and never transposed again. An ``nn.Parameter`` with
            ``requires_grad=False``: it is the module's one entry in ``state_dict()``
            (key ``"weight_t"``) and in ``parameters()``, and ``.to()`` moves and casts it.
        bias_host: a plain tensor attribute (not a parameter, not a buffer): not in
            ``state_dict()``, and ``.to()`` leaves it on the host as it was.

    forward(x): x is [..., in_features] on ``weight_t``'s device with its dtype;
    returns [..., out_features]. Raises ValueError if x's last dim is not
    in_features.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        # TODO(a02): store self.weight_t ([in, out], contiguous, made once) and self.bias_host.
        # STUB: raise NotImplementedError("a02: implement PretransposedLinear.__init__")
        # SOLUTION
        if weight.dim() != 2:
            raise ValueError(f"weight: expected [out_features, in_features], got shape {tuple(weight.shape)}")
        self.weight_t = nn.Parameter(weight.detach().t().contiguous(), requires_grad=False)
        self.bias_host = None if bias is None else bias.detach().to("cpu").clone()
        # END TODO(a02)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PretransposedLinear:
        return cls(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # TODO(a02): check x's last dim, multiply by self.weight_t, add the bias on the host.
        # STUB: raise NotImplementedError("a02: implement PretransposedLinear.forward")
        # SOLUTION
        in_features = self.weight_t.shape[0]
        if x.shape[-1] != in_features:
            raise ValueError(f"x: expected last dim {in_features} (in_features), got shape {tuple(x.shape)}")
        y = x @ self.weight_t
        if self.bias_host is None:
            return y
        return (y.to("cpu") + self.bias_host).to(x.device)
        # END TODO(a02)
