"""Assignment 9, kernel 3: SwiGLU, the gated activation of Llama's MLP, in Triton.

    from assignments.a09_llama_inference.swiglu import swiglu
    gu = linear(y, w_gate_up)        # [..., 2F]: the gate and up projections side by side, one GEMM
    m = swiglu(gu)                   # [..., F] = silu(gate) * up, then m @ W_down

GPT-2's MLP is ``W_down · gelu(W_up · x)``: one projection up to F = 4C, an activation, one down.
Llama's is GATED: ``W_down · (silu(W_gate · x) ⊙ W_up · x)``. Two projections of x go up to F; one,
through SiLU (``g · sigmoid(g)``, the "Swish" of SwiGLU), decides how much of each of the other's F
values passes. The gate is computed from the input itself, so the MLP can switch features on and off
per token; at the same parameter count (three matrices instead of two, so a narrower F: the first
Llama took F ≈ 8/3 · C where GPT-2 takes 4C) gated MLPs train to a lower loss, which is why recent
decoders use one.

Gate and up read the same x and have the same shape, so the engine stacks their weights into one
[C, 2F] matrix, ``[W_gate | W_up]``: ONE GEMM (one launch, x read once; at decode, one pass over
both weights in a single GEMV) produces both, side by side in each row. This kernel then reads a
row's two halves and writes F values: half the GEMM's output, no second pass. (A GEMV can go one
step further and apply it in its epilogue, so that the [.., 2F] product is never stored.)

Rounding, as transformers computes ``act_fn(gate_proj(x)) * up_proj(x)`` in the model's dtype: the SiLU
in fp32, rounded to the dtype, then the product, rounded again::

    out = (silu(gate.float()).to(dtype).float() * up.float()).to(dtype)

Run: ``pytest tests/test_a09_llama_inference.py -k swiglu`` (CPU: the interpreter).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from common import pdl_supported
from common.checks import check_same, check_tensor, meta
from common.launch import cdiv, fast, next_power_of_2

#: Columns a program handles (fewer where F is smaller).
BLOCK_F = 1024


@triton.jit
def _swiglu_kernel(GU, OUT, F, stride_gu, stride_out, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    """Program (row, j): columns j·BLOCK .. of row `row`. GU's row (GU + row·stride_gu, columns
    contiguous) holds the gate in columns 0..F-1 and up in F..2F-1; OUT[row, c] = silu(gate[c]) · up[c],
    the SiLU rounded to OUT's dtype before the product, the product rounded again."""
    if USE_PDL:   # given: programmatic dependent launch (tuned_gemv.PDL_NOTES): wait for the previous kernel,
        tl.extra.cuda.gdc_wait()                   # then let the next one start launching
        tl.extra.cuda.gdc_launch_dependents()
    # TODO(a09): kernel 3 (SwiGLU). Program (row, j) = (tl.program_id(0), tl.program_id(1)) handles
    #   columns c = j * BLOCK + tl.arange(0, BLOCK), masked to c < F.
    #   1. g = GU[row, c] (the gate) and u = GU[row, F + c] (up), in fp32.
    #   2. a = silu(g) = g * sigmoid(g) = g / (1 + exp(-g)), ROUNDED to OUT's dtype, back to fp32
    #      (transformers rounds the activation's output before the product).
    #   3. OUT[row, c] = a * u, cast to OUT's dtype.
    #   Row r of GU starts at GU + r * stride_gu, of OUT at OUT + r * stride_out (int64 offsets).
    pass


# ==================================================================== launch (given)
#: The calls per key (the tensors' metadata and pdl): (F, rows, the prepared launch), made by _checked_call on a
#: key's first call and looked up after that (lecture 3, "Host overhead").
_CALLS: dict[tuple, tuple] = {}


def _checked_call(gu, out, pdl) -> tuple:
    """The checks of a call (a clear error for a bad input) and its decisions: (F, rows, the output shape, the prepared launch)."""
    check_tensor(gu, "gu", min_ndim=1)
    two_f = gu.shape[-1]
    if two_f % 2:
        raise ValueError(f"gu: expected [..., 2F] (the gate and up projections side by side), got an odd last dim "
                         f"{two_f} in shape {tuple(gu.shape)}")
    f = two_f // 2
    shape = (*gu.shape[:-1], f)
    if out is not None:
        check_tensor(out, "out", dtypes=(gu.dtype,), contiguous=True)
        check_same(gu, out, "gu, out")
        if tuple(out.shape) != shape:
            raise ValueError(f"out: expected shape {shape}, got {tuple(out.shape)}")
    rows = gu.numel() // two_f if two_f else 0
    block = min(BLOCK_F, next_power_of_2(max(f, 1)))
    use_pdl = bool(pdl) and pdl_supported(gu.device)
    return f, rows, shape, fast(_swiglu_kernel).prepare(
        (rows, cdiv(f, block)), BLOCK=block, USE_PDL=use_pdl, num_warps=4 if block >= 1024 else 2 if block >= 256 else 1,
        **(dict(launch_pdl=True) if use_pdl else {}))


def swiglu(gu: torch.Tensor, *, out: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """``silu(gate) * up`` for ``gu = [gate | up]`` [..., 2F]: returns [..., F] in gu's dtype (one kernel).

    gu: fp32/fp16/bf16 on the kernel device, last dim 2F (even), contiguous in its last dim after a reshape
    to [rows, 2F] (rows that are not one strided view are copied first; the rows of a wider buffer are fine).
    ``out = (silu(gate.float()).to(dtype).float() * up.float()).to(dtype)``, as transformers' LlamaMLP rounds it.
    Returns a new contiguous tensor, or writes the given contiguous ``out`` [..., F].
    ``pdl=True``: programmatic dependent launch where the GPU supports it (tuned_gemv.PDL_NOTES).
    """
    try:   # the call's key: everything its checks and decisions read (lecture 3, "Host overhead")
        key = (meta(gu), meta(out), bool(pdl))
        call = _CALLS.get(key)
    except (AttributeError, TypeError):   # not tensors: the checks say what is wrong
        key = call = None
    if call is None:
        call = _checked_call(gu, out, pdl)
        if key is not None:
            _CALLS[key] = call
    f, rows, shape, launch = call
    y = gu.new_empty(shape) if out is None else out
    if rows == 0 or f == 0:
        return y
    g2 = gu if gu.dim() == 2 else gu.reshape(-1, 2 * f)     # a view when the leading dims collapse, else a copy
    if g2.stride(1) != 1:
        g2 = g2.contiguous()
    y2 = y if y.dim() == 2 else y.view(-1, f)
    launch(g2, y2, f, g2.stride(0), y2.stride(0))
    return y
