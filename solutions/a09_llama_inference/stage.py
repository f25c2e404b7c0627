"""Stage 9, a modern decoder (Llama 3, Qwen 3): the engine against transformers; one decode step timed.

The engine runs on stage 8's family (GPT2Engine's request loop, the a08 GEMV, write_kv and sampler), the
a06 matmul and the a07 flash attention, with this stage's RMSNorm, RoPE, SwiGLU and GQA decode attention.
"""
from __future__ import annotations

import os

import torch

from common import DEVICE
from common.kernel_check import ATEN_KERNELS, NORM_KERNELS, TORCH_ARITH, TORCH_NORM, Forbidden
from common.testing import REL_TOL
from common.course.stages.base import Load, Perf, Run, Stage, Trial, _call, _gen

from ..a08_gpt2_inference.stage import ENGINE, _decode_work_judge, _hf_static_step, _prompts, a08_dependencies

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

    # (b) Qwen 3 (q/k norm, tied embeddings): greedy tokens vs transformers' generate (float64) per prompt; a
    # step whose two best logits nearly tie could flip on rounding alone: such prompts are redrawn.
    seed, kv = rng.randrange(2**31), rng.choice([1, 2])
    extra = dict(tie_word_embeddings=True)
    m64 = model64(seed, "qwen3", kv, extra)
    new = 4
    for _ in range(20):
        lengths = [rng.randint(1, 4), rng.randint(5, 14)]
        rng.shuffle(lengths)
        prompts = _prompts(g, lengths, vocab)
        want, gap = [], float("inf")
        with torch.no_grad():
            for p in prompts:
                out = m64.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                   max_new_tokens=new, do_sample=False, output_logits=True, return_dict_in_generate=True)
                want.append(out.sequences[0, len(p):].tolist())
                for lg in out.logits:
                    top = lg[0].topk(2).values
                    gap = min(gap, ((top[0] - top[1]) / lg[0].abs().max()).item())
        if gap > 1e-4:
            break
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
    return trials


def _a09_trials(rng):
    g = _gen(rng)
    return _engine_trials(g, rng)


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
