"""a05: GPT-2's GELU as one Triton kernel, registered as a torch custom op.

    from solutions.a05_triton_gelu.gelu_triton import gelu
    y = gelu(x)      # x: fp32/fp16/bf16 on the kernel device (CUDA, or CPU interpreted)

The same contract as a04's CUDA op, written in Triton: each program loads a block of
BLOCK elements once, computes gelu_new in fp32 registers and stores once. Triton
turns the contiguous, 16-byte-aligned block accesses into 16-byte vector loads and
stores by itself; the block size and warp count are autotuned per size. Runs on a GPU,
and under the Triton interpreter on a CPU (``common`` sets TRITON_INTERPRET=1 there).

The math: 0.5·(1 + tanh(u)) = sigmoid(2u) = 1 / (1 + exp(-2u)), so
gelu_new(x) = x / (1 + exp(-2u)) with u = √(2/π)(x + 0.044715x³): one ``exp`` (an
``ex2.approx`` instruction after a multiply) and one division, cheap enough that the
kernel stays memory-bound. For very negative x, exp(-2u) overflows to inf and
x / inf = -0, the right limit; there is no cancellation in 1 + tanh(u).

Registered with ``torch.library.custom_op`` plus a fake implementation, so the op is
one opaque node for ``torch.compile`` (no graph break); an eager call on a plain tensor skips
the dispatcher and runs the op's body (``gelu``). Run:
``pytest tests/test_a05_triton_gelu.py``, bench: ``python -m common.course.bench a05``.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from common import TRITON_INTERPRET
from common.checks import check_tensor
from common.impl import op_namespace
from common.launch import Prepared, cdiv, fast, plain_eager
from common.timing import autotune_bench, precompile

NS = op_namespace(__name__)


def _configs() -> list[triton.Config]:
    if TRITON_INTERPRET:  # the interpreter runs every config while tuning: keep one
        return [triton.Config({"BLOCK": 1024}, num_warps=4)]
    return [triton.Config({"BLOCK": b}, num_warps=w)
            for b, w in ((1024, 4), (2048, 4), (2048, 8), (4096, 4), (4096, 8), (8192, 8), (8192, 16))]


# ------------------------------------------------------------------------------ YOUR WORK
# do_bench: the course's shorter timer per config; cache_results: a size tuned once on this machine
# (Triton's cache, keyed by the kernel's source) is not tuned again in the next process.
@triton.autotune(configs=_configs(), key=["n"], do_bench=autotune_bench, cache_results=True)
@triton.jit
def gelu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y[i] = gelu_new(x[i]) for i < n; program p handles [p*BLOCK, (p+1)*BLOCK).

    x_ptr, y_ptr: contiguous, same dtype (fp32/fp16/bf16); compute in fp32.
    """
    # TODO(a05): offsets of this program's block (program id as int64, so offsets past
    # 2^31 elements stay right); load, compute gelu_new in fp32 (hint: 0.5*(1 + tanh(u)) =
    # 1/(1 + exp(-2u))), store in y's dtype. Mask only the last, partial block: with a mask
    # `offs < n` on every block and n not a multiple of 16, Triton cannot prove that a group
    # of elements is all in or all out, and falls back from 16-byte vector loads and stores
    # to one element at a time (the handout's "Odd sizes").
    # STUB: pass
    # SOLUTION
    start = tl.program_id(0).to(tl.int64) * BLOCK  # int64: offsets past 2^31 elements stay right
    offs = start + tl.arange(0, BLOCK)
    mask = offs < n                  # needed by the last block only
    full = start + BLOCK <= n        # every block but the last: no mask, 16-byte vector accesses
    if full:
        x = tl.load(x_ptr + offs)
    else:
        x = tl.load(x_ptr + offs, mask=mask)
    x = x.to(tl.float32)
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    y = x / (1.0 + tl.exp(-2.0 * u))
    y = y.to(y_ptr.dtype.element_ty)
    if full:
        tl.store(y_ptr + offs, y)
    else:
        tl.store(y_ptr + offs, y, mask=mask)
    # END TODO(a05)


# ------------------------------------------------------------------------------ given code
#: The autotuner's pick per (n, dtype), once it has tuned that n, as a prepared launch of the kernel with
#: its grid and config (common.launch.Prepared): later calls launch it directly (a dict lookup instead of
#: the autotuner's per-call key building and precompile check).
_BEST: dict[tuple[int, torch.dtype], Prepared] = {}


def _gelu(x: torch.Tensor) -> torch.Tensor:
    """The op's body: contiguous copy of a strided x, one kernel launch, new output."""
    x = x.contiguous()
    y = torch.empty_like(x)   # not torch.empty(x.shape, ...): parsing a torch.Size costs more than allocating
    n = x.numel()
    if n > 0:
        best = _BEST.get((n, x.dtype))
        if best is None:   # a new size: tune it (its configs compiled in parallel threads), remember the pick
            grid = lambda meta: (cdiv(n, meta["BLOCK"]),)  # noqa: E731
            precompile(gelu_kernel, grid, x, y, n)
            gelu_kernel[grid](x, y, n)
            cfg = gelu_kernel.best_config
            _BEST[(n, x.dtype)] = fast(gelu_kernel.fn).prepare((cdiv(n, cfg.kwargs["BLOCK"]),), **cfg.all_kwargs())
        else:
            best(x, y, n)      # the pick's prepared launch (common.launch.Prepared)
    return y


@torch.library.custom_op(f"{NS}::triton_gelu", mutates_args=())
def triton_gelu(x: torch.Tensor) -> torch.Tensor:
    """The registered op (what torch.compile, fake tensors and traces see): runs :func:`_gelu`."""
    return _gelu(x)


@triton_gelu.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def gelu(x: torch.Tensor) -> torch.Tensor:
    """gelu_new(x) = 0.5·x·(1 + tanh(√(2/π)(x + 0.044715x³))) in one Triton kernel.

    x: float32/float16/bfloat16 on the kernel device (CUDA; CPU under the interpreter),
    any shape; computed in fp32. Returns a new contiguous tensor. Raises ValueError
    (wrong device) / TypeError (other dtypes).

    An eager call with a plain tensor runs the op's body directly: the custom-op dispatch
    costs several times the launch itself (lecture 3, "Host overhead"). Anything else (torch.compile
    tracing, fake tensors, a dispatch trace, an input that needs a gradient) goes through the op.
    """
    check_tensor(x, "x")
    if plain_eager(x):
        return _gelu(x)
    return triton_gelu(x)
