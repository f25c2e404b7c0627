"""Cross-compiling the course's Triton kernels for GPUs the machine does not have.

Triton compiles for any NVIDIA architecture without a GPU: ``triton.compile(ASTSource(...),
target=GPUTarget("cuda", 86, 32))`` runs Triton's passes for sm_86 and the ptxas it bundles
(no driver needed), and the compiled kernel's metadata says how much shared memory it asks for.
This module builds each kernel exactly as its launcher would on that GPU (the same
specialisation of the arguments, the same constexprs, warps and stages, the config the launcher
or autotuner would pick there), compiles it for every family in ``common.gpu.ARCHS`` and checks
it against that family's limits:

* shared memory: Triton's dynamic ``shared`` plus the cubin's static shared memory must fit the
  family's per-block maximum (what a launch would otherwise fail with: OutOfResources);
* registers: the cubin's registers per thread (cuobjdump) times the block's threads must fit the
  65536 registers of a block; spills (local memory) are reported, not failed.

    python -m common.portability                      # solutions/, the quick tier (TIERS): a table
    python -m common.portability --full --jobs 2       # every family, dtype and variant (~40 min on 2 cores)
    python -m common.portability --impl assignments --archs sm_86,sm_75 --json out.json
    python -m common.portability --full --update       # refresh tests/data/portability_facts.json

A launcher that picks its config per GPU (the matmul autotuner's pruning, the attention tables'
fallback) is followed for each family: the candidates ``configs_for`` keeps there, the first of
``smaller_configs`` that fits there. Facts of earlier compiles are read from FACTS_FILE, keyed by
Triton's own cache key (``compile_key``), so a run compiles only what changed.

``tests/test_portability.py`` runs it (on a CPU-only machine too) and fails on any kernel that
does not compile or fit. It must run with the Triton interpreter off (a Triton kernel is then a
``JITFunction``): the command line re-runs itself with ``TRITON_INTERPRET=0`` when needed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from common.gpu import ARCHS, Arch


@dataclass(frozen=True)
class Launch:
    """One kernel as a launcher builds it: ``fn[grid](*args, **kwargs)``, with torch dtypes standing in
    for tensors (16-byte aligned, as the course's allocations are) and ints for sizes and strides
    (a stride that is not a multiple of 16 stays unspecialised, as at run time)."""
    stage: str
    kernel: str
    label: str                     # the config and what it is launched with, for the table
    fn: object                     # the JITFunction
    args: tuple
    kwargs: dict
    #: the families this launch is made on (None: all); a launcher that picks its config per GPU
    #: yields one Launch per family
    archs: tuple[str, ...] | None = None
    #: kwargs the launcher falls back to, in order, where the one before does not fit the GPU's shared
    #: memory (Triton's OutOfResources: its dynamic shared memory > the device's per-block maximum)
    fallbacks: tuple[dict, ...] = ()

    def for_arch(self, arch: str) -> bool:
        return self.archs is None or arch in self.archs


@dataclass
class Result:
    stage: str
    kernel: str
    label: str
    arch: str
    ok: bool
    shared: int = 0                # bytes: Triton's dynamic shared memory + the cubin's static
    limit: int = 0
    regs: int = 0                  # registers per thread
    threads: int = 0
    spill: int = 0                 # stack-frame / local-memory bytes per thread (spilled registers)
    mma: bool = False              # tl.dot on tensor cores (False: FMA on CUDA cores)
    seconds: float = 0.0
    compiled: int = 0              # kernels compiled for it in this run (0: all facts known before)
    problems: list[str] = field(default_factory=list)


# ============================================================================ compiling
def _cuobjdump() -> str:
    import triton
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")


def resource_usage(cubin: bytes) -> dict[str, int]:
    """REG, SHARED (static), LOCAL, STACK of the one kernel in a cubin (the bundled cuobjdump)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([_cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    line = next(l for l in out.splitlines() if "REG:" in l)
    return {k: int(v) for k, v in (kv.split(":") for kv in line.split() if kv.split(":")[0] in
                                    ("REG", "SHARED", "LOCAL", "STACK"))}


def _source(launch: Launch, arch: Arch):
    """(ASTSource, GPUTarget, options) of ``launch`` on ``arch``: what ``JITFunction.run`` hands to
    ``triton.compile`` on such a GPU (the binder's specialisation of the arguments, _pack_args)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import MockTensor, create_function_from_signature

    fn = launch.fn
    target = GPUTarget("cuda", arch.arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = dict(launch.kwargs)
    args = [MockTensor.wrap_dtype(a) for a in launch.args]
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, options)
    return ASTSource(fn, signature, constexprs, attrs), target, options


def compile_launch(launch: Launch, arch: Arch):
    """Compile ``launch`` for ``arch`` as ``JITFunction.run`` would on such a GPU; the CompiledKernel."""
    import triton
    src, target, options = _source(launch, arch)
    return triton.compile(src, target=target, options=options.__dict__)


def compile_key(launch: Launch, arch: Arch) -> str:
    """The key Triton's own cache files ``launch``'s compile for ``arch`` under (triton.compile): the
    Triton build, the kernel's source and every function it calls, the specialisation, constexprs,
    options, the target and ptxas's version. Equal keys, equal compiled kernels."""
    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.compiler import make_backend
    from triton.runtime.cache import get_cache_key
    src, target, options = _source(launch, arch)
    backend = make_backend(target)
    key = get_cache_key(src, backend, backend.parse_options(options.__dict__), get_cache_invalidating_env_vars())
    return hashlib.sha256(key.encode()).hexdigest()


def facts_of(kernel) -> dict:
    """What the checks need of a compiled kernel: Triton's dynamic shared memory, the cubin's static
    shared memory, registers per thread and spills (cuobjdump), warps, and whether tl.dot became mma."""
    use = resource_usage(kernel.asm["cubin"])
    return {"dynamic": int(kernel.metadata.shared), "static": use.get("SHARED", 0), "regs": use.get("REG", 0),
            # ptxas puts spilled registers in the stack frame (local memory)
            "spill": max(use.get("LOCAL", 0), use.get("STACK", 0)), "warps": int(kernel.metadata.num_warps),
            "mma": "nvidia_mma" in kernel.asm.get("ttgir", "")}


#: Facts of kernels compiled before, by compile_key: the cross-compile of every course kernel for five
#: GPU families takes minutes on two cores, and a key only changes with what it compiles (a kernel, a
#: config, Triton). ``python -m common.portability --update`` refreshes it; the test compiles what is
#: missing and, to keep the file honest, a few kernels it holds (common.portability.verify).
FACTS_FILE = Path(__file__).resolve().parent.parent / "tests" / "data" / "portability_facts.json"


class Facts:
    """compile_key -> facts, read from FACTS_FILE (``use_file``) and filled by compiling what is missing."""

    def __init__(self, use_file: bool = True):
        self.known: dict[str, dict] = json.loads(FACTS_FILE.read_text()) if use_file and FACTS_FILE.exists() else {}
        self.compiled: dict[str, dict] = {}      # compiled in this run
        self.used: set[str] = set()              # keys this run looked up
        self.lock = threading.Lock()

    def get(self, launch: Launch, arch: Arch) -> tuple[dict, bool]:
        """(facts, compiled now) of ``launch`` on ``arch``."""
        key = compile_key(launch, arch)
        with self.lock:
            self.used.add(key)
            hit = self.compiled.get(key) or self.known.get(key)
        if hit is not None:
            return hit, False
        facts = facts_of(compile_launch(launch, arch))
        with self.lock:
            self.compiled[key] = facts
        return facts, True

    def save(self, prune: bool = False) -> None:
        """Write the facts known and compiled to FACTS_FILE; ``prune`` (after a full-tier run): only those
        this run used, so that kernels no longer launched leave the file."""
        FACTS_FILE.parent.mkdir(parents=True, exist_ok=True)
        facts = {**self.known, **self.compiled}
        facts = dict(sorted((k, v) for k, v in facts.items() if not prune or k in self.used))   # a kernel a line
        FACTS_FILE.write_text("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}"
                                                 for k, v in facts.items()) + "\n}\n")


def check(launch: Launch, arch: Arch, facts: Facts | None = None) -> Result:
    """Compile ``launch`` for ``arch`` (walking its fallbacks as the launcher would, where the kernel
    does not fit) and check what runs against the family's limits."""
    facts = facts or Facts(use_file=False)
    t0 = time.perf_counter()
    r = Result(launch.stage, launch.kernel, launch.label, arch.name, ok=False, limit=arch.smem_per_block)
    for i, kwargs in enumerate((launch.kwargs, *launch.fallbacks)):
        try:
            f, compiled = facts.get(replace(launch, kwargs=kwargs), arch)
        except Exception as e:  # noqa: BLE001 - a compile error is a finding, reported with its message
            r.problems.append(f"does not compile: {type(e).__name__}: {str(e).strip().splitlines()[0][:300]}")
            r.seconds = round(time.perf_counter() - t0, 2)
            return r
        r.compiled += compiled
        # Triton's own check at the launch (CompiledKernel._init_handles): dynamic shared memory > the maximum
        if f["dynamic"] <= arch.smem_per_block or i == len(launch.fallbacks):
            break
    if i:
        r.label += f" -> falls back to {_kw_str(kwargs)}"
    r.shared = f["dynamic"] + f["static"]
    r.regs, r.threads, r.spill, r.mma = f["regs"], f["warps"] * 32, f["spill"], f["mma"]
    if r.shared > arch.smem_per_block:
        r.problems.append(f"shared memory {r.shared} B > {arch.smem_per_block} B per block on {arch.name} "
                          f"({arch.gpus})")
    if r.regs > arch.max_regs_per_thread or r.regs * r.threads > arch.regs_per_block:
        r.problems.append(f"{r.regs} registers x {r.threads} threads > {arch.regs_per_block} per block")
    r.ok = not r.problems
    r.seconds = round(time.perf_counter() - t0, 2)
    return r


def _kw_str(kw: dict) -> str:
    return (f"{kw['BLOCK_M']}x{kw['BLOCK_N']} w{kw['num_warps']} s{kw['num_stages']}" if "BLOCK_N" in kw and "BLOCK_M" in kw
            else str(kw))


def run(launches: list[Launch], archs: list[Arch], jobs: int = 4, facts: Facts | None = None) -> list[Result]:
    """Every launch compiled for every arch it is made on, ``jobs`` compiles at a time (Triton's
    passes and ptxas run outside the GIL)."""
    facts = facts or Facts(use_file=False)
    work = [(lch, a) for a in archs for lch in launches if lch.for_arch(a.name)]
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        return list(pool.map(lambda la: check(*la, facts), work))


def verify(facts: Facts, launches: list[Launch], archs: list[Arch], n: int, seed: int | None = None) -> list[str]:
    """Compile ``n`` launches whose facts came from FACTS_FILE, drawn at random, and compare: the file must
    say what the compiler says. Returns the mismatches."""
    import random
    rng = random.Random(seed)
    pool = [(lch, a) for a in archs for lch in launches if lch.for_arch(a.name)]
    rng.shuffle(pool)
    bad, done = [], 0
    for lch, a in pool:
        if done >= n:
            break
        key = compile_key(lch, a)
        if key not in facts.known:
            continue
        done += 1
        from triton import knobs
        with knobs.compilation.scope():       # a compile of its own, not Triton's on-disk cache
            knobs.compilation.always_compile = True
            now = facts_of(compile_launch(lch, a))
        if now != facts.known[key]:
            bad.append(f"{lch.kernel} {lch.label} on {a.name}: {FACTS_FILE.name} says {facts.known[key]}, "
                       f"the compiler {now}")
    return bad


# ============================================================================ what the course launches
# Each function below yields the Launches of one stage as its launcher makes them: the dtypes,
# constexprs, warps and stages of every config the launcher or its autotuner can pick. Configs are
# read from the impl's own modules (given code, the same in assignments/ and solutions/), so a
# config table edited there is what gets compiled. Tensor arguments are 16-byte aligned and strides
# multiples of 16 elements, as the course's allocations are, except where a path exists for rows
# that are not (the matmul's PREFETCH configs).
BF16, FP16, FP32 = "bfloat16", "float16", "float32"
#: The cross-compile's two sizes. "quick" (the test's default, CI): every config the launchers and
#: autotuners pick on sm_80, sm_86 and sm_89, in bf16 and fp32 (fp16 has bf16's sizes and layouts);
#: on sm_90 the fixed configs (the H100's tables must fit as they are); on sm_75 the kernels without
#: tl.dot and the fixed matmul configs (Triton 3.6 compiles a tl.dot for sm_75 to FMA code, 10-40 s a
#: kernel). "full" (COURSE_PORTABILITY=full, --full): every family, fp16 too, fp32 with IEEE dots at
#: every head dim, the matmul's aligned configs on unaligned rows, b K-major, head dims 16 and 32, not causal.
TIERS = ("quick", "full")
TENSOR_CORE_ARCHS = ("sm_80", "sm_86", "sm_89")


def _dt(name: str):
    import torch
    return getattr(torch, name)


def _dtypes(full: bool, arch: str | None = None) -> tuple[str, ...]:
    return (FP32, BF16, FP16) if full or arch == "sm_75" else (FP32, BF16)


def _a03(load, full: bool) -> Iterator[Launch]:
    mod = load("a03_fused_linear.add_bias")
    for n in (1, 768, 50257):                  # BLOCK_N 1 .. 256, BLOCK_M 64 .. 16 (add_bias._launch)
        bn = min(_next_pow2(n), 256)
        bm = max(1, min(64, 4096 // bn))
        for dt in _dtypes(full) if full else (BF16,):
            yield Launch("a03", "add_bias_kernel", f"{dt} BLOCK_M={bm} BLOCK_N={bn}", mod.add_bias_kernel,
                         (_dt(dt),) * 3 + (4096, n, n, 1, n, 1), dict(BLOCK_M=bm, BLOCK_N=bn))


def _a05(load, full: bool) -> Iterator[Launch]:
    mod = load("a05_triton_gelu.gelu_triton")
    for c in mod.gelu_kernel.configs:          # every autotune candidate
        for dt in _dtypes(full) if full else (BF16,):
            yield Launch("a05", "gelu_kernel", f"{dt} BLOCK={c.kwargs['BLOCK']} warps={c.num_warps}", mod.gelu_kernel.fn,
                         (_dt(dt), _dt(dt), 1 << 26), dict(c.kwargs, num_warps=c.num_warps, num_stages=c.num_stages))


#: The matmul calls whose config sets differ (matmul_triton.configs_for): (what, M, K, aligned).
MATMUL_CALLS = (("M>64", 4096, 768, True), ("M>64 long K", 4096, 4096, True), ("M<=64", 16, 768, True),
                ("M>64 unaligned", 4095, 4095, False), ("M<=64 unaligned", 16, 4095, False))
#: (input dtype, INPUT_PRECISION, b's layout, full tier only): 16-bit; fp32 on TF32 tensor cores with b
#: N-major (launched as C^T = B^T A^T, SWAP_AB, at M > 64) and K-major; fp32 with IEEE dots
#: (allow_tf32=False: stage 8's fp32 engine).
MATMUL_KINDS = ((BF16, "ieee", "n-major", False), (FP32, "tf32", "n-major", False), (FP16, "ieee", "n-major", True),
                (FP32, "tf32", "k-major", True), (FP32, "ieee", "n-major", True))


def _matmul_launch(mod, arch: str, what: str, dt: str, prec: str, layout: str, m: int, k: int, aligned: bool,
                   config: tuple, prefetch: bool) -> Launch:
    n = 3072 if aligned else 4095
    swap = prec == "tf32" and m > 64 and layout == "n-major"
    mm, nn = (n, m) if swap else (m, n)
    # strides of (x, y, z) as matmul() passes them: a [M, K] row-major, b [K, N] N-major (Conv1D's
    # weight) or K-major (nn.Linear's weight.t()), c [M, N]; swapped: (b^T, a^T, c^T)
    sa, sb, sc = (k, 1), ((n, 1) if layout == "n-major" else (1, k)), (n, 1)
    if swap:
        sa, sb, sc = (sb[1], sb[0]), (sa[1], sa[0]), (sc[1], sc[0])
    bm, bn, bk, w, s = config
    kw = dict(HAS_BIAS=True, ACTIVATION="gelu_tanh", INPUT_PRECISION=prec, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
              GROUP_M=8, EVEN_K=k % bk == 0, DOT_FP32=False, FAST_TANH=dt != FP32, PREFETCH=prefetch, SWAP_AB=swap,
              num_warps=w, num_stages=s)
    t = _dt(dt)
    return Launch("a06", "matmul_kernel", f"{what} {dt} {prec} b {layout}{' swapped' if swap else ''}: "
                  f"{bm}x{bn}x{bk} w{w} s{s}{' PREFETCH' if prefetch else ''}",
                  mod.matmul_kernel, (t, t, t, t, mm, nn, k, *sa, *sb, *sc, 1), kw, (arch,))


def _a06(load, archs: list[Arch], full: bool) -> Iterator[Launch]:
    mod = load("a06_matmul.matmul_triton")
    for arch in archs:
        limits = (arch.capability, arch.smem_per_block)
        if full or arch.name in TENSOR_CORE_ARCHS:
            for dt, prec, layout, full_only in MATMUL_KINDS:
                if full_only and not full:
                    continue
                size = _dt(dt).itemsize
                for what, m, k, aligned in MATMUL_CALLS:
                    if layout == "k-major" and (m <= 64 or not aligned):
                        continue               # the same configs as n-major there (no swap)
                    for config, prefetch in mod.configs_for(m, k, size, aligned, limits):   # the autotuner's
                        if not aligned and not full and (config, prefetch) in mod.configs_for(m, k, size, True, limits):
                            continue           # an aligned config on unaligned rows: no cp.async ring, less shared memory
                        yield _matmul_launch(mod, arch.name, f"autotune {what}", dt, prec, layout, m, k, aligned,
                                             config, prefetch)
        for name in ("TINY_CONFIG", "SWEEP_CONFIG"):                  # the fixed configs, fitted as matmul() does
            for dt, prec in ((BF16, "ieee"), (FP32, "tf32"), (FP32, "ieee")):
                if name == "SWEEP_CONFIG" and dt == FP32:
                    continue                   # the bench's tile-quantization sweep is bf16
                size = _dt(dt).itemsize
                config = mod.fit_config(getattr(mod, name), size, limits)
                yield _matmul_launch(mod, arch.name, name, dt, prec, "n-major", 4096 if name == "SWEEP_CONFIG" else 16,
                                     768, True, config, False)


def _flash_args(d: int, dt: str, kind: str) -> tuple:
    t, f = _dt(dt), _dt(FP32)
    strides = (12 * 4096 * d, 4096 * d, d, 1)
    tensors = {"fwd": (t, t, t, t, f), "dkdv": (t, t, t, t, f, f, t, t), "dq": (t, t, t, t, f, f, t)}[kind]
    grads = () if kind == "fwd" else strides[:3]     # the backward kernels' dQ / dK, dV layout (contiguous here)
    return (*tensors, *strides * 4, *grads, 12, 4096, 4096, 0.125)


def _a07(load, archs: list[Arch], full: bool) -> Iterator[Launch]:
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


def _a08(load, archs: list[Arch], full: bool) -> Iterator[Launch]:
    from common.impl import Impl
    load_solutions = Impl.get("solutions").load
    ln = load("a08_gpt2_inference.layernorm")
    dec = load("a08_gpt2_inference.decode_attention")
    kv = load("a08_gpt2_inference.kv_cache")
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


def _next_pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


STAGES = ("a03", "a05", "a06", "a07", "a08")


def launches(impl=None, archs: list[Arch] | None = None, stages=STAGES, full: bool = False) -> list[Launch]:
    """Every Triton kernel launch the course's stages make (``full``: the full tier, see TIERS), from the
    impl's modules (default: COURSE_IMPL)."""
    from common.impl import Impl
    impl = Impl.get(impl)
    archs = archs if archs is not None else list(ARCHS.values())
    makers = {"a03": lambda: _a03(impl.load, full), "a05": lambda: _a05(impl.load, full),
              "a06": lambda: _a06(impl.load, archs, full), "a07": lambda: _a07(impl.load, archs, full),
              "a08": lambda: _a08(impl.load, archs, full)}
    return [lch for s in stages for lch in makers[s]()]


# ============================================================================ command line
def table(results: list[Result]) -> str:
    """One line per compiled kernel: stage, kernel, arch, shared memory against the limit, registers, spills."""
    head = f"{'stage':5} {'arch':5} {'kernel':22} {'shared B':>9} {'limit B':>8} {'regs':>4} {'thr':>4} {'spill':>5} " \
           f"{'mma':3} {'s':>5}  config"
    rows = [head, "-" * len(head)]
    for r in sorted(results, key=lambda r: (r.stage, r.arch, r.kernel, r.label)):
        rows.append(f"{r.stage:5} {r.arch:5} {r.kernel:22} {r.shared:9d} {r.limit:8d} {r.regs:4d} {r.threads:4d} "
                    f"{r.spill:5d} {'yes' if r.mma else 'no':3} {r.seconds:5.1f}  {r.label}"
                    + ("" if r.ok else "   <-- " + "; ".join(r.problems)))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--impl", default="solutions", help="the tree whose kernels are compiled (default: solutions)")
    ap.add_argument("--archs", default=",".join(ARCHS), help=f"comma-separated, of {', '.join(ARCHS)}")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {', '.join(STAGES)}")
    ap.add_argument("--full", action="store_true", help="the full tier (see TIERS): every family, dtype and variant")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiles at a time")
    ap.add_argument("--no-facts", action="store_true", help=f"compile everything (ignore {FACTS_FILE.name})")
    ap.add_argument("--update", action="store_true", help=f"write what this run compiled or knew to {FACTS_FILE.name}")
    ap.add_argument("--verify", type=int, default=0, metavar="N", help=f"compile N kernels {FACTS_FILE.name} knows "
                    "(drawn at random) and check that the file says what the compiler says")
    ap.add_argument("--json", default=None, help="write the results here (a list of objects)")
    ap.add_argument("-q", "--quiet", action="store_true", help="no table: the summary and what does not fit")
    args = ap.parse_args(argv)
    import common
    if common.TRITON_INTERPRET:   # a kernel must be a JITFunction: run again with the interpreter off
        env = dict(os.environ, TRITON_INTERPRET="0")
        return subprocess.run([sys.executable, "-m", "common.portability", *(argv if argv is not None else sys.argv[1:])],
                              env=env).returncode
    archs = [ARCHS[a] for a in args.archs.split(",")]
    t0 = time.perf_counter()
    facts = Facts(use_file=not args.no_facts)
    work = launches(args.impl, archs, args.stages.split(","), full=args.full)
    results = run(work, archs, args.jobs, facts)
    bad = [r for r in results if not r.ok]
    mismatched = verify(facts, work, archs, args.verify) if args.verify else []
    if args.update:
        facts.save(prune=args.full and set(args.archs.split(",")) == set(ARCHS) and
                   set(args.stages.split(",")) == set(STAGES))
    if args.json:
        with open(args.json, "w") as f:
            json.dump([asdict(r) for r in results], f, indent=1)
    print(table(results if not args.quiet else bad) if results and (bad or not args.quiet) else "", end="")
    print(f"\n{len(results)} kernels for {', '.join(a.name for a in archs)} ({'full' if args.full else 'quick'} tier) in "
          f"{time.perf_counter() - t0:.0f} s, {args.jobs} compiles at a time: {len(facts.compiled)} compiled, the rest "
          f"known from {FACTS_FILE.name}; {len(bad)} do not fit or do not compile"
          + (f"; {args.verify} known ones compiled again, {len(mismatched)} differ from the file" if args.verify else ""),
          flush=True)
    for m in mismatched:
        print("  MISMATCH", m)
    return 1 if bad or mismatched else 0


if __name__ == "__main__":
    sys.exit(main())
