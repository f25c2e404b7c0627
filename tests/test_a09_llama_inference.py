"""Stage 9: a modern decoder (Llama 3, Qwen 3) on the course's kernels, against Hugging Face transformers'
LlamaForCausalLM and Qwen3ForCausalLM.

Kernels against float64 references on fresh random inputs; the engine against transformers (logits in
float64, greedy tokens in fp32); the tuned path against the core path. On a CPU everything runs under the
Triton interpreter on tiny models; on a GPU also the real geometries (Llama-3.2-1B, Qwen3-0.6B widths).
Models have random weights (nothing is downloaded).
"""
from __future__ import annotations

import copy

import pytest
import torch

from common import DEVICE, HAS_CUDA
from common.kernel_check import GEMV_KERNEL, assert_is_kernel
from common.testing import REL_TOL, assert_close, randn, rel_error

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
    different lengths (B = 3): in fp32 as close as the core path (the fold stays off in fp32: the core's
    arithmetic), in bf16 at most twice the core path's error on the same steps."""
    hf = _tuned_model(arch)
    g = torch.Generator().manual_seed(seed)
    v = hf.config.vocab_size
    prompts = [torch.randint(0, v, (n,), generator=g).tolist() for n in (5, 9, 2)]
    follow = [torch.randint(0, v, (3,), generator=g).tolist() for _ in prompts]
    m64 = copy.deepcopy(hf).double()
    with torch.no_grad():
        want = [m64(torch.tensor([p + f])).logits[0, len(p):] for p, f in zip(prompts, follow)]
    errs = {}
    for name, kw in (("core", dict(tuned=False)), ("tuned", dict(tuned=True, fold_norm=True))):
        engine = tuned_engine.LlamaEngine.from_hf(hf, dtype=dtype, max_batch=3, max_seq_len=24, **kw)
        steps = _tuned_forced_logits(engine, prompts, follow)
        errs[name] = max(rel_error(steps[j][i], want[i][j]) for i in range(3) for j in range(3))
    bound = 2 * REL_TOL[torch.float32] if dtype == torch.float32 else 2 * errs["core"] + 2e-3
    assert errs["tuned"] <= bound, (f"{arch} {dtype}: the tuned path's decode logits are off transformers' float64 "
                                    f"by {errs['tuned']:.2e} (core path: {errs['core']:.2e}; allowed {bound:.1e})")


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
