"""Stage 9: a modern decoder (Llama 3, Qwen 3) on the course's kernels, against float64 references and
Hugging Face transformers' LlamaForCausalLM and Qwen3ForCausalLM.

The kernels (RMSNorm with the residual add fused in, rotary position embeddings with Qwen 3's per-head
q/k norm, SwiGLU, grouped-query decode and prefill attention) are compared with float64 references that
round where the model rounds, and with transformers' own modules (LlamaRMSNorm, Qwen3RMSNorm,
LlamaRotaryEmbedding + apply_rotary_pos_emb, the gated MLP's ``silu(gate) * up``, repeat_kv), on fresh
random inputs: odd sizes, batches with ragged lengths, strided rows, fp32/fp16/bf16. On a CPU everything
runs under the Triton interpreter at small sizes; on a GPU also at Llama-3.2-1B's and Qwen3-0.6B's
shapes, long contexts, and replayed from a CUDA graph.

Models have random weights (nothing is downloaded).
"""
from __future__ import annotations

import math

import pytest
import torch

from common import DEVICE, HAS_CUDA, reference
from common.kernel_check import (ATEN_KERNELS, DECODE_ATTENTION, NORM_KERNELS, TORCH_ARITH, TORCH_NORM, Forbidden,
                                 NotAKernel, assert_is_kernel, kernels_message, launched, watch)
from common.testing import REL_TOL, assert_close, assert_fresh_each_call, non_contiguous, randn
from tests.ids import dtype_id, shape_id

#: A kernel fed an unwritten buffer computes on garbage: the interpreter's numpy then warns of overflows and
#: invalid values, which say nothing the test's own message does not.
pytestmark = pytest.mark.filterwarnings(
    "ignore:(overflow|invalid value|divide by zero) encountered:RuntimeWarning")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _nan(shape, dtype, device=DEVICE):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", torch.float64)


def _round(t64: torch.Tensor, dtype) -> torch.Tensor:
    """A float64 value rounded to ``dtype`` (where the model rounds), back in float64."""
    return t64.to(dtype).to(torch.float64)


# ---------------------------------------------------------------- kernels: RMSNorm, RoPE, SwiGLU
#: What the three kernels may not call (common.kernel_check): the work belongs to the kernel. Slice assignment
#: (``qkv[..., :d] = rotated``: a view, then aten.copy_) counts as PyTorch doing RoPE's writes.
RMSNORM_KERNEL = Forbidden(TORCH_ARITH + TORCH_NORM + ("aten.rms_norm", "aten._fused_rms_norm*"),
                           ATEN_KERNELS + NORM_KERNELS + ("rms_norm",))
ROPE_KERNEL = Forbidden(TORCH_ARITH + TORCH_NORM + ("aten.cos", "aten.sin", "aten.neg", "aten.cat", "aten.copy",
                                                    "aten.index_put", "aten.slice_scatter"), ATEN_KERNELS)
SWIGLU_KERNEL = Forbidden(TORCH_ARITH + ("aten.silu", "aten.glu", "aten.sigmoid"), ATEN_KERNELS + ("silu", "glu"))

ROUND_NORM = ("round the normalised row to x's dtype BEFORE multiplying by the weight, then round the product; with a "
              "residual, normalise h as stored in x's dtype")
#: Tolerances of a normalised output: one rounding of the normalised row, one of the product (REL_TOL's).
NORM_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@pytest.fixture
def rms(impl):
    return impl.load("a09_llama_inference.rmsnorm")


@pytest.fixture
def rope(impl):
    return impl.load("a09_llama_inference.rope")


@pytest.fixture
def swi(impl):
    return impl.load("a09_llama_inference.swiglu")


def rmsnorm_ref(x: torch.Tensor, w: torch.Tensor, eps: float, dtype) -> torch.Tensor:
    """float64 RMSNorm of x's rows, rounded where transformers' LlamaRMSNorm rounds: the normalised row to
    ``dtype``, then the product with the weight (the caller's assert_close compares in ``dtype``)."""
    x64 = _f64(x)
    n = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    return _round(n, dtype) * _f64(w)


def assert_rounds_as_transformers(got: torch.Tensor, want: torch.Tensor, what: str, hint: str) -> None:
    """In 16 bits, ``got`` equals transformers' output ``want`` (same inputs, same dtype) bit for bit but for at most
    1% of the elements (a sum in another order, an exp one ulp off in fp32, can move a rounding): a kernel that rounds
    where the model does not (or skips a rounding it makes) differs in far more, yet within a plain tolerance."""
    differ = (got.detach().cpu() != want.detach().cpu()).float().mean().item()
    assert differ <= 0.01, (f"{what}: {differ:.1%} of the {got.dtype} outputs differ from transformers' (at most 1% "
                            f"may, by one rounding): {hint}")


def _llama_rmsnorm(n: int, eps: float, w: torch.Tensor, cls: str = "LlamaRMSNorm"):
    """transformers' own RMSNorm module (Llama's or Qwen 3's) holding the weight ``w``."""
    if cls == "LlamaRMSNorm":
        from transformers.models.llama.modeling_llama import LlamaRMSNorm as M
    else:
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm as M
    m = M(n, eps=eps).to(w.device, w.dtype)
    with torch.no_grad():
        m.weight.copy_(w)
    return m


# ------------------------------------------------ RMSNorm
@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(1, 64), (7, 1000), (3, 5, 100), (2, 2049), (4, 37)], ids=shape_id)
def test_rmsnorm(rms, dtype, shape, seed):
    """y = w · round(x · rsqrt(mean(x²) + eps)) against float64 and against transformers' LlamaRMSNorm in the same
    dtype; rows with a mean far from 0 (a kernel that subtracts the mean, as LayerNorm does, is off); N not a
    power of two (1000, 2049: padding must add nothing to the sum of squares); written into a NaN-filled out."""
    n = shape[-1]
    x = randn(*shape, dtype=dtype, scale=2.0) + 1.5
    w = (randn(n) * 0.5 + 1.0).to(dtype)
    out = _nan(shape, dtype)
    y = assert_is_kernel(lambda: rms.rmsnorm(x, w, 1e-5, out=out), RMSNORM_KERNEL, "rmsnorm")
    assert y is out, "rmsnorm must return the out tensor it was given"
    assert_close(y, rmsnorm_ref(x, w, 1e-5, dtype), dtype=dtype, rel_tol=NORM_TOL[dtype],
                 name=f"rmsnorm {shape}", inputs=dict(x=x, w=w))
    with torch.no_grad():
        want = _llama_rmsnorm(n, 1e-5, w)(x)
    assert_close(y, _f64(want), dtype=dtype, rel_tol=NORM_TOL[dtype], name=f"rmsnorm {shape} against LlamaRMSNorm")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(1, 64), (6, 1000), (2, 3, 2049)], ids=shape_id)
def test_add_rmsnorm(rms, dtype, shape, seed):
    """h = x + residual, stored in x's dtype (the residual stream), and y = RMSNorm(h as stored), one kernel;
    both written into NaN-filled buffers."""
    n = shape[-1]
    x, r = randn(*shape, dtype=dtype, scale=3.0), randn(*shape, dtype=dtype) + 2.0
    w = (randn(n) * 0.5 + 1.0).to(dtype)
    h_out, y_out = _nan(shape, dtype), _nan(shape, dtype)
    h, y = assert_is_kernel(lambda: rms.add_rmsnorm(x, r, w, 1e-6, out=y_out, h_out=h_out), RMSNORM_KERNEL,
                            "add_rmsnorm")
    assert h is h_out and y is y_out, "add_rmsnorm must return the out/h_out tensors it was given"
    assert_close(h, _f64(x) + _f64(r), dtype=dtype, name="h = x + residual")
    assert_close(y, rmsnorm_ref(h, w, 1e-6, dtype), dtype=dtype, rel_tol=NORM_TOL[dtype],
                 name="y = RMSNorm(h), h as stored in x's dtype")
    if dtype != torch.float32:
        with torch.no_grad():
            want = _llama_rmsnorm(n, 1e-6, w)(x + r)
        assert_rounds_as_transformers(y, want, "add_rmsnorm's y against LlamaRMSNorm(x + residual)", ROUND_NORM)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_rmsnorm_strided_rows_fp32_weight_and_fresh_values(rms, dtype, seed):
    """Rows that are a strided view (every other row of a wider buffer; [B, T, N] columns of a fused output),
    a residual with a strided last dim (copied by the wrapper), an fp32 weight with 16-bit x (the product rounded
    to x's dtype), the residual updated in place (h_out=residual), and the same shape again with new values."""
    n = 257
    big = randn(9, 2 * n, dtype=dtype, scale=2.0)
    w32 = randn(n) * 0.5 + 1.0
    for x in (big[::2, :n], big[:, n:], randn(2, 3, 3 * n, dtype=dtype)[..., n:2 * n]):
        y = assert_is_kernel(lambda: rms.rmsnorm(x, w32, 1e-6), RMSNORM_KERNEL, "rmsnorm")
        assert y.dtype == dtype and y.is_contiguous(), "rmsnorm returns a new contiguous tensor in x's dtype"
        assert_close(y, rmsnorm_ref(x, w32, 1e-6, dtype), dtype=dtype, rel_tol=NORM_TOL[dtype],
                     name=f"rmsnorm of a view with strides {x.stride()}, fp32 weight")
    x, r = big[1::2, :n], non_contiguous(randn(4, n, dtype=dtype) + 2.0)
    h, y = rms.add_rmsnorm(x, r, w32, 1e-6)
    assert_close(h, _f64(x) + _f64(r), dtype=dtype, name="h = x + residual, strided inputs")
    assert_close(y, rmsnorm_ref(h, w32, 1e-6, dtype), dtype=dtype, rel_tol=NORM_TOL[dtype],
                 name="y = RMSNorm(h), strided inputs")
    res = randn(3, n, dtype=dtype)
    x = randn(3, n, dtype=dtype)
    want_h = _f64(x) + _f64(res)
    h, y = rms.add_rmsnorm(x, res, w32, 1e-6, h_out=res)
    assert h is res, "add_rmsnorm must return the h_out tensor it was given"
    assert_close(h, want_h, dtype=dtype, name="h = x + residual, written over the residual (h_out=residual)")
    assert_close(y, rmsnorm_ref(h, w32, 1e-6, dtype), dtype=dtype, rel_tol=NORM_TOL[dtype],
                 name="y = RMSNorm(h), h written over the residual")
    x = randn(5, n, dtype=dtype, scale=3.0)
    assert_fresh_each_call(lambda x: rms.rmsnorm(x, w32, 1e-6), dict(x=x),
                           lambda x: rmsnorm_ref(x, w32, 1e-6, dtype), name="rmsnorm", dtype=dtype,
                           rel_tol=NORM_TOL[dtype])


@pytest.mark.parametrize("cls", ["LlamaRMSNorm", "Qwen3RMSNorm"])
def test_rmsnorm_as_transformers_rounds_it_in_bf16(rms, cls, seed):
    """bf16, as the models run: transformers rounds the normalised row to bf16 before the weight multiplies. A
    kernel that rounds once (or multiplies the weight first) differs from it in the last bit of many elements;
    this one may differ in few (the fp32 sum of squares in another order)."""
    n = 1000
    x = randn(16, n, dtype=torch.bfloat16, scale=2.0)
    w = (randn(n) * 0.5 + 1.0).to(torch.bfloat16)
    y = assert_is_kernel(lambda: rms.rmsnorm(x, w, 1e-6), RMSNORM_KERNEL, "rmsnorm")
    with torch.no_grad():
        want = _llama_rmsnorm(n, 1e-6, w, cls)(x)
    assert_close(y, _f64(want), dtype=torch.bfloat16, name=f"rmsnorm against {cls}")
    assert_rounds_as_transformers(y, want, f"rmsnorm against {cls}", ROUND_NORM)


def test_rmsnorm_eps_and_bad_inputs(rms, seed):
    """eps is used (rows of rms ~1e-3, where eps moves y visibly), and bad inputs raise clear errors (after a
    legal call)."""
    x = randn(3, 64, scale=1e-3)
    w = randn(64) + 1.0
    for eps in (1e-6, 1e-5):
        assert_close(rms.rmsnorm(x, w, eps), rmsnorm_ref(x, w, eps, torch.float32), dtype=torch.float32,
                     name=f"rmsnorm with eps={eps}")
    with pytest.raises(ValueError, match="weight"):
        rms.rmsnorm(x, randn(63), 1e-6)                                 # wrong length
    with pytest.raises(ValueError, match="weight"):
        rms.rmsnorm(x, randn(128)[::2], 1e-6)                           # not contiguous
    with pytest.raises(TypeError, match="weight"):
        rms.rmsnorm(x.bfloat16(), w.half(), 1e-6)                       # neither x's dtype nor fp32
    with pytest.raises(TypeError, match="dtype"):
        rms.rmsnorm(x.to(torch.int32), w, 1e-6)
    with pytest.raises(ValueError, match="x: expected a tensor on"):
        rms.rmsnorm(x.to("meta"), w, 1e-6)                              # not on the kernel device
    with pytest.raises(ValueError, match="residual"):
        rms.add_rmsnorm(x, randn(3, 65), w, 1e-6)
    with pytest.raises(ValueError, match="residual"):
        rms.add_rmsnorm(x, None, w, 1e-6)
    with pytest.raises(ValueError, match="out"):
        rms.rmsnorm(x, w, 1e-6, out=_nan((3, 65), torch.float32))
    with pytest.raises(ValueError, match="at most"):
        rms.rmsnorm(randn(1, 20000), randn(20000), 1e-6)
    with pytest.raises(TypeError, match="x"):
        rms.rmsnorm(x.tolist(), w, 1e-6)


# ------------------------------------------------ RoPE: the frequencies and the cache (given code)
LLAMA3_SCALING = dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=8192)


def _llama_config(head_dim: int, theta: float, scaling=None, **kw):
    """A small LlamaConfig with these rope settings (transformers 5 keeps them in ``rope_parameters``)."""
    from transformers import LlamaConfig
    n_head = kw.pop("n_head", 4)
    cfg = dict(hidden_size=n_head * head_dim, num_attention_heads=n_head, num_key_value_heads=kw.pop("n_kv_head", 2),
               head_dim=head_dim, max_position_embeddings=kw.pop("max_pos", 131072), rope_theta=theta, **kw)
    if scaling is not None:
        cfg["rope_scaling"] = dict(scaling)
    config = LlamaConfig(**cfg)
    if getattr(config, "rope_parameters", None) is not None:      # transformers 5 (5.17 and 5.24 alike)
        config.rope_parameters = {"rope_type": "default", **(scaling or {}), "rope_theta": theta}
    return config


def _hf_inv_freq(head_dim, theta, scaling=None) -> torch.Tensor:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    return LlamaRotaryEmbedding(_llama_config(head_dim, theta, scaling)).inv_freq


@pytest.mark.given
@pytest.mark.parametrize("scaling", [None, "llama3"])
@pytest.mark.parametrize("head_dim,theta", [(64, 500000.0), (128, 500000.0), (128, 1000000.0), (64, 10000.0),
                                            (80, 10000.0)], ids=lambda v: str(int(v)))
def test_rope_frequencies_are_transformers(rope, head_dim, theta, scaling):
    """rope_frequencies (given code) is bit for bit LlamaRotaryEmbedding's inv_freq, default and Llama 3 scaled;
    rope_cache's rows are cos/sin of (fp32 position · inv_freq) as transformers computes them."""
    sc = LLAMA3_SCALING if scaling else None
    got = rope.rope_frequencies(head_dim, theta, sc)
    want = _hf_inv_freq(head_dim, theta, sc)
    assert got.dtype == torch.float32 and got.shape == (head_dim // 2,)
    assert torch.equal(got, want), (f"inv_freq differs from transformers' at {(got != want).sum().item()} of "
                                    f"{head_dim // 2} places (head_dim {head_dim}, theta {theta}, scaling {scaling})")
    cos, sin = rope.rope_cache(got, 300, "cpu")
    pos = torch.tensor([[0, 1, 7, 299]])
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    hc, hs = LlamaRotaryEmbedding(_llama_config(head_dim, theta, sc))(torch.zeros(1, dtype=torch.float32), pos)
    assert torch.equal(cos[pos[0]], hc[0, :, :head_dim // 2]) and torch.equal(sin[pos[0]], hs[0, :, :head_dim // 2]), \
        "rope_cache: rows differ from transformers' cos/sin"


@pytest.mark.given
def test_rope_frequencies_refuse_what_they_do_not_know(rope):
    """Other rope types, odd head dims and bad cache sizes raise errors that name the problem."""
    with pytest.raises(ValueError, match="yarn"):
        rope.rope_frequencies(64, 10000.0, dict(rope_type="yarn", factor=4.0))
    with pytest.raises(ValueError, match="head_dim"):
        rope.rope_frequencies(63, 10000.0)
    with pytest.raises(ValueError, match="max_pos"):
        rope.rope_cache(rope.rope_frequencies(64, 10000.0), 0, "cpu")
    assert torch.equal(rope.rope_frequencies(64, 10000.0, dict(rope_type="default")), _hf_inv_freq(64, 10000.0))


# ------------------------------------------------ RoPE: the kernel
def rope_ref(qkv, cos, sin, start, n_head, n_kv_head, q_norm=None, k_norm=None, eps=1e-6) -> torch.Tensor:
    """float64 reference of apply_rope on a copy of ``qkv`` (taken BEFORE the call): [B, T, width], q and k rotated
    with the fp32 cos/sin rows start[b] + t (the same table the kernel reads), each head's optional RMSNorm
    rounded where transformers' Qwen3RMSNorm rounds (to qkv's dtype, twice); positions past the table left alone."""
    dtype = qkv.dtype
    x = _f64(qkv).clone()
    b, t, _ = x.shape
    d = 2 * cos.shape[1]
    heads = x[..., :(n_head + n_kv_head) * d].reshape(b, t, n_head + n_kv_head, d)
    for lo, hi, w in ((0, n_head, q_norm), (n_head, n_head + n_kv_head, k_norm)):
        if w is not None:
            h = heads[:, :, lo:hi]
            n = _round(h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps), dtype)
            heads[:, :, lo:hi] = _round(n * _f64(w), dtype)
    pos = start.cpu().long()[:, None] + torch.arange(t)                       # [B, T]
    ok = pos < cos.shape[0]
    c = _f64(cos)[pos.clamp(max=cos.shape[0] - 1)][:, :, None, :]            # [B, T, 1, d/2]
    s = _f64(sin)[pos.clamp(max=cos.shape[0] - 1)][:, :, None, :]
    x1, x2 = heads[..., :d // 2], heads[..., d // 2:]
    rot = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)
    heads = torch.where(ok[:, :, None, None], rot, heads)
    x[..., :(n_head + n_kv_head) * d] = heads.reshape(b, t, -1)
    return x


def rope_is_kernel(rope, qkv, *args, what: str = "apply_rope", **kwargs) -> None:
    """``apply_rope(qkv, *args, **kwargs)`` under the kernel check. It rotates in place, and on a GPU the check runs
    the call once more under the profiler: that second call goes to a copy, so qkv is rotated once."""
    __tracebackhide__ = True
    assert_is_kernel(lambda: rope.apply_rope(qkv, *args, **kwargs), ROPE_KERNEL, what, kernels=False)
    spare = torch.empty_strided(qkv.shape, qkv.stride(), dtype=qkv.dtype, device=qkv.device)
    spare.copy_(qkv)
    bad = launched(lambda: rope.apply_rope(spare, *args, **kwargs), ROPE_KERNEL)
    if bad:
        raise NotAKernel(kernels_message(what, bad))


def _qkv_view(b, t, width, dtype, pad=24):
    """qkv [B, T, width] as the fused projection's output inside a wider, NaN-padded buffer (row strides
    width + pad; T stride not B's / T): the kernel must take the strides it is given and write nothing else."""
    buf = _nan((b, t, width + pad), dtype)
    buf[..., :width] = randn(b, t, width, dtype=dtype, scale=2.0)
    return buf, buf[..., :width]


#: (B, T, n_head, n_kv_head, d, starts): decode (T = 1), a prompt, a ragged batch, GQA groups of 2 and 4 and
#: none (MHA), head dims 64, 128 and 80 (half of it, 40, padded to 64 with a mask).
ROPE_CASES = [
    (1, 1, 4, 2, 64, [5]),
    (2, 5, 4, 2, 64, [0, 17]),
    (3, 2, 4, 1, 128, [0, 3, 40]),
    (2, 3, 3, 1, 80, [1, 9]),
    (1, 4, 2, 2, 32, [60]),
]


def _rope_id(c):
    return f"B{c[0]}-T{c[1]}-H{c[2]}-KV{c[3]}-d{c[4]}"


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("case", ROPE_CASES, ids=_rope_id)
def test_apply_rope(rope, dtype, case, seed):
    """q and k rotated in place at positions start[b] + t, against float64 (Llama 3's scaled frequencies); v and
    the columns past the fused output (NaN) untouched; qkv a strided view of a wider buffer."""
    b, t, n_head, n_kv, d, starts = case
    inv = rope.rope_frequencies(d, 500000.0, LLAMA3_SCALING if d != 80 else None)
    cos, sin = rope.rope_cache(inv, 64, DEVICE)
    buf, qkv = _qkv_view(b, t, (n_head + 2 * n_kv) * d, dtype)
    start = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
    before = buf.clone()
    want = rope_ref(qkv, cos, sin, start, n_head, n_kv)
    rope_is_kernel(rope, qkv, cos, sin, start, n_head, n_kv)
    qk = (n_head + n_kv) * d
    assert_close(qkv[..., :qk], want[..., :qk], dtype=dtype, name=f"q and k after apply_rope, starts {starts}")
    after, was = buf.cpu(), before.cpu()
    same = (after[..., qk:] == was[..., qk:]) | (after[..., qk:].isnan() & was[..., qk:].isnan())
    assert same.all(), (f"apply_rope wrote outside q and k: {int((~same).sum())} values of v or of the buffer past "
                        f"qkv changed, the first at [b, t, col] = {(~same).nonzero()[0].tolist()} (col counted "
                        f"from {qk}, where v starts)")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_apply_rope_is_transformers_llama3_rotary(rope, dtype, seed):
    """Against transformers: LlamaRotaryEmbedding (rope_type llama3) and apply_rotary_pos_emb on the same q and k
    (in fp32, where transformers' cos/sin and its products are fp32, as the kernel computes), right-padded
    batch of two sequences at different offsets."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb
    b, t, n_head, n_kv, d = 2, 4, 4, 2, 64
    cfg = _llama_config(d, 500000.0, LLAMA3_SCALING, n_head=n_head, n_kv_head=n_kv)
    inv = rope.rope_frequencies(d, 500000.0, cfg.rope_parameters if hasattr(cfg, "rope_parameters")
                                else cfg.rope_scaling)
    cos, sin = rope.rope_cache(inv, 128, DEVICE)
    qkv = randn(b, t, (n_head + 2 * n_kv) * d, dtype=dtype)
    starts = [3, 100]
    x = qkv.detach().cpu().float()
    q = x[..., :n_head * d].view(b, t, n_head, d).transpose(1, 2)
    k = x[..., n_head * d:(n_head + n_kv) * d].view(b, t, n_kv, d).transpose(1, 2)
    pos = torch.tensor(starts)[:, None] + torch.arange(t)
    hc, hs = LlamaRotaryEmbedding(cfg)(x, pos)
    qr, kr = apply_rotary_pos_emb(q, k, hc, hs)
    rope.apply_rope(qkv, cos, sin, torch.tensor(starts, dtype=torch.int32, device=DEVICE), n_head, n_kv)
    got = qkv.cpu()
    assert_close(got[..., :n_head * d].view(b, t, n_head, d).transpose(1, 2), _f64(qr), dtype=dtype,
                 name="q against transformers' apply_rotary_pos_emb (llama3 scaling)")
    assert_close(got[..., n_head * d:(n_head + n_kv) * d].view(b, t, n_kv, d).transpose(1, 2), _f64(kr), dtype=dtype,
                 name="k against transformers' apply_rotary_pos_emb (llama3 scaling)")


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("norms", ["q+k", "q", "k"])
def test_apply_rope_with_qwen3_qk_norm(rope, dtype, norms, seed):
    """Qwen 3: each q head normalised with q_norm and each k head with k_norm (RMSNorm over the head's d values,
    rounded as Qwen3RMSNorm rounds) BEFORE the rotation; one norm alone leaves the other kind of head as it is.
    d = 128 (Qwen3-0.6B's), a batch of two at different offsets, heads with a mean far from 0."""
    b, t, n_head, n_kv, d = 2, 3, 4, 2, 128
    cos, sin = rope.rope_cache(rope.rope_frequencies(d, 1000000.0), 64, DEVICE)
    qkv = randn(b, t, (n_head + 2 * n_kv) * d, dtype=dtype, scale=3.0) + 1.0
    qn = (randn(d) * 0.5 + 1.0).to(dtype) if "q" in norms else None
    kn = (randn(d) * 0.5 + 1.0).to(dtype) if "k" in norms else None
    start = torch.tensor([2, 31], dtype=torch.int32, device=DEVICE)
    want = rope_ref(qkv, cos, sin, start, n_head, n_kv, qn, kn, 1e-6)
    rope_is_kernel(rope, qkv, cos, sin, start, n_head, n_kv, q_norm=qn, k_norm=kn, eps=1e-6,
                   what="apply_rope with q/k norm")
    assert_close(qkv, want, dtype=dtype, rel_tol=NORM_TOL[dtype],
                 name=f"q, k (norm: {norms}) and v after apply_rope with Qwen 3's per-head RMSNorm")


def test_apply_rope_qk_norm_is_transformers_qwen3(rope, seed):
    """Against transformers' Qwen3RMSNorm (q_norm, k_norm on each head) followed by apply_rotary_pos_emb, in
    bf16 as Qwen 3 runs (transformers' cos/sin and products are bf16 there, the kernel's fp32: a bf16 tolerance)."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb
    b, t, n_head, n_kv, d = 1, 4, 4, 2, 128
    dt = torch.bfloat16
    cos, sin = rope.rope_cache(rope.rope_frequencies(d, 1000000.0), 64, DEVICE)
    qkv = randn(b, t, (n_head + 2 * n_kv) * d, dtype=dt, scale=2.0)
    qw, kw = (randn(d) * 0.5 + 1.0).to(dt), (randn(d) * 0.5 + 1.0).to(dt)
    x = qkv.detach().cpu()
    qm, km = Qwen3RMSNorm(d, 1e-6).to(dt), Qwen3RMSNorm(d, 1e-6).to(dt)
    with torch.no_grad():
        qm.weight.copy_(qw.cpu())
        km.weight.copy_(kw.cpu())
        q = qm(x[..., :n_head * d].view(b, t, n_head, d)).transpose(1, 2).float()
        k = km(x[..., n_head * d:(n_head + n_kv) * d].view(b, t, n_kv, d)).transpose(1, 2).float()
    pos = 9 + torch.arange(t)
    c32, s32 = cos.cpu()[pos], sin.cpu()[pos]
    qr, kr = apply_rotary_pos_emb(q, k, torch.cat((c32, c32), -1)[None], torch.cat((s32, s32), -1)[None])
    rope.apply_rope(qkv, cos, sin, torch.tensor([9], dtype=torch.int32, device=DEVICE), n_head, n_kv,
                    q_norm=qw, k_norm=kw, eps=1e-6)
    got = qkv.cpu()
    assert_close(got[..., :n_head * d].view(b, t, n_head, d).transpose(1, 2), _f64(qr), dtype=dt,
                 name="q: Qwen3RMSNorm(q_norm) then the rotation")
    assert_close(got[..., n_head * d:(n_head + n_kv) * d].view(b, t, n_kv, d).transpose(1, 2), _f64(kr), dtype=dt,
                 name="k: Qwen3RMSNorm(k_norm) then the rotation")


def test_apply_rope_scores_depend_on_relative_position(rope, seed):
    """What RoPE is for: the score q(m)·k(n) of the same q and k depends on m - n only. Rotated at positions
    (m, n) and again at (m + 37, n + 37), the fp32 dot products agree; at (m, n + 1) they differ."""
    d, n_head, n_kv = 64, 1, 1
    cos, sin = rope.rope_cache(rope.rope_frequencies(d, 10000.0), 128, DEVICE)
    base = randn(1, 1, 3 * d)

    def score(m, n):
        qkv_q, qkv_k = base.clone(), base.clone()
        rope.apply_rope(qkv_q, cos, sin, torch.tensor([m], dtype=torch.int32, device=DEVICE), n_head, n_kv)
        rope.apply_rope(qkv_k, cos, sin, torch.tensor([n], dtype=torch.int32, device=DEVICE), n_head, n_kv)
        return (_f64(qkv_q[0, 0, :d]) * _f64(qkv_k[0, 0, d:2 * d])).sum().item()
    s1, s2, s3 = score(5, 2), score(42, 39), score(5, 3)
    assert math.isclose(s1, s2, rel_tol=1e-4, abs_tol=1e-4), \
        f"q(5)·k(2) = {s1:.6f} but q(42)·k(39) = {s2:.6f}: a rotation by position must keep scores relative"
    assert not math.isclose(s1, s3, rel_tol=1e-3, abs_tol=1e-3), \
        f"q(5)·k(2) = {s1:.6f} equals q(5)·k(3) = {s3:.6f}: the positions are not applied"


def test_apply_rope_fresh_values_and_bad_inputs(rope, seed):
    """The same shapes twice with new values; a token at or past the cos/sin table is left as it is; bad inputs
    raise clear errors (after a legal call)."""
    b, t, n_head, n_kv, d = 2, 2, 2, 1, 32
    cos, sin = rope.rope_cache(rope.rope_frequencies(d, 10000.0), 20, DEVICE)
    start = torch.tensor([3, 19], dtype=torch.int32, device=DEVICE)           # sequence 1's 2nd token: position 20
    for _ in range(2):
        qkv = randn(b, t, (n_head + 2 * n_kv) * d)
        want = rope_ref(qkv, cos, sin, start, n_head, n_kv)
        rope.apply_rope(qkv, cos, sin, start, n_head, n_kv)
        assert_close(qkv, want, dtype=torch.float32, name="apply_rope (position 20 past a 20-row table untouched)")
    with pytest.raises(ValueError, match="qkv"):
        rope.apply_rope(randn(b, t, 5 * d), cos, sin, start, n_head, n_kv)        # width != (H + 2·Hkv)·d
    with pytest.raises(ValueError, match="qkv"):
        rope.apply_rope(qkv[0], cos, sin, start, n_head, n_kv)                    # not [B, T, width]
    with pytest.raises(ValueError, match="contiguous last dim"):
        rope.apply_rope(non_contiguous(qkv), cos, sin, start, n_head, n_kv)
    with pytest.raises(TypeError, match="start"):
        rope.apply_rope(qkv, cos, sin, start.long(), n_head, n_kv)
    with pytest.raises(ValueError, match="start"):
        rope.apply_rope(qkv, cos, sin, start[:1], n_head, n_kv)
    with pytest.raises(TypeError, match="cos"):
        rope.apply_rope(qkv, cos.bfloat16(), sin, start, n_head, n_kv)
    with pytest.raises(ValueError, match="sin"):
        rope.apply_rope(qkv, cos, sin[:5], start, n_head, n_kv)
    with pytest.raises(ValueError, match="q_norm"):
        rope.apply_rope(qkv, cos, sin, start, n_head, n_kv, q_norm=randn(d + 1))
    with pytest.raises(ValueError, match="n_kv_head"):
        rope.apply_rope(qkv, cos, sin, start, n_head, 0)
    with pytest.raises(ValueError, match="qkv: expected a tensor on"):
        rope.apply_rope(qkv.to("meta"), cos, sin, start, n_head, n_kv)


# ------------------------------------------------ SwiGLU
def swiglu_ref(gu: torch.Tensor) -> torch.Tensor:
    """float64 silu(gate) · up, the SiLU rounded to gu's dtype first (as transformers' LlamaMLP computes it)."""
    f = gu.shape[-1] // 2
    g, u = _f64(gu[..., :f]), _f64(gu[..., f:])
    return _round(g * torch.sigmoid(g), gu.dtype) * u


@pytest.mark.parametrize("dtype", DTYPES, ids=dtype_id)
@pytest.mark.parametrize("shape", [(1, 128), (5, 2000), (2, 3, 600), (3, 4098), (4, 74)], ids=shape_id)
def test_swiglu(swi, dtype, shape, seed):
    """silu(gate) · up for gu = [gate | up] [..., 2F], against float64 and against transformers' act_fn(gate) · up
    in the same dtype; F not a power of two (1000, 2049: several column blocks, the last one partial); written
    into a NaN-filled out."""
    f = shape[-1] // 2
    gu = randn(*shape, dtype=dtype, scale=3.0)
    out = _nan((*shape[:-1], f), dtype)
    y = assert_is_kernel(lambda: swi.swiglu(gu, out=out), SWIGLU_KERNEL, "swiglu")
    assert y is out, "swiglu must return the out tensor it was given"
    assert_close(y, swiglu_ref(gu), dtype=dtype, name=f"swiglu {shape}", inputs=dict(gu=gu))
    want = torch.nn.functional.silu(gu[..., :f].cpu()) * gu[..., f:].cpu()
    assert_close(y, _f64(want), dtype=dtype, name=f"swiglu {shape} against F.silu(gate) * up in {dtype_id(dtype)}")
    if dtype != torch.float32:
        assert_rounds_as_transformers(y, want, f"swiglu {shape} against F.silu(gate) * up",
                                      "round silu(gate) to the dtype before multiplying by up, then round the product")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dtype_id)
def test_swiglu_strided_rows_and_fresh_values(swi, dtype, seed):
    """gu as the rows of a wider buffer (a GEMM's output slice) and as [B, T, 2F] with strided rows; the default
    output (new, contiguous); the same shape twice with new values."""
    f = 300
    big = randn(7, 2 * f + 9, dtype=dtype, scale=2.0)
    for gu in (big[:, :2 * f], big[::2, 5:5 + 2 * f], randn(2, 3, 2 * f + 4, dtype=dtype)[..., 4:]):
        y = assert_is_kernel(lambda: swi.swiglu(gu), SWIGLU_KERNEL, "swiglu")
        assert y.shape == (*gu.shape[:-1], f) and y.dtype == dtype and y.is_contiguous(), \
            f"swiglu: expected a new contiguous {dtype} tensor of shape {(*gu.shape[:-1], f)}, got {tuple(y.shape)}"
        assert_close(y, swiglu_ref(gu), dtype=dtype, name=f"swiglu of a view with strides {gu.stride()}")
    assert_fresh_each_call(lambda gu: swi.swiglu(gu), dict(gu=randn(4, 2 * f, dtype=dtype)), swiglu_ref,
                           name="swiglu", dtype=dtype)


def test_swiglu_bad_inputs(swi, seed):
    """Bad inputs raise clear errors (after a legal call)."""
    gu = randn(3, 64, scale=2.0)
    assert_close(swi.swiglu(gu), swiglu_ref(gu), dtype=torch.float32, name="swiglu (before the error checks)")
    with pytest.raises(ValueError, match="odd"):
        swi.swiglu(randn(3, 65))
    with pytest.raises(TypeError, match="gu"):
        swi.swiglu(gu.to(torch.int32))
    with pytest.raises(ValueError, match="gu: expected a tensor on"):
        swi.swiglu(gu.to("meta"))
    with pytest.raises(ValueError, match="out"):
        swi.swiglu(gu, out=_nan((3, 64), torch.float32))
    with pytest.raises(TypeError, match="out"):
        swi.swiglu(gu, out=_nan((3, 32), torch.bfloat16))
    with pytest.raises(TypeError, match="gu"):
        swi.swiglu(gu.tolist())


# ------------------------------------------------ the kernels at the models' shapes (GPU)
#: Llama-3.2-1B and Qwen3-0.6B: hidden size, heads, KV heads, head dim, MLP width, rope theta, scaling, q/k norm.
MODEL_SHAPES = {
    "llama-3.2-1b": dict(hidden=2048, n_head=32, n_kv=8, d=64, ffn=8192, theta=500000.0, scaling=LLAMA3_SCALING,
                         qk_norm=False),
    "qwen3-0.6b": dict(hidden=1024, n_head=16, n_kv=8, d=128, ffn=3072, theta=1000000.0, scaling=None, qk_norm=True),
}


@pytest.mark.gpu
@pytest.mark.parametrize("b,t", [(1, 1), (8, 1), (2, 1000)], ids=["decode-B1", "decode-B8", "prefill-B2-T1000"])
@pytest.mark.parametrize("model", list(MODEL_SHAPES))
def test_rmsnorm_rope_swiglu_at_model_shapes(rms, rope, swi, model, b, t, seed):
    """bf16 at the models' own shapes: add_rmsnorm over the hidden size, apply_rope over the fused QKV output (a
    view of a wider buffer; Qwen 3 with its q/k norm), SwiGLU over [gate | up], each against float64."""
    m = MODEL_SHAPES[model]
    dt = torch.bfloat16
    x, r = randn(b, t, m["hidden"], dtype=dt, scale=2.0), randn(b, t, m["hidden"], dtype=dt)
    w = (randn(m["hidden"]) * 0.5 + 1.0).to(dt)
    h, y = assert_is_kernel(lambda: rms.add_rmsnorm(x, r, w, 1e-5), RMSNORM_KERNEL, "add_rmsnorm")
    assert_close(h, _f64(x) + _f64(r), dtype=dt, name=f"{model} h = x + residual")
    assert_close(y, rmsnorm_ref(h, w, 1e-5, dt), dtype=dt, name=f"{model} add_rmsnorm")
    d, n_head, n_kv = m["d"], m["n_head"], m["n_kv"]
    cos, sin = rope.rope_cache(rope.rope_frequencies(d, m["theta"], m["scaling"]), 4096, DEVICE)
    _, qkv = _qkv_view(b, t, (n_head + 2 * n_kv) * d, dt)
    start = torch.tensor([17 * i for i in range(b)], dtype=torch.int32, device=DEVICE)
    qn = kn = None
    if m["qk_norm"]:
        qn, kn = (randn(d) * 0.5 + 1.0).to(dt), (randn(d) * 0.5 + 1.0).to(dt)
    want = rope_ref(qkv, cos, sin, start, n_head, n_kv, qn, kn)
    rope_is_kernel(rope, qkv, cos, sin, start, n_head, n_kv, q_norm=qn, k_norm=kn)
    assert_close(qkv, want, dtype=dt, name=f"{model} apply_rope")
    gu = randn(b, t, 2 * m["ffn"], dtype=dt, scale=2.0)
    got = assert_is_kernel(lambda: swi.swiglu(gu), SWIGLU_KERNEL, "swiglu")
    assert_close(got, swiglu_ref(gu), dtype=dt, name=f"{model} swiglu")


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True], ids=["plain", "pdl"])
def test_rmsnorm_rope_swiglu_in_a_cuda_graph(rms, rope, swi, pdl, seed):
    """A decode step's three kernels captured in one CUDA graph (with programmatic dependent launch where the GPU
    has it) and replayed on new values: each output follows the values of its replay."""
    from common.testing import assert_fresh_in_graph
    dt, hidden, n_head, n_kv, d, ffn = torch.bfloat16, 2048, 32, 8, 64, 8192
    w = (randn(hidden) * 0.5 + 1.0).to(dt)
    assert_fresh_in_graph(lambda x, r: rms.add_rmsnorm(x, r, w, 1e-5, pdl=pdl)[1],
                          dict(x=randn(4, hidden, dtype=dt), r=randn(4, hidden, dtype=dt)),
                          lambda x, r: rmsnorm_ref((_f64(x) + _f64(r)).to(dt), w, 1e-5, dt),
                          name="add_rmsnorm", dtype=dt)
    cos, sin = rope.rope_cache(rope.rope_frequencies(d, 500000.0, LLAMA3_SCALING), 256, DEVICE)
    start = torch.tensor([3, 70, 0, 255], dtype=torch.int32, device=DEVICE)
    width = (n_head + 2 * n_kv) * d
    src = randn(4, 1, width, dtype=dt)

    def rotate(src):
        qkv = src.clone()
        rope.apply_rope(qkv, cos, sin, start, n_head, n_kv, pdl=pdl)
        return qkv
    assert_fresh_in_graph(rotate, dict(src=src), lambda src: rope_ref(src, cos, sin, start, n_head, n_kv),
                          name="apply_rope", dtype=dt)
    assert_fresh_in_graph(lambda gu: swi.swiglu(gu, pdl=pdl), dict(gu=randn(4, 2 * ffn, dtype=dt)), swiglu_ref,
                          name="swiglu", dtype=dt)


# ---------------------------------------------------------------- grouped-query attention: decode and prefill
GQA_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
GQA_DTYPE_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
#: Stage 8's decode-attention tolerances. fp32: IEEE dots (a TF32 dot, ~3e-4, fails); 16-bit: the probabilities
#: rounded once to the dtype for P·V, the output once (bf16 ~2e-3 at 600-1000 keys, fp16 ~3e-4).
GQA_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def _gqa_dt(dtype) -> str:
    return GQA_DTYPE_IDS[dtype]


@pytest.fixture
def gqa(impl):
    return impl.load("a09_llama_inference.decode_attention")


def _repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """transformers' repeat_kv: [B, Hkv, S, d] -> [B, Hkv·G, S, d], query head h reading KV head h // G."""
    return x.repeat_interleave(group, dim=1)


def _gqa_reference(q, k, v, lengths) -> torch.Tensor:
    return reference.decode_attention(q, _repeat_kv(k, q.shape[1] // k.shape[1]), _repeat_kv(v, q.shape[1] // k.shape[1]),
                                      lengths)


def _gqa_inputs(b: int, hkv: int, g: int, d: int, s_max: int, lengths: list[int], dtype, *, scale: float = 1.0):
    """q as the engine passes it (a view of the fused q|k|v row: strided rows), the caches with NaN past every
    sequence's length (a read past it poisons the output) and distinct values per KV head."""
    h = hkv * g
    qkv = randn(b, (h + 2 * hkv) * d, dtype=dtype, scale=scale)
    q = qkv[:, :h * d].view(b, h, d)
    k, v = randn(b, hkv, s_max, d, dtype=dtype, scale=scale), randn(b, hkv, s_max, d, dtype=dtype)
    for i, n in enumerate(lengths):
        k[i, :, n:] = float("nan")
        v[i, :, n:] = float("nan")
    return q, k, v, torch.tensor(lengths, dtype=torch.int32, device=DEVICE)


#: (B, Hkv, G, d, S_max, lengths): H = Hkv·G; the id says them (B2-Hkv2-G4-d64-S40).
GQA_CASES = [
    (1, 1, 1, 64, 1, [1]),                      # G = 1 (plain multi-head attention), one key
    (2, 2, 2, 64, 40, [40, 7]),
    (3, 2, 4, 32, 150, [1, 77, 150]),           # a batch of different lengths, one of them 1
    (1, 1, 8, 128, 70, [70]),                   # one KV head for 8 query heads (S_max: the whole cache)
    (2, 8, 2, 16, 33, [33, 17]),                # 8 KV heads
    (2, 1, 4, 80, 40, [40, 3]),                 # head dims not a power of two: padded, masked
    (1, 2, 3, 96, 21, [21]),                    # a group that is no power of two: padded rows masked
    (2, 1, 2, 16, 600, [600, 531]),             # past 512 keys: a length capped at a power of two shows
]
#: On a GPU also the real models' head dims at lengths past every power of two of the tiles and splits.
GQA_GPU_CASES = [
    (2, 8, 4, 64, 4200, [4200, 1025]),          # Llama-3.2-1B's heads (32 / 8, d 64)
    (3, 8, 2, 128, 1100, [257, 513, 1100]),     # Qwen3-0.6B's heads (16 / 8, d 128)
    (1, 2, 8, 128, 9000, [8193]),
]


def _gqa_id(c) -> str:
    return f"B{c[0]}-Hkv{c[1]}-G{c[2]}-d{c[3]}-S{c[4]}"


@pytest.mark.parametrize("dtype", GQA_DTYPES, ids=_gqa_dt)
@pytest.mark.parametrize("splits", [None, 1, 3], ids=["splits-auto", "splits1", "splits3"])
@pytest.mark.parametrize("b,hkv,g,d,s_max,lengths", GQA_CASES + (GQA_GPU_CASES if HAS_CUDA else []),
                         ids=[_gqa_id(c) for c in GQA_CASES + (GQA_GPU_CASES if HAS_CUDA else [])])
def test_gqa_decode_attention(gqa, dtype, b, hkv, g, d, s_max, lengths, splits, seed):
    """One query per (sequence, query head) against the first lengths[b] positions of its KV head h // G,
    against float64 with transformers' repeat_kv; q a strided view, NaN past every length, into ``out``."""
    q, k, v, lens = _gqa_inputs(b, hkv, g, d, s_max, lengths, dtype)
    out = torch.full((b, hkv * g, d), float("nan"), dtype=dtype, device=DEVICE)
    got = assert_is_kernel(lambda: gqa.gqa_decode_attention(q, k, v, lens, splits=splits, out=out), DECODE_ATTENTION,
                           "gqa_decode_attention")
    assert got is out, "gqa_decode_attention must return the out tensor it was given"
    assert_close(got, _gqa_reference(q, k, v, lengths), dtype=dtype, rel_tol=GQA_TOL[dtype],
                 name=f"GQA decode attention, H={hkv * g} Hkv={hkv}, lengths {lengths}, splits={splits}",
                 inputs=dict(q=q, k_cache=k))


def test_gqa_decode_attention_large_scores_default_out_and_fresh_values(gqa, seed):
    """Scores of ±50 (exp overflows without the running max, and splits merged without their max), the
    default output buffer, and the same shapes called again with new values."""
    b, hkv, g, d, s = 2, 2, 2, 64, 70
    lengths = [70, 41]
    q, k, v, lens = _gqa_inputs(b, hkv, g, d, s, lengths, torch.float32, scale=3.0)
    got = gqa.gqa_decode_attention(q, k, v, lens, splits=3)
    assert_close(got, _gqa_reference(q, k, v, lengths), dtype=torch.float32, rel_tol=1e-5, name="large scores")
    k, v = torch.nan_to_num(k), torch.nan_to_num(v)
    assert_fresh_each_call(lambda q, k, v: gqa.gqa_decode_attention(q, k, v, lens, splits=2), dict(q=q, k=k, v=v),
                           lambda q, k, v: _gqa_reference(q, k, v, lengths), name="GQA decode attention",
                           dtype=torch.float32, rel_tol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_gqa_dt)
def test_gqa_decode_attention_is_deterministic(gqa, dtype, seed):
    """The same inputs give the same bits (several splits, combined in a fixed order)."""
    b, hkv, g, d = 2, 2, 4, 64
    lengths = [200, 93] if not HAS_CUDA else [3000, 1001]
    q, k, v, lens = _gqa_inputs(b, hkv, g, d, max(lengths), lengths, dtype)
    first = gqa.gqa_decode_attention(q, k, v, lens, splits=4)
    second = gqa.gqa_decode_attention(q, k, v, lens, splits=4)
    assert_close(first, _gqa_reference(q, k, v, lengths), dtype=dtype, rel_tol=GQA_TOL[dtype], name="first call")
    assert torch.equal(first, second), "two calls on the same inputs gave different bits"


def _gqa_legal_call(gqa):
    """A legal call checked first: a bad-input test must fail while the kernel is not written."""
    q, k, v, lens = _gqa_inputs(2, 2, 2, 64, 10, [10, 3], torch.float32)
    assert_close(gqa.gqa_decode_attention(q, k, v, lens), _gqa_reference(q, k, v, [10, 3]), dtype=torch.float32,
                 name="GQA decode attention (before the error checks)")
    return torch.nan_to_num(q), torch.nan_to_num(k), torch.nan_to_num(v), lens


#: name -> (the call's arguments made from a legal (q, k, v, lens), the error, what its message must say)
GQA_BAD = {
    "H-not-a-multiple-of-Hkv": (lambda q, k, v, n: (q[:, :3], k, v, n), ValueError, "multiple"),
    "lengths-not-int32": (lambda q, k, v, n: (q, k, v, n.long()), TypeError, "lengths"),
    "lengths-per-sequence": (lambda q, k, v, n: (q, k, v, n[:1]), ValueError, "lengths"),
    "k-and-v-shapes": (lambda q, k, v, n: (q, k, v[:, :, :5], n), ValueError, "v_cache"),
    "batch-mismatch": (lambda q, k, v, n: (q[:1], k, v, n[:1]), ValueError, "k_cache"),
    "head-dim-mismatch": (lambda q, k, v, n: (q[..., :32], k, v, n), ValueError, "k_cache"),
    "head-dim-too-large": (lambda q, k, v, n: (randn(2, 4, 272), randn(2, 2, 10, 272), randn(2, 2, 10, 272), n),
                           ValueError, "head dim"),
    "dtypes-differ": (lambda q, k, v, n: (q, k.to(torch.float16), v.to(torch.float16), n), TypeError, "dtype"),
    "wrong-device": (lambda q, k, v, n: (q, k.to("meta"), v.to("meta"), n), ValueError, "k_cache"),
    "last-dim-strided": (lambda q, k, v, n: (q, non_contiguous(k), v, n), ValueError, "contiguous"),
    "q-not-3d": (lambda q, k, v, n: (q[None], k, v, n), ValueError, "q"),
}


@pytest.mark.parametrize("case", list(GQA_BAD))
def test_gqa_decode_attention_bad_inputs(gqa, case, seed):
    """Each bad input gets a clear error naming what is wrong (after a legal call)."""
    make, error, words = GQA_BAD[case]
    q, k, v, lens = _gqa_legal_call(gqa)
    with pytest.raises(error, match=words):
        gqa.gqa_decode_attention(*make(q, k, v, lens))


def test_gqa_decode_attention_out_and_splits_checked(gqa, seed):
    """``out`` of the wrong shape or dtype, and splits < 1, are refused (after a legal call)."""
    q, k, v, lens = _gqa_legal_call(gqa)
    with pytest.raises(ValueError, match="out"):
        gqa.gqa_decode_attention(q, k, v, lens, out=torch.empty(2, 3, 64, device=DEVICE))
    with pytest.raises(TypeError, match="out"):
        gqa.gqa_decode_attention(q, k, v, lens, out=torch.empty(2, 4, 64, dtype=torch.float16, device=DEVICE))
    with pytest.raises(ValueError, match="splits"):
        gqa.gqa_decode_attention(q, k, v, lens, splits=0)


# -------------------------------------------- prefill: stage 7's attention through a KV-head mapping of strides
#: (B, Hkv, G, T, T_k, d)
GQA_PREFILL_CASES = [
    (2, 2, 2, 9, 9, 64),                        # the engine's call: the prompt's own keys, lower triangle
    (1, 1, 4, 13, 13, 32),
    (2, 2, 3, 5, 12, 80),                       # T_k > T: the queries are the last T positions
    (1, 8, 1, 7, 7, 16),                        # G = 1
]


def _gqa_prefill_inputs(b, hkv, g, t, t_k, d, dtype, s_max: int = 24):
    """q a view of the prompt's fused projection [B, T, (H + 2·Hkv)·d] (strided heads); k, v the cache's first
    T_k slots, k_cache[:, :, :T_k] (stride(0) = Hkv·stride(1), slots past T_k hold NaN)."""
    h = hkv * g
    qkv = randn(b, t, (h + 2 * hkv) * d, dtype=dtype)
    q = qkv[..., :h * d].unflatten(-1, (h, d)).transpose(1, 2)
    kc, vc = randn(b, hkv, s_max, d, dtype=dtype), randn(b, hkv, s_max, d, dtype=dtype)
    kc[:, :, t_k:] = float("nan")
    vc[:, :, t_k:] = float("nan")
    return q, kc[:, :, :t_k], vc[:, :, :t_k]


def _gqa_prefill_reference(q, k, v):
    g = q.shape[1] // k.shape[1]
    return reference.attention(q, _repeat_kv(k, g), _repeat_kv(v, g), is_causal=True)[0]


@pytest.mark.parametrize("dtype", GQA_DTYPES, ids=_gqa_dt)
@pytest.mark.parametrize("b,hkv,g,t,t_k,d", GQA_PREFILL_CASES,
                         ids=[f"B{c[0]}-Hkv{c[1]}-G{c[2]}-T{c[3]}-Tk{c[4]}-d{c[5]}" for c in GQA_PREFILL_CASES])
def test_gqa_prefill_attention(gqa, dtype, b, hkv, g, t, t_k, d, seed):
    """Causal prompt attention with grouped KV heads (bottom-right aligned where T_k > T), on your a07
    forward (``make check STAGE=a09 BORROW=a07`` takes the reference one until yours is done)."""
    q, k, v = _gqa_prefill_inputs(b, hkv, g, t, t_k, d, dtype)
    # q is a strided view of the fused projection: its rearrangement to [B·Hkv, G, T, d] is a PyTorch copy
    # kernel on a GPU (q only; that K and V are never copied is the test below), so only the trace is checked
    got = assert_is_kernel(lambda: gqa.gqa_prefill_attention(q, k, v, allow_tf32=False), DECODE_ATTENTION,
                           "gqa_prefill_attention", kernels=False)
    assert_close(got, _gqa_prefill_reference(q, k, v), dtype=dtype, rel_tol=GQA_TOL[dtype],
                 name=f"GQA prefill attention, H={hkv * g} Hkv={hkv}, T={t}, T_k={t_k}")


def test_gqa_prefill_copies_no_key_or_value(gqa, seed):
    """A contiguous q [B, H, T, d] is rearranged as a view and K, V are viewed with a stride of 0: the call
    copies nothing (a repeat_kv copy of K and V would be G times the cache's bytes)."""
    b, hkv, g, t, d = 2, 2, 4, 11, 32
    q = randn(b, hkv * g, t, d)
    kc, vc = randn(b, hkv, 16, d), randn(b, hkv, 16, d)
    gqa.gqa_prefill_attention(q, kc[:, :, :t], vc[:, :, :t], allow_tf32=False)   # compiled (tuned) outside the trace
    with watch() as trace:
        got = gqa.gqa_prefill_attention(q, kc[:, :, :t], vc[:, :, :t], allow_tf32=False)
    assert_close(got, _gqa_prefill_reference(q, kc[:, :, :t], vc[:, :, :t]), dtype=torch.float32,
                 name="GQA prefill attention (contiguous q)")
    copies = sorted({op for op in trace.ops if any(w in op for w in ("copy", "clone", "repeat", "cat", "index"))})
    assert not copies, f"the prefill copied tensors ({copies}): K and V must be read through strides, not repeated"


GQA_PREFILL_BAD = {
    "H-not-a-multiple-of-Hkv": (lambda q, k, v: (q[:, :3], k, v), "multiple"),
    "T_k-below-T": (lambda q, k, v: (q, k[:, :, :4], v[:, :, :4]), "T_k"),
    "k-heads-not-mergeable": (lambda q, k, v: (q, k.transpose(0, 1).contiguous().transpose(0, 1), v), "stride"),
    "k-and-v-shapes": (lambda q, k, v: (q, k, v[:, :, :5]), "one shape"),
    "head-dim-mismatch": (lambda q, k, v: (q[..., :16], k, v), "d="),
}


@pytest.mark.parametrize("case", list(GQA_PREFILL_BAD))
def test_gqa_prefill_attention_bad_inputs(gqa, case, seed):
    """Each broken assumption of the stride mapping gets a clear error (after a legal call)."""
    q, k, v = _gqa_prefill_inputs(2, 2, 2, 6, 6, 32, torch.float32)
    assert_close(gqa.gqa_prefill_attention(q, k, v, allow_tf32=False), _gqa_prefill_reference(q, k, v),
                 dtype=torch.float32, name="GQA prefill attention (before the error checks)")
    make, words = GQA_PREFILL_BAD[case]
    with pytest.raises(ValueError, match=words):
        gqa.gqa_prefill_attention(*make(q, k, v))


# -------------------------------------------------------------------------------- on a GPU
@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True], ids=["no-pdl", "pdl"])
def test_gqa_decode_attention_in_a_cuda_graph(gqa, pdl, seed):
    """Captured in a CUDA graph and replayed on new values (several splits and the combine; with PDL)."""
    from common.testing import assert_fresh_in_graph
    b, hkv, g, d, s_max = 3, 8, 4, 64, 1500
    lengths = [1500, 257, 1025]
    q, k, v, lens = _gqa_inputs(b, hkv, g, d, s_max, lengths, torch.bfloat16)
    k, v = torch.nan_to_num(k), torch.nan_to_num(v)
    assert_fresh_in_graph(lambda q, k, v: gqa.gqa_decode_attention(q, k, v, lens, pdl=pdl), dict(q=q, k=k, v=v),
                          lambda q, k, v: _gqa_reference(q, k, v, lengths), name=f"GQA decode attention, pdl={pdl}",
                          dtype=torch.bfloat16, rel_tol=GQA_TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("splits,kernels", [(1, 1), (8, 2)], ids=["splits1", "splits8"])
def test_gqa_decode_attention_kernels_per_call(gqa, splits, kernels, seed):
    """One kernel per call, the split kernel (two with splits: and the combine): no repeat_kv copy, no PyTorch
    kernel, no host transfer."""
    from common.profiling import profile
    b, hkv, g, d, s_max = 4, 8, 4, 64, 2048
    lengths = [2048, 1000, 1, 513]
    q, k, v, lens = _gqa_inputs(b, hkv, g, d, s_max, lengths, torch.bfloat16)
    rep = profile(lambda: gqa.gqa_decode_attention(q, k, v, lens, splits=splits))
    assert rep.n_kernels == kernels, f"expected {kernels} kernel(s) per call:\n{rep.table()}"
    assert rep.host_transfers == 0, f"host transfers in a decode attention call:\n{rep.table()}"
    assert_close(gqa.gqa_decode_attention(q, k, v, lens, splits=splits), _gqa_reference(q, k, v, lengths),
                 dtype=torch.bfloat16, rel_tol=GQA_TOL[torch.bfloat16], name=f"splits={splits}")
