"""Numerical comparison helpers shared by tests, the grader and benchmarks."""
from __future__ import annotations

import torch

#: Relative-error tolerances (||out - ref|| / ||ref||) that fit each dtype when the
#: computation accumulates in fp32. fp32 math lands far below 1e-4; tf32 dots near 3e-4.
REL_TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
#: Element-wise tolerances (atol, rtol) for the same dtypes.
ELEM_TOL = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5),
    torch.float16: (1e-3, 1e-2),
    torch.bfloat16: (1e-2, 2e-2),
}


def _upcast(out: torch.Tensor, ref: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Both as float64 on the CPU; None if the shapes differ or out has NaN/inf."""
    if tuple(out.shape) != tuple(ref.shape):
        return None
    o = out.detach().to("cpu", torch.float64)
    if not torch.isfinite(o).all():
        return None
    return o, ref.detach().to("cpu", torch.float64)


def rel_error(out: torch.Tensor, ref: torch.Tensor, scale: torch.Tensor | None = None) -> float:
    """||out - ref|| / ||ref|| in float64; inf if shapes differ or out has NaN/inf.

    ``scale`` (optional, ref's shape): the magnitude of the terms that were summed, e.g.
    |x| @ |w|ᵀ + |b| for a linear layer (:func:`common.reference.linear_scale`). A result
    computed in two roundings (GEMM output rounded to bf16, then the bias added) can only
    be as accurate as those terms, so the error is measured against the larger of the two
    norms: a single output that nearly cancels does not make a correct kernel fail.
    The denominator is never below the output dtype's smallest normal number (times √n).
    """
    pair = _upcast(out, ref)
    if pair is None:
        return float("inf")
    o, r = pair
    denom = r.norm().item()
    if out.dtype.is_floating_point and o.numel():
        # Below the smallest normal number a dtype has no relative precision left (fp32 keeps
        # ~1e-45 absolute steps there): measure such outputs against that threshold, so a
        # GELU of x = -10 (~1e-42 in fp32) is not a "relative error" of the dtype's spacing.
        denom = max(denom, torch.finfo(out.dtype).tiny * o.numel() ** 0.5)
    if scale is not None:
        denom = max(denom, scale.detach().to("cpu", torch.float64).norm().item())
    return (o - r).norm().item() / (denom if denom > 0 else 1.0)


def max_abs_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    pair = _upcast(out, ref)
    if pair is None:
        return float("inf")
    o, r = pair
    return (o - r).abs().max().item() if o.numel() else 0.0


def _check_output(out, ref: torch.Tensor, dtype: torch.dtype | None, name: str) -> torch.Tensor:
    """The checks every comparison starts with: a tensor, ref's shape, ``dtype`` (when given), no
    NaN/inf. Returns ``out`` as float64 on the CPU."""
    assert isinstance(out, torch.Tensor), f"{name}: expected a tensor, got {type(out).__name__}"
    assert tuple(out.shape) == tuple(ref.shape), (
        f"{name}: shape {tuple(out.shape)} but the reference has shape {tuple(ref.shape)}")
    if dtype is not None:
        assert out.dtype == dtype, f"{name}: dtype {out.dtype}, expected {dtype}"
    o = out.detach().to("cpu", torch.float64)
    bad = ~torch.isfinite(o)
    if bad.any():
        n = int(bad.sum())
        first = bad.nonzero()[0].tolist()
        if n == o.numel():
            raise AssertionError(f"{name}: every element is NaN/inf: the output was never written (not implemented "
                                 "yet?), or all of it overflowed")
        raise AssertionError(f"{name}: {n} of {o.numel()} elements are NaN/inf, the first at {first} (output shape "
                             f"{tuple(out.shape)}): never written (check the grid and the mask: do the programs "
                             "cover every row and column?) or overflowed")
    return o


def describe_inputs(inputs: dict) -> str:
    """'y [5, 7, 40] torch.float32 strides (1, 200, 5); b [40] torch.float32 strides (2,)': the inputs a
    failure message names, so that the failing case shows without a debugger."""
    return "; ".join(f"{k} {list(t.shape)} {t.dtype} strides {tuple(t.stride())}" if isinstance(t, torch.Tensor)
                     else f"{k}={t!r}" for k, t in inputs.items())


def assert_close(out: torch.Tensor, ref: torch.Tensor, *, dtype: torch.dtype | None = None,
                 rel_tol: float | None = None, name: str = "output", scale: torch.Tensor | None = None,
                 inputs: dict | None = None) -> float:
    """Assert ``out`` matches the (float64) reference within the dtype's tolerance.

    Checks shape, dtype (when given), finiteness, relative error and element-wise
    closeness. Returns the relative error. Messages say what differed and by how much, where
    (the first bad element, the output's shape and strides) and, given ``inputs`` (name ->
    tensor), each input's shape, dtype and strides.
    ``scale``: magnitude of the summed terms (see :func:`rel_error`), used for both checks.
    """
    if inputs:
        name = f"{name} (inputs: {describe_inputs(inputs)})"
    o = _check_output(out, ref, dtype, name)
    dt = dtype or out.dtype
    r = ref.detach().to("cpu", torch.float64)
    err = rel_error(out, ref, scale)
    tol = rel_tol if rel_tol is not None else REL_TOL[dt]
    atol, rtol = ELEM_TOL[dt]
    big = r.abs().max().item() if r.numel() else 1.0
    mag = r.abs() if scale is None else torch.maximum(r.abs(), scale.detach().to("cpu", torch.float64))
    close = (o - r).abs() <= atol * max(big, 1.0) + rtol * mag
    where = _first_bad(out, o, r, close)
    assert err <= tol, f"{name}: relative error {err:.3e} exceeds {tol:.1e} for {dt}{where}"
    if not close.all():
        raise AssertionError(f"{name}: {int((~close).sum())} of {o.numel()} elements off ({dt}){where}")
    return err


def _first_bad(out: torch.Tensor, o: torch.Tensor, r: torch.Tensor, close: torch.Tensor) -> str:
    """'; first bad element at [i, j]: got .., expected ..; output shape .., strides ..' (the place to
    look), or the shape and strides alone when every element is within its own tolerance."""
    layout = f"output shape {tuple(out.shape)}, strides {tuple(out.stride())}"
    if close.all() or not o.numel():
        return f" ({layout})"
    bad = (~close).nonzero()
    idx = bad[0].tolist()
    rows = f", {len(set(bad[:, 0].tolist()))} of {o.shape[0]} rows (first dim) affected" if o.dim() > 1 else ""
    return (f"; {int((~close).sum())} of {o.numel()} elements off{rows}, the first at {idx}: got "
            f"{o[tuple(idx)].item():.6g}, expected {r[tuple(idx)].item():.6g} ({layout})")


#: Calibrated tolerances: a submission may be this many times less accurate than PyTorch's own
#: op in the same dtype, on the same inputs (both measured against float64), ...
CALIBRATION = {torch.float32: 4.0, torch.float16: 3.0, torch.bfloat16: 3.0}
#: ... and any error below this floor passes (PyTorch's own error can be ~0: exact products, K = 1).
#: The floor sits under what an accumulator kept in a 16-bit type costs at long K (bf16: ~1.4e-2 at
#: K = 4096 in steps of 32, fp16: ~1.7e-3), above the rounding of one honest 16-bit result (bf16
#: ~1.6e-3, fp16 ~2e-4); fp32 keeps REL_TOL's 1e-5 (a sequential fp32 sum over K is honest too).
ERROR_FLOOR = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 4e-3}


def calibrated_tol(torch_error: float, dtype: torch.dtype, c: float | None = None) -> float:
    """The relative error allowed where PyTorch's own op in ``dtype`` is ``torch_error`` away from
    float64: ``max(c * torch_error, ERROR_FLOOR[dtype])`` (c: CALIBRATION[dtype] unless given)."""
    return max((CALIBRATION[dtype] if c is None else c) * torch_error, ERROR_FLOOR[dtype])


def torch_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.matmul(a, b)`` as the yardstick of :func:`calibrated_tol`: full-precision reductions
    (no TF32, no cuBLAS split-K partial sums in fp16/bf16), so it is PyTorch's best in that dtype."""
    m = torch.backends.cuda.matmul
    saved = (m.allow_tf32, m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction)
    m.allow_tf32 = m.allow_fp16_reduced_precision_reduction = m.allow_bf16_reduced_precision_reduction = False
    try:
        return torch.matmul(a, b)
    finally:
        m.allow_tf32, m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction = saved


def torch_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` (differentiable) as the yardstick of :func:`calibrated_tol`
    for attention, with stage 7's bottom-right causal mask: ``is_causal=True`` aligns top-left when
    Nq != Nk, ``torch.nn.attention.bias.causal_lower_right`` bottom-right (SDPA's fused kernels both)."""
    import torch.nn.functional as F
    if not is_causal or q.shape[-2] == k.shape[-2]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    from torch.nn.attention.bias import causal_lower_right
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_lower_right(q.shape[-2], k.shape[-2]))


def assert_as_accurate_as_torch(out: torch.Tensor, ref: torch.Tensor, torch_out: torch.Tensor, *,
                                dtype: torch.dtype, name: str = "output", c: float | None = None,
                                scale: torch.Tensor | None = None) -> float:
    """``out`` (the submission) and ``torch_out`` (PyTorch's op on the same inputs, same dtype and
    device) against the float64 ``ref``: the submission's relative error may be at most c times
    PyTorch's (:func:`calibrated_tol`). Fixed tolerances are loose enough for an accumulator
    rounded to bf16 on every K step; PyTorch's own error at the same K is not. Returns the error."""
    _check_output(out, ref, dtype, name)
    err, base = rel_error(out, ref, scale), rel_error(torch_out, ref, scale)
    tol = calibrated_tol(base, dtype, c)
    assert err <= tol, (
        f"{name}: relative error {err:.2e} vs float64 is {err / max(base, 1e-300):.1f}x PyTorch's own error "
        f"({base:.2e}) in {str(dtype).replace('torch.', '')} on the same inputs; allowed: "
        f"{CALIBRATION[dtype] if c is None else c:g}x PyTorch or {ERROR_FLOOR[dtype]:.0e}, whichever is larger "
        f"(rounding an fp32 accumulator to 16 bits inside the K or key-tile loop costs this much)")
    return err


def assert_fresh_each_call(fn, inputs: dict, reference, *, name: str, dtype: torch.dtype | None = None,
                           rel_tol: float | None = None, scale=None) -> None:
    """``fn(**inputs)`` twice, the second time on the *same* tensors refilled with new values: each
    output must match ``reference(**inputs)`` of the values it was computed from, the first one
    still after the second call. An output memoised by the input's address (or shape), or one
    output buffer returned by every call, fails with a message that says so. ``scale(**inputs)``
    (optional): the magnitude of the summed terms, as for :func:`assert_close`."""
    def ref_and_scale():
        return reference(**inputs), (scale(**inputs) if scale is not None else None)
    out1 = fn(**inputs)
    ref1, sc1 = ref_and_scale()
    snapshot = out1.detach().clone()
    with torch.no_grad():
        for t in inputs.values():
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                t.copy_(torch.randn(t.shape, dtype=torch.float32).to(t.device, t.dtype) * (t.float().std() + 0.5))
    out2 = fn(**inputs)
    ref2, sc2 = ref_and_scale()
    assert_close(out2, ref2, dtype=dtype, rel_tol=rel_tol, scale=sc2,
                 name=f"{name}, second call on the same input tensors with new values (an output memoised by "
                      "the input's address or shape fails here)")
    assert_close(out1, ref1, dtype=dtype, rel_tol=rel_tol, scale=sc1,
                 name=f"{name}, the first call's output after a second call (one output buffer shared by every "
                      "call fails here)")
    assert torch.equal(out1.detach(), snapshot), f"{name}: a second call changed the first call's output"


def assert_fresh_in_graph(fn, inputs: dict, reference, *, name: str, dtype: torch.dtype | None = None,
                          rel_tol: float | None = None) -> None:
    """GPU: ``fn(**inputs)`` captured in a CUDA graph, then new values written into the same input
    tensors and the graph replayed: the replay's output must match ``reference(**inputs)`` of the new
    values. A call that does its work only when it is not being captured (or captures a copy of an
    earlier result) fails, and so does one that puts work on a stream the capture never sees; one that
    cannot be captured fails with the reason (work forked onto another stream and never joined back:
    "unjoined work", said so). The grader times
    calls this way, and stage 8's engine replays its kernels so."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            fn(**inputs)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            out = fn(**inputs)
    except Exception as e:  # noqa: BLE001 - said as the test's failure
        if "unjoined" in str(e):     # forked onto a stream of its own: the caller's stream never waits for it
            raise AssertionError(f"{name}: work left on another stream, never joined back to the caller's: a reader "
                                 "on the caller's stream may see the output before it is written (join it: "
                                 "torch.cuda.current_stream().wait_stream(side), or launch on the current stream). "
                                 f"The capture said: {type(e).__name__}: {str(e).splitlines()[0][:200]}") from None
        raise AssertionError(f"{name}: could not be captured in a CUDA graph ({type(e).__name__}: {e}). A kernel call "
                             "must not synchronise or read device values on the host: the grader times it, and stage "
                             "8's engine runs it, as a graph replay") from None
    with torch.no_grad():
        for t in inputs.values():
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                t.copy_(torch.randn_like(t, dtype=torch.float32).to(t.dtype))
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, reference(**inputs), dtype=dtype, rel_tol=rel_tol,
                 name=f"{name}, replayed from a CUDA graph after new values were written into its inputs (a call "
                      "that skips its work while captured, or replays an earlier result, fails here)")


def randn(*shape: int, dtype: torch.dtype = torch.float32, device: str | None = None,
          generator: torch.Generator | None = None, scale: float = 1.0) -> torch.Tensor:
    """Fresh random normal tensor (never zeros), created in fp32 then cast."""
    from . import DEVICE
    t = torch.randn(*shape, generator=generator, dtype=torch.float32) * scale
    return t.to(device=device or DEVICE, dtype=dtype)


def non_contiguous(x: torch.Tensor) -> torch.Tensor:
    """Same values as ``x`` but with a non-unit last-dim stride (a strided view)."""
    wide = torch.empty(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype, device=x.device)
    wide[..., ::2] = x
    view = wide[..., ::2]
    assert not view.is_contiguous() or x.shape[-1] <= 1
    return view


def tiny_gpt2_config():
    """A ``transformers.GPT2Config`` small enough for CPU tests (odd vocabulary on purpose).

    Build the model with ``transformers.GPT2LMHeadModel(tiny_gpt2_config()).eval()``:
    random weights, nothing downloaded. GPT-2's own layout (``Conv1D`` weights
    ``[in, out]``, ``transformer.h[i].mlp.act`` = ``NewGELUActivation``, the tanh GELU),
    no dropout, and:

    * ``attn_implementation="eager"``: attention as plain matmul + softmax, the same aten
      ops on every device and dtype (float64 on the CPU, fake CUDA tensors, a GPU), where
      ``"sdpa"`` picks a different kernel for each;
    * ``use_cache=False``: one forward over the whole sequence, no generation. The KV
      cache would start from ``torch.tensor([])`` on the input's device, a constant a
      compiled graph on fake CUDA tensors cannot make with a CPU-only torch;
    * ``bos_token_id = eos_token_id = 96``: the last id, as GPT-2's 50256 is (its default
      lies outside this vocabulary, and transformers warns about that).
    """
    from transformers import GPT2Config
    return GPT2Config(vocab_size=97, n_positions=64, n_embd=64, n_layer=2, n_head=4, activation_function="gelu_new",
                      resid_pdrop=0, embd_pdrop=0, attn_pdrop=0, attn_implementation="eager", use_cache=False,
                      bos_token_id=96, eos_token_id=96)


def randomize_(model: torch.nn.Module, *, generator: torch.Generator | None = None, std: float = 0.02) -> torch.nn.Module:
    """Give every bias and LayerNorm parameter random values too (the init zeros them /
    sets them to one), so a test exercises every parameter. In place; returns ``model``."""
    with torch.no_grad():
        for module in model.modules():
            for name, p in module.named_parameters(recurse=False):
                if name == "bias" or isinstance(module, torch.nn.LayerNorm):
                    base = 1.0 if name == "weight" else 0.0
                    p.copy_(base + std * torch.randn(p.shape, generator=generator).to(p))
    return model


def random_gpt2(seed: int, *, std: float | None = 0.1, **cfg):
    """A transformers ``GPT2LMHeadModel`` with random weights (nothing downloaded), in eval mode.

    ``cfg``: ``GPT2Config`` fields (sizes, ``initializer_range``); dropout is off. The weights come
    from ``seed`` without touching the global RNG. ``std``: biases and LayerNorm parameters get
    random values too (:func:`randomize_`; None keeps GPT-2's init, zeros and ones). ``generate``
    makes exactly ``max_new_tokens`` (no end-of-text stop), as the stage-8 engine does.
    """
    from transformers import GPT2Config, GPT2LMHeadModel
    vocab = cfg.get("vocab_size", 50257)
    if vocab <= 50256:                 # GPT-2's end-of-text id lies outside a small vocabulary
        cfg = {"bos_token_id": vocab - 1, "eos_token_id": vocab - 1, **cfg}
    config = GPT2Config(**cfg, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = GPT2LMHeadModel(config).eval()
    if std is not None:
        randomize_(model, generator=torch.Generator().manual_seed(seed + 1), std=std)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model
