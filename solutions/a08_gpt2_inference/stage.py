"""Stage 8, GPT-2 inference: decode attention, LayerNorm, KV writes, GEMV, the engine; one decode step timed."""
from __future__ import annotations

import os
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from common import DEVICE, HAS_CUDA
from common import reference as ref
from common.roofline import gpt2_decode_bytes, gpt2_decode_flops
from common.kernel_check import (ACT_KERNELS, ATEN_KERNELS, ATTENTION_FUNCTIONS, ATTN_KERNELS, BLAS_KERNELS,
                                 NORM_KERNELS, TORCH_ARITH, TORCH_ATTENTION, TORCH_GELU, TORCH_GEMM, TORCH_NORM,
                                 TORCH_SCATTER, TORCH_SOFTMAX, Forbidden, host_syncs)
from common.testing import REL_TOL, random_gpt2
from common.gpu import ARCHS, Arch
from common.course.portability import BF16, FP16, FP32, Launch, _dt, _next_pow2
from common.course.stages.base import (DTYPE_CYCLE, Load, Perf, Run, Stage, Trial, _call, _dtype_of_draw, _gen,
                                       _pick_dtype, _randn, _refilled, _twice, _with_repeat)


# ----------------------------------------------------------------------------- what the graded calls may not call
#: a08's kernels and the engine built on them.
DECODE_ATTENTION = Forbidden(TORCH_ARITH + TORCH_GEMM + TORCH_ATTENTION + TORCH_SOFTMAX,
                             ATEN_KERNELS + BLAS_KERNELS + ATTN_KERNELS + ACT_KERNELS, ATTENTION_FUNCTIONS)
LAYERNORM_KERNEL = Forbidden(TORCH_ARITH + TORCH_NORM, ATEN_KERNELS + NORM_KERNELS)
#: a08 kernel 4, the decode GEMV (bias and GELU epilogue included), as the a06 matmul. Its Triton kernel
#: must not be named like a vendor kernel ("gemv" is one of BLAS_KERNELS): gemv.py's is _matvec_kernel.
GEMV_KERNEL = Forbidden(TORCH_GEMM + TORCH_ARITH + TORCH_GELU, BLAS_KERNELS + ATEN_KERNELS + ACT_KERNELS)
WRITE_KV = Forbidden(TORCH_ARITH + TORCH_SCATTER + ("aten.copy",), ATEN_KERNELS)
#: a08's sampler (temperature, top-k, top-p and the draw): a kernel, not PyTorch's softmax, sort or top-k.
SAMPLER = Forbidden(TORCH_SOFTMAX + ("aten.sort", "aten.topk", "aten.kthvalue", "aten.cumsum", "aten.multinomial",
                                     "aten.argmax", "aten.max", "aten.div", "aten.where"), ATEN_KERNELS + ACT_KERNELS)
#: An engine step legitimately runs a few PyTorch kernels (the embedding gather, lengths + 1, the
#: argmax of generate, copies), so it is checked for the kernels of the work itself only.
ENGINE = Forbidden(TORCH_GEMM + TORCH_ATTENTION + TORCH_NORM + TORCH_GELU + TORCH_SOFTMAX,
                   BLAS_KERNELS + ATTN_KERNELS + NORM_KERNELS + ACT_KERNELS, ATTENTION_FUNCTIONS)


A08_TINY = dict(vocab_size=257, n_positions=64, n_embd=64, n_layer=2)


def _nan(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


@_call
def a08_decode_attention(r: Run, qkv, k, v, lens, h: int, d: int, splits, out):
    dec = r.load("a08_gpt2_inference.decode_attention")
    return dec.decode_attention(qkv[:, :h * d].view(qkv.shape[0], h, d), k, v, lens, splits=splits, out=out)


def _decode_attention_trial(g, rng, splits_forced: bool, dtype: torch.dtype, odd_head: bool = False,
                            long: bool = False) -> Trial:
    """``long``: a small-head config whose longest sequence is past every power of two the kernels use for
    a block or a split (512 keys on a CPU, 4096 on a GPU), so a length capped at one of them shows."""
    b, h = rng.randint(2, 4 if not HAS_CUDA else 8), rng.randint(1, 4 if not HAS_CUDA else 16)
    d = rng.choice([24, 40, 80] if odd_head else [16, 32, 64])   # odd: padded to a power of two, masked
    s_max = rng.randint(2, 120 if not HAS_CUDA else 2000)
    if long:
        b, h, d = 2, 1, 16
        s_max = rng.randint(513, 700) if not HAS_CUDA else rng.randint(4097, 5000)
    lengths = [1, s_max] + [rng.randint(1, s_max) for _ in range(b - 2)]    # the extremes, then any
    rng.shuffle(lengths)
    qkv = _randn(g, b, 3 * h * d, dtype=dtype)                 # q: a strided view, as the engine passes it
    k, v = _randn(g, b, h, s_max, d, dtype=dtype), _randn(g, b, h, s_max, d, dtype=dtype)
    for i, n in enumerate(lengths):                            # reading past a length poisons the output
        k[i, :, n:] = float("nan")
        v[i, :, n:] = float("nan")
    q = qkv[:, :h * d].view(b, h, d)
    expected = ref.decode_attention(q, k, v, lengths)
    splits = rng.randint(2, 5) if splits_forced else None
    lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    return Trial(f"decode_attention B={b} H={h} d={d} S_max={s_max} lengths={lengths} splits={splits} {dtype}",
                 "a08_decode_attention", dict(qkv=qkv, k=k, v=v, lens=lens, h=h, d=d, splits=splits,
                                              out=_nan((b, h, d), dtype)),
                 expected, REL_TOL[dtype], forbid=DECODE_ATTENTION, inplace=("out",), dtypes=(dtype,))


@_call
def a08_add_layernorm(r: Run, x, res, w, b, eps: float, yo, ho):
    return r.load("a08_gpt2_inference.layernorm").add_layernorm(x, res, w, b, eps, out=yo, h_out=ho)


@_call
def a08_layernorm_view(r: Run, big, w, b, eps: float, c2: int):
    return r.load("a08_gpt2_inference.layernorm").layernorm(big[::2, 1:c2 + 1], w, b, eps)


def _layernorm_trials(g, rng) -> list[Trial]:
    """With and without a residual, in every dtype (DTYPE_CYCLE): the add_layernorm trials, then the others
    (one group each in the grader's progress lines)."""
    pairs = [_layernorm_pair(g, rng, dtype) for dtype in DTYPE_CYCLE]
    return [p[0] for p in pairs] + [p[1] for p in pairs]


def _layernorm_pair(g, rng, dtype) -> list[Trial]:
    c = 2 * rng.randint(1, 800) + 1                            # odd: the row never fills a power-of-2 block
    lead = tuple(rng.randint(1, 6) for _ in range(rng.randint(1, 2)))
    x = _randn(g, *lead, c, dtype=dtype, scale=3.0)
    r = (_randn(g, *lead, c) + 2.0).to(dtype)                 # nonzero mean
    w, b = _randn(g, c) * 0.5 + 1.0, _randn(g, c) * 0.5
    eps = rng.choice([1e-5, 1e-3])
    h64 = ref._f64(x)[0] + ref._f64(r)[0]
    expected = (h64, ref.layer_norm(h64.to(dtype), w, b, eps))   # y normalises h as stored in x's dtype
    trials = [Trial(f"add_layernorm {(*lead, c)} eps={eps} {dtype}", "a08_add_layernorm",
                    dict(x=x, res=r, w=w, b=b, eps=eps, yo=_nan(x.shape, dtype), ho=_nan(x.shape, dtype)),
                    expected, REL_TOL[dtype], forbid=LAYERNORM_KERNEL, inplace=("yo", "ho"), dtypes=(dtype, dtype))]
    rows, c2 = rng.randint(1, 9), 2 * rng.randint(1, 300) + 1
    big = _randn(g, 2 * rows, 2 * c2, dtype=dtype, scale=rng.choice([1e-2, 1.0]))
    w2, b2 = _randn(g, c2) + 1.0, _randn(g, c2)
    xv = big[::2, 1:c2 + 1]                                    # strided rows, offset columns
    trials.append(Trial(f"layernorm (no residual) of a strided [{rows}, {c2}] view eps={eps} {dtype}",
                        "a08_layernorm_view", dict(big=big, w=w2, b=b2, eps=eps, c2=c2),
                        ref.layer_norm(xv, w2, b2, eps), REL_TOL[dtype], forbid=LAYERNORM_KERNEL, dtypes=(dtype,)))
    return trials


@_call
def a08_write_kv(r: Run, qkv, caches, st):
    r.load("a08_gpt2_inference.kv_cache").write_kv(qkv, caches[0], caches[1], st)
    return caches[0], caches[1]


def _write_kv_trial(g, rng, odd_head: bool = False) -> Trial:
    dtype = _pick_dtype(rng)
    b, h, d = rng.randint(1, 4), rng.randint(1, 4), rng.choice([24, 40, 80] if odd_head else [16, 32, 64])
    t, s_max = rng.randint(1, 6), rng.randint(8, 40)
    start = [rng.randint(0, s_max - t) for _ in range(b)]
    start[rng.randrange(b)] = s_max - 1                        # runs off the end: positions >= S_max stay
    qkv = _randn(g, b, t, 3 * h * d, dtype=dtype)
    sentinel = -4096.0                                         # exact in every dtype; slots never written keep it
    want = torch.full((2, b, h, s_max, d), sentinel, dtype=torch.float64)
    q5 = ref._f64(qkv)[0].view(b, t, 3, h, d)
    for i, s in enumerate(start):
        n = min(t, s_max - s)
        want[:, i, :, s:s + n] = q5[i, :n, 1:].permute(1, 2, 0, 3)
    caches = torch.full((2, b, h, s_max, d), sentinel, dtype=dtype, device=DEVICE)
    st = torch.tensor(start, dtype=torch.int32, device=DEVICE)
    return Trial(f"write_kv B={b} T={t} H={h} d={d} S_max={s_max} start={start} {dtype}", "a08_write_kv",
                 dict(qkv=qkv, caches=caches, st=st), (want[0], want[1]), 0.0, forbid=WRITE_KV, inplace=("caches",))


@_call
def a08_gemv(r: Run, x, w_store, transposed: bool, bias, activation, config, out):
    """The decode GEMV; W is ``w_store.t()`` (the LM head's K-contiguous view) when ``transposed``."""
    w = w_store.t() if transposed else w_store
    return r.load("a08_gpt2_inference.gemv").gemv(x, w, bias, activation, out=out, config=config)


@_call
def a08_gemv_twice(r: Run, x, w_store, transposed: bool, bias, activation, config, x2):
    gemv = r.load("a08_gpt2_inference.gemv").gemv
    w = w_store.t() if transposed else w_store
    return gemv(x, w, bias, activation, config=config), gemv(_refilled(x, x2), w, bias, activation, config=config)


def _gemv_expected(x, w, bias, activation):
    y = ref.matmul(x, w)
    if bias is not None:
        y = y + ref._f64(bias)[0]
    return ref.gelu_tanh(y) if activation == "gelu_tanh" else y


def _gemv_scale(x, w, bias):
    (x64, w64) = ref._f64(x, w)
    s = x64.abs() @ w64.abs()
    return s if bias is None else s + ref._f64(bias)[0].abs()


def _gemv_draw(g, rng, dtype):
    """One GEMV's inputs: 1-16 rows, odd K and N (up to a few hundred on a CPU, GPT-2 XL's widths on a GPU),
    either weight layout, bias or not, GELU or not; the host's config or a forced split-K one."""
    m = rng.choice([1, rng.randint(2, 4), rng.randint(5, 16)])
    top = 300 if not HAS_CUDA else 6400
    k, n = rng.randint(1, top), rng.randint(1, top)
    transposed = rng.random() < 0.5
    w_store = _randn(g, *((n, k) if transposed else (k, n)), dtype=dtype, scale=max(k, 1) ** -0.5)
    w = w_store.t() if transposed else w_store
    x = _randn(g, m, k, dtype=dtype)
    bias = _randn(g, n, dtype=dtype) if rng.random() < 0.7 else None
    activation = rng.choice([None, "gelu_tanh"])
    config = None
    if rng.random() < 0.5:                          # split K by force: 2-5 splits, small blocks
        config = (rng.choice([16, 32, 64]), rng.choice([16, 32]), rng.randint(2, 5), 4, 1)
    return m, k, n, transposed, w_store, w, x, bias, activation, config


def _gemv_trials(g, rng) -> list[Trial]:
    def build(r, g, i):
        dtype = _dtype_of_draw(i)
        m, k, n, transposed, w_store, w, x, bias, act, config = _gemv_draw(g, r, dtype)
        label = (f"gemv {m}x{k} @ {'(an [N, K] matrix)ᵀ' if transposed else 'W'} [{k}, {n}]"
                 f"{' + bias' if bias is not None else ''}{', GELU' if act else ''}, config {config} {dtype}")
        return [Trial(label, "a08_gemv", dict(x=x, w_store=w_store, transposed=transposed, bias=bias, activation=act,
                                              config=config, out=_nan((m, n), dtype)),
                      _gemv_expected(x, w, bias, act), 2 * REL_TOL[dtype], scale=_gemv_scale(x, w, bias),
                      forbid=GEMV_KERNEL, inplace=("out",), dtypes=(dtype,))]
    trials = _with_repeat(rng, g, build, 3)
    # twice on one input tensor, split-K (a ticket counter left non-zero by the first call fails the second)
    dtype = rng.choice(DTYPE_CYCLE)
    m, k, n, transposed, w_store, w, x, bias, act, _ = _gemv_draw(g, rng, dtype)
    x2 = _randn(g, m, k, dtype=dtype)
    config = (32, 16, rng.randint(2, 5), 4, 1)
    refs = (_gemv_expected(x, w, bias, act), _gemv_expected(x2, w, bias, act))
    trials.append(_twice(f"gemv {m}x{k} @ [{k}, {n}], split-K {config}, {dtype}", "a08_gemv_twice",
                         dict(x=x, w_store=w_store, transposed=transposed, bias=bias, activation=act, config=config,
                              x2=x2), refs, 2 * REL_TOL[dtype],
                         scale=(_gemv_scale(x, w, bias), _gemv_scale(x2, w, bias)), forbid=GEMV_KERNEL))
    return trials


def _tiny_gpt2(seed: int, n_head: int):
    """A transformers GPT-2 with random weights, biases and LayerNorms (as tests/test_a08's models):
    initializer range 0.3, so greedy generation wanders through the vocabulary."""
    return random_gpt2(seed, **A08_TINY, n_head=n_head, initializer_range=0.3)


def _prompts(g, lengths, vocab):
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def _greedy_prompts(m64, g, rng, vocab: int, new: int) -> tuple[list[int], list[list[int]], list[list[int]]]:
    """Two prompts (lengths 1-4 and 5-14, in random order) and transformers' greedy ``new`` tokens for each
    (m64: a float64 model, generate per prompt). A step whose two best logits nearly tie could flip on
    rounding alone: such prompts are redrawn (20 draws at most). Returns (lengths, prompts, tokens)."""
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
    return lengths, prompts, want


def a08_dependencies(load: Load) -> str | None:
    """Stage 8's engine runs on the a06 matmul and the a07 flash attention of the same tree: say so, and
    how to try stage 8 without them, when either is not done yet (raises NotImplementedError or leaves
    its output unwritten on a tiny input); None when both compute."""
    missing = []
    g = torch.Generator().manual_seed(0)
    checks = (("a06", "matmul", "a06_matmul.matmul_triton",
               lambda m: m.matmul(_randn(g, 3, 8), _randn(g, 8, 5))),
              ("a07", "flash attention", "a07_flash_attention.flash_triton",
               lambda m: m.attention_forward(*(_randn(g, 1, 1, 5, 16) for _ in range(3)), True)[0]))
    was, warn_only = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    for key, what, module, call in checks:
        try:
            torch.use_deterministic_algorithms(True, warn_only=True)     # torch.empty gives NaN: unwritten shows
            try:
                out = call(load(module))
            finally:
                torch.use_deterministic_algorithms(was, warn_only=warn_only)
            if bool(torch.isnan(out).any()):
                raise NotImplementedError("its output was never written")
        except NotImplementedError as e:
            missing.append(f"your {key} {what} ({e})")
        except Exception:  # noqa: BLE001 - a bug there shows in that stage's own tests
            pass
    if not missing:
        return None
    stages = ",".join(m.split()[1] for m in missing)
    return (f"stage 8 runs on {' and '.join(missing)}, which {'are' if len(missing) > 1 else 'is'} not implemented "
            f"yet: finish {'them' if len(missing) > 1 else 'it'}, or try stage 8 on the reference "
            f"{'ones' if len(missing) > 1 else 'one'} with {borrow_hint(stages)}")


def borrow_hint(stages: str) -> str:
    """How to borrow ``stages`` ("a06,a07") from solutions/, in the syntax of the command in use: make's
    ``BORROW=`` where make started it (the Makefile sets COURSE_VIA_MAKE=1), else the ``--borrow`` option."""
    if os.environ.get("COURSE_VIA_MAKE") == "1":
        return f"`make check STAGE=a08 BORROW={stages}` (and `make grade STAGE=a08 BORROW={stages}`)"
    return f"`--borrow {stages}` (pytest, and python -m common.course.grade)"


def _new_engine(r: Run, seed: int, n_head: int, b: int, s: int):
    needs = a08_dependencies(r.load)
    if needs:
        raise NotImplementedError(needs)
    eng = r.load("a08_gpt2_inference.engine")
    engine = eng.GPT2Engine.from_hf(_tiny_gpt2(seed, n_head), dtype=torch.float32, max_batch=b + 1, max_seq_len=s)
    engine.cache.k.fill_(float("nan"))             # a slot read before it is written shows
    engine.cache.v.fill_(float("nan"))
    return engine


@_call
def a08_engine_decode(r: Run, seed: int, n_head: int, prompts: list, follow: list, steps: int):
    """Prefill + teacher-forced decode steps; every step's logits (cloned: a step may reuse its buffers)."""
    engine = _new_engine(r, seed, n_head, len(prompts), 32)
    ids, lens = engine.pad(prompts)
    out = [engine.prefill(ids, lens).clone()]
    for j in range(steps):
        out.append(engine.decode_step(torch.tensor([f[j] for f in follow], device=engine.device)).clone())
    return tuple(o[i] for o in out for i in range(len(prompts)))


@_call
def a08_engine_generate(r: Run, seed: int, n_head: int, prompts: list, new: int):
    """Greedy generation, eager steps (graph replay is what the performance case times)."""
    return _new_engine(r, seed, n_head, len(prompts), 32).generate(prompts, new, cuda_graph=False).cpu()


@_call
def a08_decode_work(r: Run, seed: int, n_head: int, prompts: list, follow: list):
    """A decode step's work must not grow with the context: every GEMM has B rows (one token per
    sequence) and no prefill attention runs; and it reads no device value on the host (.tolist(),
    .item(), bool(t): a sync a CUDA graph cannot hold). The engine's matmul entry points are wrapped
    to see the rows of each GEMM it issues during decode_step (facts for the judge)."""
    eng = r.load("a08_gpt2_inference.engine")
    engine = _new_engine(r, seed, n_head, len(prompts), 32)
    ids, lens = engine.pad(prompts)
    engine.prefill(ids, lens)
    rows, prefill_attention = [], [0]

    def rows_of(x):
        return x.numel() // max(x.shape[-1], 1)

    linear, matmul, attention = engine.linear, getattr(eng, "matmul", None), getattr(eng, "attention_forward", None)
    gemv = getattr(eng, "gemv", None)

    def seen_linear(x, *a, **kw):
        rows.append(rows_of(x))
        return linear(x, *a, **kw)

    def seen_matmul(x, *a, **kw):
        rows.append(rows_of(x))
        return matmul(x, *a, **kw)

    def seen_gemv(x, *a, **kw):
        rows.append(rows_of(x))
        return gemv(x, *a, **kw)

    def seen_attention(*a, **kw):
        prefill_attention[0] += 1
        return attention(*a, **kw)
    engine.linear = seen_linear
    patched = {name: fn for name, fn in (("matmul", seen_matmul), ("gemv", seen_gemv),
                                         ("attention_forward", seen_attention))
               if getattr(eng, name, None) is not None}
    saved = {name: getattr(eng, name) for name in patched}
    toks = [torch.tensor(f, device=engine.device) for f in follow]
    try:
        for name, fn in patched.items():
            setattr(eng, name, fn)
        logits = []
        with host_syncs() as syncs:
            for tok in toks:
                logits.append(engine.decode_step(tok).clone())
                logits = logits[:-1] + list(logits[-1])       # one [vocab] row per sequence
    finally:
        for name, fn in saved.items():
            setattr(eng, name, fn)
        del engine.linear
    r.fact("gemm_rows", sorted(set(rows)))
    r.fact("prefill_attention_calls", prefill_attention[0])
    r.fact("host_syncs", sorted(set(syncs))[:5])
    return tuple(logits)


def _decode_work_judge(batch: int):
    def judge(facts: dict) -> str | None:
        rows, calls = facts.get("gemm_rows", []), facts.get("prefill_attention_calls", 0)
        if facts.get("host_syncs"):
            return (f"decode_step reads device values on the host ({'; '.join(facts['host_syncs'])}): on a GPU each "
                    "is a synchronisation, and the step is replayed from a CUDA graph, which cannot hold one. Keep "
                    "the lengths and tokens on the device (cache.lengths, indexing with tensors)")
        if calls or any(n != batch for n in rows):
            return (f"decode_step recomputes the context: its GEMMs had {rows} rows and the prefill attention ran "
                    f"{calls} times, where a decode step's GEMMs have B = {batch} rows (one new token per sequence) "
                    "and attention reads the KV cache (decode_attention): the work of a step must not grow with "
                    "the context")
        if not rows:
            return ("decode_step issued no GEMM through the engine's linear()/gemv/matmul (the course's a08 GEMV, "
                    "a06 matmul)")
        return None
    return judge


def _engine_trials(g, rng) -> list[Trial]:
    import copy
    vocab = A08_TINY["vocab_size"]
    seed, n_head = rng.randrange(2**31), rng.choice([2, 4])
    model = _tiny_gpt2(seed, n_head)
    m64 = copy.deepcopy(model).to(torch.float64)
    forbid = dict(forbid=ENGINE)
    trials = []

    def teacher_forced(prompts, follow, steps):
        with torch.no_grad():
            full = [m64(torch.tensor([p + f])).logits[0, len(p) - 1:len(p) + steps] for p, f in zip(prompts, follow)]
        return tuple(full[i][j] for j in range(steps + 1) for i in range(len(prompts)))

    # (c) prefill + teacher-forced decode steps, a right-padded batch of different prompt lengths:
    # every step's logits against the model run in float64.
    steps = 3
    lengths = [rng.randint(1, 3), rng.randint(4, 9), rng.randint(10, 16)][:rng.randint(2, 3)]
    rng.shuffle(lengths)
    prompts, follow = _prompts(g, lengths, vocab), _prompts(g, [steps] * len(lengths), vocab)
    trials.append(Trial(f"GPT2Engine fp32: prefill + {steps} decode steps, prompt lengths {lengths}, logits vs "
                        f"transformers in float64", "a08_engine_decode",
                        dict(seed=seed, n_head=n_head, prompts=prompts, follow=follow, steps=steps),
                        teacher_forced(prompts, follow, steps), REL_TOL[torch.float32], **forbid))

    # (d) greedy generation, token for token with transformers' generate (float64) per prompt
    new = 4
    lengths, prompts, want = _greedy_prompts(m64, g, rng, vocab, new)
    trials.append(Trial(f"GPT2Engine fp32: generate({new}) of prompts of lengths {lengths}, greedy tokens vs "
                        f"transformers' generate", "a08_engine_generate",
                        dict(seed=seed, n_head=n_head, prompts=prompts, new=new), torch.tensor(want), 0, exact=True,
                        **forbid))

    # (e) the work of a decode step: B-row GEMMs after a prompt of 12-20 tokens, never the whole context
    lengths = [rng.randint(12, 20), rng.randint(12, 20)]
    prompts, follow = _prompts(g, lengths, vocab), _prompts(g, [2] * 2, vocab)
    follow = [[f[j] for f in follow] for j in range(2)]
    full = teacher_forced(prompts, [[f[i] for f in follow] for i in range(2)], 2)
    trials.append(Trial(f"GPT2Engine fp32: the work of decode_step after prompts of {lengths} tokens (GEMMs of "
                        "B rows, no prefill attention, no host sync)", "a08_decode_work",
                        dict(seed=seed, n_head=n_head, prompts=prompts, follow=follow), full[2:],
                        REL_TOL[torch.float32], judge=_decode_work_judge(len(prompts)), **forbid))
    return trials


def _a08_trials(rng):
    g = _gen(rng)
    return (_with_repeat(rng, g, lambda r, g, i: [_decode_attention_trial(g, r, i == 1, _dtype_of_draw(i))], 3)
            + [_decode_attention_trial(g, rng, False, _dtype_of_draw(0), odd_head=True),
               _decode_attention_trial(g, rng, False, _dtype_of_draw(0), long=True)]
            + _layernorm_trials(g, rng) + [_write_kv_trial(g, rng), _write_kv_trial(g, rng, odd_head=True)]
            + _gemv_trials(g, rng) + _engine_trials(g, rng))


def _hf_static_step(hf, ids: torch.Tensor, tok0: torch.Tensor, ctx: int):
    """transformers' GPT-2 decoding a token after the prompt ``ids`` (ctx tokens) with a StaticCache,
    as one idempotent, graph-capturable call ``step(tok)``: the prefill runs once here; every call
    puts the cache's write position back to ctx first, so each replay writes the same slot."""
    from transformers import StaticCache
    b = ids.shape[0]
    try:
        cache = StaticCache(config=hf.config, max_cache_len=ctx + 8)
    except TypeError:                                    # older transformers
        cache = StaticCache(config=hf.config, max_batch_size=b, max_cache_len=ctx + 8, device=ids.device,
                            dtype=hf.dtype)
    with torch.no_grad():
        hf(ids, past_key_values=cache, use_cache=True)   # prefill: the cache holds ctx tokens
    # transformers 5: each layer keeps its write position in a device tensor (cumulative_length),
    # advanced in place by every update. Make them views of one tensor: one fill_ resets them all.
    layers = [la for la in getattr(cache, "layers", ()) if isinstance(getattr(la, "cumulative_length", None), torch.Tensor)]
    if layers:
        pos = torch.full((len(layers),), ctx, dtype=layers[0].cumulative_length.dtype, device=ids.device)
        for i, la in enumerate(layers):
            la.cumulative_length = pos[i]
        kw = {}
    else:                                                # transformers that take the slot as cache_position
        pos = None
        kw = dict(cache_position=torch.tensor([ctx], device=ids.device))

    def step(tok):
        if pos is not None:
            pos.fill_(ctx)
        with torch.no_grad():
            return hf(tok[:, None], past_key_values=cache, use_cache=True, **kw).logits[:, -1]
    return step


def a08_decode_case(load, cfg: dict, *, batch: int = 1, ctx: int = 128, dtype=torch.bfloat16,
                    device: str = "cuda", tol: float = 6e-2) -> Perf:
    """One decode step of a random-weight GPT-2 of config ``cfg`` after ``ctx`` tokens of context:
    the engine against transformers' GPT2LMHeadModel decoding one token with a static KV cache.
    Each input set is a new token per sequence; each call first puts the context back to the same
    ctx tokens (the engine: cache.lengths; transformers: the static cache's write position), so
    every replay writes the same cache slot and computes the logits of its own token."""
    eng = load("a08_gpt2_inference.engine")
    b = batch
    hf = random_gpt2(0, std=None, **cfg).to(device, dtype)
    cfg = hf.config
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, cfg.vocab_size, (b, ctx), generator=g).to(device)
    tok0 = torch.randint(0, cfg.vocab_size, (b,), generator=g).to(device)
    engine = eng.GPT2Engine.from_hf(hf, dtype=dtype, device=device, max_batch=b, max_seq_len=ctx + 8)
    engine.prefill(ids)
    context = torch.full((b,), ctx, dtype=torch.int32, device=device)

    def submission(inp):
        engine.cache.lengths[:b].copy_(context)         # back to ctx tokens: the step is idempotent
        return engine.decode_step(inp["tok"])

    def inputs(gen):
        return {"tok": torch.randint(0, cfg.vocab_size, (b,), device=device, generator=gen)}

    hf_step = _hf_static_step(hf, ids, tok0, ctx)
    # The step attends over ctx + 1 keys (the new token's included).
    c, n_layer = cfg.n_embd, cfg.n_layer
    flops = gpt2_decode_flops(n_layer, c, cfg.vocab_size, b, ctx + 1)
    nbytes = gpt2_decode_bytes(n_layer, c, cfg.vocab_size, b, ctx + 1, torch.empty((), dtype=dtype).element_size())
    path = "the tuned path" if engine.tuned is not None else "the core: your kernels as written"   # what is timed
    return Perf(f"GPT-2 decode step (n_embd {c}, {n_layer} layers), batch {b}, context {ctx}, "
                f"{str(dtype).replace('torch.', '')}, {path}", inputs, submission, lambda i: hf_step(i["tok"]),
                "transformers GPT2LMHeadModel, StaticCache", flops, nbytes, tol=tol)


#: GPT-2 small's shape; the initializer range of GPT-2 itself.
GPT2_SMALL = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, initializer_range=0.02)


#: bf16 through 12 layers: transformers itself is ~1.2e-2 (relative) from float64 at this shape,
#: so two correct bf16 implementations differ by up to ~2-3e-2; wrong logits are off by ~1.
A08_PERF_TOL = 6e-2


def _a08_perf(load):
    return a08_decode_case(load, GPT2_SMALL, batch=1, ctx=128, dtype=torch.bfloat16, tol=A08_PERF_TOL)


STAGE = Stage("a08_gpt2_inference", "GPT-2 inference: prefill + KV-cache decode", _a08_trials, _a08_perf,
              perf_target=1.0, perf_tol=A08_PERF_TOL)
#: ``python -m common.course.bench KEY`` runs this module of solutions/
BENCHES = {"a08": "a08_gpt2_inference.bench"}


# ----------------------------------------------------------------------------- host cost
def _hc_add_layernorm(load, dev, dt):
    m = load("a08_gpt2_inference.layernorm")
    x, r = torch.randn(4, 768, device=dev, dtype=dt), torch.randn(4, 768, device=dev, dtype=dt)
    w, b = torch.randn(768, device=dev, dtype=dt), torch.randn(768, device=dev, dtype=dt)

    def torch_op():
        h = x + r
        return h, F.layer_norm(h, (768,), w, b)
    return (lambda: m.add_layernorm(x, r, w, b)), torch_op


def _hc_decode_attention(load, dev, dt):
    m = load("a08_gpt2_inference.decode_attention")
    b, h, s_max, d, length = 1, 12, 128, 64, 100
    q = torch.randn(b, h, d, device=dev, dtype=dt)
    kc, vc = torch.randn(b, h, s_max, d, device=dev, dtype=dt), torch.randn(b, h, s_max, d, device=dev, dtype=dt)
    lengths = torch.full((b,), length, dtype=torch.int32, device=dev)
    return (lambda: m.decode_attention(q, kc, vc, lengths)), (
        lambda: F.scaled_dot_product_attention(q[:, :, None], kc[:, :, :length], vc[:, :, :length]))


def _hc_write_kv(load, dev, dt):
    m = load("a08_gpt2_inference.kv_cache")
    b, h, s_max, d, pos = 1, 12, 128, 64, 100
    qkv = torch.randn(b, 1, 3 * h * d, device=dev, dtype=dt)
    kc, vc = torch.zeros(b, h, s_max, d, device=dev, dtype=dt), torch.zeros(b, h, s_max, d, device=dev, dtype=dt)
    start = torch.full((b,), pos, dtype=torch.int32, device=dev)

    def torch_op():   # the slice assignments write_kv replaces
        _, k, v = qkv.view(b, 1, 3, h, d).unbind(2)
        kc[:, :, pos:pos + 1] = k.transpose(1, 2)
        vc[:, :, pos:pos + 1] = v.transpose(1, 2)
    return (lambda: m.write_kv(qkv, kc, vc, start)), torch_op


def _hc_gemv(load, dev, dt):
    try:                                          # the reference: its tuned path's GEMV (solutions/ only)
        m = load("a08_gpt2_inference.tuned_gemv")
    except ModuleNotFoundError:                   # a student's tree: its core GEMV
        m = load("a08_gpt2_inference.gemv")
    x, w, b = torch.randn(1, 768, device=dev, dtype=dt), torch.randn(768, 768, device=dev, dtype=dt), torch.randn(768, device=dev, dtype=dt)
    return (lambda: m.gemv(x, w, b)), (lambda: torch.addmm(b, x, w))


def hostcost_cases() -> list:
    """This stage's eager host-cost cases (``python -m common.course.hostcost``): its entry points at a launch-bound
    shape, beside the PyTorch op each replaces."""
    from common.course.hostcost import Case
    return [
        Case("a08_add_layernorm", "a08", "add_layernorm vs x + r, F.layer_norm; [4, 768]", 1, _hc_add_layernorm),
        Case("a08_decode_attention", "a08", "decode_attention vs SDPA on the cache; B 1, H 12, 100 of 128 keys",
             2, _hc_decode_attention),
        Case("a08_write_kv", "a08", "write_kv vs two slice assignments; B 1, T 1, H 12", 1, _hc_write_kv),
        Case("a08_gemv", "a08", "gemv + bias vs addmm; [1, 768] x [768, 768]", 1, _hc_gemv),
    ]


# ----------------------------------------------------------------------------- portability (common.course.portability)
def portability_launches(load, archs: list[Arch], full: bool) -> Iterator[Launch]:
    """The stage's Triton launches as its launcher makes them, for ``python -m common.course.portability``."""
    ln = load("a08_gpt2_inference.layernorm")
    dec = load("a08_gpt2_inference.decode_attention")
    kv = load("a08_gpt2_inference.kv_cache")
    from common.impl import Impl
    load_solutions = Impl.get("solutions").load
    gv = load_solutions("a08_gpt2_inference.tuned_gemv")      # the tuned path's kernels (given, solutions/ only)
    smp = load_solutions("a08_gpt2_inference.tuned_sampling")
    nc = -(-50257 // smp.CHUNK)                # sampling.py's kernels over GPT-2's vocabulary
    f32, i32, i64 = _dt(FP32), _dt("int32"), _dt("int64")
    for dt in (FP32, BF16):
        t = _dt(dt)
        for greedy in (True, False):
            mode = "greedy" if greedy else "sample"
            yield Launch("a08", "_choose_kernel", f"{dt} {mode} CHUNK={smp.CHUNK} SPREAD={smp.SPREAD} KC={smp.KC} warps={smp.CHUNK_WARPS}",
                         smp._choose_kernel,
                         (t, f32, i64, i32, f32, i32, i64, f32, i32, i64, 50257, 50257, nc),
                         dict(GREEDY=greedy, CHUNK=smp.CHUNK, SPREAD=smp.SPREAD, KC=smp.KC, NB=smp.NB, RANGE=smp.RANGE,
                              NCP=_next_pow2(nc), MAX_ROUNDS=smp.MAX_ROUNDS, NUCLEUS=not greedy,
                              BLOCK_V=smp.BLOCK_V, USE_PDL=False, num_warps=smp.CHUNK_WARPS))
        yield Launch("a08", "_choose_kernel", f"{dt} sample wide CHUNK={smp.CHUNK} SPREAD={smp.SPREAD} KC={smp.KC_WIDE} warps={smp.CHUNK_WARPS}",
                     smp._choose_kernel,
                     (t, f32, i64, i32, f32, i32, i64, f32, i32, i64, 50257, 50257, nc),
                     dict(GREEDY=False, CHUNK=smp.CHUNK, SPREAD=smp.SPREAD, KC=smp.KC_WIDE, NB=smp.NB, RANGE=smp.RANGE,
                          NCP=_next_pow2(nc), MAX_ROUNDS=smp.MAX_ROUNDS, NUCLEUS=True,
                          BLOCK_V=smp.BLOCK_V, USE_PDL=False, num_warps=smp.CHUNK_WARPS))
        yield Launch("a08", "_reject_kernel", f"{dt} CHUNK={smp.CHUNK} SPREAD={smp.SPREAD} KA={smp.KA} BLOCK_V={smp.BLOCK_V} warps={smp.CHUNK_WARPS}",
                     smp._reject_kernel,
                     (t, f32, i64, i32, f32, i32, i64, i32, i64, 50257, 50257, nc),
                     dict(CHUNK=smp.CHUNK, SPREAD=smp.SPREAD, NCP=_next_pow2(nc), KA=smp.KA, BLOCK_V=smp.BLOCK_V, MAX_ROUNDS=smp.MAX_ROUNDS,
                          USE_PDL=False, num_warps=smp.CHUNK_WARPS))
    for dt in (FP32, BF16, FP16):
        only = None if full or dt != FP16 else ("sm_75",)     # fp16: bf16's sizes on tensor-core GPUs
        t, f = _dt(dt), _dt(FP32)
        yield from _a08_gemv(gv, dt, t, f, only)
        for c in (64, 768, 1600, 8192):        # BLOCK_C 64 .. 8192, warps 1 .. 8 (layernorm._launch)
            block = _next_pow2(c)
            warps = ln.warps_for(block)
            yield Launch("a08", "_add_layernorm_kernel", f"{dt} BLOCK_C={block} warps={warps}", ln._add_layernorm_kernel,
                         (t, t, t, t, t, t, c, c, c, c, c, 1e-5),
                         dict(HAS_RESIDUAL=True, BLOCK_C=block, USE_PDL=False, num_warps=warps),
                         only)
        for d in (64, 128):
            warps = dec.split_warps(d)
            for splits in (1, 64):
                yield Launch("a08", "_decode_split", f"{dt} d={d} NUM_SPLITS={splits} BLOCK_N={dec.BLOCK_N} warps={warps}",
                             dec._decode_split, (t, t, t, _dt("int32"), t, f, f, 12 * d, d, 12 * 1024 * d, 1024 * d, d,
                                                 12 * 1024 * d, 1024 * d, d, 12 * d, d, 12, 0.18),
                             dict(NUM_SPLITS=splits, HEAD_DIM=d, BLOCK_N=dec.BLOCK_N, BLOCK_D=d, USE_PDL=False,
                                  PREFETCH=0, LINE=64, num_warps=warps), only)
            yield Launch("a08", "_decode_combine", f"{dt} d={d} NUM_SPLITS=64", dec._decode_combine,
                         (f, f, t, 12 * d, d, 12),
                         dict(NUM_SPLITS=64, SPLITS_P2=64, HEAD_DIM=d, BLOCK_D=d, USE_PDL=False, num_warps=1), only)
            yield Launch("a08", "_write_kv_kernel", f"{dt} d={d} BLOCK_H=32", kv._write_kv_kernel,
                         (t, t, t, _dt("int32"), 1, 25, 1024, 3 * 25 * d, 25 * 1024 * d, 1024 * d, d),
                         dict(HEAD_DIM=d, BLOCK_H=32, BLOCK_D=d, USE_PDL=False, num_warps=4), only)


def _a08_gemv(gv, dt: str, t, f, only) -> Iterator[Launch]:
    """The decode GEMV as the engine launches it (gemv.choose_config on 132 SMs, GPT-2 XL's shapes): K-major W
    at 1 row (FMAs) and 16 rows (tl.dot), and N-major W split over K (the partial sums' combine); one
    more with programmatic dependent launch, on sm_90 only (griddepcontrol needs Hopper)."""
    from common.launch import cdiv
    tdt = _dt(dt)
    for m, k, n, kmajor, smem, archs in _gemv_cases(gv, only):
        bn, bk, splits, warps, stages = gv.choose_config(m, n, k, tdt, kmajor, 132, smem=smem, interpreter=False)
        dot = gv.use_dot(m)
        bm = gv.block_m(m, dot)
        per = cdiv(cdiv(k, bk), splits) * bk             # rows of W per split, whole slices (as gemv())
        sw = (1, k) if kmajor else (n, 1)              # W's (stride_wk, stride_wn)
        for pdl in (False, True):
            if pdl and ((m, kmajor) != (1, True) or only is not None):
                continue
            # the engine's epilogues: c_attn / c_fc with the LayerNorm folded in (K = n_embd; c_attn also
            # writes the KV cache), the projections with the residual added (K = 4·n_embd or n_embd)
            fold, res = k == 1600, k != 1600
            yield Launch("a08", "_matvec_kernel",
                         f"{dt} M={m} {k}->{n} {'K' if kmajor else 'N'}-major {(bn, bk, splits, warps, stages)}"
                         f"{' LN fold' if fold else ' residual'}{' PDL' if pdl else ''}", gv._matvec_kernel,
                         (t, t, f, t, f, _dt("int32"), t, f, m, n, k, per, k, 1, *sw, n, n, 1e-5,
                          t, t, _dt("int32"), 25 * 1024 * 64, 1024 * 64, 64, 1024, 64),   # XL's cache [B, 25, 1024, 64]
                         dict(KV_WRITE=n == 3 * k, HAS_BIAS=True, ACTIVATION="gelu_tanh", FAST_TANH=tdt.itemsize == 2,
                              HAS_RESIDUAL=res, LN_FOLD=fold, PRELOAD=gv.preload(k, bm, warps),
                              ONE_TILE=gv.stat_k(k, bm, warps) >= k, STAT_K=gv.stat_k(k, bm, warps), SPLIT_K=splits,
                              COMBINE=gv.combine_chunk(splits, bm, bn, warps), USE_DOT=dot, DOT_FP32=False,
                              BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, W_K_CONTIG=kmajor, FENCE=True, USE_PDL=pdl,
                              num_warps=warps, num_stages=stages),
                         ("sm_90",) if pdl else archs)


def _gemv_cases(gv, only) -> Iterator[tuple]:
    """(M, K, N, K-major, shared memory, the families) of each _a08_gemv launch: the K-major tl.dot path's
    tile and stages follow the GPU's shared memory (gemv.choose_config's ``smem``), so it is one launch per
    family; the others are one launch for all."""
    for m, k, n, kmajor in ((1, 1600, 4800, True), (16, 6400, 1600, True), (1, 1600, 4800, False), (16, 1600, 6400, False)):
        if kmajor and gv.use_dot(m):
            for name, arch in ARCHS.items():
                if only is None or name in only:
                    yield m, k, n, kmajor, arch.smem_per_block, (name,)
        else:
            yield m, k, n, kmajor, None, only


# ----------------------------------------------------------------------------- results (make results)
def results_runs() -> dict:
    """The GPU runs behind this stage's files in lectures/results/ (``make results STAGE=...``): each a
    script and the files it makes (lectures/_tools/results.py)."""
    from lectures._tools.results import Run, _same
    run = "solutions/a08_gpt2_inference/run.sh"
    return {"a08": [Run(run, ("bench",), files={
                        "a08_gpt2_inference.md": "a08_gpt2_inference.md", "a08_gpt2_inference.csv": "a08_gpt2_inference.csv",
                        "a08_decode_speedup.png": "a08_decode_speedup.png", "bench.log": "a08_h100_bench.log",
                        "a08_profile_small.txt": "a08_profile_small.txt"}),
                    Run(run, ("gemv",), files=_same("a08_gemv.md", "a08_gemv.csv", "a08_gemv_sweep.csv")),
                    Run(run, ("step",), files=_same("a08_decode_step.md", "a08_decode_step.csv")),
                    Run(run, ("tests",), files={"pytest_a08.log": "a08_h100_tests.log"}),
                    Run(run, ("profile",), files=_same("a08_decode_profile.md", "a08_decode_timeline.png"))]}
