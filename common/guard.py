"""Detect a submission that patches torch or the harness.

:func:`snapshot` records the identity of every public callable in the modules a
grade relies on (torch, torch.nn.functional, torch.Tensor, torch.linalg,
torch.special, torch.testing and the harness's own reference/testing/profiling
modules). :func:`changed` lists what differs later: a submission that replaced
``torch.matmul`` or ``common.reference.gelu_tanh`` at import time or during a call
is caught. Names added later (lazy imports) are not treated as patches.
"""
from __future__ import annotations

import types
from pathlib import Path

import torch
import torch.nn.functional as F

from . import profiling, reference, testing


def _watched() -> dict[str, object]:
    return {"torch": torch, "torch.nn.functional": F, "torch.Tensor": torch.Tensor, "torch.linalg": torch.linalg,
            "torch.special": torch.special, "torch.testing": torch.testing, "common.reference": reference,
            "common.testing": testing, "common.profiling": profiling}


def snapshot() -> dict[str, int]:
    ids = {}
    for label, mod in _watched().items():
        for name, obj in list(vars(mod).items()):
            if name.startswith("__") or isinstance(obj, (types.ModuleType, type)) or not callable(obj):
                continue
            ids[f"{label}.{name}"] = id(obj)
    return ids


def _objects() -> dict[str, object]:
    return {f"{label}.{name}": obj for label, mod in _watched().items() for name, obj in list(vars(mod).items())}


_TORCH_DIR = str(Path(torch.__file__).resolve().parent)


def _torch_wrapper(obj: object, original_id: int) -> bool:
    """True for torch's own lazy wrappers (e.g. torch.manual_seed wrapped by dynamo)."""
    code = getattr(obj, "__code__", None)
    return (getattr(obj, "__wrapped__", None) is not None and id(obj.__wrapped__) == original_id
            and code is not None and str(Path(code.co_filename).resolve()).startswith(_TORCH_DIR))


def changed(before: dict[str, int]) -> list[str]:
    now = _objects()
    return sorted(k for k, v in before.items()
                  if k in now and id(now[k]) != v and not _torch_wrapper(now[k], v))
