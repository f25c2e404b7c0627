"""Stage 9: a modern decoder (Llama 3, Qwen 3) on the course's kernels, against Hugging Face transformers'
LlamaForCausalLM and Qwen3ForCausalLM.

The engine (LlamaEngine, built on stage 8's GPT2Engine) is compared with transformers: greedy tokens
identical to ``generate(do_sample=False)`` in fp32 (Llama with GQA groups 1, 4 and 8, head dims 64 and 128,
Llama 3's RoPE scaling, tied and untied embeddings; Qwen 3 with its q/k norm; right-padded ragged batches),
logits against the model in float64 (bf16: within a few times transformers' own bf16 error), and sampling,
EOS, streaming and bad input through stage 8's request loop. On a CPU everything runs under the Triton
interpreter on tiny models (hidden 64-128, vocabulary 300); on a GPU also at larger sizes.

Models have random weights (nothing is downloaded): matrices N(0, 0.3²) and RMSNorm weights 1 + N(0, 0.2²)
(common.course.stages.random_llama), so greedy generation wanders through the vocabulary.
"""
from __future__ import annotations

import pytest
import torch

from common import DEVICE, HAS_CUDA
from common.kernel_check import ENGINE, called, host_syncs, watch
from common.testing import rel_error

#: A kernel fed an unwritten buffer computes on garbage: the interpreter's numpy then warns of overflows and
#: invalid values, which say nothing the test's own message does not.
pytestmark = pytest.mark.filterwarnings(
    "ignore:(overflow|invalid value|divide by zero) encountered:RuntimeWarning")


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
