"""Stage 9, a modern decoder (Llama 3, Qwen 3): the engine against transformers; one decode step timed.

The engine runs on stage 8's family (GPT2Engine's request loop, the a08 GEMV, write_kv and sampler), the
a06 matmul and the a07 flash attention, with this stage's RMSNorm, RoPE, SwiGLU and GQA decode attention.
"""
from __future__ import annotations

import os

import torch

from common import DEVICE, HAS_CUDA
from common import reference as ref
from common.kernel_check import (ACT_KERNELS, ATEN_KERNELS, ATTENTION_FUNCTIONS, ATTN_KERNELS, BLAS_KERNELS,
                                 COPY_KERNELS, NORM_KERNELS, TORCH_ARITH, TORCH_ATTENTION, TORCH_GEMM, TORCH_NORM,
                                 TORCH_SOFTMAX, Forbidden, input_copies)
from common.testing import REL_TOL
from common.course.stages.base import (Load, Perf, Run, Stage, Trial, _call, _dtype_of_draw, _gen, _no_copies,
                                       _randn, _with_repeat)

from ..a08_gpt2_inference.stage import (ENGINE, _decode_work_judge, _greedy_prompts, _hf_static_step, _nan,
                                        _prompts, a08_dependencies)

# ----------------------------------------------------------------------------- what the graded calls may not call
#: ENGINE (stage 8's table, imported above): a decode step (and prefill) runs the course's kernels for the work,
#: no PyTorch matmul, attention, norm, softmax or GELU (the embedding gather, lengths + 1 and copies are allowed).
#: The three kernels of a09 (rmsnorm.py, rope.py, swiglu.py): the work belongs to the kernel. Slice assignment
#: (``qkv[..., :d] = rotated``: a view, then aten.copy_) counts as PyTorch doing RoPE's writes.
RMSNORM_KERNEL = Forbidden(TORCH_ARITH + TORCH_NORM + ("aten.rms_norm", "aten._fused_rms_norm*"),
                           ATEN_KERNELS + NORM_KERNELS + ("rms_norm",))
ROPE_KERNEL = Forbidden(TORCH_ARITH + TORCH_NORM + ("aten.cos", "aten.sin", "aten.neg", "aten.cat", "aten.copy",
                                                    "aten.index_put", "aten.slice_scatter"), ATEN_KERNELS)
SWIGLU_KERNEL = Forbidden(TORCH_ARITH + ("aten.silu", "aten.glu", "aten.sigmoid"), ATEN_KERNELS + ("silu", "glu"))

#: a09's grouped-query attention, decode and prefill: as a08's decode attention. The prefill's one copy (q
#: rearranged to [B·Hkv, G, T, d] where its layout allows no view) is allowed: no copy op is in the list, and
#: its kernel (PyTorch's direct_copy_kernel, an elementwise_kernel) is exempt on a GPU.
GQA_ATTENTION = Forbidden(TORCH_ARITH + TORCH_GEMM + TORCH_ATTENTION + TORCH_SOFTMAX,
                          ATEN_KERNELS + BLAS_KERNELS + ATTN_KERNELS + ACT_KERNELS, ATTENTION_FUNCTIONS,
                          allow=COPY_KERNELS)

#: On a CPU: two layers of width 64, a GQA group of 2 or 4, heads of 32 (the grader's engine trials).
A09_TINY = dict(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                max_position_embeddings=64)
LLAMA3_SCALING = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=16)


def random_llama(seed: int, arch: str = "llama", *, std: float | None = 0.3, norm_std: float = 0.2,
                 device: str | torch.device = "cpu", **cfg):
    """A transformers ``LlamaForCausalLM`` (arch "llama") or ``Qwen3ForCausalLM`` ("qwen3") with random weights
    (nothing downloaded), in eval mode, fp32 on the CPU. ``cfg``: the config's fields (``rope_scaling`` for Llama
    3's: LLAMA3_SCALING; ``rope_theta``; ``tie_word_embeddings``). Every matrix is N(0, std²) (larger than
    the models' 0.02: greedy generation then wanders through the vocabulary instead of repeating one token),
    every RMSNorm weight (q_norm and k_norm too) 1 + N(0, norm_std²). No end-of-sequence id: ``generate``
    makes exactly max_new_tokens, as the engine does without eos_token_id. ``std=None``: transformers' own
    initialisation (N(0, initializer_range²), norms at one), built on ``device`` (the GPU's timed case)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen3": (Qwen3Config, Qwen3ForCausalLM)}[arch]
    cfg = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None, **cfg}
    scaling = cfg.pop("rope_scaling", None)
    theta = cfg.pop("rope_theta", 10000.0)
    config = config_cls(**cfg)
    params = {"rope_type": "default", **(scaling or {}), "rope_theta": theta}
    if getattr(config, "rope_parameters", None) is not None:       # transformers 5
        config.rope_parameters = params
    else:                                                          # older ones
        config.rope_theta, config.rope_scaling = theta, scaling
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = model_cls(config).eval()
    if std is None:
        model.generation_config.eos_token_id = None
        return model
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1 + norm_std * torch.randn(p.shape, generator=g))
            elif not (name == "lm_head.weight" and model.config.tie_word_embeddings):
                p.copy_(std * torch.randn(p.shape, generator=g))
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def _tiny(seed: int, arch: str, kv_heads: int, **extra):
    return random_llama(seed, arch, **A09_TINY, num_key_value_heads=kv_heads, head_dim=32, **extra)


def a09_dependencies(load: Load) -> str | None:
    """Stage 9's engine runs on the a06 matmul, the a07 flash attention and stage 8's GEMV and KV-cache write of
    the same tree: say which are not done yet and how to borrow the reference ones; None when all compute."""
    needs = a08_dependencies(load)
    missing = [] if needs is None else [k for k in ("a06", "a07") if f"your {k}" in needs]
    g = torch.Generator().manual_seed(0)
    try:
        gv = load("a08_gpt2_inference.gemv")
        out = gv.gemv(torch.randn(2, 8, generator=g).to(DEVICE), torch.randn(8, 5, generator=g).to(DEVICE))
        kv = load("a08_gpt2_inference.kv_cache")
        cache = torch.full((2, 1, 4, 8), float("nan"), device=DEVICE)
        v_cache = cache.clone()
        kv.write_kv(torch.randn(2, 1, 24, generator=g).to(DEVICE), cache, v_cache,
                    torch.zeros(2, dtype=torch.int32, device=DEVICE))
        if bool(torch.isnan(out).any()) or bool(torch.isnan(cache[:, :, 0]).any()):
            raise NotImplementedError
    except NotImplementedError:
        missing.append("a08")
    except Exception:  # noqa: BLE001 - a bug there shows in that stage's own tests
        pass
    if not missing:
        return None
    stages = ",".join(missing)
    how = (f"`make check STAGE=a09 BORROW={stages}` (and `make grade STAGE=a09 BORROW={stages}`)"
           if os.environ.get("COURSE_VIA_MAKE") == "1" else f"`--borrow {stages}` (pytest, and python -m common.course.grade)")
    what = {"a06": "a06 matmul", "a07": "a07 flash attention", "a08": "a08 gemv and write_kv"}
    names = [what[k] for k in missing]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return (f"stage 9 runs on your {listed}, not implemented yet: finish {'it' if len(names) == 1 else 'them'}, "
            f"or try stage 9 on the reference {'one' if len(names) == 1 else 'ones'} with {how}")


def _new_engine(r: Run, seed: int, arch: str, kv_heads: int, b: int, extra: dict):
    needs = a09_dependencies(r.load)
    if needs:
        raise NotImplementedError(needs)
    eng = r.load("a09_llama_inference.engine")
    engine = eng.LlamaEngine.from_hf(_tiny(seed, arch, kv_heads, **extra), dtype=torch.float32, max_batch=b + 1,
                                     max_seq_len=32, tuned=False)
    engine.cache.k.fill_(float("nan"))             # a slot read before it is written shows
    engine.cache.v.fill_(float("nan"))
    return engine


#: Configs from_hf must refuse with a ValueError (the engine would compute something else): (what, arch, config)
UNSUPPORTED = (("attention_bias", "llama", dict(attention_bias=True)), ("mlp_bias", "llama", dict(mlp_bias=True)),
               ("hidden_act='gelu'", "llama", dict(hidden_act="gelu")),
               ("rope_type='linear'", "llama", dict(rope_scaling={"rope_type": "linear", "factor": 2.0})),
               ("head_dim=512", "llama", dict(head_dim=512)),
               ("a sliding window", "qwen3", dict(use_sliding_window=True, sliding_window=8, max_window_layers=0)))


@_call
def a09_engine_refuses(r: Run):
    """For each UNSUPPORTED config: 1 if LlamaEngine.from_hf raised a ValueError, else 0."""
    eng = r.load("a09_llama_inference.engine")
    got = []
    for _, arch, cfg in UNSUPPORTED:
        model = random_llama(0, arch, **{**A09_TINY, "num_key_value_heads": 2, "head_dim": 32, **cfg})
        try:
            eng.LlamaEngine.from_hf(model, dtype=torch.float32, max_batch=1, max_seq_len=16)
            got.append(0)
        except ValueError:
            got.append(1)
    return torch.tensor(got)


@_call
def a09_engine_decode(r: Run, seed: int, arch: str, kv_heads: int, extra: dict, prompts: list, follow: list,
                      steps: int):
    """Prefill + teacher-forced decode steps; every step's logits (cloned: a step may reuse its buffers)."""
    engine = _new_engine(r, seed, arch, kv_heads, len(prompts), extra)
    ids, lens = engine.pad(prompts)
    out = [engine.prefill(ids, lens).clone()]
    for j in range(steps):
        out.append(engine.decode_step(torch.tensor([f[j] for f in follow], device=engine.device)).clone())
    return tuple(o[i] for o in out for i in range(len(prompts)))


@_call
def a09_engine_generate(r: Run, seed: int, arch: str, kv_heads: int, extra: dict, prompts: list, new: int):
    """Greedy generation, eager steps."""
    return _new_engine(r, seed, arch, kv_heads, len(prompts), extra).generate(prompts, new, cuda_graph=False).cpu()


@_call
def a09_decode_work(r: Run, seed: int, arch: str, kv_heads: int, extra: dict, prompts: list, follow: list):
    """A decode step's work must not grow with the context: every GEMM through linear() has B rows and no
    prefill attention runs; no host sync (facts for the judge, as stage 8's a08_decode_work)."""
    eng = r.load("a09_llama_inference.engine")
    engine = _new_engine(r, seed, arch, kv_heads, len(prompts), extra)
    ids, lens = engine.pad(prompts)
    engine.prefill(ids, lens)
    rows, prefill_attention = [], [0]
    linear, attention = engine.linear, eng.gqa_prefill_attention

    def seen_linear(x, *a, **kw):
        rows.append(x.numel() // max(x.shape[-1], 1))
        return linear(x, *a, **kw)

    def seen_attention(*a, **kw):
        prefill_attention[0] += 1
        return attention(*a, **kw)
    from common.kernel_check import host_syncs
    engine.linear, eng.gqa_prefill_attention = seen_linear, seen_attention
    try:
        logits = []
        with host_syncs() as syncs:
            for f in follow:
                logits += list(engine.decode_step(torch.tensor(f, device=engine.device)).clone())
    finally:
        eng.gqa_prefill_attention = attention
        del engine.linear
    r.fact("gemm_rows", sorted(set(rows)))
    r.fact("prefill_attention_calls", prefill_attention[0])
    r.fact("host_syncs", sorted(set(syncs))[:5])
    return tuple(logits)


def _engine_trials(g, rng) -> list[Trial]:
    import copy
    vocab = A09_TINY["vocab_size"]
    forbid = dict(forbid=ENGINE)
    trials = []

    def model64(seed, arch, kv_heads, extra):
        return copy.deepcopy(_tiny(seed, arch, kv_heads, **extra)).to(torch.float64)

    def teacher_forced(m64, prompts, follow, steps):
        with torch.no_grad():
            full = [m64(torch.tensor([p + f])).logits[0, len(p) - 1:len(p) + steps] for p, f in zip(prompts, follow)]
        return tuple(full[i][j] for j in range(steps + 1) for i in range(len(prompts)))

    # (a) Llama 3 (its RoPE scaling, untied LM head, a GQA group of 2 or 4): prefill + teacher-forced decode
    # steps of a right-padded batch, every step's logits against the model in float64.
    seed, kv = rng.randrange(2**31), rng.choice([1, 2])
    extra = dict(rope_scaling=LLAMA3_SCALING, rope_theta=500000.0, tie_word_embeddings=False)
    m64 = model64(seed, "llama", kv, extra)
    steps = 3
    lengths = [rng.randint(1, 3), rng.randint(4, 9), rng.randint(10, 16)][:rng.randint(2, 3)]
    rng.shuffle(lengths)
    prompts, follow = _prompts(g, lengths, vocab), _prompts(g, [steps] * len(lengths), vocab)
    args = dict(seed=seed, arch="llama", kv_heads=kv, extra=extra)
    trials.append(Trial(f"LlamaEngine fp32 (Llama 3, {4 // kv} query heads per KV head): prefill + {steps} decode "
                        f"steps, prompt lengths {lengths}, logits vs transformers in float64", "a09_engine_decode",
                        dict(args, prompts=prompts, follow=follow, steps=steps),
                        teacher_forced(m64, prompts, follow, steps), REL_TOL[torch.float32], **forbid))

    # (b) Qwen 3 (q/k norm, tied embeddings): greedy tokens vs transformers' generate (float64) per prompt
    # (near-tie prompts redrawn: a08's _greedy_prompts)
    seed, kv = rng.randrange(2**31), rng.choice([1, 2])
    extra = dict(tie_word_embeddings=True)
    m64 = model64(seed, "qwen3", kv, extra)
    new = 4
    lengths, prompts, want = _greedy_prompts(m64, g, rng, vocab, new)
    trials.append(Trial(f"LlamaEngine fp32 (Qwen 3, {4 // kv} query heads per KV head): generate({new}) of prompts "
                        f"of lengths {lengths}, greedy tokens vs transformers' generate", "a09_engine_generate",
                        dict(seed=seed, arch="qwen3", kv_heads=kv, extra=extra, prompts=prompts, new=new),
                        torch.tensor(want), 0, exact=True, **forbid))

    # (c) the work of a decode step: B-row GEMMs after prompts of 12-20 tokens, never the whole context
    seed, kv = rng.randrange(2**31), 2
    extra = {}
    m64 = model64(seed, "llama", kv, extra)
    lengths = [rng.randint(12, 20), rng.randint(12, 20)]
    prompts, follow = _prompts(g, lengths, vocab), _prompts(g, [2] * 2, vocab)
    full = teacher_forced(m64, prompts, follow, 2)
    trials.append(Trial(f"LlamaEngine fp32: the work of decode_step after prompts of {lengths} tokens (GEMMs of "
                        "B rows, no prefill attention, no host sync)", "a09_decode_work",
                        dict(seed=seed, arch="llama", kv_heads=kv, extra=extra, prompts=prompts,
                             follow=[[f[j] for f in follow] for j in range(2)]), full[2:],
                        REL_TOL[torch.float32], judge=_decode_work_judge(len(prompts)), **forbid))

    # (d) configs the engine does not compute: from_hf refuses each with a ValueError (1 = refused)
    trials.append(Trial(f"LlamaEngine.from_hf refuses {', '.join(w for w, _, _ in UNSUPPORTED)} (1 = ValueError)",
                        "a09_engine_refuses", {}, torch.ones(len(UNSUPPORTED), dtype=torch.long), 0, exact=True))
    return trials


# ----------------------------------------------------------------------------- the kernels' trials
# The judge never imports the submission: the RoPE table (cos, sin) is computed here with transformers'
# formula (rope.rope_cache's) and handed to the call as an input, like every other tensor.

#: bf16 RMSNorm and SwiGLU against transformers' own bf16 output: relative error (common.testing.rel_error) at most
#: this. One rounding flipped in ~1% of the elements is ~5e-4; a rounding skipped or moved is ~2.5e-3.
ROUND_TOL = 1.2e-3


def _f64(t):
    return t.detach().to("cpu", torch.float64)


def _rms64(x64, w, eps, dtype):
    """float64 RMSNorm over the last dim, rounded where transformers' LlamaRMSNorm rounds (the normalised row to
    ``dtype`` before the weight multiplies)."""
    n = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    return n.to(dtype).to(torch.float64) * _f64(w)


@_call
def a09_add_rmsnorm(r: Run, x, res, w, eps: float, yo, ho):
    return r.load("a09_llama_inference.rmsnorm").add_rmsnorm(x, res, w, eps, out=yo, h_out=ho)


@_call
def a09_rmsnorm_view(r: Run, big, w, eps: float, n: int):
    return r.load("a09_llama_inference.rmsnorm").rmsnorm(big[::2, 1:n + 1], w, eps)


@_call
def a09_apply_rope(r: Run, buf, cos, sin, start, n_head: int, n_kv_head: int, width: int, q_norm, k_norm,
                   eps: float):
    r.load("a09_llama_inference.rope").apply_rope(buf[..., :width], cos, sin, start, n_head, n_kv_head,
                                                  q_norm=q_norm, k_norm=k_norm, eps=eps)
    return buf[..., :width]


@_call
def a09_swiglu(r: Run, big, f: int, out):
    return r.load("a09_llama_inference.swiglu").swiglu(big[:, 3:3 + 2 * f], out=out)


def _rope_table(d: int, theta: float, max_pos: int):
    """(cos, sin) fp32 [max_pos, d/2] as transformers computes them (rope.rope_cache's formula), on the kernel device."""
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).to(dtype=torch.float) / d))
    freqs = torch.arange(max_pos).float()[:, None] * inv
    return freqs.cos().to(DEVICE), freqs.sin().to(DEVICE)


def _rope64(buf, width, cos, sin, start, n_head, n_kv, qn, kn, eps):
    """float64 apply_rope on a copy of ``buf`` [B, T, width + pad] (qkv is its first ``width`` columns): q and k
    heads (optionally RMSNormed, rounded as Qwen3RMSNorm rounds) rotated at start[b] + t with the fp32 table; v
    and the padding as they were."""
    dtype = buf.dtype
    x = _f64(buf).clone()
    b, t, _ = x.shape
    d = 2 * cos.shape[1]
    nh = n_head + n_kv
    heads = x[..., :nh * d].reshape(b, t, nh, d)
    for lo, hi, w in ((0, n_head, qn), (n_head, nh, kn)):
        if w is not None:
            h = heads[:, :, lo:hi]
            heads[:, :, lo:hi] = _rms64(h, w, eps, dtype).to(dtype).to(torch.float64)
    pos = _f64(start).long()[:, None] + torch.arange(t)
    c, s = _f64(cos)[pos][:, :, None], _f64(sin)[pos][:, :, None]
    x1, x2 = heads[..., :d // 2], heads[..., d // 2:]
    x[..., :nh * d] = torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1).reshape(b, t, -1)
    return x


def _kernel_trials(g, rng) -> list[Trial]:
    """RMSNorm (with the residual, and of a strided view with an fp32 weight), RoPE (GQA groups, ragged starts, odd
    head dims, Qwen 3's q/k norm or none, qkv a strided view of a wider buffer) and SwiGLU (F odd, rows of a
    wider buffer): each draw in the dtype of its turn (fp32, bf16, fp16), the first draw's shapes again at the end."""
    big_n = 8000 if HAS_CUDA else 1600

    def build(r, g, i):
        dtype = _dtype_of_draw(i)
        trials = []
        n = 2 * r.randint(1, big_n // 2) + 1                       # odd: never fills a power-of-2 block
        lead = tuple(r.randint(1, 5) for _ in range(r.randint(1, 2)))
        x = _randn(g, *lead, n, dtype=dtype, scale=3.0)
        res = (_randn(g, *lead, n) + 2.0).to(dtype)
        w = (_randn(g, n) * 0.5 + 1.0).to(dtype)
        eps = r.choice([1e-6, 1e-5])
        h64 = _f64(x) + _f64(res)
        trials.append(Trial(f"add_rmsnorm {(*lead, n)} eps={eps} {dtype}", "a09_add_rmsnorm",
                            dict(x=x, res=res, w=w, eps=eps, yo=_nan(x.shape, dtype), ho=_nan(x.shape, dtype)),
                            (h64, _rms64(h64.to(dtype).to(torch.float64), w, eps, dtype)), REL_TOL[dtype],
                            forbid=RMSNORM_KERNEL, inplace=("yo", "ho"), dtypes=(dtype, dtype)))
        if dtype == torch.bfloat16:
            # rounds where transformers rounds (the residual stream, then the normalised row, then the product):
            # against transformers' own bf16 arithmetic, a kernel one rounding off in ~1% of the elements stays
            # near 5e-4; one that rounds elsewhere (the weight before the rounding, h unrounded) is ~2.5e-3 off.
            # Rows of at least 257: one flipped rounding in a short row would weigh more than 1%
            n_r = 2 * r.randint(128, big_n // 2) + 1
            x_r = _randn(g, 2, n_r, dtype=dtype, scale=3.0)
            res_r, w_r = (_randn(g, 2, n_r) + 2.0).to(dtype), (_randn(g, n_r) * 0.5 + 1.0).to(dtype)
            h16 = (x_r.cpu() + res_r.cpu()).float()
            n16 = (h16 * torch.rsqrt(h16.pow(2).mean(-1, keepdim=True) + eps)).to(dtype)
            trials.append(Trial(f"add_rmsnorm (2, {n_r}) eps={eps} {dtype}, rounded as transformers rounds",
                                "a09_add_rmsnorm", dict(x=x_r, res=res_r, w=w_r, eps=eps, yo=_nan(x_r.shape, dtype),
                                                        ho=_nan(x_r.shape, dtype)),
                                (h16.to(dtype), w_r.cpu() * n16), ROUND_TOL, forbid=RMSNORM_KERNEL,
                                inplace=("yo", "ho"), dtypes=(dtype, dtype)))
        rows, n2 = r.randint(1, 9), 2 * r.randint(1, 300) + 1
        big = _randn(g, 2 * rows, 2 * n2, dtype=dtype, scale=r.choice([1e-2, 1.0]))
        w32 = _randn(g, n2) * 0.5 + 1.0
        trials.append(Trial(f"rmsnorm of a strided [{rows}, {n2}] view, fp32 weight, {dtype}", "a09_rmsnorm_view",
                            dict(big=big, w=w32, eps=eps, n=n2), _rms64(_f64(big[::2, 1:n2 + 1]), w32, eps, dtype),
                            REL_TOL[dtype], forbid=RMSNORM_KERNEL, dtypes=(dtype,)))
        b, t = r.randint(1, 3), r.choice([1, 1, r.randint(2, 6)])
        n_kv, group = r.randint(1, 3), r.choice([1, 2, 4])
        n_head, d = n_kv * group, 80 if i == 0 else r.choice([32, 64, 80, 128])   # 80: a padded half (40 of 64)
        max_pos = 64
        starts = [r.randint(0, max_pos - t) for _ in range(b)]
        starts[r.randrange(b)] = r.randint(1, max_pos - t)        # a position past 0 (at 0 the rotation is none)
        start = torch.tensor(starts, dtype=torch.int32, device=DEVICE)
        cos, sin = _rope_table(d, r.choice([10000.0, 500000.0]), max_pos)
        width, pad = (n_head + 2 * n_kv) * d, r.randint(1, 40)
        buf = _randn(g, b, t, width + pad, dtype=dtype, scale=2.0)
        norm = r.random() < 0.5
        qn = (_randn(g, d) * 0.5 + 1.0).to(dtype) if norm else None
        kn = (_randn(g, d) * 0.5 + 1.0).to(dtype) if norm else None
        want = _rope64(buf, width, cos, sin, start, n_head, n_kv, qn, kn, 1e-6)[..., :width]   # q, k rotated; v kept
        trials.append(Trial(f"apply_rope B={b} T={t} H={n_head} KV={n_kv} d={d} start={starts} "
                            f"q/k norm={norm} {dtype}", "a09_apply_rope",
                            dict(buf=buf, cos=cos, sin=sin, start=start, n_head=n_head, n_kv_head=n_kv, width=width,
                                 q_norm=qn, k_norm=kn, eps=1e-6),
                            want, REL_TOL[dtype] if not norm else 2 * REL_TOL[dtype], forbid=ROPE_KERNEL,
                            inplace=("buf",), dtypes=(dtype,)))
        f, rows = 2 * r.randint(1, big_n // 2) + 1, r.randint(1, 6)
        gbig = _randn(g, rows, 2 * f + 7, dtype=dtype, scale=3.0)
        gu = _f64(gbig[:, 3:3 + 2 * f])
        gate, up = gu[:, :f], gu[:, f:]
        want = (gate * torch.sigmoid(gate)).to(dtype).to(torch.float64) * up
        trials.append(Trial(f"swiglu [{rows}, 2·{f}] rows of a wider buffer {dtype}", "a09_swiglu",
                            dict(big=gbig, f=f, out=_nan((rows, f), dtype)), want, REL_TOL[dtype],
                            forbid=SWIGLU_KERNEL, inplace=("out",), dtypes=(dtype,)))
        if dtype == torch.bfloat16:
            # silu(gate) rounded before the product, as transformers' act_fn(gate) * up: against its own bf16
            # arithmetic (ROUND_TOL, as the RMSNorm's); rows of at least 257 features
            f_r = 2 * r.randint(128, big_n // 2) + 1
            gbig_r = _randn(g, 2, 2 * f_r + 7, dtype=dtype, scale=3.0)
            gu16 = gbig_r[:, 3:3 + 2 * f_r].cpu()
            want16 = torch.nn.functional.silu(gu16[:, :f_r]) * gu16[:, f_r:]
            trials.append(Trial(f"swiglu [2, 2·{f_r}] {dtype}, rounded as transformers rounds", "a09_swiglu",
                                dict(big=gbig_r, f=f_r, out=_nan((2, f_r), dtype)), want16, ROUND_TOL,
                                forbid=SWIGLU_KERNEL, inplace=("out",), dtypes=(dtype,)))
        return trials

    return _with_repeat(rng, g, build, 3)


# ----------------------------------------------------------------------------- grouped-query attention's trials
def _repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    """transformers' repeat_kv: query head h reads KV head h // G."""
    return x.repeat_interleave(group, dim=1)


# ----------------------------------------------------------------------------- trials
@_call
def a09_gqa_decode_attention(r: Run, qkv, k, v, lens, h: int, d: int, splits, out):
    dec = r.load("a09_llama_inference.decode_attention")
    return dec.gqa_decode_attention(qkv[:, :h * d].view(qkv.shape[0], h, d), k, v, lens, splits=splits, out=out)


def _gqa_decode_trial(g, rng, splits_forced: bool, dtype: torch.dtype, odd_head: bool = False,
                      long: bool = False) -> Trial:
    """``long``: a longest sequence past every power of two the kernel uses for a block or a split (512 keys on
    a CPU, 4096 on a GPU), so a length capped at one of them shows."""
    b, hkv = rng.randint(2, 4 if not HAS_CUDA else 8), rng.randint(1, 3 if not HAS_CUDA else 8)
    group = rng.choice([1, 2, 3, 4, 8])
    d = rng.choice([24, 40, 80, 96] if odd_head else [16, 32, 64, 128])   # odd: padded to a power of two, masked
    s_max = rng.randint(2, 120 if not HAS_CUDA else 2000)
    if long:
        b, hkv, group, d = 2, 1, 2, 16
        s_max = rng.randint(513, 700) if not HAS_CUDA else rng.randint(4097, 5000)
    h = hkv * group
    lengths = [1, s_max] + [rng.randint(1, s_max) for _ in range(b - 2)]    # the extremes, then any
    rng.shuffle(lengths)
    qkv = _randn(g, b, (h + 2 * hkv) * d, dtype=dtype)         # q: a strided view, as the engine passes it
    k, v = _randn(g, b, hkv, s_max, d, dtype=dtype), _randn(g, b, hkv, s_max, d, dtype=dtype)
    for i, n in enumerate(lengths):                            # reading past a length poisons the output
        k[i, :, n:] = float("nan")
        v[i, :, n:] = float("nan")
    q = qkv[:, :h * d].view(b, h, d)
    expected = ref.decode_attention(q, _repeat_kv(k, group), _repeat_kv(v, group), lengths)
    splits = rng.randint(2, 5) if splits_forced else None
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    return Trial(f"gqa_decode_attention B={b} H={h} Hkv={hkv} d={d} S_max={s_max} lengths={lengths} splits={splits} "
                 f"{dtype}", "a09_gqa_decode_attention",
                 dict(qkv=qkv, k=k, v=v, lens=lens, h=h, d=d, splits=splits, out=_nan((b, h, d), dtype)),
                 expected, REL_TOL[dtype], forbid=GQA_ATTENTION, inplace=("out",), dtypes=(dtype,))


@_call
def a09_gqa_prefill_attention(r: Run, qkv, kc, vc, h: int, hkv: int, d: int, t_k: int):
    """q: a view of the prompt's fused projection [B, T, (H + 2·Hkv)·d], heads strided; k, v: the cache's first
    T_k slots. fp32: IEEE dots (allow_tf32=False), as the engine runs it. Reports the copies it made of K or V
    (a repeat_kv copy reads G times the cache's bytes; the contract reads them through strides)."""
    dec = r.load("a09_llama_inference.decode_attention")
    q = qkv[..., :h * d].unflatten(-1, (h, d)).transpose(1, 2)
    k, v = kc[:, :, :t_k], vc[:, :, :t_k]
    out, copies = input_copies(lambda: dec.gqa_prefill_attention(q, k, v, allow_tf32=False), k=k, v=v)
    r.fact("copies", copies)
    return out


def _gqa_prefill_trial(g, rng, dtype: torch.dtype) -> Trial:
    b, hkv, group = rng.randint(1, 3), rng.randint(1, 3), rng.choice([1, 2, 3, 4])
    d = rng.choice([16, 32, 64, 80])
    t = rng.randint(1, 40 if not HAS_CUDA else 300)
    t_k = t + rng.choice([0, 0, rng.randint(1, 20)])           # mostly the engine's T_k = T; a continued cache
    s_max = t_k + rng.randint(0, 8)
    h = hkv * group
    qkv = _randn(g, b, t, (h + 2 * hkv) * d, dtype=dtype)
    kc, vc = _randn(g, b, hkv, s_max, d, dtype=dtype), _randn(g, b, hkv, s_max, d, dtype=dtype)
    kc[:, :, t_k:] = float("nan")
    vc[:, :, t_k:] = float("nan")
    q = qkv[..., :h * d].unflatten(-1, (h, d)).transpose(1, 2)
    expected = ref.attention(q, _repeat_kv(kc[:, :, :t_k], group), _repeat_kv(vc[:, :, :t_k], group),
                             is_causal=True)[0]
    return Trial(f"gqa_prefill_attention B={b} H={h} Hkv={hkv} T={t} T_k={t_k} d={d} {dtype}",
                 "a09_gqa_prefill_attention", dict(qkv=qkv, kc=kc, vc=vc, h=h, hkv=hkv, d=d, t_k=t_k),
                 expected, REL_TOL[dtype], forbid=GQA_ATTENTION, dtypes=(dtype,), judge=_no_copies)


def _gqa_trials(rng) -> list[Trial]:
    """For stage.py's trials: three decode draws (fp32, bf16, fp16; the second with forced splits, the first
    again with new values), an odd head dim, a long sequence, and three prefill draws."""
    g = _gen(rng)
    return (_with_repeat(rng, g, lambda r, g, i: [_gqa_decode_trial(g, r, i == 1, _dtype_of_draw(i))], 3)
            + [_gqa_decode_trial(g, rng, False, _dtype_of_draw(0), odd_head=True),
               _gqa_decode_trial(g, rng, False, _dtype_of_draw(0), long=True)]
            + [_gqa_prefill_trial(g, rng, _dtype_of_draw(i)) for i in range(3)])


def _a09_trials(rng):
    """Each kernel on its own (a broken one loses its own trials), then the engine."""
    g = _gen(rng)
    return _kernel_trials(g, rng) + _gqa_trials(rng) + _engine_trials(g, rng)


# ----------------------------------------------------------------------------- the timed case (GPU)
#: Llama 3.2 1B's shape (16 layers, hidden 2048, 32 query and 8 KV heads of 64, SwiGLU 8192, vocab 128256, tied).
LLAMA_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, head_dim=64, max_position_embeddings=131072,
                rope_theta=500000.0, rope_scaling=dict(LLAMA3_SCALING, factor=32.0, original_max_position_embeddings=8192),
                tie_word_embeddings=True)
#: bf16 through 16 layers: two correct bf16 implementations differ by a few 1e-2 (as stage 8's A08_PERF_TOL).
A09_PERF_TOL = 6e-2


def llama_decode_bytes(cfg: dict, batch: int, ctx: int, itemsize: int) -> int:
    """Bytes one decode step must read: every weight once (per layer the fused q|k|v, o, gate|up and down
    matrices and two RMSNorm vectors; the LM head, the embedding itself when tied; the final norm; B embedding
    rows) and the KV cache: ctx positions of K and V of Hkv heads per layer per sequence."""
    c, f, v, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    h, hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    per_layer = c * (h + 2 * hkv) * d + h * d * c + 3 * c * f + 2 * c
    weights = n * per_layer + v * c * (1 if cfg.get("tie_word_embeddings", True) else 2) + c + batch * c
    return (weights + batch * ctx * 2 * n * hkv * d) * itemsize


def llama_decode_flops(cfg: dict, batch: int, ctx: int) -> float:
    """FLOPs of one decode step: 2 per weight per token in the GEMMs + attention, 2·2·ctx·H·d per layer."""
    c, f, v, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
    h, hkv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    gemm = n * (c * (h + 2 * hkv) * d + h * d * c + 3 * c * f) + v * c
    return 2 * batch * gemm + 4 * batch * n * ctx * h * d


def a09_decode_case(load, cfg: dict, *, batch: int = 1, ctx: int = 128, dtype=torch.bfloat16,
                    device: str = "cuda", tol: float = A09_PERF_TOL) -> Perf:
    """One decode step of a random-weight Llama of config ``cfg`` after ``ctx`` tokens: the engine against
    transformers' LlamaForCausalLM decoding one token with a static KV cache (as stage 8's a08_decode_case)."""
    eng = load("a09_llama_inference.engine")
    b = batch
    hf = random_llama(0, "llama", std=None, device=device, **cfg).to(device, dtype)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg["vocab_size"], (b, ctx), generator=g).to(device)
    tok0 = torch.randint(0, cfg["vocab_size"], (b,), generator=g).to(device)
    engine = eng.LlamaEngine.from_hf(hf, dtype=dtype, device=device, max_batch=b, max_seq_len=ctx + 8)
    engine.prefill(ids)
    context = torch.full((b,), ctx, dtype=torch.int32, device=device)

    def submission(inp):
        engine.cache.lengths[:b].copy_(context)         # back to ctx tokens: the step is idempotent
        return engine.decode_step(inp["tok"])

    def inputs(gen):
        return {"tok": torch.randint(0, cfg["vocab_size"], (b,), device=device, generator=gen)}

    hf_step = _hf_static_step(hf, ids, tok0, ctx)
    itemsize = torch.empty((), dtype=dtype).element_size()
    path = "the tuned path" if engine.tuned is not None else "the core: your kernels as written"
    return Perf(f"Llama decode step (hidden {cfg['hidden_size']}, {cfg['num_hidden_layers']} layers, "
                f"{cfg['num_attention_heads']}/{cfg['num_key_value_heads']} heads), batch {b}, context {ctx}, "
                f"{str(dtype).replace('torch.', '')}, {path}", inputs, submission, lambda i: hf_step(i["tok"]),
                "transformers LlamaForCausalLM, StaticCache", llama_decode_flops(cfg, b, ctx + 1),
                llama_decode_bytes(cfg, b, ctx + 1, itemsize), tol=tol)


def _a09_perf(load):
    return a09_decode_case(load, LLAMA_1B, batch=1, ctx=128)


STAGE = Stage("a09_llama_inference", "Llama / Qwen 3 inference: RMSNorm, RoPE, SwiGLU, GQA decode", _a09_trials,
              _a09_perf, perf_target=1.0, perf_tol=A09_PERF_TOL)
#: ``python -m common.course.bench KEY`` runs this module of solutions/
BENCHES = {"a09": "a09_llama_inference.bench"}


def results_runs() -> dict:
    """The GPU runs behind this stage's files in lectures/results/ (``make results STAGE=a09``)."""
    from lectures._tools.results import Run, _same
    run = "solutions/a09_llama_inference/run.sh"
    return {"a09": [Run(run, ("bench",), files=_same("a09_decode.md", "a09_decode.csv", "a09_decode.png")),
                    Run(run, ("gqa",), files=_same("a09_gqa_attention.md"))]}


def portability_launches(load, archs, full: bool):
    """The stage's Triton launches for ``python -m common.course.portability`` (portability.py)."""
    from .portability import launches
    yield from launches(load, archs, full)
