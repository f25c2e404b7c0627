"""Stage 7, flash attention forward and backward (7a tiled PyTorch, 7b Triton): trials, memory, speed cases."""
from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from common import HAS_CUDA
from common import reference as ref
from common.roofline import attention_flops
from common.shapes import ATTENTION_HEADS, attention_batch
from common.kernel_check import (ACT_KERNELS, ATTENTION_FUNCTIONS, ATTN_KERNELS, BLAS_KERNELS, TORCH_ATTENTION,
                                 TORCH_GEMM, TORCH_SOFTMAX, Forbidden, attention_tile_bound, largest_new_tensor,
                                 tile_message)
from common.testing import calibrated_tol, rel_error, torch_attention
from common.gpu import Arch
from common.course.portability import BF16, FP32, TENSOR_CORE_ARCHS, Launch, _dt, _dtypes
from common.course.stages.base import Perf, Run, Stage, Trial, _call, _cuda_randn, _gen, _randn, _with_repeat


# ----------------------------------------------------------------------------- what the graded calls may not call
#: a07a: tiled attention in PyTorch (its matmuls are torch's, by design; the fused op is not).
ATTENTION_TILED = Forbidden(TORCH_ATTENTION, ATTN_KERNELS, ATTENTION_FUNCTIONS)
#: a07b: the Triton forward and backward kernels.
ATTENTION_KERNEL = Forbidden(TORCH_ATTENTION + TORCH_GEMM + TORCH_SOFTMAX, ATTN_KERNELS + BLAS_KERNELS + ACT_KERNELS,
                             ATTENTION_FUNCTIONS)


#: Stage 7's attention entry points: (module, function name).
ATTENTION_FN = {"torch": ("a07_flash_attention.flash_torch", "flash_attention_torch"),
                "triton": ("a07_flash_attention.flash_triton", "flash_attention")}


def _attention_fn(r: Run, impl: str):
    module, name = ATTENTION_FN[impl]
    return getattr(r.load(module), name)


@_call
def a07_fwd(r: Run, impl: str, q, k, v, causal: bool):
    return _attention_fn(r, impl)(q, k, v, causal)


@_call
def a07_fwd_bwd(r: Run, impl: str, q, k, v, do, causal: bool, with_o: bool = True):
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    o = _attention_fn(r, impl)(q, k, v, causal)
    o.backward(do)
    return (o.detach(), q.grad, k.grad, v.grad) if with_o else (q.grad, k.grad, v.grad)


def _attn_trials(impl: str, label: str, rng, forbid: Forbidden):
    g = _gen(rng)

    def build(r, g, i):
        causal = (False, True)[i]
        dtype = torch.float32 if not HAS_CUDA else (torch.bfloat16, torch.float16)[i]   # both, not a random one
        d = r.choice([16, 32] if not HAS_CUDA else [16, 32, 64, 128])
        nq = r.randint(1, 80 if not HAS_CUDA else 600)
        nk = nq if r.random() < 0.5 else r.randint(max(1, nq), (80 if not HAS_CUDA else 600) + nq)
        lead = (r.randint(1, 2), r.randint(1, 3))
        q, k, v = (_randn(g, *lead, n, d, dtype=dtype) for n in (nq, nk, nk))
        do = _randn(g, *lead, nq, d, dtype=dtype)
        o_ref, _ = ref.attention(q, k, v, causal)
        grads_ref = ref.attention_backward(q, k, v, do, causal)
        tol = 1e-4 if dtype == torch.float32 else 2e-2
        return [Trial(f"{label} fwd+bwd lead={lead} Nq={nq} Nk={nk} d={d} causal={causal} {dtype}", "a07_fwd_bwd",
                      dict(impl=impl, q=q, k=k, v=v, do=do, causal=causal), (o_ref, *grads_ref), tol, forbid=forbid,
                      dtypes=(dtype,) * 4)]
    return _with_repeat(rng, g, build, 2)


#: Long-Nk attention trials: every query row walks >= 180 key tiles under the interpreter (16 keys
#: each), Nk >= 4096 on a GPU, where an accumulator kept in 16 bits between key tiles costs several
#: times SDPA's error. Few query rows under the interpreter: the cost is Nq x Nk there.
LONG_NK = (2900, 3600) if not HAS_CUDA else (4096, 8192)


def _long_attn_trials(impl: str, label: str, rng, forbid: Forbidden) -> list[Trial]:
    """Forward, and forward + backward, at long Nk in 16 bits. Tolerance: a few times
    F.scaled_dot_product_attention's own error on the same inputs (testing.calibrated_tol), O against
    SDPA's O and the gradients against SDPA's largest gradient error (on the CPU SDPA's dQ can be
    1.5x less accurate than its O: one shared tolerance would let a 16-bit O accumulator through)."""
    g = _gen(rng)
    trials = []
    for dtype in (torch.bfloat16,) + ((torch.float16,) if HAS_CUDA else ()):
        causal = rng.random() < 0.5
        d = rng.choice([32, 64] if not HAS_CUDA else [64, 128])
        nq = rng.randint(16, 40) if not HAS_CUDA else rng.randint(500, 2048)
        nk = rng.randint(*LONG_NK)
        lead = (1, 1) if not HAS_CUDA else (rng.randint(1, 2), rng.randint(1, 4))
        q, k, v = (_randn(g, *lead, n, d, dtype=dtype) for n in (nq, nk, nk))
        do = _randn(g, *lead, nq, d, dtype=dtype)
        o_ref, grads_ref = ref.attention(q, k, v, causal)[0], ref.attention_backward(q, k, v, do, causal)
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        o = torch_attention(qq, kk, vv, causal)
        o_tol = calibrated_tol(rel_error(o, o_ref), dtype)
        grads_tol = calibrated_tol(max(rel_error(t, r) for t, r in
                                       zip(torch.autograd.grad(o, (qq, kk, vv), do), grads_ref)), dtype)
        what = (f"long Nk: lead={lead} Nq={nq} Nk={nk} d={d} causal={causal} {dtype} "
                f"(tolerance: a few times SDPA's error)")
        trials += [Trial(f"{label} fwd O, {what}", "a07_fwd", dict(impl=impl, q=q, k=k, v=v, causal=causal), o_ref,
                         o_tol, forbid=forbid),
                   Trial(f"{label} fwd+bwd dQ dK dV, {what}", "a07_fwd_bwd",
                         dict(impl=impl, q=q, k=k, v=v, do=do, causal=causal, with_o=False), grads_ref, grads_tol,
                         forbid=forbid)]
    return trials


def _odd_head_trials(impl: str, label: str, rng, forbid: Forbidden) -> list[Trial]:
    """The forward at a head size that is no power of two (GPT-2-like models use 80 and 96): the kernel
    pads the head to a power of two and must mask the padding on every load and store."""
    g = _gen(rng)
    dtype = torch.bfloat16
    d = rng.choice([24, 40] if not HAS_CUDA else [80, 96])
    causal = rng.random() < 0.5
    nq = rng.randint(5, 40) if not HAS_CUDA else rng.randint(100, 700)
    lead = (1, rng.randint(1, 2)) if not HAS_CUDA else (rng.randint(1, 2), rng.randint(1, 8))
    q, k, v = (_randn(g, *lead, nq, d, dtype=dtype) for _ in range(3))
    o_ref = ref.attention(q, k, v, causal)[0]
    o_tol = calibrated_tol(rel_error(torch_attention(q, k, v, causal), o_ref), dtype)
    return [Trial(f"{label} fwd O, head size {d} (no power of two): lead={lead} Nq={nq} causal={causal} {dtype}",
                  "a07_fwd", dict(impl=impl, q=q, k=k, v=v, causal=causal), o_ref, o_tol, forbid=forbid)]


@_call
def a07_tiled(r: Run, q, k, v, do, causal: bool, bm: int, bn: int):
    """7a's two functions on their own, with the largest tensor each creates (a dispatch trace)."""
    ft = r.load("a07_flash_attention.flash_torch")
    (o, lse), big = largest_new_tensor(lambda: ft.flash_forward_torch(q, k, v, causal, bm, bn), q, k, v)
    r.fact("forward_largest", [big.elements, big.op, list(big.shape)])
    grads, big = largest_new_tensor(lambda: ft.flash_backward_torch(q, k, v, o, lse, do, causal, bm, bn),
                                    q, k, v, o, lse, do)
    r.fact("backward_largest", [big.elements, big.op, list(big.shape)])
    return (o, lse, *grads)


def _tile_judge(bound: int, bm: int, bn: int, nq: int, nk: int):
    def judge(facts: dict) -> str | None:
        from common.kernel_check import NewTensor
        for fn, key in (("flash_forward_torch", "forward_largest"), ("flash_backward_torch", "backward_largest")):
            elements, op, shape = facts.get(key, [0, "", []])
            if elements > bound:
                return tile_message(f"{fn}(block_m={bm}, block_n={bn})", NewTensor(elements, op, tuple(shape)),
                                    bound, nq, nk)
        return None
    return judge


def _tiled_memory_trial(rng, dtype=torch.float32) -> Trial:
    """Stage 7a's contract, never more than one [block_m, block_n] tile of scores, on sequences
    several tiles long: the largest tensor each of its two functions creates (dispatch trace). In a
    16-bit dtype, O keeps it and the logsumexp L is float32 (the contract: the saved statistics stay
    in fp32)."""
    g = _gen(rng)
    bm, bn, d = rng.choice([16, 32]), rng.choice([16, 32]), 16
    nq = rng.randint(130, 260)
    nk = rng.randint(nq, 300)
    causal = rng.random() < 0.5
    lead = (rng.randint(1, 2), rng.randint(1, 2))
    q, k, v = (_randn(g, *lead, n, d, dtype=dtype) for n in (nq, nk, nk))
    do = _randn(g, *lead, nq, d, dtype=dtype)
    o_ref, l_ref = ref.attention(q, k, v, causal)
    grads_ref = ref.attention_backward(q, k, v, do, causal)
    bound = attention_tile_bound(q, k, bm, bn)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    return Trial(f"tiled PyTorch, one tile at a time: lead={lead} Nq={nq} Nk={nk} d={d} blocks {bm}x{bn} "
                 f"causal={causal} {dtype} (largest tensor <= {bound} elements; L in float32)", "a07_tiled",
                 dict(q=q, k=k, v=v, do=do, causal=causal, bm=bm, bn=bn), (o_ref, l_ref, *grads_ref), tol,
                 forbid=ATTENTION_TILED, dtypes=(dtype, torch.float32, dtype, dtype, dtype),
                 judge=_tile_judge(bound, bm, bn, nq, nk))


def _a07_trials(rng):
    return (_attn_trials("torch", "tiled PyTorch", rng, ATTENTION_TILED)
            + [_tiled_memory_trial(rng), _tiled_memory_trial(rng, torch.bfloat16)]
            + _attn_trials("triton", "Triton", rng, ATTENTION_KERNEL)
            + _long_attn_trials("triton", "Triton", rng, ATTENTION_KERNEL)
            + _odd_head_trials("triton", "Triton", rng, ATTENTION_KERNEL))


#: Stage 7's speed cases (B, H, S, d), causal, bf16, forward, from the bench's real-shape sweep
#: (B·H·S ~ 2^18): GPT-2 small's attention (12 heads of 64) at S = 1024, an odd length (a partial
#: last tile) at d = 128, and a long sequence at d = 128.
A07_SHAPES = tuple((attention_batch(s, ATTENTION_HEADS[d]), ATTENTION_HEADS[d], s, d)
                   for s, d in ((1024, 64), (1537, 128), (4096, 128)))


def _a07_perf(load):
    fx = load("a07_flash_attention.flash_triton")
    cases = []
    for b, h, s, d in A07_SHAPES:
        cases.append(Perf(f"flash attention fwd B={b} H={h} S={s} d={d} causal bf16",
                          lambda g, shape=(b, h, s, d): {n: _cuda_randn(g, *shape) for n in "qkv"},
                          lambda i: fx.flash_attention(i["q"], i["k"], i["v"], True),
                          lambda i: F.scaled_dot_product_attention(i["q"], i["k"], i["v"], is_causal=True),
                          "F.scaled_dot_product_attention", attention_flops(b * h, s, s, d, True), 4 * b * h * s * d * 2))
    return cases


STAGE = Stage("a07_flash_attention", "Flash attention fwd+bwd", _a07_trials, _a07_perf, perf_target=0.7)
#: ``python -m common.course.bench KEY`` runs this module of solutions/ (7c: the Hopper CUDA forward)
BENCHES = {"a07": "a07_flash_attention.bench", "a07c": "a07_flash_attention.bench_hopper"}


# ----------------------------------------------------------------------------- host cost
def _hc_attn_inputs(dev, dt, grad, b=1, h=2, s=64, d=64):
    return [torch.randn(b, h, s, d, device=dev, dtype=dt).requires_grad_(grad) for _ in range(3)]


def _hc_flash_fwd(load, dev, dt):
    m = load("a07_flash_attention.flash_triton")
    q, k, v = _hc_attn_inputs(dev, dt, False)
    return (lambda: m.flash_attention(q, k, v, True)), (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))


def _hc_step(attn, q, k, v, do):
    """One autograd step through ``attn``: forward, backward with ``do``; the grads start empty."""
    def step():
        for t in (q, k, v):
            t.grad = None
        attn(q, k, v).backward(do)
    return step


def _hc_flash_fwd_bwd(load, dev, dt):
    m = load("a07_flash_attention.flash_triton")
    q, k, v = _hc_attn_inputs(dev, dt, True)
    do = torch.randn_like(q)
    return (_hc_step(lambda q, k, v: m.flash_attention(q, k, v, True), q, k, v, do),
            _hc_step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v, do))


#: The training cases: (model, B, H, S) with d = 64, causal, bf16, GPT-2's layout (q, k, v views of one qkv
#: tensor [B, S, 3·H·d]). The floor applies at B·H 96-384 (GPT-2 small/medium training shapes);
#: the S = 1000, B 2 case is reported beside them.
HOSTCOST_TRAINING = [("small", 8, 12, 1024), ("small", 32, 12, 512), ("small", 2, 12, 1000), ("medium", 8, 16, 1024),
                     ("medium", 24, 16, 512)]


def hostcost_training(impl, log=print) -> list[dict]:
    """Eager autograd steps, flash (the impl's a07) vs SDPA, at HOSTCOST_TRAINING's shapes: ms per step,
    the speed ratio (SDPA time / flash time) and the floor (TRAINING_FLOOR at B·H 96-384); the rows of
    ``python -m common.course.hostcost`` on a GPU."""
    from common.course import native
    from common.course.hostcost import TRAINING_FLOOR, _gpt2_qkv, _row, host_and_gpu_us, interleaved_us, training_step
    m = impl.load("a07_flash_attention.flash_triton")
    ready = native.load(wait=True) is not None      # flash's native autograd (common.course.native), built once
    log(f"[hostcost] native autograd: {'ready' if ready else 'unavailable: ' + native.reason}")
    rows = []
    for model, b, h, s in HOSTCOST_TRAINING:
        try:
            ours = training_step(lambda q, k, v: m.flash_attention(q, k, v, True), b, h, s)
            sdpa = training_step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), b, h, s)

            def python_autograd(step=ours):
                with native.disabled():
                    step()
            for _ in range(3):
                ours()
                sdpa()
            c, t, cpy = interleaved_us([ours, sdpa, python_autograd], calls=10, runs=3)
            (ch, cg), (th, tg) = host_and_gpu_us(ours, calls=10, runs=3), host_and_gpu_us(sdpa, calls=10, runs=3)
            # The autograd engine runs a CUDA backward on its own device thread: with that off, the backward
            # runs on the calling thread (what the host loses to the hand-off between threads, see markdown()).
            with torch.autograd.set_multithreading_enabled(False):
                c1, t1 = interleaved_us([ours, sdpa], calls=10, runs=3)
        except Exception as e:  # noqa: BLE001
            log(f"[hostcost] training {model} B={b} H={h} S={s}: FAILED {type(e).__name__}: {str(e)[:200]}")
            continue
        speed = t / c
        in_range = 96 <= b * h <= 384
        met = ("yes" if speed >= TRAINING_FLOOR else "no") if in_range else ""
        rows.append(_row("training", "a07", f"GPT-2 {model} training step, attention fwd+bwd: B {b}, H {h}, S {s}, "
                                            f"d 64, causal, bf16", 4, c, t, float("nan"),
                         TRAINING_FLOOR if in_range else float("nan"), met, ch, th, cg, tg, "cuda",
                         key=f"training_{model}_B{b}_S{s}"))
        rows[-1].update(ratio=speed, course_1thread_us=c1, torch_1thread_us=t1, course_python_us=cpy,
                        native=native.replayed(m.flash_attention(*_gpt2_qkv(b, h, s, 64, "cuda", torch.bfloat16)[1](),
                                                                 True)))
        log(f"[hostcost] training {model} B={b} H={h} S={s}: {c / 1e3:.3f} ms vs SDPA {t / 1e3:.3f} ms = {speed:.2f}x "
            f"(GPU alone {tg / cg:.2f}x; host {ch:.0f} vs {th:.0f} us; engine on one thread {c1 / 1e3:.3f} vs "
            f"{t1 / 1e3:.3f} ms = {t1 / c1:.2f}x; Python autograd {cpy / 1e3:.3f} ms = {t / cpy:.2f}x) {met}")
    return rows


def hostcost_cases() -> list:
    """This stage's eager host-cost cases (``python -m common.course.hostcost``): its entry points at a launch-bound
    shape, beside the PyTorch op each replaces."""
    from common.course.hostcost import Case
    return [
        Case("a07_fwd", "a07", "flash forward vs SDPA; B 1, H 2, S 64, d 64, causal", 1, _hc_flash_fwd),
        Case("a07_fwd_bwd", "a07", "flash forward + backward (autograd) vs SDPA's; same shape", 4, _hc_flash_fwd_bwd),
    ]


# ----------------------------------------------------------------------------- portability (common.course.portability)
def _flash_args(d: int, dt: str, kind: str) -> tuple:
    t, f = _dt(dt), _dt(FP32)
    strides = (12 * 4096 * d, 4096 * d, d, 1)
    tensors = {"fwd": (t, t, t, t, f), "dkdv": (t, t, t, t, f, f, t, t), "dq": (t, t, t, t, f, f, t)}[kind]
    grads = () if kind == "fwd" else strides[:3]     # the backward kernels' dQ / dK, dV layout (contiguous here)
    return (*tensors, *strides * 4, *grads, 12, 4096, 4096, 0.125)


def portability_launches(load, archs: list[Arch], full: bool) -> Iterator[Launch]:
    """The stage's Triton launches as its launcher makes them, for ``python -m common.course.portability``."""
    mod = load("a07_flash_attention.flash_triton")
    fns = {"fwd": mod._attn_fwd, "dkdv": mod._attn_bwd_dkdv, "dq": mod._attn_bwd_dq}
    # (kind, dtype, d, N_Q, precision, causal): every table entry and HALF_D128 choice the launcher makes
    # (flash_triton._pick), fp32 forward also with IEEE dots (attention_forward(allow_tf32=False): stage
    # 8's fp32 prefill at d = 64); causal: both key loops, the masked one with its compare.
    for arch in archs:
        if not full and arch.name not in TENSOR_CORE_ARCHS + ("sm_90",):
            continue
        for kind in ("fwd", "dkdv", "dq"):
            for dt in _dtypes(full, arch.name):
                for d in ((16, 32, 64, 128) if full else (64, 128)):
                    for n in ((512, 4096) if d == 128 and dt != FP32 else (4096,)):
                        precs = ((None, "ieee") if full or d == 64 else (None,)) if kind == "fwd" and dt == FP32 \
                            else (None,)
                        for prec in precs:
                            if not full and arch.name == "sm_90" and (dt == FP32 and prec == "ieee"):
                                continue
                            for causal in ((True, False) if full else (True,)):
                                # the launcher's own choice: the config, and whether it may fall back
                                _, cfg, fallback = mod._kernel(fns[kind], kind, d, n, _dt(dt))
                                kw = dict(HEAD_DIM=d, CAUSAL=causal,
                                          **({"BLOCK_D": d} if kind == "fwd" else {}),
                                          **({"allowed_dot_input_precisions": (prec,)} if prec else {}))
                                chain = tuple(dict(kw, **c) for c in (mod.smaller_configs(cfg) if fallback else [cfg]))
                                yield Launch("a07", fns[kind].__name__,
                                             f"{dt}{' ieee' if prec else ''} d={d} N_Q={n}{'' if causal else ' not causal'}: "
                                             f"{_cfg_str(cfg)}", fns[kind], _flash_args(d, dt, kind), chain[0],
                                             (arch.name,), chain[1:])
    t, f = _dt(BF16), _dt(FP32)
    yield Launch("a07", "_attn_bwd_delta", "bfloat16 d=128 BLOCK_M=64", mod._attn_bwd_delta,
                 (t, t, f, *(12 * 4096 * 128, 4096 * 128, 128, 1) * 2, 12, 4096), dict(HEAD_DIM=128, BLOCK_M=64))


def _cfg_str(cfg: dict) -> str:
    return f"{cfg['BLOCK_M']}x{cfg['BLOCK_N']} w{cfg['num_warps']} s{cfg['num_stages']}"


# ----------------------------------------------------------------------------- CUDA builds (common.cuda_ext)
def cuda_ops() -> dict:
    """The CUDA extensions this stage builds (7c's Hopper attention forward (sm_90 only)): a cold test run on a GPU prebuilds them
    in the background (tests/autograder.py)."""
    from common.cuda_ext import CourseOp
    return {
        "a07c": CourseOp("a07_flash_attention.flash_hopper", lambda m: m._op(), "test_a07c_flash_hopper.py",
                         hopper_only=True),
    }


# ----------------------------------------------------------------------------- results (make results)
def results_runs() -> dict:
    """The GPU runs behind this stage's files in lectures/results/ (``make results STAGE=...``): each a
    script and the files it makes (lectures/_tools/results.py)."""
    from lectures._tools.results import GAPS, SWEEP, Run, _same, ncu
    run = "solutions/a07_flash_attention/run.sh"
    return {"a07": [Run(run, ("final",), files=_same(
                        "a07_flash_attention.md", "a07_flash_attention.csv", "a07_flash_attention_memory.csv",
                        "a07_memory.png", "a07_tflops_fwd.png", "a07_flash_attention_tuned.md")),
                    Run(run, ("sweep",), files={"sweep.log": "a07_sweep.log"}),
                    SWEEP, ncu("a07"), GAPS],
            "a07c": [Run("solutions/a07_flash_attention/run_hopper.sh",
                         files={"a07c_flash_hopper.md": "a07c/a07c_flash_hopper.md",
                                "a07c_flash_hopper.csv": "a07c/a07c_flash_hopper.csv",
                                "bench.log": "a07c/bench.log", "ncu_s4096_d128.txt": "a07c/ncu_s4096_d128.txt"})]}
