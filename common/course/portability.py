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

    python -m common.course.portability                      # solutions/, the quick tier (TIERS): a table
    python -m common.course.portability --full --jobs 2       # every family, dtype and variant (~40 min on 2 cores)
    python -m common.course.portability --impl assignments --archs sm_86,sm_75 --json out.json
    python -m common.course.portability --full --update       # refresh tests/data/portability_facts.json

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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from common.gpu import ARCHS, Arch
from common.impl import add_impl_argument


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
#: config, Triton). ``python -m common.course.portability --update`` refreshes it; the test compiles what is
#: missing and, to keep the file honest, a few kernels it holds (common.course.portability.verify).
FACTS_FILE = Path(__file__).resolve().parents[2] / "tests" / "data" / "portability_facts.json"


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
# Each stage's spec module (solutions/aNN_name/stage.py) has a ``portability_launches(load, archs, full)``
# that yields the Launches of the stage as its launcher makes them: the dtypes,
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


def _next_pow2(n: int) -> int:
    return 1 << (max(n, 1) - 1).bit_length()


def makers() -> dict:
    """stage key -> its ``portability_launches(load, archs, full)`` (the stage's spec module,
    solutions/aNN_name/stage.py), for the stages that launch Triton kernels."""
    from common.course.stages import STAGE_MODULES
    return {m.STAGE.key: m.portability_launches for m in STAGE_MODULES if hasattr(m, "portability_launches")}


def launches(impl=None, archs: list[Arch] | None = None, stages=None, full: bool = False) -> list[Launch]:
    """Every Triton kernel launch the course's stages make (``stages``: those keys, default all; ``full``:
    the full tier, see TIERS), from the impl's modules (default: COURSE_IMPL)."""
    from common.impl import Impl
    impl = Impl.get(impl)
    archs = archs if archs is not None else list(ARCHS.values())
    make = makers()
    return [lch for s in (stages or make) for lch in make[s](impl.load, archs, full)]


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
    add_impl_argument(ap, default="solutions", help="the tree whose kernels are compiled")
    ap.add_argument("--archs", default=",".join(ARCHS), help=f"comma-separated, of {', '.join(ARCHS)}")
    stages = list(makers())
    ap.add_argument("--stages", default=",".join(stages), help=f"comma-separated, of {', '.join(stages)}")
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
        return subprocess.run([sys.executable, "-m", "common.course.portability", *(argv if argv is not None else sys.argv[1:])],
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
                   set(args.stages.split(",")) == set(stages))
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
