"""Assignment 9, kernel 1: RMSNorm, and RMSNorm with the residual add fused in, in Triton.

    from assignments.a09_llama_inference.rmsnorm import add_rmsnorm, rmsnorm
    h, y = add_rmsnorm(x, residual, weight, eps)   # h = x + residual;  y = RMSNorm(h)
    y = rmsnorm(x, weight, eps)

LayerNorm (stage 8) centres each row and scales it: ``(x - mean) / sqrt(var + eps) * w + b``.
RMSNorm (Llama, Qwen, Mistral, ...) keeps only the scaling: ``x / sqrt(mean(x²) + eps) * w``, with
no mean subtracted and no bias. The root mean square is the row's size; dividing by it puts every
row on the same scale, which is what the next matmul needs from a norm. The centring turned out to
matter little for training, so one reduction (the sum of squares) replaces two (the mean, then the
variance around it), and the bias goes. The kernel is stage 8's LayerNorm minus those steps.

Rounding, as transformers' ``LlamaRMSNorm`` (and ``Qwen3RMSNorm``) does it: the statistics in fp32,
the normalised row ``x · rsqrt(mean(x²) + eps)`` rounded to x's dtype, THEN multiplied by the
weight, and the product rounded again::

    y = (w * (x.float() * rsqrt(mean(x.float()**2) + eps)).to(x.dtype)).to(x.dtype)

In fp32 the two roundings change nothing; in bf16 they are what the model computes, and a kernel
that rounds once differs from it in the last bit of many elements.

Llama adds each sub-layer's output to the residual stream and normalises the sum for the next one
(``h = h + attn(...)``, then ``post_attention_layernorm(h)``). ``add_rmsnorm`` does both in one
program per row: it reads x and the residual once and writes the new residual h (rounded to x's
dtype: what the stream holds) and y = RMSNorm(h as stored).

Run: ``pytest tests/test_a09_llama_inference.py -k rmsnorm`` (CPU: the interpreter).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from common import pdl_supported
from common.checks import check_same, check_tensor, meta
from common.launch import fast, next_power_of_2

#: The widest row one program holds (Llama 3 70B: 8192).
MAX_N = 16384


@triton.jit
def _add_rmsnorm_kernel(X, R, H, Y, W, stride_x, stride_r, stride_h, stride_y, N, eps,
                        HAS_RESIDUAL: tl.constexpr, BLOCK_N: tl.constexpr, USE_PDL: tl.constexpr):
    """One row: H = X + R (if HAS_RESIDUAL), Y = RMSNorm(H) * W. Rows are strided (stride_*), columns
    contiguous; the sum of squares in fp32; the normalised row rounded to Y's dtype before W multiplies."""
    if USE_PDL:   # given: programmatic dependent launch (tuned_gemv.PDL_NOTES): wait for the previous kernel,
        tl.extra.cuda.gdc_wait()                   # then let the next one start launching
        tl.extra.cuda.gdc_launch_dependents()
    # TODO(a09): kernel 1 (RMSNorm, with the residual add fused in). Program `row` handles one row of
    #   N elements (cols = tl.arange(0, BLOCK_N), masked to cols < N; BLOCK_N >= N is a power of 2).
    #   1. h = X[row] (+ R[row] if HAS_RESIDUAL) in fp32. With a residual, store h to H[row] in
    #      H's dtype, and normalise that rounded value (what the residual stream holds).
    #   2. ms = sum(h * h) / N over the N real columns (padding columns load 0 and add nothing);
    #      no mean is subtracted: that is LayerNorm, not RMSNorm.
    #   3. n = h * rsqrt(ms + eps), ROUNDED to Y's dtype (as transformers rounds it), back to fp32;
    #      Y[row] = n * W (W in fp32), cast to Y's dtype.
    #   Row r of a tensor T starts at T + r * stride_t (use int64 offsets); columns are contiguous.
    pass


# ==================================================================== launch (given)
def warps_for(block: int) -> int:
    """Warps of a program that holds a row of ``block`` (a power of two) elements: 1 up to 256 .. 16 past 8192."""
    return 1 if block <= 256 else 2 if block <= 1024 else 4 if block <= 4096 else 8 if block <= 8192 else 16


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """[..., N] -> [rows, N] as a view when the rows have one stride and columns are dense."""
    t2 = t if t.dim() == 2 else t.reshape(-1, n)   # a view when the leading dims collapse, else a copy
    return t2 if t2.stride(1) == 1 else t2.contiguous()


#: The calls per key (the tensors' metadata and pdl): (N, rows, the prepared launch), made by _checked_call on a
#: key's first call and looked up after that (lecture 3, "Host overhead").
_CALLS: dict[tuple, tuple] = {}


def _launch(x, residual, weight, eps, out, h_out, pdl):
    try:   # the call's key: everything its checks and decisions read (lecture 3, "Host overhead")
        key = (meta(x), meta(residual), meta(weight), meta(out), meta(h_out), bool(pdl))
        call = _CALLS.get(key)
    except (AttributeError, TypeError):   # not tensors: the checks say what is wrong
        key = call = None
    if call is None:
        call = _checked_call(x, residual, weight, out, h_out, pdl)
        if key is not None:
            _CALLS[key] = call
    n, rows, launch = call
    y = torch.empty_like(x, memory_format=torch.contiguous_format) if out is None else out
    h = (torch.empty_like(x, memory_format=torch.contiguous_format) if h_out is None else h_out) \
        if residual is not None else None
    if rows == 0:
        return h, y
    flat = x.dim() == 2
    x2, y2 = _rows(x, n), (y if flat else y.view(-1, n))
    r2 = _rows(residual, n) if residual is not None else x2
    h2 = (h if flat else h.view(-1, n)) if h is not None else y2
    launch(x2, r2, h2, y2, weight, x2.stride(0), r2.stride(0), h2.stride(0), y2.stride(0), n, float(eps))
    return h, y


def _checked_call(x, residual, weight, out, h_out, pdl) -> tuple:
    """The checks of a call (a clear error for a bad input) and its decisions: (N, rows, the prepared launch)."""
    check_tensor(x, "x", min_ndim=1)
    n = x.shape[-1]
    check_tensor(weight, "weight", dtypes=(x.dtype, torch.float32), ndim=1)
    check_same(x, weight, "x, weight", dtype=False)
    if weight.shape[0] != n:
        raise ValueError(f"weight: expected shape ({n},) to match x's last dim, got {tuple(weight.shape)}")
    if weight.stride(0) != 1:
        raise ValueError(f"weight: expected a contiguous vector, got stride {weight.stride(0)}")
    if residual is not None:
        check_tensor(residual, "residual")
        check_same(x, residual, "x, residual")
        if residual.shape != x.shape:
            raise ValueError(f"residual: expected x's shape {tuple(x.shape)}, got {tuple(residual.shape)}")
    block = next_power_of_2(max(n, 1))
    if block > MAX_N:
        raise ValueError(f"x: rows of {n} elements; this kernel holds a row in one block (at most {MAX_N})")
    for given, name in ((out, "out"), (h_out if residual is not None else None, "h_out")):
        if given is not None:
            check_tensor(given, name, dtypes=(x.dtype,), contiguous=True)
            check_same(x, given, f"x, {name}")
            if given.shape != x.shape:
                raise ValueError(f"{name}: expected shape {tuple(x.shape)}, got {tuple(given.shape)}")
    rows = x.numel() // n if n else 0
    use_pdl = bool(pdl) and pdl_supported(x.device)
    return n, rows, fast(_add_rmsnorm_kernel).prepare(
        (rows,), HAS_RESIDUAL=residual is not None, BLOCK_N=block, USE_PDL=use_pdl, num_warps=warps_for(block),
        **(dict(launch_pdl=True) if use_pdl else {}))


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6, *, out: torch.Tensor | None = None,
            pdl: bool = False) -> torch.Tensor:
    """``RMSNorm(x) * w`` over the last dim, as transformers' ``LlamaRMSNorm``.

    x: [..., N], fp32/fp16/bf16, on the kernel device; last dim contiguous after a reshape to [rows, N]
    (rows that are not one strided view are copied first). w: [N], contiguous, x's dtype or fp32.
    ``y = w * (x.float() * rsqrt(mean(x.float()**2, -1) + eps)).to(x.dtype)``, the product rounded to x's
    dtype. Returns a new contiguous tensor of x's shape and dtype, or writes the given contiguous ``out``.
    ``pdl=True``: programmatic dependent launch where the GPU supports it (tuned_gemv.PDL_NOTES).
    """
    return _launch(x, None, w, eps, out, None, pdl)[1]


def add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, w: torch.Tensor, eps: float = 1e-6, *,
                out: torch.Tensor | None = None, h_out: torch.Tensor | None = None,
                pdl: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``h = x + residual`` (in x's dtype: the residual stream) and ``y = rmsnorm(h, w, eps)``, one kernel.

    x, residual: [..., N], same shape, dtype and device; any leading dims and row strides. w as
    :func:`rmsnorm`. Returns new contiguous (h, y) in x's dtype, or writes the given ``h_out`` / ``out``
    (``h_out`` may be ``residual`` itself: each program reads its row before it writes it).
    """
    if residual is None:
        raise ValueError("residual: expected a tensor (use rmsnorm() for no residual)")
    return _launch(x, residual, w, eps, out, h_out, pdl)
