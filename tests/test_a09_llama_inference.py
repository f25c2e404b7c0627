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

import copy
import math

import pytest
import torch

from common import DEVICE, HAS_CUDA, reference
from common.kernel_check import (DECODE_ATTENTION, ENGINE, GEMV_KERNEL, GQA_ATTENTION, RMSNORM_KERNEL, ROPE_KERNEL,
                                 SWIGLU_KERNEL, NotAKernel, assert_is_kernel, called, host_syncs, kernels_message, launched, watch)
from common.testing import REL_TOL, assert_close, assert_fresh_each_call, non_contiguous, randn, rel_error
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
    # q is a strided view of the fused projection: its rearrangement to [B·Hkv, G, T, d] may be a PyTorch copy
    # kernel on a GPU, which GQA_ATTENTION allows (q only; that K and V are never copied is the test below)
    got = assert_is_kernel(lambda: gqa.gqa_prefill_attention(q, k, v, allow_tf32=False), GQA_ATTENTION,
                           "gqa_prefill_attention")
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


# ---------------------------------------------------------------- the engine
_ENG_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
#: The shared shape of the CPU models: a vocabulary of 300, SwiGLU width 96, 64 positions.
_ENG_BASE = dict(vocab_size=300, intermediate_size=96, max_position_embeddings=64)
_ENG_LLAMA3 = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=16)
#: (architecture, config): GQA groups 1, 4, 8 and 2; head dims 64 and 128 (128 with hidden 64: wider q than
#: the residual stream); Llama 3's RoPE scaling (factor 8 from 16 original positions: every band of the
#: frequencies is used by a 20-token sequence); tied and untied LM heads; Qwen 3's q/k norm.
_ENG_CONFIGS = {
    "llama-g1-d64-untied": ("llama", dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                          num_key_value_heads=2, head_dim=64, tie_word_embeddings=False)),
    "llama-g4-d128-llama3-tied": ("llama", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                                num_key_value_heads=1, head_dim=128, rope_theta=500000.0,
                                                rope_scaling=_ENG_LLAMA3, tie_word_embeddings=True)),
    "llama-g8-d64-llama3-3layers": ("llama", dict(hidden_size=128, num_hidden_layers=3, num_attention_heads=8,
                                                  num_key_value_heads=1, head_dim=64, rope_theta=500000.0,
                                                  rope_scaling=_ENG_LLAMA3, tie_word_embeddings=False)),
    "qwen3-g2-d64-qknorm": ("qwen3", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=64, tie_word_embeddings=True)),
}
#: Sampling under the interpreter costs milliseconds a row per vocabulary block: one layer, a vocabulary of 48.
_ENG_SAMPLING = ("llama", dict(vocab_size=48, hidden_size=64, intermediate_size=96, max_position_embeddings=64,
                               num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                               rope_scaling=_ENG_LLAMA3, tie_word_embeddings=False))
_ENG_MODELS: dict = {}


def _eng_model(name: str, seed: int = 5):
    """The random-weight transformers model of config ``name`` (built once per process)."""
    if name not in _ENG_MODELS:
        from common.course.stages import random_llama
        arch, cfg = _ENG_CONFIGS[name] if name in _ENG_CONFIGS else _ENG_SAMPLING
        _ENG_MODELS[name] = random_llama(seed + len(_ENG_MODELS), arch, **{**_ENG_BASE, **cfg})
    return _ENG_MODELS[name]


@pytest.fixture
def llama(impl):
    """The stage-9 engine module; its tests fail at once, saying why, while the a06 matmul, the a07 attention or
    the a08 GEMV / KV write it runs on is not written (common.course.stages.a09_dependencies: how to borrow)."""
    from common.course.stages import a09_dependencies
    needs = a09_dependencies(impl.load)
    if needs:
        pytest.fail(needs, pytrace=False)
    return impl.load("a09_llama_inference.engine")


def _eng_engine(llama, model, dtype=torch.float32, max_batch=3, max_seq_len=48, **kw):
    return llama.LlamaEngine.from_hf(model, dtype=dtype, max_batch=max_batch, max_seq_len=max_seq_len, tuned=False, **kw)


def _eng_prompts(lengths, seed, vocab=_ENG_BASE["vocab_size"]):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def _eng_hf_generate(model, prompt: list[int], n: int, **kw) -> list[int]:
    """transformers' greedy tokens after one prompt (run alone: no padding), on the model's device."""
    dev = next(model.parameters()).device
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt], device=dev), max_new_tokens=n, do_sample=False,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=dev), **kw)
    return out[0, len(prompt):].tolist()


def _eng_logits(model, ids: list[int], dtype) -> torch.Tensor:
    """Logits [T, vocab] of one sequence from a copy of the model in ``dtype`` on the CPU (float64: the reference)."""
    key = f"_course_{dtype}"
    m = getattr(model, key, None)
    if m is None:
        import copy
        m = copy.deepcopy(model).to("cpu", dtype)
        setattr(model, key, m)
    with torch.no_grad():
        return m(torch.tensor([ids])).logits[0].double()


#: New tokens per prompt on a CPU: the longest prompt (13) then crosses 16 cached keys.
_ENG_NEW = 4


@pytest.mark.parametrize("config", list(_ENG_CONFIGS))
def test_engine_generate_matches_transformers(llama, config, seed):
    """Greedy tokens identical to transformers' generate(do_sample=False) (fp32) for a right-padded batch of
    prompts of lengths 7, 2 and 13, each compared with the prompt run alone; the engine keeps Hkv heads in its
    cache, transformers' RoPE frequencies bit for bit, and the LM head tied (a view of the embedding) or not."""
    model = _eng_model(config)
    cfg = model.config
    engine = _eng_engine(llama, model)
    assert engine.cache.k.shape[2] == cfg.num_key_value_heads and engine.head_dim == cfg.head_dim, (
        f"KV cache {tuple(engine.cache.k.shape)}: expected {cfg.num_key_value_heads} KV heads of {cfg.head_dim}")
    assert torch.equal(engine.inv_freq.cpu(), model.model.rotary_emb.inv_freq.cpu()), \
        "RoPE inverse frequencies differ from transformers' (rope_theta, rope scaling)"
    tied = engine.lm_w.data_ptr() == engine.embed_w.data_ptr()
    assert tied == bool(cfg.tie_word_embeddings), f"LM head shares the embedding: {tied}, config says " \
                                                  f"tie_word_embeddings={cfg.tie_word_embeddings}"
    prompts = _eng_prompts([7, 2, 13], seed)
    got = engine.generate(prompts, _ENG_NEW).tolist()
    for i, p in enumerate(prompts):
        want = _eng_hf_generate(model, p, _ENG_NEW)
        assert got[i] == want, (f"{config}, prompt {i} (length {len(p)}, batch of 3): first difference at new token "
                                f"{next(j for j in range(_ENG_NEW) if got[i][j] != want[j])}\n"
                                f"engine:       {got[i]}\ntransformers: {want}")


def _eng_allowed(hf_err: float, dtype) -> float:
    """A few times transformers' own error in the dtype, never below the dtype's floor."""
    return max(4.0 * hf_err, {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=lambda d: _ENG_IDS[d])
@pytest.mark.parametrize("config", ["llama-g4-d128-llama3-tied", "qwen3-g2-d64-qknorm"])
def test_engine_logits_against_transformers(llama, config, dtype, seed):
    """Prefill of a right-padded batch (lengths 5, 12) and 3 teacher-forced decode steps: the logits at every real
    position and step against transformers in float64, within a few times transformers' own error in the
    engine's dtype; the cache lengths advance by one a step."""
    model = _eng_model(config)
    engine = _eng_engine(llama, model, dtype, max_batch=2)
    prompts, follow = _eng_prompts([5, 12], seed), _eng_prompts([3, 3], seed + 1)
    ids, lengths = engine.pad(prompts)
    logits = engine.prefill(ids, lengths, all_logits=True)
    engine.prefill(ids, lengths)
    steps = []
    for j in range(3):
        steps.append(engine.decode_step(torch.tensor([f[j] for f in follow], device=engine.device)))
        assert engine.cache.lengths[:2].tolist() == [n + j + 1 for n in lengths], (
            f"after decode step {j + 1}: cache lengths {engine.cache.lengths[:2].tolist()}")
    for i, (p, f) in enumerate(zip(prompts, follow)):
        ref = _eng_logits(model, p + f, torch.float64)
        theirs = _eng_logits(model, p + f, dtype)
        for what, mine, sl in (("prefill", logits[i, :len(p)], slice(0, len(p))),
                               ("decode", torch.stack([s[i] for s in steps]), slice(len(p), len(p) + 3))):
            err, hf_err = rel_error(mine, ref[sl]), rel_error(theirs[sl], ref[sl])
            assert err <= _eng_allowed(hf_err, dtype), (
                f"{config} {_ENG_IDS[dtype]}: {what} logits of sequence {i} (prompt length {len(p)}): relative "
                f"error {err:.2e} against transformers in float64; transformers in {_ENG_IDS[dtype]}: {hf_err:.2e}")


def test_engine_decode_step_runs_on_the_course_kernels(llama, seed):
    """A decode step runs every GEMM on the a08 GEMV (4 a layer: q|k|v, o, gate|up, down; and the LM head), calls
    no PyTorch matmul, norm, softmax or attention and reads no device value on the host (a CUDA graph holds
    it); neither does prefill call PyTorch for the work."""
    model = _eng_model("qwen3-g2-d64-qknorm")
    engine = _eng_engine(llama, model, max_batch=2)
    ids, lengths = engine.pad(_eng_prompts([4, 9], seed))
    with watch(ENGINE) as t:
        engine.prefill(ids, lengths)
    bad = called(t, ENGINE)
    assert not bad, f"prefill called PyTorch for the kernels' work: {bad}"
    calls, gemv = [], llama.gemv

    def counted(x, w, *a, **kw):
        calls.append(tuple(w.shape))
        return gemv(x, w, *a, **kw)
    llama.gemv = counted
    try:
        with watch(ENGINE) as t, host_syncs() as syncs:
            logits = engine.decode_step(torch.tensor([3, 5], device=engine.device))
    finally:
        llama.gemv = gemv
    assert logits.shape == (2, model.config.vocab_size), f"decode_step returned shape {tuple(logits.shape)}"
    bad = called(t, ENGINE)
    assert not bad, f"decode_step called PyTorch for the kernels' work: {bad}"
    syncs += [op for op in t.ops if "_local_scalar_dense" in op]
    assert not syncs, f"decode_step reads device values on the host: {sorted(set(syncs))}"
    n = model.config.num_hidden_layers
    assert len(calls) == 4 * n + 1, f"decode_step ran {len(calls)} GEMMs on the gemv, expected {4 * n + 1}: {calls}"


def test_engine_sampling_eos_and_streaming(llama, seed):
    """Through stage 8's request loop: sampling is reproducible by seed (top_k=1 is greedy), eos_token_id
    stops each sequence where transformers' greedy generate stops it (the rest padded), and stream() yields
    generate()'s tokens step by step."""
    model = _eng_model("sampling")
    engine = _eng_engine(llama, model)
    prompts = _eng_prompts([5, 9, 2], seed, model.config.vocab_size)
    n = 5
    greedy = engine.generate(prompts, n).tolist()
    a = engine.generate(prompts, 2, do_sample=True, temperature=1.5, seed=seed).tolist()
    assert engine.generate(prompts, 2, do_sample=True, temperature=1.5, seed=seed).tolist() == a, \
        "two sampled generations with one seed differ"
    assert engine.generate(prompts, 2, do_sample=True, top_k=1, seed=seed).tolist() == [g[:2] for g in greedy], \
        "sampling with top_k=1 is not greedy"
    eos = sorted({g[k] for g, k in zip(greedy, (1, 3, 2))})
    got = engine.generate(prompts, n, eos_token_id=eos, pad_token_id=7, check_every=2).tolist()
    want = [_eng_hf_generate(model, p, n, eos_token_id=eos, pad_token_id=7) for p in prompts]
    assert len(got[0]) == max(len(w) for w in want), (
        f"generate() returned {len(got[0])} steps; transformers' longest sequence ends after {max(map(len, want))}")
    for i, w in enumerate(want):
        assert got[i][:len(w)] == w, f"sequence {i}: engine {got[i]}, transformers {w} (eos {eos})"
        assert all(t == 7 for t in got[i][len(w):]), f"sequence {i} after its EOS: {got[i][len(w):]}, expected pad 7"
    steps = list(engine.stream(prompts, n, eos_token_id=eos, pad_token_id=7))
    assert torch.stack(steps, 1).tolist() == got, "stream() and generate() disagree"


def _eng_unsupported():
    """(what, model, the message's words) for configs from_hf must refuse."""
    from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                              MistralForCausalLM, Qwen3Config, Qwen3ForCausalLM)
    small = dict(vocab_size=40, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
                 num_key_value_heads=1, max_position_embeddings=32)
    return [
        ("GPT-2", GPT2LMHeadModel(GPT2Config(vocab_size=40, n_embd=32, n_layer=1, n_head=2, n_positions=32)), "gpt2"),
        ("Mistral", MistralForCausalLM(MistralConfig(**small, sliding_window=16)), "mistral"),
        ("attention_bias", LlamaForCausalLM(LlamaConfig(**small, attention_bias=True)), "attention_bias"),
        ("mlp_bias", LlamaForCausalLM(LlamaConfig(**small, mlp_bias=True)), "mlp_bias"),
        ("hidden_act", LlamaForCausalLM(LlamaConfig(**small, hidden_act="gelu")), "hidden_act"),
        ("rope_type", LlamaForCausalLM(LlamaConfig(**small, rope_scaling={"rope_type": "linear", "factor": 2.0})),
         "rope_type='linear'"),
        ("head_dim", LlamaForCausalLM(LlamaConfig(**small, head_dim=512)), "head_dim=512"),
        ("sliding window", Qwen3ForCausalLM(Qwen3Config(**small, use_sliding_window=True, sliding_window=8,
                                                        max_window_layers=0)), "sliding"),
    ]


def test_engine_refuses_bad_input_and_stays_usable(llama, seed):
    """A bad token id, a prompt longer than the cache, too many sequences (ValueError saying what and what is
    expected), and configs the kernels do not run (another architecture, biases, an activation other than
    SiLU, another RoPE type, head_dim over the kernels' maximum, sliding windows: ValueError naming it); a
    generate() after the refusals gives the same tokens as before them."""
    model = _eng_model("qwen3-g2-d64-qknorm")
    engine = _eng_engine(llama, model, max_batch=2, max_seq_len=16)
    good = _eng_prompts([3, 5], seed)
    first = engine.generate(good, 3).tolist()
    with pytest.raises(ValueError, match=r"token id 300 in sequence 1 at position 0 .*vocab_size=300"):
        engine.generate([[1, 2], [300]], 2)
    with pytest.raises(ValueError, match="max_seq_len"):
        engine.generate([[1] * 14], 4)
    with pytest.raises(ValueError, match="batch"):
        engine.generate([[1], [2], [3]], 2)
    with pytest.raises(TypeError, match="integers"):
        engine.generate([[1.0, 2.5]], 2)
    for what, bad, words in _eng_unsupported():
        with pytest.raises(ValueError, match=words) as e:
            llama.LlamaEngine.from_hf(bad)
        assert "not supported" in str(e.value), f"{what}: {e.value}"
    assert engine.generate(good, 3).tolist() == first, "generate() after refused inputs gave other tokens"


#: On a GPU: a wider model (hidden 512, 4 layers, 16 query heads of 64 over 4 KV heads, vocabulary 4096) and a
#: Qwen 3 of heads 128, 32 new tokens a prompt.
_ENG_GPU = {
    "llama-gpu": ("llama", dict(vocab_size=4096, hidden_size=512, intermediate_size=1408, num_hidden_layers=4,
                                num_attention_heads=16, num_key_value_heads=4, head_dim=64, rope_theta=500000.0,
                                rope_scaling=dict(_ENG_LLAMA3, original_max_position_embeddings=64),
                                max_position_embeddings=512, tie_word_embeddings=True)),
    "qwen3-gpu": ("qwen3", dict(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                                num_attention_heads=8, num_key_value_heads=2, head_dim=128, max_position_embeddings=512,
                                tie_word_embeddings=False)),
}


@pytest.mark.gpu
@pytest.mark.parametrize("config", list(_ENG_GPU))
def test_engine_generate_larger_models_on_gpu(llama, config, seed):
    """fp32: 32 greedy tokens identical to transformers for a ragged batch (lengths 21, 3, 64, 18), with and
    without CUDA graphs; bf16: prefill and decode logits within a few times transformers' own bf16 error."""
    from common.course.stages import random_llama
    arch, cfg = _ENG_GPU[config]
    model = random_llama(11, arch, std=0.1, **cfg).to(DEVICE)
    engine = llama.LlamaEngine.from_hf(model, dtype=torch.float32, max_batch=4, max_seq_len=128, tuned=False)
    prompts = _eng_prompts([21, 3, 64, 18], seed, cfg["vocab_size"])
    got = engine.generate(prompts, 32).tolist()
    assert engine.generate(prompts, 32, cuda_graph=False).tolist() == got, "CUDA-graph and eager steps differ"
    for i, p in enumerate(prompts):
        want = _eng_hf_generate(model, p, 32)
        assert got[i] == want, f"{config}, prompt {i} (length {len(p)}): engine {got[i]}, transformers {want}"
    engine = llama.LlamaEngine.from_hf(model, dtype=torch.bfloat16, max_batch=1, max_seq_len=128, tuned=False)
    p, f = prompts[0], _eng_prompts([4], seed + 1, cfg["vocab_size"])[0]
    ids, lengths = engine.pad([p])
    pre = engine.prefill(ids, lengths, all_logits=True)[0]
    engine.prefill(ids, lengths)
    dec = torch.stack([engine.decode_step(torch.tensor([t], device=DEVICE))[0] for t in f])
    mine = torch.cat([pre, dec]).double().cpu()
    ref = _eng_logits(model.cpu(), p + f, torch.float64)[:len(p) + len(f)]
    theirs = _eng_logits(model, p + f, torch.bfloat16)[:len(p) + len(f)]
    assert rel_error(mine, ref) <= _eng_allowed(rel_error(theirs, ref), torch.bfloat16), (
        f"{config} bf16 logits: relative error {rel_error(mine, ref):.2e}, transformers bf16 {rel_error(theirs, ref):.2e}")


# ---------------------------------------------------------------- the tuned path
# solutions/a09_llama_inference/tuned.py (given code, the reference engine's default) and the two epilogues it
# added to a08's tuned GEMV (solutions/a08_gpt2_inference/tuned_gemv.py: rms_fold, swiglu).

_TUNED_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
_TUNED_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
#: Split K 3 ways (K = 91: 32, 32 and 27 rows), 32-column blocks (16 SwiGLU features a block); no split.
_TUNED_SPLIT, _TUNED_NO_SPLIT = (32, 16, 3, 4, 1), (64, 32, 1, 4, 1)
#: Tiny models for the interpreter: Llama (tied embeddings, GQA 4:2) and Qwen 3 (untied, q/k norms, head_dim 32
#: with 4 heads: q is wider than the hidden size).
_TUNED_LLAMA = dict(vocab_size=131, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.3, tie_word_embeddings=True)
_TUNED_QWEN3 = dict(vocab_size=131, hidden_size=64, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=32, max_position_embeddings=64, initializer_range=0.3,
                    tie_word_embeddings=False, rms_norm_eps=1e-6)


def _tuned_dt(dtype) -> str:
    return _TUNED_IDS[dtype]


@pytest.fixture
def tuned_gv():
    """The tuned path's GEMV (given code beside the reference, solutions/a08_gpt2_inference/tuned_gemv.py)."""
    from common.impl import load
    return load("a08_gpt2_inference.tuned_gemv", "solutions")


@pytest.fixture
def tuned_engine(impl):
    return impl.load("a09_llama_inference.engine")


def _tuned_weight(k: int, n: int, dtype, layout: str) -> torch.Tensor:
    """W [K, N]: "kn" row-major (N contiguous) or "nk.t" K-major (the tuned path's decode copies)."""
    if layout == "kn":
        return randn(k, n, dtype=dtype, scale=k**-0.5)
    return randn(n, k, dtype=dtype, scale=k**-0.5).t()


def _rms64(x: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.to("cpu", torch.float64)
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * g.to("cpu", torch.float64)


@pytest.mark.given
@pytest.mark.parametrize("dtype", _TUNED_DTYPES, ids=_tuned_dt)
@pytest.mark.parametrize("m", [1, 3, 16], ids=lambda m: f"M{m}")
@pytest.mark.parametrize("split", [False, True], ids=["one-split", "split-k"])
def test_tuned_gemv_rmsnorm_fold(tuned_gv, dtype, m, split, seed):
    """gemv(x, fold_rmsnorm(γ, W), rms_fold=True) = RMSNorm(x)·W against float64, the residual in the same
    epilogue: x with a mean far from 0 (a LayerNorm's statistics, or none, are off), K = 91, N = 133, both
    layouts (by M: 1 and 16 K-major, 3 N-major), split 3 ways or not; the fold keeps W's layout."""
    k, n, eps = 91, 133, 1e-6
    x = randn(m, k, dtype=dtype, scale=3.0) + 2.0
    w = _tuned_weight(k, n, dtype, "kn" if m == 3 else "nk.t")
    g, r = randn(k, dtype=dtype) + 1.0, randn(m, n, dtype=dtype)
    w_f = tuned_gv.fold_rmsnorm(g, w)
    assert w_f.stride() == w.stride() and w_f.dtype == w.dtype, "fold_rmsnorm: w_f keeps w's layout and dtype"
    cfg = _TUNED_SPLIT if split else _TUNED_NO_SPLIT
    y = _rms64(x, g, eps)
    w64 = w.to("cpu", torch.float64)
    want = y @ w64 + r.to("cpu", torch.float64)
    scale = y.abs() @ w64.abs() + r.to("cpu", torch.float64).abs()
    got = assert_is_kernel(lambda: tuned_gv.gemv(x, w_f, residual=r, rms_fold=True, eps=eps, config=cfg),
                           GEMV_KERNEL, "gemv with the RMSNorm folded in")
    assert_close(got, want, dtype=dtype, rel_tol=3 * REL_TOL[dtype], scale=scale,
                 name=f"gemv {m}x{k}: RMSNorm(x) @ W + residual, config {cfg}")
    plain = tuned_gv.gemv(x, w, residual=r, config=cfg)           # the same call without the flag: no norm
    assert rel_error(plain, want) > 10 * REL_TOL[dtype], "rms_fold=False must leave x as it is"
    with pytest.raises(ValueError, match="rms_fold"):
        tuned_gv.gemv(x, w_f, rms_fold=True, ln_colsum=torch.zeros(n, device=DEVICE))


@pytest.mark.given
@pytest.mark.parametrize("dtype", _TUNED_DTYPES, ids=_tuned_dt)
@pytest.mark.parametrize("m", [1, 2, 5], ids=lambda m: f"M{m}")
@pytest.mark.parametrize("fold", [False, True], ids=["no-norm", "rms-fold"])
@pytest.mark.parametrize("split", [False, True], ids=["one-split", "split-k"])
def test_tuned_gemv_swiglu_epilogue(tuned_gv, dtype, m, fold, split, seed):
    """gemv(x, interleave_gate_up(W), swiglu=True) = silu(x·W_gate)·(x·W_up) [M, F] against float64, with and
    without the RMSNorm fold: F = 67 features (odd: the last 32-column block holds a partial pair count), K = 91,
    M = 1, 2 (FMAs) and 5 (tl.dot), split or not. In 16 bits the result is what transformers' rounding gives
    from the two rounded projections (silu rounded, the product rounded): within a rounding of it."""
    k, f, eps = 91, 67, 1e-5
    x = randn(m, k, dtype=dtype, scale=2.0) + (1.0 if fold else 0.0)
    w = _tuned_weight(k, 2 * f, dtype, "nk.t" if m != 2 else "kn")           # [gate | up]
    g = randn(k, dtype=dtype) + 1.0
    w_i = tuned_gv.interleave_gate_up(tuned_gv.fold_rmsnorm(g, w) if fold else w)
    cfg = _TUNED_SPLIT if split else _TUNED_NO_SPLIT
    got = assert_is_kernel(lambda: tuned_gv.gemv(x, w_i, swiglu=True, rms_fold=fold, eps=eps, config=cfg),
                           GEMV_KERNEL, "gemv with the SwiGLU epilogue")
    assert got.shape == (m, f) and got.dtype == dtype, f"swiglu=True: expected [{m}, {f}] {dtype}, got " \
                                                       f"{tuple(got.shape)} {got.dtype}"
    y = _rms64(x, g, eps) if fold else x.to("cpu", torch.float64)
    w64 = w.to("cpu", torch.float64)
    gu, s = y @ w64, y.abs() @ w64.abs()
    gate, up = gu[:, :f], gu[:, f:]
    want = torch.nn.functional.silu(gate) * up
    scale = (gate.abs() + s[:, :f]) * (up.abs() + s[:, f:])
    assert_close(got, want, dtype=dtype, rel_tol=3 * REL_TOL[dtype], scale=scale,
                 name=f"gemv {m}x{k}: silu(gate)·up{' of RMSNorm(x)' if fold else ''}, config {cfg}")
    if dtype != torch.float32 and not fold:      # transformers' roundings of the unfused projections
        two = tuned_gv.gemv(x, w, config=cfg).float()
        ref = (torch.nn.functional.silu(two[:, :f]).to(dtype).float() * two[:, f:]).to(dtype)
        assert_close(got, ref.to("cpu", torch.float64), dtype=dtype, rel_tol=REL_TOL[dtype],
                     name="swiglu epilogue against the unfused GEMV, silu and product rounded as transformers")


def _rotate64(y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: list[int], heads: int, d: int):
    """transformers' rotate_half rotation of the first ``heads`` heads of each row of y [M, N] at pos[m], float64."""
    y = y.clone()
    half = d // 2
    for m, p in enumerate(pos):
        c, s = cos[p].double(), sin[p].double()
        for h in range(heads):
            x1, x2 = y[m, h * d:h * d + half].clone(), y[m, h * d + half:(h + 1) * d].clone()
            y[m, h * d:h * d + half], y[m, h * d + half:(h + 1) * d] = x1 * c - x2 * s, x2 * c + x1 * s
    return y


@pytest.mark.given
@pytest.mark.parametrize("dtype", _TUNED_DTYPES, ids=_tuned_dt)
@pytest.mark.parametrize("m", [1, 2, 5], ids=lambda m: f"M{m}")
@pytest.mark.parametrize("fold", [False, True], ids=["no-norm", "rms-fold"])
@pytest.mark.parametrize("split", [False, True], ids=["one-split", "split-k"])
def test_tuned_gemv_rope_and_kv_write_epilogue(tuned_gv, dtype, m, fold, split, seed):
    """gemv(x, interleave_rope(W_qkv, d), kv_cache=..., rope=rope_table(cos, sin)): q|k|v of a grouped-query
    attention (4 q heads, 2 KV heads, head dim 12: not a power of 2) with q and k rotated at each row's position
    (the projection rounded to the dtype, rotated in fp32, rounded once: apply_rope's arithmetic) against
    float64; k and v in the caches exactly as the output has them (the same bits), each row at its own slot,
    nothing else of the caches written; with and without the RMSNorm fold, split or not."""
    h, hkv, d, k, s_max, eps = 4, 2, 12, 37, 9, 1e-5
    n = (h + 2 * hkv) * d
    x = randn(m, k, dtype=dtype, scale=2.0) + (1.0 if fold else 0.0)
    w = _tuned_weight(k, n, dtype, "nk.t" if m != 2 else "kn")
    g = randn(k, dtype=dtype) + 1.0
    inv = 1.0 / 10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.arange(s_max, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    pos = [(3 * i + 1) % s_max for i in range(m - 1)] + [s_max - 1]
    start = torch.tensor(pos, dtype=torch.int32, device=DEVICE)
    kc = torch.full((m, hkv, s_max, d), float("nan"), dtype=dtype, device=DEVICE)
    vc = kc.clone()
    w_r = tuned_gv.interleave_rope(tuned_gv.fold_rmsnorm(g, w) if fold else w, d)
    assert w_r.stride() == w.stride(), "interleave_rope must keep w's layout"
    cfg = _TUNED_SPLIT if split else _TUNED_NO_SPLIT
    got = assert_is_kernel(lambda: tuned_gv.gemv(x, w_r, rms_fold=fold, eps=eps, kv_cache=(kc, vc, start),
                                                 rope=tuned_gv.rope_table(cos, sin).to(DEVICE), config=cfg),
                           GEMV_KERNEL, "gemv with the rotation and the KV write")
    y = _rms64(x, g, eps) if fold else x.to("cpu", torch.float64)
    w64 = w.to("cpu", torch.float64)
    want = _rotate64(y @ w64, cos, sin, pos, h + hkv, d)
    s0 = y.abs() @ w64.abs()                                  # a rotated value sums the terms of both of its pair
    scale = s0 + s0.view(m, -1, 2, d // 2).flip(2).reshape(m, n)
    assert_close(got, want, dtype=dtype, rel_tol=3 * REL_TOL[dtype], scale=scale,
                 name=f"gemv {m}x{k} q|k|v rotated{' of RMSNorm(x)' if fold else ''}, config {cfg}")
    kw, vw = torch.full_like(kc, float("nan")), torch.full_like(vc, float("nan"))
    for i, p in enumerate(pos):
        kw[i, :, p] = got[i, h * d:(h + hkv) * d].view(hkv, d)
        vw[i, :, p] = got[i, (h + hkv) * d:].view(hkv, d)
    for name, have, exp in (("K", kc, kw), ("V", vc, vw)):
        assert torch.equal(have.nan_to_num(7.0).cpu(), exp.nan_to_num(7.0).cpu()), (
            f"gemv's rope epilogue: the {name} cache differs from the output's {name} heads (rotated k, v as is) "
            f"at each row's slot start[b]; nothing else may be written")
    with pytest.raises(ValueError, match="rope"):
        tuned_gv.gemv(x, w_r, rope=tuned_gv.rope_table(cos, sin).to(DEVICE))                 # no kv_cache
    with pytest.raises(ValueError, match="rope"):
        tuned_gv.gemv(x, w_r, kv_cache=(kc, vc, start), rope=tuned_gv.rope_table(cos[:4], sin[:4]).to(DEVICE))


@pytest.mark.given
@pytest.mark.parametrize("layout", ["kn", "nk.t"])
def test_tuned_interleave_and_fold_keep_layout_and_check_inputs(tuned_gv, layout, seed):
    """interleave_gate_up: column 2f = gate f, 2f + 1 = up f, w's memory layout kept (a K-major copy stays
    K-major), the bias interleaved alike; fold_rmsnorm: diag(γ)·W rounded once. Bad shapes: ValueError; the
    gemv's swiglu refuses an odd N, a residual and a KV cache with it."""
    k, f = 13, 9
    w = _tuned_weight(k, 2 * f, torch.float32, layout)
    b = randn(2 * f)
    w_i, b_i = tuned_gv.interleave_gate_up(w, b)
    assert w_i.stride() == w.stride(), f"interleave_gate_up: layout {layout} changed: {w.stride()} -> {w_i.stride()}"
    assert torch.equal(w_i[:, 0::2], w[:, :f]) and torch.equal(w_i[:, 1::2], w[:, f:]), \
        "interleave_gate_up: column 2f must be the gate's column f, 2f + 1 the up's"
    assert torch.equal(b_i[0::2], b[:f]) and torch.equal(b_i[1::2], b[f:])
    g = randn(k)
    assert torch.equal(tuned_gv.fold_rmsnorm(g, w), (g.double()[:, None] * w.double()).float())
    with pytest.raises(ValueError, match="2F"):
        tuned_gv.interleave_gate_up(randn(k, 2 * f + 1))
    with pytest.raises(ValueError, match="fold_rmsnorm"):
        tuned_gv.fold_rmsnorm(randn(k + 1), w)
    x = randn(2, k)
    with pytest.raises(ValueError, match="even"):
        tuned_gv.gemv(x, randn(k, 2 * f + 1), swiglu=True)
    with pytest.raises(ValueError, match="swiglu"):
        tuned_gv.gemv(x, w_i, swiglu=True, residual=randn(2, f))


# ------------------------------------------------ the tuned path in the engine
def _tuned_model(arch: str, dtype=torch.float32, **over):
    import transformers
    torch.manual_seed(0)
    if arch == "llama":
        cfg, cls = transformers.LlamaConfig(**{**_TUNED_LLAMA, **over}), transformers.LlamaForCausalLM
    else:
        cfg, cls = transformers.Qwen3Config(**{**_TUNED_QWEN3, **over}), transformers.Qwen3ForCausalLM
    model = cls(cfg).eval().to(dtype)
    model.generation_config.eos_token_id = None          # generate() as long as asked, as the engine does
    return model


def _tuned_forced_logits(engine, prompts: list[list[int]], follow: list[list[int]]) -> list[torch.Tensor]:
    """Prefill the prompts, then one eager decode step per column of ``follow`` (the tokens forced): the logits
    [B, vocab] of each step."""
    ids = torch.zeros(len(prompts), max(map(len, prompts)), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, :len(p)] = torch.tensor(p)
    engine.prefill(ids.to(engine.device), [len(p) for p in prompts])
    out = []
    for j in range(len(follow[0])):
        tok = torch.tensor([f[j] for f in follow], device=engine.device)
        out.append(engine.decode_step(tok).to("cpu", torch.float64))
    return out


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=_tuned_dt)
def test_tuned_path_decode_matches_the_model(tuned_engine, arch, dtype, seed):
    """The tuned path's decode steps (its GEMV, the RMSNorm fold forced on wherever the GEMV runs, the SwiGLU
    epilogue, the one-kernel embedding) against transformers' model in float64, teacher-forced from prompts of
    different lengths (B = 3), two steps each: in fp32 within twice fp32's tolerance (the fold stays off in
    fp32: the core's arithmetic), in bf16 at most twice the core path's error on the same steps."""
    hf = _tuned_model(arch)
    g = torch.Generator().manual_seed(seed)
    v = hf.config.vocab_size
    prompts = [torch.randint(0, v, (n,), generator=g).tolist() for n in (5, 9, 2)]
    follow = [torch.randint(0, v, (2,), generator=g).tolist() for _ in prompts]
    m64 = copy.deepcopy(hf).double()
    with torch.no_grad():
        want = [m64(torch.tensor([p + f])).logits[0, len(p):] for p, f in zip(prompts, follow)]
    errs = {}
    # fp32's bound is fixed: the core path's own error is needed (and run) in 16 bits only
    paths = {"tuned": dict(tuned=True, fold_norm=True)}
    if dtype != torch.float32:
        paths["core"] = dict(tuned=False)
    for name, kw in paths.items():
        engine = tuned_engine.LlamaEngine.from_hf(hf, dtype=dtype, max_batch=3, max_seq_len=24, **kw)
        steps = _tuned_forced_logits(engine, prompts, follow)
        errs[name] = max(rel_error(steps[j][i], want[i][j]) for i in range(3) for j in range(len(follow[0])))
    bound = 2 * REL_TOL[torch.float32] if dtype == torch.float32 else 2 * errs["core"] + 2e-3
    core = f"core path: {errs['core']:.2e}; " if "core" in errs else ""
    assert errs["tuned"] <= bound, (f"{arch} {dtype}: the tuned path's decode logits are off transformers' float64 "
                                    f"by {errs['tuned']:.2e} ({core}allowed {bound:.1e})")


@pytest.mark.parametrize("tuned", [False, True], ids=["core", "tuned"])
def test_decode_step_takes_a_strided_token_column(tuned_engine, tuned, seed):
    """decode_step(tokens) with tokens a column of an id matrix (stride != 1) gives the same logits, bit for
    bit, as with the same ids contiguous: the one-kernel embedding reads tokens with their stride."""
    hf = _tuned_model("llama")
    ids = torch.randint(0, hf.config.vocab_size, (2, 7), device=DEVICE)
    out = []
    for tokens in (ids[:, 6].contiguous(), ids[:, 6]):
        engine = tuned_engine.LlamaEngine.from_hf(hf, dtype=torch.bfloat16, max_batch=2, max_seq_len=16, tuned=tuned)
        engine.prefill(ids[:, :6])
        out.append(engine.decode_step(tokens))
    assert torch.equal(out[0], out[1]), (f"decode_step on a strided token column (stride {ids[:, 6].stride(0)}) "
                                         f"differs from the contiguous one by {rel_error(out[1], out[0]):.2e}")


def _tuned_count_kernels(engine) -> dict:
    """Wrap the tuned path's core kernels with counters: {name: calls}."""
    counts = {}
    for name, fn in list(engine.tuned.kernels.items()):
        counts[name] = 0

        def counted(*a, _name=name, _fn=fn, **kw):
            counts[_name] += 1
            return _fn(*a, **kw)
        engine.tuned.kernels[name] = counted
    return counts


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tuned_path_fuses_the_norms_and_the_swiglu(tuned_engine, arch, seed):
    """What the tuned path runs in a decode step of L layers: in 16 bits with the fold on, the RMSNorm kernel
    only for the final norm (each layer's two folded into their GEMVs), no swiglu kernel (the gate|up GEMV's
    epilogue) and for Llama no apply_rope or write_kv (the q|k|v GEMV's epilogue; Qwen 3's q/k norms keep them);
    in fp32 the RMSNorms as kernels (never folded: fp32 keeps the core's arithmetic), the rest fused as in 16
    bits; with fuse_epilogues=False all of them as kernels. Greedy generation in fp32 on the tuned
    path gives transformers' tokens. A bad option: ValueError."""
    hf = _tuned_model(arch)
    n_layer = hf.config.num_hidden_layers
    ids = torch.randint(0, hf.config.vocab_size, (1, 6), generator=torch.Generator().manual_seed(seed))
    cases = [(torch.bfloat16, dict(fold_norm=True), 1, 0), (torch.float32, {}, 2 * n_layer + 1, 0),
             (torch.bfloat16, dict(fuse_epilogues=False), 2 * n_layer + 1, n_layer)]
    for dtype, kw, norms, swiglus in cases:
        engine = tuned_engine.LlamaEngine.from_hf(hf, dtype=dtype, max_batch=1, max_seq_len=16, tuned=True, **kw)
        engine.prefill(ids.to(engine.device))
        counts = _tuned_count_kernels(engine)
        engine.decode_step(torch.tensor([3], device=engine.device))
        ropes = n_layer if arch == "qwen3" or kw.get("fuse_epilogues") is False else 0   # Qwen 3: q/k norms
        got = (counts["rmsnorm"], counts["swiglu"], counts["apply_rope"], counts["write_kv"])
        assert got == (norms, swiglus, ropes, ropes), (
            f"{arch} {dtype} tuned {kw}: a decode step ran rmsnorm, swiglu, apply_rope, write_kv {got} times; "
            f"expected {(norms, swiglus, ropes, ropes)}")
    engine = tuned_engine.LlamaEngine.from_hf(hf, dtype=torch.float32, max_batch=1, max_seq_len=16, tuned=True)
    with torch.no_grad():
        want = hf.generate(ids, max_new_tokens=5, do_sample=False, attention_mask=torch.ones_like(ids))[0, 6:]
    got = engine.generate(ids.to(engine.device), 5, cuda_graph=False)[0].cpu()
    assert torch.equal(got, want), f"{arch} fp32 tuned path: greedy tokens {got.tolist()}, transformers {want.tolist()}"
    with pytest.raises(ValueError, match="fold_norm"):
        tuned_engine.LlamaEngine.from_hf(hf, dtype=torch.float32, max_batch=1, max_seq_len=16, tuned=True,
                                         fold_norm="always")


# ------------------------------------------------ on a GPU: the real geometries
#: (name, hidden, heads, KV heads, head_dim, intermediate, vocab) of the course's two models
_TUNED_REAL = [("llama-3.2-1b", 2048, 32, 8, 64, 8192, 128256), ("qwen3-0.6b", 1024, 16, 8, 128, 3072, 151936)]


@pytest.mark.gpu
@pytest.mark.given
@pytest.mark.parametrize("geom", _TUNED_REAL, ids=lambda g: g[0])
@pytest.mark.parametrize("m", [1, 2, 16], ids=lambda m: f"M{m}")
def test_tuned_gemv_epilogues_at_real_geometries(tuned_gv, geom, m, seed):
    """bf16, the decode copies as the tuned path makes them (K-major, folded, interleaved) with the configs
    choose_config gives on this GPU, against float64: q|k|v with the RMSNorm folded in (and for Llama the
    rotation at positions up to 4095 and the KV write: the cache holds the output's k and v), gate|up folded
    with the SwiGLU epilogue."""
    name, c, h, hkv, d, f, _ = geom
    dt, s_max, eps = torch.bfloat16, 4096, 1e-5
    x = randn(m, c, dtype=dt, device="cuda", scale=2.0) + 0.5
    g = randn(c, dtype=dt, device="cuda") + 1.0
    y = _rms64(x, g, eps)
    inv = 1.0 / 500000.0 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.arange(s_max, dtype=torch.float32)[:, None] * inv[None, :]
    pos = [(977 * i + 5) % s_max for i in range(m - 1)] + [s_max - 1]
    for n, kind in (((h + 2 * hkv) * d, "qkv"), (2 * f, "gate|up")):
        w = (randn(n, c, dtype=dt, device="cuda") * c**-0.5).t()            # K-major
        w_d = tuned_gv.fold_rmsnorm(g, w)
        kw = dict(rms_fold=True, eps=eps)
        rope = kind == "qkv" and name.startswith("llama")
        if kind == "gate|up":
            w_d, kw["swiglu"] = tuned_gv.interleave_gate_up(w_d), True
        elif rope:
            kc = torch.zeros(m, hkv, s_max, d, dtype=dt, device="cuda")
            vc = torch.zeros_like(kc)
            start = torch.tensor(pos, dtype=torch.int32, device="cuda")
            w_d = tuned_gv.interleave_rope(w_d, d)
            kw.update(kv_cache=(kc, vc, start), rope=tuned_gv.rope_table(ang.cos(), ang.sin()).cuda())
        got = tuned_gv.gemv(x, w_d, **kw)
        w64 = w.to("cpu", torch.float64)
        full, s = y @ w64, y.abs() @ w64.abs()
        if kind == "gate|up":
            want = torch.nn.functional.silu(full[:, :f]) * full[:, f:]
            scale = (full[:, :f].abs() + s[:, :f]) * (full[:, f:].abs() + s[:, f:])
        elif rope:
            want = _rotate64(full, ang.cos(), ang.sin(), pos, h + hkv, d)
            scale = s + s.view(m, -1, 2, d // 2).flip(2).reshape(m, n)
            for i, p in enumerate(pos):
                assert torch.equal(kc[i, :, p], got[i, h * d:(h + hkv) * d].view(hkv, d)) and \
                    torch.equal(vc[i, :, p], got[i, (h + hkv) * d:].view(hkv, d)), f"{name}: KV write of row {i}"
        else:
            want, scale = full, s
        assert_close(got, want, dtype=dt, rel_tol=3 * REL_TOL[dt], scale=scale,
                     name=f"{name} M={m} {kind} with the RMSNorm folded in{' and rotated' if rope else ''}")


@pytest.mark.gpu
@pytest.mark.parametrize("geom", _TUNED_REAL, ids=lambda g: g[0])
def test_tuned_path_at_real_geometry(tuned_engine, geom, seed):
    """Two layers of the real widths (vocabulary included), bf16, batch 2, on the GPU: the tuned path's
    decode logits (folds where they pay, SwiGLU epilogue, PDL) within bf16 rounding of the core path's on the
    same teacher-forced steps; replayed from a CUDA graph, generate() gives the eager tuned path's tokens."""
    import transformers
    name, c, h, hkv, d, f, v = geom
    common_kw = dict(vocab_size=v, hidden_size=c, intermediate_size=f, num_hidden_layers=2, num_attention_heads=h,
                     num_key_value_heads=hkv, head_dim=d, max_position_embeddings=4096, initializer_range=0.05,
                     tie_word_embeddings=True)
    torch.manual_seed(seed)
    if name.startswith("llama"):
        hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common_kw))
    else:
        hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common_kw, rms_norm_eps=1e-6))
    hf = hf.eval()
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, v, (n,), generator=g).tolist() for n in (40, 17)]
    follow = [torch.randint(0, v, (4,), generator=g).tolist() for _ in prompts]
    out = {}
    for path, tuned in (("core", False), ("tuned", True)):
        engine = tuned_engine.LlamaEngine.from_hf(hf, dtype=torch.bfloat16, device="cuda", max_batch=2,
                                                  max_seq_len=128, tuned=tuned)
        out[path] = _tuned_forced_logits(engine, prompts, follow)
    for j, (a, b) in enumerate(zip(out["core"], out["tuned"])):
        err = rel_error(b, a)
        assert err < 3e-2, f"{name}: tuned decode step {j} logits off the core path's by {err:.2e} (bf16)"
    eager = engine.generate(prompts, 8, cuda_graph=False)
    graph = engine.generate(prompts, 8, cuda_graph=True)
    assert torch.equal(eager, graph), f"{name}: the tuned path replayed from a graph gives other tokens than eager"


@pytest.mark.given
def test_tuned_bench_parses_its_options_and_writes_the_floors(tmp_path):
    """The stage-9 bench (solutions/a09_llama_inference/bench.py, run on a GPU) without a GPU: its arguments, the
    bytes a step reads (every weight once, the tied head's embedding once, the KV cache of B sequences at the
    context) and the table with each floor's verdict (Llama-3.2-1B batch 1: 60 %, Qwen3-0.6B batch 1: 45 %, both
    at batch 16: 60 %; decode at least as fast as transformers' compiled static cache)."""
    from common.impl import load
    bench = load("a09_llama_inference.bench", "solutions")
    a = bench.parse_args(["--models", "llama-tiny", "--batches", "1", "16", "--prompts", "7", "--quick",
                          "--tuned-options", "fold_norm=True", "pdl=False"])
    assert (a.models, a.batches, a.prompts, a.reps, a.runs) == (["llama-tiny"], [1, 16], [7], 3, 2)
    assert a.options == {"fold_norm": True, "pdl": False}
    with pytest.raises(SystemExit):
        bench.parse_args(["--tuned-options", "fold_norm"])
    assert (bench.floor("llama-3.2-1b", 1), bench.floor("qwen3-0.6b", 1), bench.floor("qwen3-0.6b", 16)) == (0.6, 0.45, 0.6)

    class Layer:                              # the engine's weights, as shapes only
        def __init__(self, *shapes):
            (self.attn_norm_w, self.qkv_w, self.o_w, self.mlp_norm_w, self.gate_up_w, self.down_w) = \
                [torch.empty(s, dtype=torch.bfloat16) for s in shapes]
            self.q_norm_w = self.k_norm_w = None

    class Engine:
        n_layer, n_kv_head, head_dim, n_embd, dtype = 2, 2, 8, 16, torch.bfloat16
        layers = [Layer((16,), (16, 64), (32, 16), (16,), (16, 48), (24, 16)) for _ in range(2)]
        embed_w = torch.empty(50, 16, dtype=torch.bfloat16)
        lm_w, norm_w = embed_w.t(), torch.empty(16, dtype=torch.bfloat16)
    per_layer = 16 + 16 * 64 + 32 * 16 + 16 + 16 * 48 + 24 * 16
    want = (2 * per_layer + 50 * 16 + 16 + 3 * 10 * 2 * 2 * 2 * 8) * 2
    assert bench.step_bytes(Engine(), 3, 10) == want, "step_bytes: weights once (tied head: the embedding once) + KV"
    rows = [dict(model="llama-3.2-1b", batch=1, prompt=128, step_ms=1.0, step_MB=2e3, GBps=2e3, of_copy=0.7,
                 engine_decode_ms=1.0, engine_prefill_ms=2.0, hfc_decode_ms=0.9, hf_decode_ms=9.0),
             dict(model="qwen3-0.6b", batch=1, prompt=128, step_ms=1.0, step_MB=2e3, GBps=2e3, of_copy=0.5,
                  engine_decode_ms=1.0, engine_prefill_ms=2.0, notes=["hf compiled: RuntimeError"])]
    text = bench.write(rows, tmp_path / "a09_decode", 3000.0, "solutions", "python -m x --flag", [])
    assert "`python -m x --flag`" in text.splitlines()[2], "the rerun command goes at the top"
    assert "llama-3.2-1b B=1 P=128: 70.0% of copy, floor 60%: met" in text
    assert "NOT met (at least as fast)" in text and "qwen3-0.6b B=1 P=128: 50.0% of copy, floor 45%: met" in text
    assert (tmp_path / "a09_decode.csv").exists() and (tmp_path / "a09_decode.md").exists()
    kept = bench.earlier_rows(tmp_path / "a09_decode", rows[1:])      # --append: a run that measured Qwen again
    assert kept == rows[:1], f"--append keeps the other cases' rows as they were: {kept}"
