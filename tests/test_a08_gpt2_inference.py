"""Stage 8: GPT-2 inference (prefill + KV-cache decode) on the course's kernels, against
Hugging Face transformers' GPT2LMHeadModel.

The kernels (fused residual + LayerNorm, flash-decoding attention, the KV-cache write) are
compared with float64 references on fresh random inputs; the engine with transformers'
model run in float64 (logits) and in the engine's dtype (the error it is allowed is a small
multiple of transformers' own error in that dtype); greedy generation token for token
with transformers' ``generate(do_sample=False)``. On a CPU everything runs under the
Triton interpreter on a tiny model (2 layers, n_embd 64); on a GPU also GPT-2 small's
shape, 64 new tokens, bf16, CUDA-graph replay and the KV cache's memory.

Models have random weights (nothing is downloaded). Their initializer range is larger
than GPT-2's 0.02: a freshly initialised GPT-2 repeats one token forever, which would make
"same tokens" a weak check; at 0.1-0.3 greedy generation wanders through the vocabulary.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import os

import pytest
import torch

from common import DEVICE, HAS_CUDA
from common import reference
from common.kernel_check import (DECODE_ATTENTION, ENGINE, GEMV_KERNEL, LAYERNORM_KERNEL, SAMPLER, WRITE_KV,
                                 assert_is_kernel, called, host_syncs, watch)
from common.testing import (REL_TOL, assert_as_accurate_as_torch, assert_close, assert_fresh_each_call,
                            non_contiguous, random_gpt2, randn, rel_error, torch_matmul)

#: A kernel fed an unwritten buffer (a part not written yet) computes on garbage: the interpreter's numpy
#: then warns of overflows and invalid values, which say nothing the test's own message does not.
pytestmark = pytest.mark.filterwarnings(
    "ignore:(overflow|invalid value|divide by zero) encountered:RuntimeWarning")

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
DTYPE_IDS = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


def dt(dtype) -> str:
    """A dtype's part of a test id: fp32, fp16, bf16 (``make check STAGE=a08 K=bf16`` picks those cases)."""
    return DTYPE_IDS[dtype]


#: On a CPU (the Triton interpreter, milliseconds a program) 2 layers, n_embd 64, a vocabulary of 257.
TINY = dict(vocab_size=257, n_positions=96, n_embd=64, n_layer=2, n_head=2, initializer_range=0.3)
SMALL = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, initializer_range=0.1)
#: What the kernels and a step of the engine may not call (common.kernel_check, as the grader checks
#: it): the work belongs to the course's kernels.


# ============================================================ first: what stage 8 runs on
_DEPENDENCIES: dict = {}


def _dependencies(impl) -> str | None:
    """common.course.stages.a08_dependencies, once per tree and borrow (each call runs a small matmul and attention)."""
    from common.impl import BORROW_VAR
    from common.course.stages import a08_dependencies
    key = (str(impl.root), os.environ.get(BORROW_VAR, ""))
    if key not in _DEPENDENCIES:
        _DEPENDENCIES[key] = a08_dependencies(impl.load)
    return _DEPENDENCIES[key]


@pytest.mark.given      # checks no a08 work: not graded (a06's and a07's own tests grade them)
def test_stage8_runs_on_your_a06_matmul_and_a07_attention(impl):
    """The engine's prefill runs on the a06 matmul and the a07 flash attention of the same tree; this test
    comes first and says, while either is not written, how to try stage 8 on the reference ones instead."""
    needs = _dependencies(impl)
    if needs:
        pytest.fail(needs, pytrace=False)


@pytest.fixture
def ln(impl):
    return impl.load("a08_gpt2_inference.layernorm")


@pytest.fixture
def dec(impl):
    return impl.load("a08_gpt2_inference.decode_attention")


@pytest.fixture
def kv(impl):
    return impl.load("a08_gpt2_inference.kv_cache")


@pytest.fixture
def eng(impl):
    """The engine module; a08's engine tests fail at once, saying why, while the a06 matmul or the a07
    attention it runs on is not written (common.course.stages.a08_dependencies says how to borrow them)."""
    needs = _dependencies(impl)
    if needs:
        pytest.fail(needs, pytrace=False)
    return impl.load("a08_gpt2_inference.engine")


@pytest.fixture
def gv(impl):
    return impl.load("a08_gpt2_inference.gemv")


@pytest.fixture
def tg():
    """The tuned path's GEMV (given code beside the reference, solutions/a08_gpt2_inference/tuned_gemv.py)."""
    from common.impl import load
    return load("a08_gpt2_inference.tuned_gemv", "solutions")


def _nan(shape, dtype, device=DEVICE):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def hf_logits64(model, ids: list[int]) -> torch.Tensor:
    """Logits [T, vocab] of one sequence from the model run in float64 on the CPU."""
    m64 = getattr(model, "_course_f64", None)
    if m64 is None:
        import copy
        m64 = model._course_f64 = copy.deepcopy(model).to("cpu", torch.float64)
    with torch.no_grad():
        return m64(torch.tensor([ids])).logits[0]


def hf_logits(model, ids: list[int], dtype, device) -> torch.Tensor:
    """The same logits from transformers in ``dtype`` on ``device`` (its own error sets the bar)."""
    key = f"_course_{dtype}_{device}"
    m = getattr(model, key, None)
    if m is None:
        import copy
        m = copy.deepcopy(model).to(device, dtype)
        setattr(model, key, m)
    with torch.no_grad():
        return m(torch.tensor([ids], device=device)).logits[0]


def hf_generate(model, prompt: list[int], n: int, device="cpu") -> list[int]:
    m = model if device == "cpu" else getattr(model, "_course_gen_" + device, None)
    if m is None:
        import copy
        m = copy.deepcopy(model).to(device)
        setattr(model, "_course_gen_" + device, m)
    with torch.no_grad():
        out = m.generate(torch.tensor([prompt], device=device), max_new_tokens=n, do_sample=False,
                         attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=device))
    return out[0, len(prompt):].tolist()


def _prompts(lengths, vocab, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


# ============================================================ kernel 1: residual + LayerNorm
LN_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


@pytest.mark.parametrize("dtype", DTYPES, ids=dt)
@pytest.mark.parametrize("shape", [(1, 64), (7, 768), (3, 5, 100), (2, 1600), (4, 37)],
                         ids=lambda s: "x".join(map(str, s)))
def test_add_layernorm(ln, dtype, shape, seed):
    """h = x + residual (stored in x's dtype) and y = LayerNorm(h)·w + b, against float64."""
    c = shape[-1]
    x, r = randn(*shape, dtype=dtype, scale=3.0), randn(*shape, dtype=dtype) + 2.0   # nonzero mean
    w, b = randn(c) * 0.5 + 1.0, randn(c) * 0.5
    h_out, y_out = _nan(shape, dtype), _nan(shape, dtype)
    h, y = assert_is_kernel(lambda: ln.add_layernorm(x, r, w, b, 1e-5, out=y_out, h_out=h_out), LAYERNORM_KERNEL,
                            "add_layernorm")
    assert h is h_out and y is y_out, "add_layernorm must return the out/h_out tensors it was given"
    h64 = x.to("cpu", torch.float64) + r.to("cpu", torch.float64)
    assert_close(h, h64, dtype=dtype, name="h = x + residual")
    ref = reference.layer_norm(h.to("cpu", torch.float64), w, b)          # normalises h as stored
    assert_close(y, ref, dtype=dtype, rel_tol=LN_TOL[dtype], name="y = LayerNorm(h)")



@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dt)
def test_add_layernorm_strided_inputs(ln, dtype, seed):
    """The contract's "any leading dims and strides" for x and residual, with the residual add."""
    c = 96
    big = randn(10, 3 * c, dtype=dtype)
    x, r = big[::2, :c], non_contiguous(randn(5, c, dtype=dtype) + 2.0)   # strided rows; strided last dim
    w, b = randn(c) * 0.5 + 1.0, randn(c) * 0.5
    h, y = ln.add_layernorm(x, r, w, b, 1e-5)
    h64 = x.to("cpu", torch.float64) + r.to("cpu", torch.float64)
    assert_close(h, h64, dtype=dtype, name="h = x + residual, strided inputs")
    assert_close(y, reference.layer_norm(h.to("cpu", torch.float64), w, b), dtype=dtype, rel_tol=LN_TOL[dtype],
                 name="y = LayerNorm(h), strided inputs")

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dt)
def test_layernorm_no_residual_and_strided_rows(ln, dtype, seed):
    """No residual; rows that are a strided view (every other row, and a column slice)."""
    c = 257
    big = randn(9, 2 * c, dtype=dtype, scale=2.0)
    w, b = randn(c) + 1.0, randn(c)
    for x in (big[::2, :c], big[:, c:], non_contiguous(randn(5, c, dtype=dtype))):
        y = ln.layernorm(x, w, b, 1e-5)
        assert_close(y, reference.layer_norm(x.to("cpu", torch.float64), w, b), dtype=dtype, rel_tol=LN_TOL[dtype],
                     name=f"layernorm of a view with strides {x.stride()}")


def test_layernorm_eps_and_bad_inputs(ln, seed):
    """eps is used (rows of variance ~1e-4, where eps = 1e-5 moves y by 5%), and bad inputs raise
    clear errors."""
    x = randn(3, 64, scale=1e-2)
    w, b = randn(64) + 1.0, randn(64)
    for eps in (1e-5, 1e-1):
        assert_close(ln.layernorm(x, w, b, eps), reference.layer_norm(x.to("cpu", torch.float64), w, b, eps),
                     dtype=torch.float32, rel_tol=1e-4, name=f"layernorm with eps={eps}")
    with pytest.raises(ValueError, match="weight"):
        ln.layernorm(x, randn(63), b)
    with pytest.raises(ValueError, match="residual"):
        ln.add_layernorm(x, randn(3, 65), w, b)
    with pytest.raises(TypeError, match="dtype"):
        ln.layernorm(x.to(torch.int32), w, b)


# ============================================================ kernel 2: decode attention
DEC_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}
#: (B, H, d, S_max, lengths): the test id says B, H, d and S_max (B3-H2-d32-S150).
DEC_CASES = [
    (1, 2, 64, 1, [1]),                         # one key
    (1, 3, 64, 200, [200]),                     # the whole cache (S_max), not a multiple of any block
    (3, 2, 32, 150, [1, 77, 150]),              # a batch of different lengths
    (4, 1, 128, 97, [13, 96, 2, 65]),
    (2, 4, 16, 33, [33, 17]),
    (2, 2, 80, 40, [40, 7]),                    # head dims not a power of two: padded to 128, masked
    (1, 3, 96, 21, [21]),
    (2, 1, 16, 600, [600, 531]),                # past 512 keys: a length capped at a power of two shows
]


@pytest.mark.parametrize("dtype", DTYPES, ids=dt)
@pytest.mark.parametrize("splits", [None, 1, 3], ids=["splits-auto", "splits1", "splits3"])
@pytest.mark.parametrize("b,h,d,s_max,lengths", DEC_CASES, ids=[f"B{c[0]}-H{c[1]}-d{c[2]}-S{c[3]}" for c in DEC_CASES])
def test_decode_attention(dec, dtype, b, h, d, s_max, lengths, splits, seed):
    """One query per (sequence, head) against its first lengths[b] cache positions. Positions past
    a sequence's length hold NaN: reading one would poison the output. q is a strided view."""
    if not HAS_CUDA and splits == 3 and d == 128:
        pytest.skip("the interpreter is slow; splits=3 is covered at the other shapes")
    qkv = randn(b, 3 * h * d, dtype=dtype)
    q = qkv[:, :h * d].view(b, h, d)                          # as the engine passes it: strided rows
    k, v = randn(b, h, s_max, d, dtype=dtype), randn(b, h, s_max, d, dtype=dtype)
    for i, n in enumerate(lengths):
        k[i, :, n:] = float("nan")
        v[i, :, n:] = float("nan")
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    out = _nan((b, h, d), dtype)
    got = assert_is_kernel(lambda: dec.decode_attention(q, k, v, lens, splits=splits, out=out), DECODE_ATTENTION,
                           "decode_attention")
    assert got is out, "decode_attention must return the out tensor it was given"
    assert_close(got, reference.decode_attention(q, k, v, lengths), dtype=dtype, rel_tol=DEC_TOL[dtype],
                 name=f"decode attention, lengths {lengths}, splits={splits}")


def test_decode_attention_large_scores_and_default_out(dec, seed):
    """Scores of ±50 (exp overflows without the running max) and the default output buffer."""
    b, h, d, s = 2, 2, 64, 70
    q = randn(b, h, d, scale=8.0)
    k, v = randn(b, h, s, d, scale=8.0), randn(b, h, s, d)
    lengths = [70, 41]
    got = dec.decode_attention(q, k, v, torch.tensor(lengths, dtype=torch.int32, device=DEVICE), splits=2)
    assert_close(got, reference.decode_attention(q, k, v, lengths), dtype=torch.float32, rel_tol=1e-5, name="large scores")


def test_decode_attention_bad_inputs(dec, seed):
    q, k = randn(2, 2, 64), randn(2, 2, 10, 64)
    lens = torch.tensor([10, 3], dtype=torch.int32, device=DEVICE)
    assert_close(dec.decode_attention(q, k, k, lens), reference.decode_attention(q, k, k, [10, 3]), dtype=torch.float32,
                 name="decode attention (before the error checks)")
    with pytest.raises(TypeError, match="lengths"):
        dec.decode_attention(q, k, k, lens.long())
    with pytest.raises(ValueError, match="k_cache"):
        dec.decode_attention(q, randn(2, 3, 10, 64), randn(2, 3, 10, 64), lens)
    with pytest.raises(ValueError, match="lengths"):
        dec.decode_attention(q, k, k, lens[:1])


# ============================================================ kernel 3: the KV-cache write
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dt)
@pytest.mark.parametrize("t,d", [(1, 32), (5, 32), (3, 80)], ids=["T1-d32", "T5-d32", "T3-d80"])
def test_write_kv(kv, dtype, t, d, seed):
    """Token t of sequence b lands at start[b] + t of its own row, head by head; nothing else is
    written (the cache is NaN elsewhere), and no slot at or past S_max (start near the end). Head dim
    80: not a power of two (the kernel pads it to 128 with a mask)."""
    b, h, s_max = 3, 3, 20
    qkv = randn(b, t, 3 * h * d, dtype=dtype)
    k_cache, v_cache = _nan((b, h, s_max, d), dtype), _nan((b, h, s_max, d), dtype)
    start = [0, 7, s_max - 2]
    st = torch.tensor(start, dtype=torch.int32, device=DEVICE)
    assert_is_kernel(lambda: kv.write_kv(qkv, k_cache, v_cache, st), WRITE_KV, "write_kv")   # idempotent
    want_k, want_v = _nan((b, h, s_max, d), dtype, "cpu"), _nan((b, h, s_max, d), dtype, "cpu")
    q3 = qkv.cpu().view(b, t, 3, h, d)
    for i, s in enumerate(start):
        n = min(t, s_max - s)
        want_k[i, :, s:s + n] = q3[i, :n, 1].transpose(0, 1)
        want_v[i, :, s:s + n] = q3[i, :n, 2].transpose(0, 1)
    for name, got, want in (("K", k_cache, want_k), ("V", v_cache, want_v)):
        got = got.cpu()
        same = (got == want) | (got.isnan() & want.isnan())
        assert same.all(), (f"{name} cache wrong at {int((~same).sum())} of {got.numel()} places, first at "
                            f"[b, h, pos, d] = {(~same).nonzero()[0].tolist()} (start={start}, T={t})")


def test_kv_cache_size_and_errors(kv, seed):
    """The cache's bytes per token, and write_kv's input checks (after a legal write)."""
    qkv = randn(2, 1, 3 * 2 * 16)
    cache = kv.KVCache(n_layer=3, batch=2, n_head=2, head_dim=16, max_seq_len=8, dtype=torch.float32, device=DEVICE)
    kv.write_kv(qkv, cache.k[0], cache.v[0], cache.lengths)
    assert torch.equal(cache.k[0, :, :, 0].cpu(), qkv.cpu().view(2, 3, 2, 16)[:, 1]), "write_kv at position 0"
    assert kv.KVCache.bytes_per_token(12, 12, 64, torch.bfloat16) == 2 * 12 * 12 * 64 * 2
    assert cache.nbytes == 2 * 3 * 2 * 2 * 8 * 16 * 4
    with pytest.raises(ValueError, match="qkv"):
        kv.write_kv(randn(2, 1, 95), cache.k[0], cache.v[0], cache.lengths)
    with pytest.raises(TypeError, match="start"):
        kv.write_kv(qkv, cache.k[0], cache.v[0], cache.lengths.long())


# ============================================================ kernel 4: the decode GEMV
def _gemv_weight(k: int, n: int, dtype, layout: str) -> torch.Tensor:
    """W [K, N]: "kn" row-major (GPT-2's Conv1D weight [in, out], N contiguous) or "nk.t" the transposed
    view of an [N, K] matrix (the LM head's wte.t(), K contiguous)."""
    if layout == "kn":
        return randn(k, n, dtype=dtype, scale=k**-0.5)
    return randn(n, k, dtype=dtype, scale=k**-0.5).t()


def _gemv_ref(x, w, bias, activation):
    y = reference.matmul(x.reshape(-1, x.shape[-1]), w).reshape(*x.shape[:-1], w.shape[1])
    if bias is not None:
        y = y + bias.to("cpu", torch.float64)
    return reference.gelu_tanh(y) if activation == "gelu_tanh" else y


def _gemv_scale(x, w, bias):
    """|x| @ |w| + |b|: the magnitude of the terms each output sums (tolerances, as for a Linear)."""
    s = reference.matmul(x.reshape(-1, x.shape[-1]).abs(), w.abs()).reshape(*x.shape[:-1], w.shape[1])
    return s if bias is None else s + bias.to("cpu", torch.float64).abs()


#: Split K 3 ways, 32-column blocks, 16-row slices: K = 91 gives splits of 32, 32 and 27 rows.
GEMV_SPLIT = (32, 16, 3, 4, 1)
#: 4 ways at K = 77: splits of 32, 32, 13 rows and an empty one (which must add nothing).
GEMV_SPLIT_EMPTY = (32, 16, 4, 4, 1)
GEMV_NO_SPLIT = (64, 32, 1, 4, 1)


@pytest.mark.parametrize("dtype", DTYPES, ids=dt)
@pytest.mark.parametrize("m", [1, 3, 16], ids=lambda m: f"M{m}")
@pytest.mark.parametrize("layout", ["kn", "nk.t"])
@pytest.mark.parametrize("split", [False, True], ids=["one-split", "split-k"])
def test_gemv(gv, dtype, m, layout, split, seed):
    """act(x @ W + b) with GELU, against float64: M rows (1 and 3: the FMA path; 16: tl.dot), K = 91 and
    N = 133 (no multiple of any block), both weight layouts, K in one piece or split 3 ways (the last
    split shorter); written into a given NaN-filled ``out``."""
    k, n = 91, 133
    x, w, b = randn(m, k, dtype=dtype), _gemv_weight(k, n, dtype, layout), randn(n, dtype=dtype)
    out = _nan((m, n), dtype)
    cfg = GEMV_SPLIT if split else GEMV_NO_SPLIT
    got = assert_is_kernel(lambda: gv.gemv(x, w, b, "gelu_tanh", out=out, config=cfg), GEMV_KERNEL, "gemv")
    assert got is out, "gemv must return the out tensor it was given"
    assert_close(got, _gemv_ref(x, w, b, "gelu_tanh"), dtype=dtype, rel_tol=2 * REL_TOL[dtype],
                 scale=_gemv_scale(x, w, b), name=f"gemv {m}x{k} @ {layout} [{k}, {n}] + bias, GELU, config {cfg}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dt)
@pytest.mark.parametrize("epilogue", ["none", "bias", "gelu"])
def test_gemv_epilogues_views_and_default_config(gv, dtype, epilogue, seed):
    """Without bias, bias alone, GELU alone; x as [2, 1, K] (leading dims) and as a strided view; the
    configs the host heuristic picks (choose_config: split-K or not, by the shapes); the default output."""
    k, n = 200, 75
    bias = randn(n, dtype=dtype) if epilogue == "bias" else None
    act = "gelu_tanh" if epilogue == "gelu" else None
    for x, w in ((randn(2, 1, k, dtype=dtype), _gemv_weight(k, n, dtype, "kn")),
                 (non_contiguous(randn(5, k, dtype=dtype)), _gemv_weight(k, n, dtype, "nk.t"))):
        got = assert_is_kernel(lambda: gv.gemv(x, w, bias, act), GEMV_KERNEL, "gemv")
        assert_close(got, _gemv_ref(x, w, bias, act), dtype=dtype, rel_tol=2 * REL_TOL[dtype],
                     scale=_gemv_scale(x, w, bias),
                     name=f"gemv, x {tuple(x.shape)} strides {x.stride()}, W strides {w.stride()}, {epilogue}")


@pytest.mark.parametrize("dtype", DTYPES, ids=dt)
@pytest.mark.parametrize("m", [1, 3, 16], ids=lambda m: f"M{m}")
@pytest.mark.parametrize("split", [False, True], ids=["one-split", "split-k"])
def test_gemv_residual(gv, dtype, m, split, seed):
    """The projections' epilogue: act(x @ W + b) + residual, the product rounded to x's dtype before the add
    (the unfused model's rounding), against float64; K = 91, N = 133, both layouts (by M), split 3 ways or
    not; also the update in place (out=residual), and a residual of the wrong shape refused."""
    k, n = 91, 133
    x = randn(m, k, dtype=dtype)
    w = _gemv_weight(k, n, dtype, "kn" if m != 3 else "nk.t")
    b, r = randn(n, dtype=dtype), randn(m, n, dtype=dtype)
    cfg = GEMV_SPLIT if split else GEMV_NO_SPLIT
    want = _gemv_ref(x, w, b, "gelu_tanh") + r.to("cpu", torch.float64)
    scale = _gemv_scale(x, w, b) + r.to("cpu", torch.float64).abs()
    got = assert_is_kernel(lambda: gv.gemv(x, w, b, "gelu_tanh", residual=r, config=cfg), GEMV_KERNEL,
                           "gemv with a residual")
    assert_close(got, want, dtype=dtype, rel_tol=3 * REL_TOL[dtype], scale=scale,
                 name=f"gemv {m}x{k}: GELU(x @ W + b) + residual, config {cfg}")
    r2 = r.clone()
    same = gv.gemv(x, w, b, "gelu_tanh", residual=r2, out=r2, config=cfg)
    assert same is r2, "gemv must return the out tensor it was given"
    assert_close(same, want, dtype=dtype, rel_tol=3 * REL_TOL[dtype], scale=scale,
                 name=f"gemv {m}x{k}, residual updated in place (out=residual)")
    with pytest.raises(ValueError, match="residual"):
        gv.gemv(x, w, residual=randn(m, n + 1, dtype=dtype))


@pytest.mark.given
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 16])
@pytest.mark.parametrize("split", [False, True], ids=["one-split", "split-k"])
def test_tuned_gemv_layernorm_fold_and_residual(tg, dtype, m, split, seed):
    """The decode step's fused epilogues: act(LayerNorm(x) @ W + b) + residual, the LayerNorm folded into W
    and b by fold_layernorm (the kernel computes each row's statistics), against float64 LayerNorm and
    matmul. x has a mean far from 0 (a row statistic taken over a split, or without the mean, is off);
    K = 91, N = 133, both layouts (by M), split 3 ways or not; also the update in place (out=residual)."""
    k, n = 91, 133
    x = randn(m, k, dtype=dtype, scale=3.0) + 2.0
    w = _gemv_weight(k, n, dtype, "kn" if m != 3 else "nk.t")
    g, beta, b, r = randn(k, dtype=dtype) + 1.0, randn(k, dtype=dtype), randn(n, dtype=dtype), randn(m, n, dtype=dtype)
    w_f, b_f, colsum = tg.fold_layernorm(g, beta, w, b)
    assert w_f.stride() == w.stride() and b_f.dtype == colsum.dtype == torch.float32, \
        "fold_layernorm: w_f keeps w's layout; bias_f and colsum are fp32"
    cfg = GEMV_SPLIT if split else GEMV_NO_SPLIT
    y_ln = reference.layer_norm(*(t.to("cpu", torch.float64) for t in (x, g, beta)), 1e-5)
    want = _gemv_ref(y_ln, w, b, "gelu_tanh") + r.to("cpu", torch.float64)
    scale = _gemv_scale(y_ln, w, b) + r.to("cpu", torch.float64).abs()
    got = assert_is_kernel(lambda: tg.gemv(x, w_f, b_f, "gelu_tanh", residual=r, ln_colsum=colsum, eps=1e-5,
                                           config=cfg), GEMV_KERNEL, "gemv with the LayerNorm folded in")
    assert_close(got, want, dtype=dtype, rel_tol=3 * REL_TOL[dtype], scale=scale,
                 name=f"gemv {m}x{k}: GELU(LayerNorm(x) @ W + b) + residual, config {cfg}")
    r2 = r.clone()
    same = tg.gemv(x, w_f, b_f, "gelu_tanh", residual=r2, ln_colsum=colsum, eps=1e-5, out=r2, config=cfg)
    assert same is r2, "gemv must return the out tensor it was given"
    assert_close(same, want, dtype=dtype, rel_tol=3 * REL_TOL[dtype], scale=scale,
                 name=f"gemv {m}x{k}, residual updated in place (out=residual)")
    with pytest.raises(ValueError, match="ln_colsum"):
        tg.gemv(x, w_f, ln_colsum=colsum[:-1])


@pytest.mark.given
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dt)
def test_gemv_layernorm_fold_of_a_wide_row(tg, dtype, seed):
    """The fold at one row wider than FOLD_MAX_K (GPT-2 large and XL: the row loaded before the main loop,
    8 values a thread): LayerNorm(x) @ W + b against float64, x with a mean far from 0, K = 1100."""
    k, n = 1100, 67
    x = randn(1, k, dtype=dtype, scale=3.0) + 2.0
    w = _gemv_weight(k, n, dtype, "nk.t")          # K-major, as the engine's decode copies
    g, beta, b = randn(k, dtype=dtype) + 1.0, randn(k, dtype=dtype), randn(n, dtype=dtype)
    w_f, b_f, colsum = tg.fold_layernorm(g, beta, w, b)
    y_ln = reference.layer_norm(*(t.to("cpu", torch.float64) for t in (x, g, beta)), 1e-5)
    want = _gemv_ref(y_ln, w, b, None)
    got = assert_is_kernel(lambda: tg.gemv(x, w_f, b_f, ln_colsum=colsum, eps=1e-5), GEMV_KERNEL,
                           "gemv with the LayerNorm folded in, K = 1100")
    assert_close(got, want, dtype=dtype, rel_tol=3 * REL_TOL[dtype], scale=_gemv_scale(y_ln, w, b),
                 name=f"gemv 1x{k}: LayerNorm(x) @ W + b, folded")


@pytest.mark.given
def test_fold_pays_where_the_folded_gemv_fits_one_wave(tg):
    """tuned_gemv.fold_pays, the tuned path's rule for the LayerNorm fold (given code), on an H100's 132 SMs: 1-2 rows of
    at most 1024 columns always; one row of GPT-2 large or XL where the GEMV's grid fits one wave of 6
    programs an SM (XL's c_attn, 600 programs; large's c_fc, 640), not where it does not (XL's c_fc, 800;
    large's c_attn, 960); never at more rows or wider rows."""
    assert tg.fold_pays(1, 768, 2304, 132) and tg.fold_pays(2, 1024, 4096, 132)
    assert tg.fold_pays(1, 1600, 4800, 132) and not tg.fold_pays(1, 1600, 6400, 132)
    assert tg.fold_pays(1, 1280, 5120, 132) and not tg.fold_pays(1, 1280, 3840, 132)
    assert not tg.fold_pays(2, 1600, 4800, 132) and not tg.fold_pays(1, 4096, 4800, 132)
    assert not tg.fold_pays(1, 1600)             # without N and the SM count: no
    assert tg.preload(1600, 1, 8), "the wide fold must load the row before the main loop (stat_k >= K)"


@pytest.mark.given
@pytest.mark.parametrize("m", [2, 5], ids=lambda m: f"M{m}")
def test_gemv_writes_the_kv_cache(tg, m, seed):
    """c_attn's GEMV with the cache write in its epilogue (kv_cache=...): y as without it, and K and V in the
    cache exactly as write_kv puts them (the same bits), at each row's own position (one of them past the
    cache's end: nothing written), nothing else of the cache touched. Head size 24 (not a power of 2);
    M = 2 (FMAs) and 5 (tl.dot)."""
    h, d, s_max = 3, 24, 8
    c = h * d
    x, w, b = randn(m, 40), _gemv_weight(40, 3 * c, torch.float32, "kn"), randn(3 * c)
    start = torch.tensor([(3 * i + 1) % s_max for i in range(m - 1)] + [s_max], dtype=torch.int32, device=DEVICE)
    kc, vc = _nan((m, h, s_max, d), torch.float32), _nan((m, h, s_max, d), torch.float32)
    kw, vw = kc.clone(), vc.clone()
    y = assert_is_kernel(lambda: tg.gemv(x, w, b, kv_cache=(kc, vc, start)), GEMV_KERNEL, "gemv with the KV write")
    assert_close(y, _gemv_ref(x, w, b, None), dtype=torch.float32, rel_tol=2 * REL_TOL[torch.float32],
                 scale=_gemv_scale(x, w, b), name="gemv with kv_cache: its output")
    for i, pos in enumerate(start.tolist()):                # write_kv's layout: heads of d inside k and v
        if pos < s_max:
            kw[i, :, pos] = y[i, c:2 * c].view(h, d)
            vw[i, :, pos] = y[i, 2 * c:].view(h, d)
    for name, got, want in (("K", kc, kw), ("V", vc, vw)):
        assert torch.equal(got.nan_to_num(7.0).cpu(), want.nan_to_num(7.0).cpu()), (
            f"gemv's cache write: {name} differs from write_kv's on the same output (each row at its position "
            f"start[b], columns C + h·d + j of k and 2C + h·d + j of v; nothing at or past S_max, nothing else)")
    with pytest.raises(ValueError, match="kv_cache"):
        tg.gemv(x, randn(40, 3 * c + 3), kv_cache=(kc, vc, start))


def test_gemv_long_k_as_accurate_as_torch(gv, seed):
    """K = 4096 in bf16, split-K: the fp32 accumulator and the fp32 partial sums stay as accurate as
    torch.matmul on the same inputs (a partial sum rounded to bf16 is not)."""
    k, n = 4096, 40
    x, w = randn(2, k, dtype=torch.bfloat16), _gemv_weight(k, n, torch.bfloat16, "kn")
    got = gv.gemv(x, w, config=(64, 64, 8, 4, 1))
    assert_as_accurate_as_torch(got, reference.matmul(x, w), torch_matmul(x, w), dtype=torch.bfloat16,
                                name="gemv at K = 4096, 8 splits")


def test_gemv_twice_on_one_input_and_deterministic(gv, seed):
    """Split-K (4 splits, the last one empty) called twice on the same tensors with new values (an output
    memoised per address, a shared output buffer, or a ticket counter left non-zero by the first call
    fails), and the same inputs twice give the same bits (the partial sums are added in a fixed order)."""
    k, n = 77, 70
    x, w, b = randn(3, k), _gemv_weight(k, n, torch.float32, "kn"), randn(n)
    call = lambda x, w, b: gv.gemv(x, w, b, "gelu_tanh", config=GEMV_SPLIT_EMPTY)     # noqa: E731
    assert_fresh_each_call(call, dict(x=x, w=w, b=b), lambda x, w, b: _gemv_ref(x, w, b, "gelu_tanh"),
                           name="gemv, split-K", scale=lambda x, w, b: _gemv_scale(x, w, b))
    assert torch.equal(call(x, w, b), call(x, w, b)), "gemv: the same inputs gave different bits on two calls"


def test_gemv_bad_inputs(gv, seed):
    """Clear errors (after a legal call): too many rows, K mismatch, dtypes, bias shape, activation."""
    x, w = randn(2, 32), randn(32, 24)
    assert_close(gv.gemv(x, w), reference.matmul(x, w), dtype=torch.float32, name="gemv (before the error checks)")
    with pytest.raises(ValueError, match="rows"):
        gv.gemv(randn(17, 32), w)
    with pytest.raises(ValueError, match="inner"):
        gv.gemv(randn(2, 31), w)
    with pytest.raises(TypeError, match="dtype"):
        gv.gemv(x, w.to(torch.bfloat16))
    with pytest.raises(ValueError, match="bias"):
        gv.gemv(x, w, randn(23))
    with pytest.raises(ValueError, match="activation"):
        gv.gemv(x, w, activation="relu")


# ============================================================ the engine against transformers
# The engine runs on the four kernels above: prefill on add_layernorm, write_kv and (its LM head) the GEMV,
# a decode step on all four. When an engine test fails, each kernel is tried once more at the model's
# shapes (_broken_parts), and the failure names the first one that is wrong ("fix gemv first: ...").

#: Which engine steps run on each part, in the order the failure names them.
PARTS = (("gemv", "gemv.py", "prefill's LM head and every GEMM of a decode step"),
         ("layernorm", "layernorm.py", "every LayerNorm of prefill and decode"),
         ("write_kv", "kv_cache.py", "prefill's and decode's KV-cache writes"),
         ("decode_attention", "decode_attention.py", "every attention of a decode step"))


def _check_gemv(mod, c: int, vocab: int, dtype) -> None:
    gv = mod("gemv")
    tol = 4 * REL_TOL[dtype]
    params = inspect.signature(gv.gemv).parameters
    for m, k, n, layout, bias, act in ((1, c, 3 * c, "kn", True, None), (3, c, 4 * c, "kn", True, "gelu_tanh"),
                                       (2, c, vocab, "nk.t", False, None), (4, 4 * c, c, "nk.t", True, None)):
        x, w = randn(m, k, dtype=dtype), _gemv_weight(k, n, dtype, layout)
        b = randn(n, dtype=dtype) if bias else None
        assert_close(gv.gemv(x, w, b, act), _gemv_ref(x, w, b, act), dtype=dtype, rel_tol=tol,
                     scale=_gemv_scale(x, w, b), name=f"gemv {m}x{k} @ W [{k}, {n}]"
                     f"{' (K contiguous, as the LM head' + chr(39) + 's wteᵀ)' if layout == 'nk.t' else ''}"
                     f"{' + bias' if bias else ''}{', GELU' if act else ''}")
    x, w = randn(2, c, dtype=dtype), _gemv_weight(c, c, dtype, "nk.t")
    b, r = randn(c, dtype=dtype), randn(2, c, dtype=dtype)
    if "residual" in params:
        assert_close(gv.gemv(x, w, b, residual=r), _gemv_ref(x, w, b, None) + r.to("cpu", torch.float64),
                     dtype=dtype, rel_tol=tol, scale=_gemv_scale(x, w, b) + r.to("cpu", torch.float64).abs(),
                     name=f"gemv 2x{c} @ [{c}, {c}] + bias + residual")
    if hasattr(gv, "fold_layernorm") and "ln_colsum" in params:
        x = randn(2, c, dtype=dtype, scale=3.0) + 2.0
        g, beta, w = randn(c, dtype=dtype) + 1.0, randn(c, dtype=dtype), _gemv_weight(c, 3 * c, dtype, "nk.t")
        b = randn(3 * c, dtype=dtype)
        w_f, b_f, colsum = gv.fold_layernorm(g, beta, w, b)
        y_ln = reference.layer_norm(*(t.to("cpu", torch.float64) for t in (x, g, beta)), 1e-5)
        assert_close(gv.gemv(x, w_f, b_f, ln_colsum=colsum, eps=1e-5), _gemv_ref(y_ln, w, b, None), dtype=dtype,
                     rel_tol=2 * tol, scale=_gemv_scale(y_ln, w, b), name=f"gemv 2x{c}, LayerNorm folded in")


def _check_layernorm(mod, c: int, dtype) -> None:
    ln = mod("layernorm")
    x, r = randn(5, c, dtype=dtype, scale=3.0), randn(5, c, dtype=dtype) + 2.0
    w, b = randn(c) * 0.5 + 1.0, randn(c) * 0.5
    h, y = ln.add_layernorm(x, r, w, b, 1e-5)
    assert_close(h, x.to("cpu", torch.float64) + r.to("cpu", torch.float64), dtype=dtype,
                 name=f"add_layernorm's h, [5, {c}]")
    assert_close(y, reference.layer_norm(h.to("cpu", torch.float64), w, b), dtype=dtype, rel_tol=LN_TOL[dtype],
                 name=f"add_layernorm's y, [5, {c}]")
    assert_close(ln.layernorm(x, w, b, 1e-5), reference.layer_norm(x.to("cpu", torch.float64), w, b), dtype=dtype,
                 rel_tol=LN_TOL[dtype], name=f"layernorm, [5, {c}]")


def _check_write_kv(mod, c: int, n_head: int, dtype) -> None:
    kv = mod("kv_cache")
    b, t, d, s_max = 2, 3, c // n_head, 8
    qkv = randn(b, t, 3 * c, dtype=dtype)
    k_cache, v_cache = torch.zeros(b, n_head, s_max, d, dtype=dtype, device=DEVICE), \
        torch.zeros(b, n_head, s_max, d, dtype=dtype, device=DEVICE)
    kv.write_kv(qkv, k_cache, v_cache, torch.tensor([0, 4], dtype=torch.int32, device=DEVICE))
    q5 = qkv.cpu().view(b, t, 3, n_head, d)
    for i, s in enumerate((0, 4)):
        for name, got, j in (("K", k_cache, 1), ("V", v_cache, 2)):
            assert torch.equal(got.cpu()[i, :, s:s + t], q5[i, :, j].transpose(0, 1)), (
                f"write_kv: the {name} cache of sequence {i} at positions {s}..{s + t - 1} is not the qkv's {name} "
                f"(B={b}, T={t}, H={n_head}, d={d})")


def _check_decode_attention(mod, c: int, n_head: int, dtype) -> None:
    dec = mod("decode_attention")
    b, d, s_max, lengths = 2, c // n_head, 20, [20, 5]
    q, k, v = randn(b, n_head, d, dtype=dtype), randn(b, n_head, s_max, d, dtype=dtype), \
        randn(b, n_head, s_max, d, dtype=dtype)
    got = dec.decode_attention(q, k, v, torch.tensor(lengths, dtype=torch.int32, device=DEVICE))
    assert_close(got, reference.decode_attention(q, k, v, lengths), dtype=dtype, rel_tol=DEC_TOL[dtype],
                 name=f"decode_attention B={b} H={n_head} d={d} lengths {lengths}")


def _broken_parts(package: str, dtype, c: int, n_head: int, vocab: int) -> list[tuple[str, str, str, str]]:
    """(part, file, what runs on it, what is wrong) for each a08 kernel of ``package`` that fails on its own at
    a model's shapes (n_embd ``c``, ``n_head`` heads, ``vocab``) in ``dtype``."""
    def mod(name):
        return importlib.import_module(f"{package}.{name}")
    checks = {"gemv": lambda: _check_gemv(mod, c, vocab, dtype), "layernorm": lambda: _check_layernorm(mod, c, dtype),
              "write_kv": lambda: _check_write_kv(mod, c, n_head, dtype),
              "decode_attention": lambda: _check_decode_attention(mod, c, n_head, dtype)}
    broken = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for part, file, use in PARTS:
            try:
                checks[part]()
            except Exception as e:  # noqa: BLE001 - a wrong value, a NotImplementedError, a crash: each says why
                broken.append((part, file, use, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:400]}"
                               if not isinstance(e, AssertionError) else str(e).strip().splitlines()[0][:400]))
    return broken


def _blame(e: Exception, kwargs: dict) -> str | None:
    """"fix <part> first: ..." where an a08 kernel fails on its own at the test's model shapes, else None."""
    eng, impl = kwargs.get("eng"), kwargs.get("impl")
    package = (eng.__name__.rsplit(".", 1)[0] if eng is not None else
               f"{impl.package}.a08_gpt2_inference" if impl is not None else None)
    if package is None:
        return None
    model = next((v for v in kwargs.values() if hasattr(v, "config") and hasattr(v.config, "n_embd")), None)
    cfg = model.config if model is not None else None
    c, n_head, vocab = ((cfg.n_embd, cfg.n_head, cfg.vocab_size) if cfg is not None else
                        (2 * kwargs["head_size"], 2, 97) if "head_size" in kwargs else
                        (TINY["n_embd"], TINY["n_head"], TINY["vocab_size"]))
    broken = _broken_parts(package, kwargs.get("dtype", torch.float32), c, n_head, vocab)
    if not broken:
        return None
    part, file, use, why = broken[0]
    others = [f"{p} ({f})" for p, f, _, _ in broken[1:]]
    also = (f"\n{', '.join(others[:-1]) + ' and ' if len(others) > 1 else ''}{others[-1]} "
            f"{'fail' if len(others) > 1 else 'fails'} on {'their' if len(others) > 1 else 'its'} own too."
            if others else "")
    first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
    return (f"fix {part} first ({file}; {use} run on it): {why}{also}\n"
            f"(this test's own failure, which follows from it: {first})")


@pytest.mark.mutants
def test_broken_parts_names_the_kernel_that_fails():
    """The course's own check of the diagnosis above (not graded; with the mutation checks, --mutants): the
    reference kernels pass it, the untouched stubs fail it part by part, the GEMV named first."""
    from common.impl import Impl
    if Impl.get().package != "solutions":
        pytest.skip("course self-check: runs with --impl solutions, where assignments/ are the stubs")
    assert _broken_parts("solutions.a08_gpt2_inference", torch.float32, 32, 2, 40) == []
    broken = _broken_parts("assignments.a08_gpt2_inference", torch.float32, 32, 2, 40)
    assert [p for p, *_ in broken] == [p for p, *_ in PARTS], broken


def names_the_failing_part(test):
    """An engine test that, when it fails, first checks each a08 kernel at the model's shapes and, where
    one is wrong, fails with "fix <part> first: <what is wrong>" (the engine's own failure after it)."""
    @functools.wraps(test)
    def run(*args, **kwargs):
        try:
            return test(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - pytest's skip and fail are BaseExceptions: they pass through
            blame = _blame(e, kwargs)
            if blame is None:
                raise
        pytest.fail(blame, pytrace=False)              # outside the except: no "during handling of" chain
    return run


@pytest.fixture(scope="module")
def tiny_model():
    return random_gpt2(8, **TINY)


def _engine(eng, model, dtype=torch.float32, max_batch=4, max_seq_len=None):
    return eng.GPT2Engine.from_hf(model, dtype=dtype, max_batch=max_batch, max_seq_len=max_seq_len)


def _allowed(hf_err: float, dtype) -> float:
    """The engine may be a few times less accurate than transformers in the same dtype, never
    less accurate than the dtype's tolerance floor allows."""
    return max(4.0 * hf_err, {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[dtype])


@pytest.mark.parametrize("tuned", [False, True], ids=["core", "tuned"])
def test_decode_step_takes_a_strided_token_column(eng, tiny_model, tuned, seed):
    """decode_step(tokens) with tokens a column of an id matrix (stride != 1) gives the same logits, bit for
    bit, as with the same ids contiguous: the tuned path's one-kernel embedding reads tokens with their stride."""
    ids = torch.randint(0, tiny_model.config.vocab_size, (2, 7), device=DEVICE)
    out = []
    for tokens in (ids[:, 6].contiguous(), ids[:, 6]):
        engine = eng.GPT2Engine.from_hf(tiny_model, max_batch=2, max_seq_len=16, tuned=tuned)
        engine.prefill(ids[:, :6])
        out.append(engine.decode_step(tokens))
    assert torch.equal(out[0], out[1]), f"decode_step on a strided token column (stride {ids[:, 6].stride(0)}) differs"


@pytest.mark.parametrize("dtype", DTYPES, ids=dt)
def test_prefill_logits(eng, tiny_model, dtype, seed):
    """Prefill of a right-padded batch (lengths 9, 1, 14): the logits at every real position match
    transformers in float64, within a few times transformers' own error in this dtype."""
    if dtype == torch.float16 and not HAS_CUDA:
        pytest.skip("fp16 GPT-2 in transformers on a CPU is not supported by every torch build")
    engine = _engine(eng, tiny_model, dtype)
    prompts = _prompts([9, 1, 14], TINY["vocab_size"], seed)
    ids, lengths = engine.pad(prompts)
    logits = engine.prefill(ids, lengths, all_logits=True)
    last = engine.prefill(ids, lengths)
    for i, p in enumerate(prompts):
        ref = hf_logits64(tiny_model, p)
        mine = rel_error(logits[i, :len(p)], ref)
        theirs = rel_error(hf_logits(tiny_model, p, dtype, DEVICE), ref)
        assert mine <= _allowed(theirs, dtype), (
            f"prefill logits of prompt {i} (length {len(p)}): relative error {mine:.2e}, transformers in "
            f"{dtype} {theirs:.2e}")
        assert_close(last[i], logits[i, len(p) - 1], rel_tol=1e-6 if dtype == torch.float32 else 1e-2,
                     name=f"prefill()'s last-token logits of prompt {i}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=dt)
def test_decode_logits(eng, tiny_model, dtype, seed):
    """Decode steps after a padded prefill (lengths 6, 14, 2; the longest crosses 16 keys, a block of the
    decode attention under the interpreter): the logits at each step match transformers (float64) on the
    whole sequence; the cache lengths advance by one per step. 3 steps on a CPU, 5 on a GPU."""
    engine = _engine(eng, tiny_model, dtype)
    vocab = TINY["vocab_size"]
    steps_n = 5 if HAS_CUDA else 3
    prompts = _prompts([6, 14, 2], vocab, seed)
    follow = _prompts([steps_n] * 3, vocab, seed + 1)        # teacher-forced next tokens
    ids, lengths = engine.pad(prompts)
    engine.prefill(ids, lengths)
    steps = []
    for j in range(steps_n):
        tok = torch.tensor([f[j] for f in follow], device=engine.device)
        steps.append(engine.decode_step(tok))
        assert engine.cache.lengths[:3].tolist() == [n + j + 1 for n in lengths], (
            f"after decode step {j + 1}: cache lengths {engine.cache.lengths[:3].tolist()}, expected "
            f"{[n + j + 1 for n in lengths]}")
    for i, (p, f) in enumerate(zip(prompts, follow)):
        ref = hf_logits64(tiny_model, p + f)[len(p):]
        mine = torch.stack([s[i] for s in steps])
        theirs = rel_error(hf_logits(tiny_model, p + f, dtype, DEVICE)[len(p):], ref)
        err = rel_error(mine, ref)
        assert err <= _allowed(theirs, dtype), (
            f"decode logits of sequence {i} (prompt length {len(p)}): relative error {err:.2e} against "
            f"transformers in float64 (transformers in {dtype}: {theirs:.2e}); per step: "
            f"{[f'{rel_error(mine[j], ref[j]):.1e}' for j in range(len(f))]}")


def test_decode_step_runs_every_matmul_on_your_decode_kernel(eng, tiny_model, seed):
    """Every GEMM of a decode step (4 per block and the LM head) goes through the a08 GEMV (gemv.py, the core path)."""
    engine = eng.GPT2Engine.from_hf(tiny_model, dtype=torch.float32, max_batch=4, tuned=False)
    ids, lengths = engine.pad(_prompts([3, 6], TINY["vocab_size"], seed))
    engine.prefill(ids, lengths)
    calls, gemv = [], eng.gemv

    def counted(x, w, *a, **kw):
        calls.append(tuple(w.shape))
        return gemv(x, w, *a, **kw)
    eng.gemv = counted
    try:
        logits = engine.decode_step(torch.tensor([1, 2], device=engine.device))
    finally:
        eng.gemv = gemv
    assert logits.shape == (2, TINY["vocab_size"])
    assert len(calls) == 4 * TINY["n_layer"] + 1, f"decode_step ran {len(calls)} GEMMs on the gemv: {calls}"


#: New tokens a generate test compares on a CPU (each decode step is a dozen interpreted launches): the
#: batch of 4's longest prompt (13) then crosses 16 cached keys, a block of the interpreter's decode attention.
N_NEW_CPU = 4


@pytest.mark.parametrize("lengths", [[7], [1], [5, 13, 1, 9]], ids=["b1-len7", "b1-len1", "b4-mixed"])
def test_generate_matches_transformers(eng, tiny_model, lengths, seed):
    """Greedy tokens identical to transformers' generate(do_sample=False), prompt by prompt (fp32)."""
    engine = _engine(eng, tiny_model)
    prompts = _prompts(lengths, TINY["vocab_size"], seed)
    got = engine.generate(prompts, N_NEW_CPU).tolist()
    for i, p in enumerate(prompts):
        want = hf_generate(tiny_model, p, N_NEW_CPU)
        assert got[i] == want, (f"prompt {i} (length {len(p)}, batch of {len(prompts)}): first difference at new "
                                f"token {next(j for j in range(N_NEW_CPU) if got[i][j] != want[j])}\n"
                                f"engine:       {got[i]}\ntransformers: {want}")


@pytest.mark.parametrize("head_size", [80, 96], ids=lambda d: f"d{d}")
def test_generate_head_sizes_not_a_power_of_two(eng, head_size, seed):
    """Head sizes 80 and 96 (n_embd 160 / 192, 2 heads; real models have 80, 96, 160): prefill's flash
    attention, the KV-cache write and decode attention pad the head to 128 with masks; greedy tokens
    identical to transformers (fp32) for a right-padded batch of two prompts."""
    model = random_gpt2(3, vocab_size=97, n_positions=32, n_embd=2 * head_size, n_layer=1, n_head=2,
                        initializer_range=0.3)
    engine = eng.GPT2Engine.from_hf(model, dtype=torch.float32, max_batch=2, max_seq_len=32)
    assert engine.head_dim == head_size
    prompts = _prompts([7, 3], 97, seed)
    got = engine.generate(prompts, 3).tolist()
    for i, p in enumerate(prompts):
        want = hf_generate(model, p, 3)
        assert got[i] == want, f"head size {head_size}, prompt {i}: engine {got[i]}, transformers {want}"


def test_decode_step_uses_the_course_kernels(eng, tiny_model, seed):
    """A decode step calls no PyTorch matmul, LayerNorm, GELU, softmax or attention, and reads no
    device value on the host (.item(), .tolist(), bool(t), int(t), .cpu(): a host sync, which a CUDA
    graph cannot hold), seen on the CPU too (common.kernel_check.host_syncs)."""
    engine = _engine(eng, tiny_model)
    ids, lengths = engine.pad(_prompts([4, 9], TINY["vocab_size"], seed))
    engine.prefill(ids, lengths)
    tok = torch.tensor([3, 5], device=engine.device)
    with watch(ENGINE) as t, host_syncs() as syncs:
        logits = engine.decode_step(tok)
    assert logits.shape == (2, TINY["vocab_size"]), f"decode_step returned shape {tuple(logits.shape)}"
    bad = called(t, ENGINE)
    assert not bad, f"decode_step called PyTorch for the kernels' work: {bad}"
    syncs += [op for op in t.ops if "_local_scalar_dense" in op]
    assert not syncs, (f"decode_step reads device values on the host ({sorted(set(syncs))}): on a GPU each is a "
                       "synchronisation, which the CUDA graph the step is replayed from cannot hold; keep the lengths "
                       "and tokens on the device (cache.lengths, index with tensors, no .tolist()/.item()/if t:)")
    with watch(ENGINE) as t:
        engine.prefill(ids, lengths)
    bad = called(t, ENGINE)
    assert not bad, f"prefill called PyTorch for the kernels' work: {bad}"


def test_decode_step_work_does_not_grow_with_the_context(impl, seed):
    """After prompts of 12-20 tokens, every GEMM of a decode step has B rows (one new token per
    sequence) and no prefill attention runs: a step that recomputes the whole context gives the same
    logits at a cost that grows with it. The grader's check (common.course.stages: a08_decode_work)."""
    import random

    from common.course.stages import A08_TINY, CALLS, Run, _decode_work_judge, _prompts
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    prompts = _prompts(g, [rng.randint(12, 20), rng.randint(12, 20)], A08_TINY["vocab_size"])
    follow = [[rng.randrange(A08_TINY["vocab_size"]) for _ in range(2)] for _ in range(2)]
    run = Run(impl.load)
    CALLS["a08_decode_work"](run, seed=seed, n_head=2, prompts=prompts, follow=follow)
    problem = _decode_work_judge(len(prompts))(run.facts)
    assert problem is None, problem


def test_from_hf_and_generate_check_their_inputs(eng, tiny_model, seed):
    """Clear errors for an unsupported config, a cache too small, an empty prompt (after a legal run)."""
    from transformers import GPT2Config, GPT2LMHeadModel
    engine = _engine(eng, tiny_model, max_batch=2, max_seq_len=12)
    assert engine.generate([[1, 2, 3]], 2).shape == (1, 2)
    with pytest.raises(ValueError, match="max_seq_len"):
        engine.generate([[1] * 10], 4)
    with pytest.raises(ValueError, match="batch"):
        engine.generate([[1], [2], [3]], 2)
    with pytest.raises(ValueError, match="non-empty"):
        engine.generate([[1], []], 2)
    if engine.device.type != "cuda":
        with pytest.raises(ValueError, match="CUDA device"):
            engine.generate([[1, 2, 3]], 2, cuda_graph=True)
    relu = GPT2LMHeadModel(GPT2Config(**{**TINY, "activation_function": "relu"}))
    with pytest.raises(ValueError, match="activation_function"):
        eng.GPT2Engine.from_hf(relu)
    wide = GPT2LMHeadModel(GPT2Config(**{**TINY, "n_embd": 600, "n_head": 2, "n_layer": 1}))
    with pytest.raises(ValueError, match="head size 300"):
        eng.GPT2Engine.from_hf(wide)


BAD_IDS = [  # (prompts, error, what the message must say)
    ([[1, 2, 257]], ValueError, r"token id 257 in sequence 0 at position 2 .*vocab_size=257"),
    ([[4, 5], [3, 1, -1]], ValueError, r"token id -1 in sequence 1 at position 2"),
    (torch.tensor([[7, 300, 2]]), ValueError, r"token id 300 in sequence 0 at position 1"),
    (torch.rand(1, 4), TypeError, r"integers.*float32"),
    ([[1.0, 2.5]], TypeError, r"prompts\[0\].*integers"),
    ([torch.tensor([True, False])], TypeError, r"integers.*bool"),
    (["hello"], TypeError, r"tokenize"),
]


def test_generate_refuses_bad_token_ids_and_stays_usable(eng, tiny_model, seed):
    """Token ids out of [0, vocab_size) (ValueError naming the value, the sequence and the position) and
    non-integer ids (TypeError) are refused before any kernel runs; a generate() after each refusal gives
    the same tokens as before it (on a GPU an out-of-range id would otherwise be a device-side assert that
    kills the process's CUDA context). ``prefill`` checks its ids too."""
    engine = _engine(eng, tiny_model, max_batch=2, max_seq_len=16)
    good = _prompts([3, 5], TINY["vocab_size"], seed)
    first = engine.generate(good, 2).tolist()
    for prompts, err, msg in BAD_IDS:
        with pytest.raises(err, match=msg):
            engine.generate(prompts, 2)
    with pytest.raises(ValueError, match="position 3"):
        engine.prefill(torch.tensor([[1, 2, 3, 999]], device=engine.device))
    assert engine.generate(good, 2).tolist() == first, "generate() after refused inputs gave other tokens"


# ============================================================ stop tokens, streaming, sampling
ONE_LAYER = dict(TINY, n_layer=1, vocab_size=40)      # a small vocabulary: the interpreter samples ~20 rows/s


@pytest.fixture(scope="module")
def one_layer_model():
    return random_gpt2(11, **ONE_LAYER)


def hf_generate_with(model, prompt: list[int], n: int, **kw) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n,
                             attention_mask=torch.ones(1, len(prompt), dtype=torch.long), **kw)
    return out[0, len(prompt):].tolist()


def test_eos_stops_each_sequence_and_streaming_gives_the_same_tokens(eng, one_layer_model, seed):
    """eos_token_id (a list: one id each sequence produces early): every sequence's tokens up to its EOS
    are transformers' greedy generate(eos_token_id=...) token for token (fp32), the ended sequences are
    padded with pad_token_id, and generate() returns at the longest one's EOS, as transformers does, with
    the host checking every 2 steps; stream() yields the same tokens step by step and stops there too."""
    engine = _engine(eng, one_layer_model, max_batch=3, max_seq_len=40)
    prompts = _prompts([5, 9, 2], ONE_LAYER["vocab_size"], seed)
    n = 7
    greedy = engine.generate(prompts, n).tolist()
    eos = sorted({g[k] for g, k in zip(greedy, (1, 4, 3))})     # each sequence meets one of these early
    got = engine.generate(prompts, n, eos_token_id=eos, pad_token_id=3, check_every=2).tolist()
    want = [hf_generate_with(one_layer_model, p, n, do_sample=False, eos_token_id=eos, pad_token_id=3)
            for p in prompts]
    assert len(got[0]) == max(len(w) for w in want) < n, (
        f"generate() returned {len(got[0])} steps; transformers' longest sequence ends after {max(map(len, want))}")
    for i, w in enumerate(want):
        assert got[i][:len(w)] == w, f"sequence {i}: engine {got[i]}, transformers {w} (eos {eos})"
        assert all(t == 3 for t in got[i][len(w):]), f"sequence {i} after its EOS: {got[i][len(w):]}, expected pad 3"
    steps = list(engine.stream(prompts, n, eos_token_id=eos, pad_token_id=3))
    assert all(s.shape == (3,) and s.device.type == "cpu" for s in steps), "stream() yields int64 [B] on the host"
    assert torch.stack(steps, 1).tolist() == got, "stream() and generate() disagree"
    assert torch.stack(list(engine.stream(prompts, 4)), 1).tolist() == [g[:4] for g in greedy], \
        "stream() without EOS: generate()'s greedy tokens"
    with pytest.raises(ValueError, match="eos_token_id"):
        engine.generate(prompts, 2, eos_token_id=ONE_LAYER["vocab_size"])


# ------------------------------------------------------------ the sampler (sampling.py) and the engine's two paths
@pytest.fixture
def smp(impl):
    return impl.load("a08_gpt2_inference.sampling")


def _tuned_sampling():
    """The tuned path's sampler (given code beside the reference, solutions/a08_gpt2_inference/tuned_sampling.py)."""
    from common.impl import load
    return load("a08_gpt2_inference.tuned_sampling", "solutions")


PATHS = [False, True]
PATH_IDS = ["core", "tuned"]


def _tuned_sampler_on_this_machine(tuned: bool = True) -> None:
    """The tuned path's sampler is course code (solutions/), interpreted seconds a call on a CPU: a student's
    run checks it on a GPU, and the course's own run (make test, --impl solutions) on a CPU too."""
    from common.impl import Impl
    if tuned and not HAS_CUDA and Impl.get().package != "solutions":
        pytest.skip("the tuned path's sampler is course code: on a CPU make test checks it; a GPU checks it here")


@pytest.mark.parametrize("tuned", PATHS, ids=PATH_IDS)
def test_sampling_seeds_and_greedy_limits(eng, one_layer_model, tuned, seed):
    """do_sample=True on the core (your sampler) and on the tuned path: top_k=1 and a temperature near 0 give
    the greedy tokens; the same seed (or a torch.Generator in the same state) the same tokens, another seed
    other tokens; bad parameters are refused."""
    _tuned_sampler_on_this_machine(tuned)
    engine = eng.GPT2Engine.from_hf(one_layer_model, dtype=torch.float32, max_batch=2, max_seq_len=40, tuned=tuned)
    prompts = _prompts([4, 7], ONE_LAYER["vocab_size"], seed)
    n = 5 if HAS_CUDA else 3                                   # 3 steps: 6 sampled tokens to tell two seeds apart
    greedy = engine.generate(prompts, n).tolist()
    assert engine.generate(prompts, n, do_sample=True, top_k=1, seed=5).tolist() == greedy, "top_k=1 is greedy"
    assert engine.generate(prompts, n, do_sample=True, temperature=1e-4, seed=5).tolist() == greedy, \
        "temperature 1e-4 is greedy"
    a = engine.generate(prompts, n, do_sample=True, temperature=1.5, seed=123).tolist()
    assert engine.generate(prompts, n, do_sample=True, temperature=1.5, seed=123).tolist() == a, "same seed, other tokens"
    assert engine.generate(prompts, n, do_sample=True, temperature=1.5, seed=124).tolist() != a, \
        f"seeds 123 and 124 gave the same {2 * n} sampled tokens"
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    assert engine.generate(prompts, n, do_sample=True, temperature=1.5, generator=g1).tolist() == \
        engine.generate(prompts, n, do_sample=True, temperature=1.5, generator=g2).tolist(), "same generator state"
    if tuned:                                                  # the tuned sampler's wide-top-k graph
        wide = engine.generate(prompts, n, do_sample=True, top_k=engine.tuned.wide_top_k + 1, seed=7)
        assert all(0 <= t < ONE_LAYER["vocab_size"] for row in wide.tolist() for t in row)
    for bad in (dict(temperature=0.0), dict(top_k=-1), dict(top_p=0.0), dict(top_p=1.5)):
        with pytest.raises(ValueError, match=next(iter(bad))):
            engine.generate(prompts, 2, do_sample=True, **bad)


def _hf_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """transformers' sampling distribution for one row of logits (its warpers, in generate()'s order)."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper
    scores = logits.float().cpu()[None]
    scores = TemperatureLogitsWarper(temperature)(None, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.softmax(-1)[0].double()


#: A chi-square p-value below this fails. Each run draws fresh seeds and makes ~18 such checks: at 1e-3
#: about one run in 50 failed by chance (300 seeds on the H100: p-values uniform, the sampler exact),
#: where a real error (a wrong temperature, a token of the kept set dropped) gives p < 1e-10 at 20000
#: draws. A dropped token is also caught on its own (_check_draws: never drawn though expected >= 25).
P_FAIL = 1e-6


def _check_draws(counts: torch.Tensor, probs: torch.Tensor, what: str, chi_square: bool = True) -> None:
    """counts (one per token) against probs: none outside the kept tokens, none of the kept tokens that
    are expected 25 times or more left undrawn, and (chi_square) Pearson's test with p > P_FAIL."""
    n = float(counts.sum())
    outside = int(counts[probs == 0].sum())
    assert outside == 0, f"{what}: {outside} of {n:.0f} draws outside the kept tokens"
    missing = ((probs * n >= 25) & (counts == 0)).nonzero().flatten().tolist()
    assert not missing, f"{what}: tokens {missing[:5]} were never drawn, though expected >= 25 times each"
    if chi_square:
        pv = _chi_square_p(counts, probs)
        assert pv > P_FAIL, f"{what}: chi-square p-value {pv:.1e} < {P_FAIL:g}: the draws do not follow the distribution"


def _chi_square_p(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's chi-square test of counts against probs (cells expected < 5 times pooled)."""
    n = counts.sum()
    exp = probs * n
    big = exp >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([exp[big], exp[~big].sum()[None]])
    keep = exp > 0
    chi = ((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), chi / 2)) if dof > 0 else 1.0


#: (temperature, top_k, top_p): temperature alone, top-k, top-p, both
SAMPLING_CASES = [(1.0, 0, 1.0), (0.7, 6, 1.0), (1.3, 0, 0.8), (1.0, 12, 0.7)]
#: Draws per case: your sampler is a reduction per bisection step, fast under the interpreter too; the
#: tuned one takes ~50 ms a draw interpreted (on a CPU: its top-p case only, its support only)
DRAWS = 20000 if HAS_CUDA else 2000
DRAWS_TUNED_CPU = 120


@pytest.mark.parametrize("case", SAMPLING_CASES, ids=[f"T{t}-k{k}-p{p}" for t, k, p in SAMPLING_CASES])
def test_sample_follows_transformers_filters(smp, case, seed):
    """Your sampler (sampling.sample) on a 40-token vocabulary (not a power of 2), DRAWS draws in a batch of
    rows that alternate between two different rows of logits, each row its own position: both rows' draws
    against transformers' temperature, top-k and top-p warpers (_check_draws: a chi-square test, nothing
    outside the kept tokens, none of the likely ones missing); the same seed gives the same tokens."""
    t, k, p = case
    g = torch.Generator().manual_seed(seed)
    v = 40
    # top-k and top-p together on flat logits: the top-k tokens then hold well under top_p of the whole
    # mass, so top-p measured over every token (not over the top-k) keeps other tokens on every seed
    two = torch.randn(2, v, generator=g) * (0.5 if k and p < 1 else 2)
    n = DRAWS
    rows = two.repeat(n // 2, 1).to(DEVICE)                       # row i: logits two[i % 2]
    pos = torch.arange(n, dtype=torch.int32, device=DEVICE)
    params, key = smp.SamplingParams(t, k, p).tensor(DEVICE), torch.tensor([seed], device=DEVICE)
    tok = assert_is_kernel(lambda: smp.sample(rows, params, key, pos), SAMPLER, "sample").cpu()
    assert tok.shape == (n,) and tok.dtype == torch.int64, f"sample returned {tuple(tok.shape)} {tok.dtype}"
    for i in range(2):
        counts = torch.bincount(tok[i::2], minlength=v).double()
        _check_draws(counts, _hf_probs(two[i], t, k, p), f"sample T={t} top_k={k} top_p={p}, logits row {i}")
    assert torch.equal(smp.sample(rows, params, key, pos).cpu(), tok), "the same seed gave other tokens"


def test_sample_limits_dtypes_and_strided_rows(smp, seed):
    """Your sampler: top_k=1 and a tiny temperature draw the largest logit (a tie of it in 16 bits); top_k >= V
    and top_p = 1 keep every token;
    bf16 and fp16 logits; rows that are a strided view (a row stride larger than V); a row whose logits tie
    (the draw spreads over all of them); bad inputs raise."""
    g = torch.Generator().manual_seed(seed)
    v, n = 29, 64
    wide = torch.randn(n, v + 7, generator=g).to(DEVICE) * 3
    rows = wide[:, :v]                                             # row stride v + 7
    pos = torch.arange(n, dtype=torch.int32, device=DEVICE)
    key = torch.tensor([seed], device=DEVICE)
    for dt in (torch.float32, torch.bfloat16, torch.float16):
        r = rows.to(dt) if dt != torch.float32 else rows
        for params in (smp.SamplingParams(1.0, 1, 1.0), smp.SamplingParams(1e-4, 0, 1.0), smp.SamplingParams(0.5, 1, 0.3)):
            got = smp.sample(r, params.tensor(DEVICE), key, pos)      # the argmax, or a tie with it (16 bits)
            assert torch.equal(r.float().gather(1, got[:, None])[:, 0], r.float().amax(-1)), \
                f"{params} on {dt} logits: a token below the row's largest logit"
    many = smp.sample(rows[:1].expand(2000, -1).contiguous(), smp.SamplingParams(1.0, v + 5, 1.0).tensor(DEVICE), key,
                      torch.arange(2000, dtype=torch.int32, device=DEVICE)).cpu()
    _check_draws(torch.bincount(many, minlength=v).double(), _hf_probs(rows[0], 1.0, 0, 1.0), "top_k > V: no filter")
    tied = smp.sample(torch.zeros(400, v, device=DEVICE), smp.SamplingParams(1.0, 3, 1.0).tensor(DEVICE), key,
                      torch.arange(400, dtype=torch.int32, device=DEVICE)).cpu()
    assert len(set(tied.tolist())) > v // 2, "tied logits (top-k keeps ties): the draw must spread over all of them"
    with pytest.raises(ValueError, match="positions"):
        smp.sample(rows, smp.SamplingParams().tensor(DEVICE), key, pos[:3])
    with pytest.raises(TypeError, match="params"):
        smp.sample(rows, smp.SamplingParams().tensor(DEVICE).double(), key, pos)


@pytest.mark.parametrize("tuned", PATHS, ids=PATH_IDS)
def test_sampled_tokens_follow_transformers_distribution(eng, one_layer_model, tuned, seed):
    """The engine's first-token distribution after a prompt (its prefill logits, the sampler of the path as
    generate() calls it: your sampling.sample on the core, tuned_sampling.sample on the tuned path) against
    transformers' do_sample distribution for the same prompt (its model's logits through its temperature,
    top-k and top-p warpers): a chi-square test (p > P_FAIL), and no draw outside top-k / the nucleus. On a
    CPU the tuned sampler (interpreted, slow) draws the top-p case only, DRAWS_TUNED_CPU times."""
    _tuned_sampler_on_this_machine(tuned)
    engine = eng.GPT2Engine.from_hf(one_layer_model, dtype=torch.float32, max_batch=1, max_seq_len=40, tuned=tuned)
    prompt = _prompts([6], ONE_LAYER["vocab_size"], seed)[0]
    ids, lengths = engine.pad([prompt])
    logits = engine.prefill(ids, lengths)
    with torch.no_grad():
        hf_logits_last = one_layer_model(torch.tensor([prompt])).logits[0, -1]
    slow = tuned and not HAS_CUDA
    n = DRAWS_TUNED_CPU if slow else DRAWS
    rows = logits.expand(n, -1).contiguous()
    positions = torch.full((n,), len(prompt), dtype=torch.int32, device=engine.device)
    key = torch.tensor([1234], device=engine.device)
    for t, k, p in SAMPLING_CASES[2:3] if slow else SAMPLING_CASES:
        params = eng.SamplingParams(t, k, p).tensor(engine.device)
        if tuned:
            _, _, nucleus, wide = engine.mode(True, False, k, p)
            tok = _tuned_sampling().sample(rows, params, key, positions, nucleus_pass=nucleus, wide=wide)
        else:
            tok = eng.sample(rows, params, key, positions)
        counts = torch.bincount(tok.cpu(), minlength=ONE_LAYER["vocab_size"]).double()
        _check_draws(counts, _hf_probs(hf_logits_last, t, k, p), f"T={t} top_k={k} top_p={p} (engine draws vs transformers)")


def test_core_and_tuned_paths_generate_transformers_tokens(eng, one_layer_model, seed):
    """The same engine on its core (your kernels as they are) and on the tuned path (tuned.py around them):
    transformers' greedy tokens (fp32) for a right-padded batch, on each path, and set_path switches between
    them on one engine; the tuned path's options without tuned=True are refused."""
    engine = eng.GPT2Engine.from_hf(one_layer_model, dtype=torch.float32, max_batch=2, max_seq_len=40, tuned=False)
    prompts = _prompts([3, 8], ONE_LAYER["vocab_size"], seed)
    want = [hf_generate(one_layer_model, p, 6) for p in prompts]
    for tuned in (False, True, False):
        engine.set_path(tuned)
        assert (engine.tuned is not None) == tuned
        got = engine.generate(prompts, 6).tolist()
        assert got == want, f"{PATH_IDS[tuned]} path: engine {got}, transformers {want}"
    with pytest.raises(TypeError, match="tuned=True"):
        engine.set_path(False, pdl=False)


@pytest.mark.given
def test_sample_kernel_frequencies_on_a_small_vocabulary(seed):
    """tuned_sampling.sample (the tuned path's sampler, given code) on an 8-token vocabulary (a GPU: 200): draws
    (one a row) at a fixed seed match softmax(logits / T) after top-k / top-p (_check_draws), top-p and top-k
    never draw outside the kept tokens, the draws differ between rows and repeat with the seed. The cases reach
    each of the kernel's paths: the candidates (top-k <= KC), top-k beyond the candidates (one program draws
    exactly), every logit tied (no chunk keeps a candidate), and tuned_sampling.argmax is torch.argmax."""
    _tuned_sampler_on_this_machine()
    smp = _tuned_sampling()
    g = torch.Generator().manual_seed(seed)
    v, n = (200, 50000) if HAS_CUDA else (8, 100)
    logits = torch.randn(v, generator=g) * 2
    rows = logits.to(DEVICE).expand(n, -1).contiguous()
    pos = torch.arange(n, dtype=torch.int32, device=DEVICE) % 7
    key = torch.tensor([seed], device=DEVICE)
    # nucleus_pass=False (the engine without top-p): no kernels C and D; a row that needs them is drawn in B.
    # wide=True (the engine with top_k > WIDE_TOP_K): KC_WIDE candidates a chunk, top-k KC + 2 on the fast path
    for t, k, p, nucleus, wide in [(1.0, 0, 1.0, True, False), (0.6, 0, 0.75, True, False), (1.0, 3, 1.0, True, False),
                                   (1.0, smp.KC + 2, 0.9, True, False), (1.0, smp.KC + 2, 1.0, False, False),
                                   (0.6, 0, 0.75, False, False), (1.0, smp.KC + 2, 0.9, True, True)]:
        m = n if HAS_CUDA or (k == 0 and nucleus) else 20    # interpreted: top-k ~4x slower a draw; support only
        tok = smp.sample(rows[:m], smp.SamplingParams(t, k, p).tensor(DEVICE), key, pos[:m], nucleus_pass=nucleus,
                         wide=wide).cpu()
        probs = _hf_probs(logits, t, k, p)
        counts = torch.bincount(tok, minlength=v).double()
        _check_draws(counts, probs, f"T={t} top_k={k} top_p={p} nucleus_pass={nucleus} wide={wide}", chi_square=m == n)
    flat = torch.zeros(6, v, device=DEVICE)                        # every logit tied: no chunk has candidates
    for k, p in ((3, 1.0), (0, 0.5)):                              # (ties kept: the draw is over all of them)
        tok = smp.sample(flat, smp.SamplingParams(1.0, k, p).tensor(DEVICE), key, pos[:6]).cpu()
        assert ((tok >= 0) & (tok < v)).all(), f"tied logits, top_k={k} top_p={p}: tokens {tok.tolist()}"
    hot = smp.SamplingParams(temperature=50.0).tensor(DEVICE)      # near uniform: 30 draws of > 2 tokens
    first = smp.sample(rows[:30], hot, key, pos[:30]).cpu()
    assert torch.equal(first, smp.sample(rows[:30], hot, key, pos[:30]).cpu())
    assert len(set(first.tolist())) > 2, "30 rows drew (almost) the same token: the rows share a random stream"
    noisy = rows[:5] + torch.randn(5, v, generator=g).to(DEVICE)
    noisy[1, 3] = noisy[1, 5] = noisy[1].max() + 1                 # a tie: the first index, as torch.argmax
    for dt in (torch.float32, torch.bfloat16):
        assert smp.argmax(noisy.to(dt)).tolist() == noisy.to(dt).argmax(-1).tolist(), f"argmax {dt}"


GPT2_VOCAB_CASES = [(1.0, 0, 1.0, True), (0.8, 50, 1.0, True), (0.8, 0, 0.9, True), (0.8, 50, 0.9, True),
                    (0.8, 50, 0.9, False), (1.0, 100, 1.0, True), (1.0, 1000, 1.0, False)]


def _gpt2_vocab_logits(scale: float, seed: int) -> torch.Tensor:
    """Logits over GPT-2's 50257 tokens: "peaked" (3.0), "flat" (0.55: a random-weight model's spread, the
    nucleus below the tuned sampler's candidates) or "sorted" (-3.0: the likely tokens at the lowest ids, as
    a BPE vocabulary puts its frequent ones). fp32: bf16 logits tie, and ties at a top-p border are kept by
    the samplers, cut by sort order in transformers."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(50257, generator=g) * abs(scale)
    return logits.sort(descending=True).values if scale < 0 else logits


@pytest.mark.gpu
@pytest.mark.parametrize("scale", [3.0, 0.55, -3.0], ids=["peaked", "flat", "sorted"])
def test_sample_on_gpt2_vocabulary(smp, scale, seed):
    """Your sampler over GPT-2's 50257 tokens: 20000 draws against the exact distribution after each filter
    (_check_draws), top-k up to 1000."""
    logits = _gpt2_vocab_logits(scale, seed)
    rows = logits.cuda().expand(20000, -1).contiguous()
    pos = torch.arange(20000, dtype=torch.int32, device="cuda")
    for t, k, p, _ in GPT2_VOCAB_CASES:
        tok = assert_is_kernel(lambda: smp.sample(rows, smp.SamplingParams(t, k, p).tensor("cuda"),
                                                  torch.tensor([seed], device="cuda"), pos), SAMPLER, "sample").cpu()
        _check_draws(torch.bincount(tok, minlength=50257).double(), _hf_probs(logits, t, k, p), f"T={t} top_k={k} top_p={p}")


@pytest.mark.gpu
@pytest.mark.given
@pytest.mark.parametrize("scale", [3.0, 0.55, -3.0], ids=["peaked", "flat", "sorted"])
def test_sample_kernel_on_gpt2_vocabulary(scale, seed):
    """tuned_sampling.sample over GPT-2's 50257 tokens (25 chunks): 20000 draws against the exact distribution
    after each filter (_check_draws). "flat" logits put the nucleus below the chunks' candidates, so top-p is
    decided by rejection (kernels C and D); top_k=1000 takes the wide candidates (the engine's choice above
    WIDE_TOP_K); nucleus_pass=False with top-k, as the engine calls it; argmax against torch.argmax."""
    smp = _tuned_sampling()
    logits = _gpt2_vocab_logits(scale, seed)
    rows = logits.cuda().expand(20000, -1).contiguous()
    pos = torch.arange(20000, dtype=torch.int32, device="cuda")
    for t, k, p, nucleus in GPT2_VOCAB_CASES:
        tok = smp.sample(rows, smp.SamplingParams(t, k, p).tensor("cuda"), torch.tensor([seed], device="cuda"), pos,
                         nucleus_pass=nucleus, wide=k > smp.WIDE_TOP_K).cpu()
        _check_draws(torch.bincount(tok, minlength=50257).double(), _hf_probs(logits, t, k, p),
                     f"T={t} top_k={k} top_p={p} nucleus_pass={nucleus}")
    assert smp.argmax(rows[:4]).tolist() == rows[:4].argmax(-1).tolist()


# ============================================================ GPU: GPT-2 small's shape, graphs, memory
@pytest.fixture(scope="module")
def small_model():
    return random_gpt2(124, **SMALL)


@pytest.mark.gpu
@pytest.mark.parametrize("lengths, warm", [([21], [40]), ([3], [60]), ([37, 5, 64, 18], [60, 2, 50, 33])],
                         ids=["b1-len21", "b1-len3", "b4-mixed"])
def test_generate_gpt2_small_64_tokens(eng, small_model, lengths, warm, seed):
    """GPT-2 small's shape (fp32, random weights): 64 greedy tokens identical to transformers on the
    GPU, with the decode step replayed from a CUDA graph, and the same with it run eagerly. A first
    generate() with other prompts of the same padded length captures the prefill graph, so the
    checked one replays it with new token ids (and a different real length: padding re-zeroed)."""
    engine = _engine(eng, small_model, max_batch=4, max_seq_len=256)
    prompts = _prompts(lengths, SMALL["vocab_size"], seed)
    engine.generate(_prompts(warm, SMALL["vocab_size"], seed + 7), 4)
    got = engine.generate(prompts, 64).tolist()
    eager = engine.generate(prompts, 64, cuda_graph=False).tolist()
    assert got == eager, "CUDA-graph replay and eager decode steps disagree"
    for i, p in enumerate(prompts):
        want = hf_generate(small_model, p, 64, device="cuda")
        assert got[i] == want, (f"prompt {i} (length {len(p)}): first difference at new token "
                                f"{next(j for j in range(64) if got[i][j] != want[j])}\n"
                                f"engine:       {got[i]}\ntransformers: {want}")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=dt)
def test_gpt2_small_decode_logits_16bit(eng, small_model, dtype, seed):
    """16-bit engine at GPT-2 small's shape: prefill + 8 decode steps, logits against transformers
    in float64, within a few times transformers' own error in the same dtype on the GPU."""
    engine = _engine(eng, small_model, dtype, max_batch=2, max_seq_len=128)
    prompts = _prompts([50, 17], SMALL["vocab_size"], seed)
    follow = _prompts([8, 8], SMALL["vocab_size"], seed + 1)
    ids, lengths = engine.pad(prompts)
    first = engine.prefill(ids, lengths)
    steps = [first] + [engine.decode_step(torch.tensor([f[j] for f in follow], device="cuda")) for j in range(8)]
    for i, (p, f) in enumerate(zip(prompts, follow)):
        ref = hf_logits64(small_model, p + f)[len(p) - 1:]
        theirs = rel_error(hf_logits(small_model, p + f, dtype, "cuda")[len(p) - 1:], ref)
        err = rel_error(torch.stack([s[i] for s in steps]), ref)
        assert err <= _allowed(theirs, dtype), (
            f"sequence {i}: logits relative error {err:.2e}, transformers in {dtype} {theirs:.2e}")


@pytest.mark.gpu
def test_kv_cache_memory_matches_accounting(eng, small_model):
    """The cache takes 2·n_layer·n_head·d·itemsize bytes per token (measured with memory_allocated)."""
    torch.cuda.synchronize()
    engine = _engine(eng, small_model, torch.bfloat16, max_batch=1, max_seq_len=16)   # weights first
    before = torch.cuda.memory_allocated()
    cache = type(engine.cache)(12, 8, 12, 64, 1024, torch.bfloat16, "cuda")
    grown = torch.cuda.memory_allocated() - before
    expected = 8 * 1024 * engine.kv_bytes_per_token
    assert engine.kv_bytes_per_token == 2 * 12 * 12 * 64 * 2
    assert expected <= grown <= expected + 2 * 2**20, f"cache grew memory by {grown} bytes, accounting says {expected}"
    ids = torch.randint(0, 100, (1, 5), device="cuda")
    assert engine.generate(ids, 3).shape == (1, 3)
    del cache


@pytest.mark.gpu
@pytest.mark.parametrize("model", ["small", "xl"])
@pytest.mark.parametrize("m", [1, 16], ids=lambda m: f"M{m}")
def test_gemv_gpt2_shapes(gv, model, m, seed):
    """The decode GEMMs of GPT-2 small and XL in bf16 with the configs the engine uses (choose_config:
    split-K where N is small): as accurate as torch.matmul on the same inputs, and the same bits on 20
    calls in a row (the split-K partial sums are added in order; a race between the programs that
    store them and the one that adds them would show as a changed bit)."""
    c = {"small": 768, "xl": 1600}[model]
    for name, (k, n, layout) in {"qkv": (c, 3 * c, "kn"), "proj": (c, c, "kn"), "fc": (c, 4 * c, "kn"),
                                 "fc_proj": (4 * c, c, "kn"), "lm_head": (c, 50257, "nk.t")}.items():
        x, w = randn(m, k, dtype=torch.bfloat16), _gemv_weight(k, n, torch.bfloat16, layout)
        b = randn(n, dtype=torch.bfloat16) if name != "lm_head" else None
        act = "gelu_tanh" if name == "fc" else None
        got = assert_is_kernel(lambda: gv.gemv(x, w, b, act), GEMV_KERNEL, f"gemv {name}")
        want = _gemv_ref(x, w, b, act)
        base = torch_matmul(x, w).float() + (b.float() if b is not None else 0)
        base = torch.nn.functional.gelu(base, approximate="tanh") if act else base
        assert_as_accurate_as_torch(got, want, base.to(torch.bfloat16), dtype=torch.bfloat16,
                                    name=f"gemv, GPT-2 {model} {name} M={m}", scale=_gemv_scale(x, w, b))
        again = [gv.gemv(x, w, b, act) for _ in range(20)]
        assert all(torch.equal(a, got) for a in again), f"gemv, GPT-2 {model} {name} M={m}: bits changed between calls"


@pytest.mark.gpu
@pytest.mark.given
@pytest.mark.parametrize("model", ["large", "xl"])
def test_gemv_layernorm_fold_at_gpt2_widths(tg, model, seed):
    """The LayerNorm fold at one row as GPT-2 large and XL run it on the GPU (the row loaded before the main
    loop, the engine's configs), c_attn and c_fc in bf16: as accurate as the LayerNorm in float64 then
    torch.matmul on the same inputs."""
    c = {"large": 1280, "xl": 1600}[model]
    for name, n in (("c_attn", 3 * c), ("c_fc", 4 * c)):
        x = randn(1, c, dtype=torch.bfloat16, scale=3.0) + 1.0
        w = _gemv_weight(c, n, torch.bfloat16, "nk.t")    # K-major, as the engine's decode copies
        g, beta, b = randn(c, dtype=torch.bfloat16) + 1.0, randn(c, dtype=torch.bfloat16), randn(n, dtype=torch.bfloat16)
        w_f, b_f, colsum = tg.fold_layernorm(g, beta, w, b)
        got = assert_is_kernel(lambda: tg.gemv(x, w_f, b_f, ln_colsum=colsum), GEMV_KERNEL, f"gemv {name} folded")
        y_ln = reference.layer_norm(*(t.to("cpu", torch.float64) for t in (x, g, beta)), 1e-5)
        want = _gemv_ref(y_ln, w, b, None)
        base = torch_matmul(torch.nn.functional.layer_norm(x.float(), (c,), g.float(), beta.float()).to(torch.bfloat16),
                            w).float() + b.float()
        assert_as_accurate_as_torch(got, want, base.to(torch.bfloat16), dtype=torch.bfloat16,
                                    name=f"gemv, GPT-2 {model} {name}, LayerNorm folded", scale=_gemv_scale(y_ln, w, b))


@pytest.mark.gpu
def test_gemv_in_a_cuda_graph(gv, seed):
    """Your split-K gemv captured in a CUDA graph and replayed on new values, three calls in a chain."""
    _gemv_chain_in_a_graph(gv.gemv, {})


@pytest.mark.gpu
@pytest.mark.given
@pytest.mark.parametrize("pdl", [False, True], ids=["no-pdl", "pdl"])
def test_tuned_gemv_in_a_cuda_graph(tg, pdl, seed):
    """The tuned gemv, the same chain, with and without programmatic dependent launch (on sm_90+ the graph
    then holds programmatic edges)."""
    _gemv_chain_in_a_graph(tg.gemv, dict(pdl=pdl))


def _gemv_chain_in_a_graph(gemv, kw: dict) -> None:
    from common.testing import assert_fresh_in_graph
    k, n = 1600, 1600
    x, w1, w2 = randn(1, k, dtype=torch.bfloat16), _gemv_weight(k, n, torch.bfloat16, "kn"), \
        _gemv_weight(n, n, torch.bfloat16, "kn")
    b = randn(n, dtype=torch.bfloat16)

    def chain(x, w1, w2, b):
        y = gemv(x, w1, b, "gelu_tanh", **kw)
        return gemv(gemv(y, w2, b, **kw), w1, **kw)

    def ref(x, w1, w2, b):
        y = _gemv_ref(x, w1, b, "gelu_tanh").to(torch.bfloat16)
        return _gemv_ref(_gemv_ref(y, w2, b, None).to(torch.bfloat16), w1, None, None)
    gemv(x, w1, b)                    # the ticket counters are allocated eagerly, outside the graph
    assert_fresh_in_graph(chain, dict(x=x, w1=w1, w2=w2, b=b), ref, name=f"three gemv calls {kw}",
                          dtype=torch.bfloat16, rel_tol=3e-2)


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True], ids=["no-pdl", "pdl"])
def test_kv_write_then_decode_attention_in_a_cuda_graph(tg, dec, pdl, seed):
    """The decode step's pair, captured and replayed on new values: c_attn's gemv writes the new token's K and
    V into the cache (kv_cache=), then decode_attention reads the cache up to and including that row. With PDL
    the attention's programs start during the gemv and prefetch their cache rows before they wait: the row
    the gemv writes must still be read as written."""
    from common.testing import assert_fresh_in_graph
    b, h, d, k, s_max = 2, 4, 64, 16, 208
    c = h * d
    start = torch.tensor([100, 37], dtype=torch.int32, device=DEVICE)
    lens = start + 1
    x, w = randn(b, k, dtype=torch.bfloat16), _gemv_weight(k, 3 * c, torch.bfloat16, "kn")
    kc, vc = randn(b, h, s_max, d, dtype=torch.bfloat16), randn(b, h, s_max, d, dtype=torch.bfloat16)

    def step(x, w, kc, vc):
        qkv = tg.gemv(x, w, kv_cache=(kc, vc, start), pdl=pdl)
        return dec.decode_attention(qkv[:, :c].view(b, h, d), kc, vc, lens, pdl=pdl)

    def ref(x, w, kc, vc):
        qkv = _gemv_ref(x, w, None, None).to(torch.bfloat16)
        q, k_new, v_new = (qkv[:, i * c:(i + 1) * c].view(b, h, d) for i in range(3))
        k2, v2 = kc.cpu().clone(), vc.cpu().clone()
        for i, pos in enumerate(start.tolist()):
            k2[i, :, pos], v2[i, :, pos] = k_new[i], v_new[i]
        return reference.decode_attention(q, k2, v2, lens.tolist())
    assert_fresh_in_graph(step, dict(x=x, w=w, kc=kc, vc=vc), ref, name=f"KV write + decode attention, pdl={pdl}",
                          dtype=torch.bfloat16, rel_tol=3e-2)


@pytest.mark.gpu
def test_engine_gemv_and_pdl_switches_give_the_same_tokens(eng, small_model, seed):
    """fp32 at GPT-2 small's shape: the engine on its core, and on the tuned path with the GEMV and PDL (the
    default on sm_90+), without PDL, and with the a06 matmul for decode (decode_gemv=False) all generate
    transformers' 32 greedy tokens, decode steps replayed from CUDA graphs."""
    prompt = _prompts([29], SMALL["vocab_size"], seed)
    want = hf_generate(small_model, prompt[0], 32, device="cuda")
    for kw in ({"tuned": False}, {"tuned": True}, {"tuned": True, "pdl": False},
               {"tuned": True, "decode_gemv": False, "pdl": False}):
        engine = eng.GPT2Engine.from_hf(small_model, dtype=torch.float32, max_batch=1, max_seq_len=128, **kw)
        got = engine.generate(prompt, 32).tolist()[0]
        assert got == want, (f"engine {kw or 'default'} (pdl={engine.pdl}): first difference at new token "
                             f"{next(j for j in range(32) if got[j] != want[j])}")


@pytest.mark.gpu
def test_bad_token_ids_on_the_gpu_keep_the_cuda_context(eng, tiny_model, seed):
    """On the GPU: ids on the host or on the device, out of range (the id vocab_size, a negative one) or
    floats, are refused with a clear error; prompts on the CPU are moved; every later generate() works."""
    engine = eng.GPT2Engine.from_hf(tiny_model, dtype=torch.float32, device="cuda", max_batch=2, max_seq_len=16)
    good = _prompts([3, 5], TINY["vocab_size"], seed)
    first = engine.generate(good, 3).tolist()
    for prompts, err, msg in BAD_IDS + [(torch.tensor([[1, 2, 257]], device="cuda"), ValueError, "token id 257"),
                                        (torch.tensor([[1, -5]], device="cuda"), ValueError, "token id -5"),
                                        (torch.rand(1, 4, device="cuda"), TypeError, "integers")]:
        with pytest.raises(err, match=msg):
            engine.generate(prompts, 3)
        assert engine.generate(good, 3).tolist() == first, f"generate() after refusing {prompts!r} gave other tokens"
    on_cpu = torch.tensor([good[0]])
    assert engine.generate(on_cpu, 3).tolist()[0] == first[0], "a prompt tensor on the CPU is moved to the GPU"
    torch.cuda.synchronize()


# Every test of the engine (those taking ``eng``, and the decode-work check) names the a08 kernel that broke it.
_ENGINE_BY_IMPL = ("test_decode_step_work_does_not_grow_with_the_context",)     # takes impl, runs the engine
for _name, _test in list(globals().items()):
    if _name.startswith("test_") and callable(_test) and (
            "eng" in inspect.signature(_test).parameters or _name in _ENGINE_BY_IMPL):
        globals()[_name] = names_the_failing_part(_test)
del _name, _test
