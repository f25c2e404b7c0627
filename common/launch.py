"""Cheap host work around a kernel launch (lecture 3, "Host overhead"; ``python -m common.hostcost``).

At small shapes an eager call costs what the host spends on it, and a wrapper's Python can
cost more than the launch itself. Three habits keep it small:

* integer helpers in plain Python: ``triton.cdiv`` and ``triton.next_power_of_2`` are
  ``@constexpr_function`` objects in Triton 3.x, about a microsecond or more per call from
  Python; :func:`cdiv` and :func:`next_power_of_2` here are one integer expression each;
* decisions per key: what a call derives from its shapes, strides and dtypes (the grid, a
  config, which path) is computed once per key and looked up after that (a dict, or
  ``functools.lru_cache`` on a function of the key);
* one registered-op dispatch only where it is needed: :func:`plain_eager` says when a call
  may run a custom op's body directly (plain tensors, nothing tracing, no autograd), and the
  op keeps its registration for ``torch.compile``, fake tensors and traces.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for positive b (what ``triton.cdiv`` computes, without its call overhead)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of 2 >= n (1 for n = 1; 0 for n = 0, as ``triton.next_power_of_2``)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


def plain_eager(*tensors: torch.Tensor) -> bool:
    """True when a custom op's body may run directly instead of through the dispatcher: every
    tensor a plain ``torch.Tensor`` (no FakeTensor, no subclass) that needs no gradient, no
    dispatch mode active (fake tensors, the course's traces) and torch.compile not tracing.
    Otherwise call the registered op, which handles all of those."""
    if torch.compiler.is_compiling() or _get_current_dispatch_mode() is not None:
        return False
    grad = torch.is_grad_enabled()
    return all(type(t) is torch.Tensor and not (grad and t.requires_grad) for t in tensors)
