"""Stage 9: a modern decoder (Llama 3, Qwen 3) on the course's kernels: RMSNorm, rotary embeddings,
grouped-query attention, SwiGLU, against float64 references and Hugging Face transformers.

On a CPU the kernels run under the Triton interpreter at small sizes; on a GPU also the real models'
shapes, long contexts and CUDA-graph replay.
"""
from __future__ import annotations

import pytest
import torch

from common import DEVICE, HAS_CUDA
from common import reference
from common.kernel_check import DECODE_ATTENTION, assert_is_kernel, watch
from common.testing import assert_close, assert_fresh_each_call, non_contiguous, randn

#: A kernel fed an unwritten buffer computes on garbage: the interpreter's numpy then warns of overflows.
pytestmark = pytest.mark.filterwarnings(
    "ignore:(overflow|invalid value|divide by zero) encountered:RuntimeWarning")


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
    got = assert_is_kernel(lambda: gqa.gqa_prefill_attention(q, k, v, allow_tf32=False), DECODE_ATTENTION,
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
