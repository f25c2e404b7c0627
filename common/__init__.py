"""Shared harness for the course: impl switching, checks, timing, profiling,
roofline accounting, CUDA-extension builds and float64 reference implementations: what a
student's code and the tests call. The course's own tooling (the grader, the stage registry,
the bench and ncu drivers, the self-checks) is in ``common.course``.

Importing ``common`` first thing makes Triton kernels run under the Triton
interpreter on machines without a CUDA GPU (``TRITON_INTERPRET=1``), so every
Triton stage can be checked on a laptop CPU; there, loads and stores are also
bounds-checked (an off-by-one mask raises an error naming the kernel and the tensor), and
float32 -> bfloat16 casts round to nearest even as on a GPU (the interpreter truncates).
"""
import os

import torch

HAS_CUDA: bool = torch.cuda.is_available()
if not HAS_CUDA:
    # Must happen before any @triton.jit decorator runs.
    os.environ.setdefault("TRITON_INTERPRET", "1")

#: Where kernels run: "cuda" on a GPU machine, "cpu" under the Triton interpreter.
DEVICE: str = "cuda" if HAS_CUDA else "cpu"
TRITON_INTERPRET: bool = os.environ.get("TRITON_INTERPRET", "0") == "1"

if TRITON_INTERPRET:
    # Out-of-bounds loads and stores raise a clear error under the interpreter instead of
    # silently corrupting host memory (common/interpreter_patch.py). Never on a GPU run.
    try:
        from common.interpreter_patch import patch_bf16_round, patch_bounds_check
    except ImportError:     # no triton on this platform
        pass
    else:
        patch_bounds_check()
        patch_bf16_round()    # fp32 -> bf16 rounds to nearest even, as on a GPU (the interpreter truncates)


def is_hopper(device=None) -> bool:
    """True on an sm_90 GPU (H100/H200): the chips with TMA and wgmma (matmul version 7)."""
    return HAS_CUDA and torch.cuda.get_device_capability(device) == (9, 0)


def pdl_supported(device=None) -> bool:
    """True where Triton kernels can use programmatic dependent launch (``launch_pdl=True`` and
    ``tl.extra.cuda.gdc_*``): a CUDA GPU of compute capability 9.0 or later (Hopper, Blackwell),
    never under the Triton interpreter (inline PTX cannot run on the CPU)."""
    if not HAS_CUDA or TRITON_INTERPRET:
        return False
    if isinstance(device, torch.device) and device.type != "cuda":
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9
