"""a04: GPT-2's GELU as a CUDA torch operator, and a patch that puts it into transformers' GPT-2.

    from solutions.a04_cuda_gelu.fused_gelu import fused_gelu, patch_model
    y = fused_gelu(x)                    # x: CUDA fp32/fp16/bf16, any shape
    y = fused_gelu(x, fast_math=True)    # the --use_fast_math build
    patch_model(model)                   # transformers' GPT-2: every transformer.h[i].mlp.act -> FusedGELU

How the pieces fit (given code unless marked YOUR WORK):

1. The schema ``<ns>::fused_gelu(Tensor x) -> Tensor`` (and ``fused_gelu_fast``) is
   defined here in Python, with ``torch.library``, at import: no build needed.
2. ``gelu_fake`` (YOUR WORK) is registered as the op's fake (meta) implementation:
   what ``torch.compile`` runs while tracing, on tensors that have a shape, dtype
   and device but no data. With it the op traces without graph breaks, also on a
   machine without a GPU.
3. ``gelu_kernel.cu`` (YOUR WORK) + ``binding.cpp`` register the CUDA kernel for the
   op (``TORCH_LIBRARY_IMPL(ns, CUDA, m)``). They are built just in time by
   ``common.cuda_ext.load_op`` on the first call (a minute, once per machine; cached).
4. ``patch_model`` (YOUR WORK) swaps the activation module of Hugging Face transformers'
   GPT-2 (``GPT2MLP.act``, a ``NewGELUActivation``) for ``FusedGELU``.

The namespace ``<ns>`` is the impl's (``course_solutions``, ``course_assignments``,
...; ``common.impl.op_namespace``), so several impls can be loaded in one process.
"""
from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from common.checks import check_tensor
from common.cuda_ext import load_op
from common.impl import op_namespace

HERE = Path(__file__).resolve().parent
SOURCES = (HERE / "gelu_kernel.cu", HERE / "binding.cpp")
NS = op_namespace(__name__)
#: Op name per build: the --use_fast_math build registers its own op (load_op passes the name to binding.cpp).
OP_NAMES = {False: "fused_gelu", True: "fused_gelu_fast"}

_lib = torch.library.Library(NS, "FRAGMENT")  # keep a reference: dropping it unregisters
for _name in OP_NAMES.values():
    _lib.define(f"{_name}(Tensor x) -> Tensor")


# ----------------------------------------------------------------------- YOUR WORK (1/2)
def gelu_fake(x: torch.Tensor) -> torch.Tensor:
    """Fake (meta) implementation of ``fused_gelu``: the output's metadata, no data.

    Contract: return a new tensor with x's shape, dtype and device, laid out
    contiguously (the CUDA op returns a contiguous tensor even for a strided x).
    It must not read x's data (a fake tensor has none) and must not call the op.
    """
    # TODO(a04): a new, empty tensor with x's shape, dtype and device (contiguous).
    # STUB: raise NotImplementedError("a04: write gelu_fake (the op's fake implementation)")
    # SOLUTION
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)
    # END TODO(a04)


for _name in OP_NAMES.values():
    torch.library.register_fake(f"{NS}::{_name}", lambda x: gelu_fake(x), lib=_lib)

def build(fast_math: bool = False) -> None:
    """Build (first time on a machine: about a minute) or load the CUDA extension; after
    the first call in a process, a dictionary lookup (common.cuda_ext.load_op)."""
    load_op(f"a04_{OP_NAMES[fast_math]}", SOURCES, namespace=NS, op_name=OP_NAMES[fast_math], fast_math=fast_math)


def op(fast_math: bool = False):
    """The torch operator, e.g. ``torch.ops.course_solutions.fused_gelu`` (build it first)."""
    return getattr(getattr(torch.ops, NS), OP_NAMES[fast_math])


def fused_gelu(x: torch.Tensor, *, fast_math: bool = False) -> torch.Tensor:
    """gelu_new(x) = 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))) in one CUDA kernel.

    x: CUDA tensor, float32/float16/bfloat16, any shape; computed in fp32. A strided x
    is copied to contiguous first (one extra kernel). Returns a new contiguous tensor.
    Raises ValueError (not on CUDA) / TypeError (other dtypes).
    """
    check_tensor(x, "x", device="cuda")
    # While torch.compile traces, or on fake tensors without a GPU, the fake stands in for
    # the kernel: nothing to build.
    if torch.cuda.is_available() and not torch.compiler.is_compiling():
        build(fast_math)
    return op(fast_math)(x)


class FusedGELU(nn.Module):
    """Drop-in replacement for transformers' ``NewGELUActivation`` (GPT-2's ``mlp.act``) that
    calls ``fused_gelu``."""

    def __init__(self, fast_math: bool = False):
        super().__init__()
        self.fast_math = fast_math
        if torch.cuda.is_available():  # build now, so a torch.compile'd model finds the kernel
            build(fast_math)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused_gelu(x, fast_math=self.fast_math)

    def extra_repr(self) -> str:
        return f"op={NS}::{OP_NAMES[self.fast_math]}"


# ----------------------------------------------------------------------- YOUR WORK (2/2)
def patch_model(model: nn.Module, *, fast_math: bool = False) -> nn.Module:
    """Replace the activation of every GPT-2 MLP in ``model`` by ``FusedGELU``; in place.

    ``model``: a Hugging Face transformers GPT-2 (``GPT2LMHeadModel``, ``GPT2Model``, or any
    module that contains GPT-2 blocks). Its MLPs are
    ``transformers.models.gpt2.modeling_gpt2.GPT2MLP`` modules (``c_fc``, ``act``,
    ``c_proj``, ``dropout``), e.g. ``model.transformer.h[i].mlp``; ``act`` is
    ``NewGELUActivation`` (``activation_function="gelu_new"``, the tanh GELU as torch ops).

    Contract: every ``GPT2MLP`` submodule's ``act`` becomes a ``FusedGELU(fast_math)``;
    nothing else changes (weights, other modules). Returns ``model``. Raises ValueError,
    naming the model's type, if ``model`` has no ``GPT2MLP``.
    """
    # TODO(a04): set .act of every GPT2MLP in model to FusedGELU(fast_math); ValueError if there is none.
    # STUB: raise NotImplementedError("a04: write patch_model")
    # SOLUTION
    from transformers.models.gpt2.modeling_gpt2 import GPT2MLP
    mlps = [m for m in model.modules() if isinstance(m, GPT2MLP)]
    if not mlps:
        raise ValueError(f"patch_model: no transformers GPT2MLP found in {type(model).__name__} "
                         "(expected a transformers GPT-2: GPT2LMHeadModel, GPT2Model)")
    for mlp in mlps:
        mlp.act = FusedGELU(fast_math)
    return model
    # END TODO(a04)
