"""Host cost: what one eager call of each course op costs, against the PyTorch op it replaces.

    python -m common.hostcost --impl solutions          # GPU: lectures/results/hostcost.md / .csv
    python -m common.hostcost --stub                    # no GPU: the wrappers' Python alone, launches stubbed
    python -m common.hostcost --profile a05_gelu        # where one call's microseconds go (cProfile)
    python -m common.hostcost --compare before.csv after.csv   # the same cases measured twice

The grader and the benches time CUDA-graph replays: the GPU alone. A user calls the ops
eagerly (a notebook, a training step with autograd), and at small shapes such a call costs
what the *host* spends on it: the wrapper's checks and allocations, the custom-op dispatch,
Triton's launcher (it binds the arguments, specialises the integers, looks the compiled
kernel up) and the driver's launch. Here every stage's public entry point is called at a
launch-bound shape, beside the PyTorch op it replaces and a bare launch of a one-line Triton
kernel (Triton's own floor), and three numbers are taken per call:

* ``eager_us``: calls back to back, ``torch.cuda.synchronize()`` bracketing each batch, median
  of the batches: what a user sees;
* ``host_us``: the host's time to issue one call while the GPU is held busy
  (``torch.cuda._sleep``), so no launch waits for the GPU: the host cost alone;
* ``gpu_us``: the GPU's time for the calls queued that way, back to back (CUDA events): the
  kernels alone, with no host gap between them.

The floor (issue #29): ``eager_us <= max(1.5 x the PyTorch op, 1.5 x a bare launch x kernels
launched)``, the three measured side by side in rounds (:func:`interleaved_us`). The training
cases time an autograd step (flash forward + backward against SDPA's) at GPT-2 training shapes,
with the inputs laid out as GPT-2's attention makes them (views of one fused qkv tensor); floor:
at least 0.8x SDPA. Speed claims are the GPU's; on a machine without one, ``--stub`` replaces
every Triton launch by a no-op (under the interpreter) and times what is left, the wrapper's
Python, beside the same PyTorch op run on the CPU.
"""
from __future__ import annotations

import argparse
import contextlib
import csv
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from . import DEVICE, HAS_CUDA, TRITON_INTERPRET, native
from .impl import Impl, add_impl_argument, command_line, results_dir

#: The issue's floors: a course op may cost 1.5x the PyTorch op it replaces, or 1.5x a bare Triton
#: launch per kernel it launches, whichever is larger; a training step at least 0.8x SDPA's speed.
OP_FACTOR, LAUNCH_FACTOR, TRAINING_FLOOR = 1.5, 1.5, 0.8
FIELDS = ["kind", "key", "stage", "case", "kernels", "course_us", "torch_us", "bare_us", "ratio", "floor_us", "met",
          "course_host_us", "torch_host_us", "course_gpu_us", "torch_gpu_us", "clock", "course_1thread_us",
          "torch_1thread_us", "course_python_us", "native"]


# ----------------------------------------------------------------------------- the bare launch
def _bare_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def bare(X):
        tl.store(X, 1.0)
    return bare


_BARE = []


def bare_launch(x: torch.Tensor) -> None:
    """One launch of a one-line Triton kernel (one pointer argument, one program): Triton's floor."""
    if not _BARE:
        _BARE.append(_bare_kernel())
    _BARE[0][(1,)](x)


# ----------------------------------------------------------------------------- timing
def interleaved_us(fns: list[Callable[[], object]], *, rounds: int = 5, calls: int = 50, runs: int = 5) -> list[float]:
    """:func:`eager_us` of each of ``fns``, measured in turn ``rounds`` times, the median per function.
    A host's speed drifts (its clock, other work on the machine) by tens of percent within a minute;
    calls compared with each other are measured side by side, so a drift moves them together."""
    per = [[] for _ in fns]
    for _ in range(rounds):
        for times, fn in zip(per, fns):
            times.append(eager_us(fn, calls=calls, runs=runs))
    return [statistics.median(t) for t in per]


def eager_us(fn: Callable[[], object], *, calls: int = 50, runs: int = 15) -> float:
    """µs per call of ``fn()`` called back to back, synchronised before and after each batch of
    ``calls``; the median over ``runs`` batches (CPU: wall time, no GPU to wait for)."""
    sync = torch.cuda.synchronize if HAS_CUDA else (lambda: None)
    fn()
    sync()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e6 / calls)
    return statistics.median(times)


_CYCLES_PER_MS: list[float] = []


def _sleep_ms(ms: float) -> None:
    """Keep the GPU busy for about ``ms`` (torch.cuda._sleep spins a kernel for a number of cycles)."""
    if not _CYCLES_PER_MS:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.cuda._sleep(10_000_000)
        e.record()
        torch.cuda.synchronize()
        _CYCLES_PER_MS.append(10_000_000 / s.elapsed_time(e))
    torch.cuda._sleep(int(ms * _CYCLES_PER_MS[0]))


def host_and_gpu_us(fn: Callable[[], object], *, calls: int = 30, runs: int = 5) -> tuple[float, float]:
    """(host µs, GPU µs) per call of ``fn()``: the calls are issued while a sleeping kernel holds the
    GPU, so the host never waits for it (host µs: issuing them), and then run on the GPU back to
    back (GPU µs: CUDA events around them). Medians over ``runs``; the sleep grows until it outlasts
    the issuing."""
    fn()
    torch.cuda.synchronize()
    hosts, gpus, sleep = [], [], 5.0
    while len(hosts) < runs:
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        mark = torch.cuda.Event(enable_timing=True)
        mark.record()
        _sleep_ms(sleep)
        s.record()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        e.record()
        torch.cuda.synchronize()
        if (t1 - t0) * 1e3 > 0.8 * mark.elapsed_time(s):   # the GPU may have caught up: sleep longer
            sleep *= 2
            continue
        hosts.append((t1 - t0) * 1e6 / calls)
        gpus.append(s.elapsed_time(e) * 1e3 / calls)
    return statistics.median(hosts), statistics.median(gpus)


@contextlib.contextmanager
def stub_launches():
    """Every Triton launch becomes a no-op (the Triton interpreter only: ``TRITON_INTERPRET=1``, what
    ``import common`` sets without a GPU): what is left of a call is its wrapper's Python (checks,
    allocations, decisions, the custom-op dispatch) and the PyTorch ops it runs."""
    if not TRITON_INTERPRET:
        raise RuntimeError("stub_launches needs the Triton interpreter (a machine without a GPU, or TRITON_INTERPRET=1)")
    from triton.runtime.interpreter import InterpretedFunction
    run = InterpretedFunction.run
    InterpretedFunction.run = lambda self, *args, **kwargs: None
    try:
        yield
    finally:
        InterpretedFunction.run = run


# ----------------------------------------------------------------------------- the cases
@dataclass
class Case:
    """One course entry point at a launch-bound shape, beside the PyTorch op it replaces.
    ``make(load, device, dtype)`` builds the inputs and returns (course call, PyTorch call)."""
    key: str
    stage: str
    what: str
    kernels: int                 # launches of the course call (Triton kernels, the CUDA op, cuBLAS GEMMs)
    make: Callable
    cuda_only: bool = False      # a CUDA op: no interpreter path


def _randn(*shape, device, dtype, grad=False):
    return torch.randn(*shape, device=device, dtype=dtype).requires_grad_(grad)


def _add_bias(load, dev, dt):
    m = load("a03_fused_linear.add_bias")
    y, b = _randn(8, 64, device=dev, dtype=dt), _randn(64, device=dev, dtype=dt)
    return (lambda: m.add_bias(y, b)), (lambda: y + b)


def _fused_linear(backend):
    def make(load, dev, dt):
        m = load("a03_fused_linear.fused_linear")
        w, b, x = _randn(64, 64, device=dev, dtype=dt), _randn(64, device=dev, dtype=dt), _randn(8, 64, device=dev, dtype=dt)
        layer = m.FusedLinear(w, b, backend=backend)
        return (lambda: layer(x)), (lambda: F.linear(x, w, b))
    return make


def _cuda_gelu(load, dev, dt):
    m = load("a04_cuda_gelu.fused_gelu")
    x = _randn(8, 64, device=dev, dtype=dt)
    return (lambda: m.fused_gelu(x)), (lambda: F.gelu(x, approximate="tanh"))


def _triton_gelu(load, dev, dt):
    m = load("a05_triton_gelu.gelu_triton")
    x = _randn(8, 64, device=dev, dtype=dt)
    return (lambda: m.gelu(x)), (lambda: F.gelu(x, approximate="tanh"))


def _matmul(load, dev, dt):
    m = load("a06_matmul.matmul_triton")
    a, w = _randn(64, 64, device=dev, dtype=dt), _randn(64, 64, device=dev, dtype=dt)
    return (lambda: m.matmul(a, w)), (lambda: a @ w)


def _matmul_gelu(load, dev, dt):
    m = load("a06_matmul.matmul_triton")
    a, w, b = _randn(64, 64, device=dev, dtype=dt), _randn(64, 64, device=dev, dtype=dt), _randn(64, device=dev, dtype=dt)
    return (lambda: m.matmul(a, w, b, activation="gelu_tanh")), (lambda: F.gelu(torch.addmm(b, a, w), approximate="tanh"))


def _attn_inputs(dev, dt, grad, b=1, h=2, s=64, d=64):
    return [_randn(b, h, s, d, device=dev, dtype=dt, grad=grad) for _ in range(3)]


def _flash_fwd(load, dev, dt):
    m = load("a07_flash_attention.flash_triton")
    q, k, v = _attn_inputs(dev, dt, False)
    return (lambda: m.flash_attention(q, k, v, True)), (lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))


def _step(attn, q, k, v, do):
    """One autograd step through ``attn``: forward, backward with ``do``; the grads start empty."""
    def step():
        for t in (q, k, v):
            t.grad = None
        attn(q, k, v).backward(do)
    return step


def _flash_fwd_bwd(load, dev, dt):
    m = load("a07_flash_attention.flash_triton")
    q, k, v = _attn_inputs(dev, dt, True)
    do = torch.randn_like(q)
    return (_step(lambda q, k, v: m.flash_attention(q, k, v, True), q, k, v, do),
            _step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, k, v, do))


def _add_layernorm(load, dev, dt):
    m = load("a08_gpt2_inference.layernorm")
    x, r = _randn(4, 768, device=dev, dtype=dt), _randn(4, 768, device=dev, dtype=dt)
    w, b = _randn(768, device=dev, dtype=dt), _randn(768, device=dev, dtype=dt)

    def torch_op():
        h = x + r
        return h, F.layer_norm(h, (768,), w, b)
    return (lambda: m.add_layernorm(x, r, w, b)), torch_op


def _decode_attention(load, dev, dt):
    m = load("a08_gpt2_inference.decode_attention")
    b, h, s_max, d, length = 1, 12, 128, 64, 100
    q = _randn(b, h, d, device=dev, dtype=dt)
    kc, vc = _randn(b, h, s_max, d, device=dev, dtype=dt), _randn(b, h, s_max, d, device=dev, dtype=dt)
    lengths = torch.full((b,), length, dtype=torch.int32, device=dev)
    return (lambda: m.decode_attention(q, kc, vc, lengths)), (
        lambda: F.scaled_dot_product_attention(q[:, :, None], kc[:, :, :length], vc[:, :, :length]))


def _write_kv(load, dev, dt):
    m = load("a08_gpt2_inference.kv_cache")
    b, h, s_max, d, pos = 1, 12, 128, 64, 100
    qkv = _randn(b, 1, 3 * h * d, device=dev, dtype=dt)
    kc, vc = torch.zeros(b, h, s_max, d, device=dev, dtype=dt), torch.zeros(b, h, s_max, d, device=dev, dtype=dt)
    start = torch.full((b,), pos, dtype=torch.int32, device=dev)

    def torch_op():   # the slice assignments write_kv replaces
        _, k, v = qkv.view(b, 1, 3, h, d).unbind(2)
        kc[:, :, pos:pos + 1] = k.transpose(1, 2)
        vc[:, :, pos:pos + 1] = v.transpose(1, 2)
    return (lambda: m.write_kv(qkv, kc, vc, start)), torch_op


def _gemv(load, dev, dt):
    try:                                          # the reference: its tuned path's GEMV (solutions/ only)
        m = load("a08_gpt2_inference.tuned_gemv")
    except ModuleNotFoundError:                   # a student's tree: its core GEMV
        m = load("a08_gpt2_inference.gemv")
    x, w, b = _randn(1, 768, device=dev, dtype=dt), _randn(768, 768, device=dev, dtype=dt), _randn(768, device=dev, dtype=dt)
    return (lambda: m.gemv(x, w, b)), (lambda: torch.addmm(b, x, w))


CASES = [
    Case("a03_add_bias", "a03", "add_bias(y, b) vs y + b; y [8, 64]", 1, _add_bias),
    Case("a03_linear_addmm", "a03", "FusedLinear (addmm) vs F.linear; [8, 64] x 64->64", 1, _fused_linear("addmm")),
    Case("a03_linear_triton", "a03", "FusedLinear (triton: GEMM + add_bias_) vs F.linear", 2, _fused_linear("triton")),
    Case("a04_gelu", "a04", "fused_gelu (CUDA op) vs F.gelu(tanh); [8, 64]", 1, _cuda_gelu, cuda_only=True),
    Case("a05_gelu", "a05", "gelu (Triton custom op) vs F.gelu(tanh); [8, 64]", 1, _triton_gelu),
    Case("a06_matmul", "a06", "matmul vs a @ w; 64x64x64", 1, _matmul),
    Case("a06_matmul_gelu", "a06", "matmul + bias + GELU vs addmm + F.gelu; 64x64x64", 1, _matmul_gelu),
    Case("a07_fwd", "a07", "flash forward vs SDPA; B 1, H 2, S 64, d 64, causal", 1, _flash_fwd),
    Case("a07_fwd_bwd", "a07", "flash forward + backward (autograd) vs SDPA's; same shape", 4, _flash_fwd_bwd),
    Case("a08_add_layernorm", "a08", "add_layernorm vs x + r, F.layer_norm; [4, 768]", 1, _add_layernorm),
    Case("a08_decode_attention", "a08", "decode_attention vs SDPA on the cache; B 1, H 12, 100 of 128 keys", 2,
         _decode_attention),
    Case("a08_write_kv", "a08", "write_kv vs two slice assignments; B 1, T 1, H 12", 1, _write_kv),
    Case("a08_gemv", "a08", "gemv + bias vs addmm; [1, 768] x [768, 768]", 1, _gemv),
]

#: The training cases: (model, B, H, S) with d = 64, causal, bf16, GPT-2's layout (q, k, v views of one qkv
#: tensor [B, S, 3·H·d]). The floor applies at B·H 96-384 (the issue's GPT-2 small/medium training shapes);
#: the issue's S = 1000, B 2 case is reported beside them.
TRAINING = [("small", 8, 12, 1024), ("small", 32, 12, 512), ("small", 2, 12, 1000), ("medium", 8, 16, 1024),
            ("medium", 24, 16, 512)]


def _gpt2_qkv(b, h, s, d, dev, dt):
    """q, k, v [B, H, S, d] as GPT-2's attention makes them: head views of one leaf qkv [B, S, 3·H·d]."""
    qkv = _randn(b, s, 3 * h * d, device=dev, dtype=dt, grad=True)

    def split():
        return [t.view(b, s, h, d).transpose(1, 2) for t in qkv.split(h * d, dim=-1)]
    return qkv, split


def training_step(attn, b, h, s, d=64, *, dev="cuda", dt=torch.bfloat16):
    """A training step's attention: split a fused qkv leaf into heads, ``attn(q, k, v)`` causal, backward."""
    qkv, split = _gpt2_qkv(b, h, s, d, dev, dt)
    do = torch.randn(b, h, s, d, device=dev, dtype=dt)

    def step():
        qkv.grad = None
        q, k, v = split()
        attn(q, k, v).backward(do)
    return step


# ----------------------------------------------------------------------------- running
def floor_us(torch_us: float, bare_us: float, kernels: int) -> float:
    return max(OP_FACTOR * torch_us, LAUNCH_FACTOR * bare_us * kernels)


def _row(kind, stage, case, kernels, course, torch_, bare, floor, met, ch, th, cg, tg, clock, key="") -> dict:
    return dict(kind=kind, key=key, stage=stage, case=case, kernels=kernels, course_us=course, torch_us=torch_, bare_us=bare,
                ratio=course / torch_ if torch_ else float("nan"), floor_us=floor, met=met, course_host_us=ch,
                torch_host_us=th, course_gpu_us=cg, torch_gpu_us=tg, clock=clock)


def run_cases(impl: Impl, keys: list[str] | None = None, *, stub: bool = False, log=print) -> list[dict]:
    """Measure CASES (those in ``keys``, default all) for ``impl``: on a GPU for real, or with ``stub``
    under the interpreter (the wrappers' Python; the PyTorch op on the CPU)."""
    dev, dt = DEVICE, (torch.bfloat16 if HAS_CUDA else torch.float32)
    clock = "cpu-stub" if stub else "cuda"
    rows = []
    with stub_launches() if stub else contextlib.nullcontext():
        bx = torch.zeros(1, device=dev)
        bare, tbare = interleaved_us([lambda: bare_launch(bx), lambda: bx.add_(0)])
        rows.append(_row("op", "-", "bare Triton launch (1-line kernel) vs x.add_(0)", 1, bare, tbare, bare,
                         float("nan"), "", *[float("nan")] * 4, clock, key="bare"))
        if not stub:
            h1, g1 = host_and_gpu_us(lambda: bare_launch(bx))
            h2, g2 = host_and_gpu_us(lambda: bx.add_(0))
            rows[-1].update(course_host_us=h1, torch_host_us=h2, course_gpu_us=g1, torch_gpu_us=g2)
        log(f"[hostcost] bare launch {bare:.1f} us, x.add_(0) {tbare:.1f} us ({clock})")
        for case in CASES:
            if keys and case.key not in keys:
                continue
            if case.cuda_only and not HAS_CUDA:
                continue
            try:
                course, base = case.make(impl.load, dev, dt)
                for _ in range(3):          # compile, tune, build
                    course()
                    base()
                # the floor's bare launch is measured beside the case, in the same rounds
                c, t, bare = interleaved_us([course, base, lambda: bare_launch(bx)])
                hg = [float("nan")] * 4
                if not stub:
                    (ch, cg), (th, tg) = host_and_gpu_us(course), host_and_gpu_us(base)
                    hg = [ch, th, cg, tg]
            except Exception as e:  # noqa: BLE001 - one case that fails is reported, the others still run
                log(f"[hostcost] {case.key}: FAILED {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
                rows.append(_row("op", case.stage, case.what, case.kernels, float("nan"), float("nan"), bare,
                                 float("nan"), "failed", *[float("nan")] * 4, clock, key=case.key))
                continue
            fl = floor_us(t, bare, case.kernels)
            met = "" if stub else ("yes" if c <= fl else "no")
            rows.append(_row("op", case.stage, case.what, case.kernels, c, t, bare, fl, met, *hg, clock, key=case.key))
            log(f"[hostcost] {case.key}: {c:.1f} us vs {t:.1f} us ({c / t:.2f}x), floor {fl:.1f} us {met}")
    return rows


def run_training(impl: Impl, log=print) -> list[dict]:
    """Eager autograd steps, flash (the impl's a07) vs SDPA, at TRAINING's shapes: ms per step, the
    speed ratio (SDPA time / flash time) and the floor (TRAINING_FLOOR at B·H 96-384)."""
    m = impl.load("a07_flash_attention.flash_triton")
    ready = native.load(wait=True) is not None      # flash's native autograd (common.native), built once
    log(f"[hostcost] native autograd: {'ready' if ready else 'unavailable: ' + native.reason}")
    rows = []
    for model, b, h, s in TRAINING:
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


def _fmt(v, spec=".1f") -> str:
    return "-" if isinstance(v, float) and v != v else (format(v, spec) if isinstance(v, float) else str(v))


def markdown(rows: list[dict], command: str, device: str) -> str:
    ops = [r for r in rows if r["kind"] == "op"]
    train = [r for r in rows if r["kind"] == "training"]
    out = [f"# Host cost of an eager call: {device}", "", f"`{command}`", "",
           "Launch-bound shapes, bf16 (fp32 on the CPU). µs per call: **eager** = calls back to back, synchronised "
           "around each batch (median); **host** = the host's time to issue a call while the GPU is held busy; "
           "**GPU** = the calls' kernels run back to back. Floor: eager ≤ max(1.5 × PyTorch, 1.5 × bare launch × "
           "kernels).", "",
           "| stage | call | kernels | eager µs | PyTorch µs | ratio | floor µs | met | host µs (PyTorch) | GPU µs (PyTorch) |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for r in ops:
        out.append(f"| {r['stage']} | {r['case']} | {r['kernels']} | {_fmt(r['course_us'])} | {_fmt(r['torch_us'])} | "
                   f"{_fmt(r['ratio'], '.2f')}x | {_fmt(r['floor_us'])} | {r['met'] or '-'} | "
                   f"{_fmt(r['course_host_us'])} ({_fmt(r['torch_host_us'])}) | "
                   f"{_fmt(r['course_gpu_us'])} ({_fmt(r['torch_gpu_us'])}) |")
    if train:
        out += ["", "## Training step: flash attention forward + backward vs SDPA (eager, autograd)", "",
                "Speed = SDPA's time / flash's (≥ 0.8x at B·H 96-384). GPU alone: the same steps' kernels run back to "
                "back; host: issuing one step. Engine on one thread: the same eager steps under "
                "`torch.autograd.set_multithreading_enabled(False)`. By default the autograd engine runs a CUDA "
                "backward on its own device thread: the hand-off to it and back costs host time in every step, "
                "and a backward written in Python runs on a core that was idle. Flash's forward and backward replay "
                "from C++ once a shape's first backward has run (`common.native`; `native`: whether this step did); "
                "Python autograd: the same step with that turned off (`autograd.Function` in Python), in the same "
                "rounds.", "",
                "| case | flash ms | SDPA ms | speed | met | native | flash, Python autograd ms (speed) "
                "| GPU alone: flash / SDPA ms (speed) | host µs: flash / SDPA "
                "| engine on one thread: flash / SDPA ms (speed) |",
                "|---|---|---|---|---|---|---|---|---|---|"]
        for r in train:
            out.append(f"| {r['case']} | {r['course_us'] / 1e3:.3f} | {r['torch_us'] / 1e3:.3f} | {r['ratio']:.2f}x | "
                       f"{r['met'] or '-'} | {'yes' if r.get('native') else 'no'} | " + (
                           f"{r['course_python_us'] / 1e3:.3f} ({r['torch_us'] / r['course_python_us']:.2f}x)"
                           if r.get("course_python_us") else "-") + f" | {r['course_gpu_us'] / 1e3:.3f} / {r['torch_gpu_us'] / 1e3:.3f} "
                       f"({r['torch_gpu_us'] / r['course_gpu_us']:.2f}x) | {r['course_host_us']:.0f} / "
                       f"{r['torch_host_us']:.0f} | " + (
                           f"{r['course_1thread_us'] / 1e3:.3f} / {r['torch_1thread_us'] / 1e3:.3f} "
                           f"({r['torch_1thread_us'] / r['course_1thread_us']:.2f}x) |"
                           if r.get("course_1thread_us") else "- |"))
    return "\n".join(out) + "\n"


def write(rows: list[dict], out: Path, name: str, command: str, device: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"{name}.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.3f}" if isinstance(v, float) else v) for k, v in r.items()})
    (out / f"{name}.md").write_text(markdown(rows, command, device))


def compare(before: Path, after: Path, *, tolerance: float = 1.05) -> int:
    """Print after/before per case (eager and GPU time); 1 if a GPU time got worse by more than ``tolerance``."""
    def load(p):
        with open(p, newline="") as f:
            return {r["case"]: r for r in csv.DictReader(f)}
    b, a = load(before), load(after)
    worse = []
    print(f"{'case':<70} {'eager before':>12} {'after':>8} {'x':>6}   {'GPU before':>10} {'after':>8}")
    for case, ra in a.items():
        rb = b.get(case)
        if rb is None:
            continue
        eb, ea, gb, ga = (float(rb["course_us"]), float(ra["course_us"]), float(rb["course_gpu_us"]),
                          float(ra["course_gpu_us"]))
        print(f"{case[:70]:<70} {eb:>12.1f} {ea:>8.1f} {eb / ea:>5.2f}x   {gb:>10.1f} {ga:>8.1f}")
        if ga > tolerance * gb and ga - gb > 1.0:    # 1 µs: the timer's spread at these sizes
            worse.append(case)
    for case in worse:
        print(f"GPU time got worse: {case}")
    return 1 if worse else 0


def profile_case(impl: Impl, key: str, *, stub: bool, calls: int = 2000, top: int = 18) -> str:
    """cProfile of ``calls`` calls of one case's course call: where its host microseconds go."""
    import cProfile
    import io
    import pstats
    case = next((c for c in CASES if c.key == key), None)
    if case is None:
        raise SystemExit(f"--profile: no case {key!r}; cases: {', '.join(c.key for c in CASES)}")
    with stub_launches() if stub else contextlib.nullcontext():
        course, _ = case.make(impl.load, DEVICE, torch.bfloat16 if HAS_CUDA else torch.float32)
        for _ in range(3):
            course()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(calls):
            course()
        prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(top)
    return s.getvalue()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_impl_argument(ap)
    ap.add_argument("--stub", action="store_true", help="no GPU: stub the Triton launches, time the wrappers' Python")
    ap.add_argument("--cases", default="", help="comma-separated case keys (default: all), e.g. a05_gelu,a07_fwd")
    ap.add_argument("--no-training", action="store_true", help="skip the training-shape cases")
    ap.add_argument("--profile", metavar="CASE", help="cProfile one case's calls and print where the time goes")
    ap.add_argument("--compare", nargs=2, metavar=("BEFORE_CSV", "AFTER_CSV"), help="compare two runs")
    ap.add_argument("--out", type=Path, help="folder for hostcost.md/.csv (default: the impl's results folder)")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(Path(args.compare[0]), Path(args.compare[1]))
    impl = Impl.get(args.impl)
    stub = args.stub or not HAS_CUDA
    if args.profile:
        print(profile_case(impl, args.profile, stub=stub))
        return 0
    keys = [k for k in args.cases.split(",") if k] or None
    rows = run_cases(impl, keys, stub=stub)
    if not stub and not args.no_training:
        rows += run_training(impl)
    device = torch.cuda.get_device_name() if not stub else "CPU, Triton launches stubbed (the wrappers' Python)"
    name = "hostcost" if not stub else "hostcost_cpu_stub"
    out = args.out or results_dir(impl)
    write(rows, out, name, command_line("common.hostcost", argv), device)
    print(markdown(rows, command_line("common.hostcost", argv), device))
    print(f"[hostcost] wrote {out / name}.md and .csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
