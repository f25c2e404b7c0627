"""Stage 6, the tiled matmul (Triton, and the CUDA versions this GPU runs): trials, long K, speed cases."""
from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.nn.functional as F

from common import HAS_CUDA, gpu
from common import reference as ref
from common.roofline import matmul_bytes, matmul_flops
from common.shapes import GPT2_MODELS, gpt2_gemms
from common.kernel_check import (ACT_KERNELS, ATEN_KERNELS, BLAS_KERNELS, TORCH_ARITH, TORCH_GELU, TORCH_GEMM,
                                 Forbidden, input_copies)
from common.testing import REL_TOL, calibrated_tol, rel_error, torch_matmul
from common.gpu import Arch
from common.course.portability import BF16, FP16, FP32, TENSOR_CORE_ARCHS, Launch, _dt
from common.course.stages.base import (Perf, Run, Stage, Trial, _call, _cuda_randn, _gen, _no_copies, _randn, _refilled,
                                       _twice, _with_repeat)


# ----------------------------------------------------------------------------- what the graded calls may not call
#: a06: the matmul kernels (Triton, CUDA versions 1-7), epilogue included.
MATMUL_KERNEL = Forbidden(TORCH_GEMM + TORCH_ARITH + TORCH_GELU, BLAS_KERNELS + ATEN_KERNELS + ACT_KERNELS)


def _matmul_tol(a: torch.Tensor, b: torch.Tensor, expected: torch.Tensor) -> float:
    """c x torch.matmul's own error on these inputs (same dtype and device), or the dtype's floor."""
    return calibrated_tol(rel_error(torch_matmul(a, b), expected), a.dtype)


#: Long-K trials: K >= 4096 on a GPU, where an accumulator rounded to 16 bits on every K step
#: costs several times cuBLAS's error; K = 4096 under the interpreter (32 steps of 128).
LONG_K = (4096, 4608) if not HAS_CUDA else (4096, 8192)


@_call
def a06_triton(r: Run, a, b, allow_tf32: bool = True):
    return r.load("a06_matmul.matmul_triton").matmul(a, b, allow_tf32=allow_tf32)


@_call
def a06_triton_twice(r: Run, a, b, x2):
    mm = r.load("a06_matmul.matmul_triton").matmul
    return mm(a, b), mm(_refilled(a, x2), b)


@_call
def a06_linear_gelu(r: Run, x, weight, bias):
    """The fused Linear + GELU (nn.Linear's weight [N, K], read as a transposed view)."""
    mod = r.load("a06_matmul.matmul_triton")
    out, copies = input_copies(lambda: mod.linear_gelu(x, weight, bias), weight=weight)
    r.fact("copies", copies)
    return out


@_call
def a06_cuda(r: Run, a, b, version: int):
    return r.load("a06_matmul.matmul_cuda").matmul(a, b, version)


def _a06_cuda_versions() -> tuple[int, ...]:
    """The CUDA matmul versions this GPU runs: 1-4 everywhere, 5-6 on sm_80+, 7 on sm_90 (gpu.NEEDS)."""
    return tuple(v for v in range(1, 8) if f"a06 v{v}" not in gpu.NEEDS or gpu.why_not(f"a06 v{v}") is None)


def _a06_not_here() -> list[str]:
    """What of stage 6 this GPU cannot run, so the grader did not try it: the reasons, naming the GPU."""
    if not HAS_CUDA:
        return []
    return [f"not graded on this GPU: {gpu.why_not(f'a06 v{v}')}" for v in range(5, 8)
            if v not in _a06_cuda_versions()]


def _a06_trials(rng):
    g = _gen(rng)
    small = 72 if not HAS_CUDA else 700
    dtypes = (torch.float16, torch.bfloat16, torch.float32)

    def build(r, g, i):
        dtype = dtypes[i]
        m, n, k = (r.randint(1, small) for _ in range(3))
        a, b = _randn(g, m, k, dtype=dtype), _randn(g, k, n, dtype=dtype)
        expected = ref.matmul(a, b)
        tol = 2e-3 if dtype == torch.float32 else _matmul_tol(a, b, expected)   # fp32 dots run as tf32
        return [Trial(f"Triton matmul {m}x{n}x{k} {dtype}", "a06_triton", dict(a=a, b=b), expected, tol,
                      forbid=MATMUL_KERNEL, dtypes=(dtype,))]
    trials = _with_repeat(rng, g, build, len(dtypes))
    # fp32 with TF32 off: IEEE fp32 dots, fp32's tolerance (a kernel that always uses TF32 fails)
    m, n, k = (rng.randint(1, small) for _ in range(3))
    a, b = _randn(g, m, k), _randn(g, k, n)
    trials.append(Trial(f"Triton matmul {m}x{n}x{k} torch.float32, allow_tf32=False", "a06_triton",
                        dict(a=a, b=b, allow_tf32=False), ref.matmul(a, b), REL_TOL[torch.float32],
                        forbid=MATMUL_KERNEL))
    for dtype in (torch.bfloat16,) + ((torch.float16,) if HAS_CUDA else ()):
        m, n = (rng.randint(1, 40 if not HAS_CUDA else 700) for _ in range(2))
        k = rng.randint(*LONG_K)
        a, b = _randn(g, m, k, dtype=dtype), _randn(g, k, n, dtype=dtype)
        expected = ref.matmul(a, b)
        trials.append(Trial(f"Triton matmul, long K {m}x{n}x{k} {dtype} (tolerance: a few times torch.matmul's error)",
                            "a06_triton", dict(a=a, b=b), expected, _matmul_tol(a, b, expected),
                            forbid=MATMUL_KERNEL))
    dtype = rng.choice((torch.float16, torch.bfloat16))
    m, n, k = (rng.randint(1, small) for _ in range(3))
    a, a2, b = _randn(g, m, k, dtype=dtype), _randn(g, m, k, dtype=dtype), _randn(g, k, n, dtype=dtype)
    e1, e2 = ref.matmul(a, b), ref.matmul(a2, b)
    trials.append(_twice(f"Triton matmul {m}x{n}x{k} {dtype}", "a06_triton_twice", dict(a=a, b=b, x2=a2), (e1, e2),
                         max(_matmul_tol(a, b, e1), _matmul_tol(a2, b, e2)), forbid=MATMUL_KERNEL))
    # linear_gelu: nn.Linear's weight [N, K] read in place (a weight copied per call is refused). N, K >= 2:
    # with either 1, weight.t() is already contiguous, so a per-call .contiguous() copies nothing to see
    m, n, k = rng.randint(1, small), rng.randint(2, small), rng.randint(2, small)
    x, w, bias = _randn(g, m, k, dtype=dtype), _randn(g, n, k, dtype=dtype, scale=k**-0.5), _randn(g, n, dtype=dtype)
    trials.append(Trial(f"linear_gelu {m}x{k} @ weight [{n}, {k}]ᵀ + bias, GELU {dtype}", "a06_linear_gelu",
                        dict(x=x, weight=w, bias=bias), ref.gelu_tanh(ref.linear(x, w, bias)),
                        2 * REL_TOL[dtype], forbid=MATMUL_KERNEL, judge=_no_copies, dtypes=(dtype,)))
    if HAS_CUDA:
        versions = _a06_cuda_versions()   # 1-4 fp32, 5-7 fp16/bf16, those this GPU runs

        def cuda_trial(version, dtype, m, n, k, note=""):
            a, b = _randn(g, m, k, dtype=dtype), _randn(g, k, n, dtype=dtype)
            expected = ref.matmul(a, b)
            return Trial(f"CUDA matmul v{version} {m}x{n}x{k} {dtype}{note}", "a06_cuda",
                         dict(a=a, b=b, version=version), expected, _matmul_tol(a, b, expected), forbid=MATMUL_KERNEL,
                         dtypes=(dtype,))

        def build_cuda(r, g, i):
            version = versions[i]
            dtype = torch.float32 if version <= 4 else r.choice([torch.float16, torch.bfloat16])
            m, n, k = (r.randint(1, 600) for _ in range(3))
            if version == 7:                  # TMA: K and N multiples of 8
                n, k = 8 * r.randint(1, 75), 8 * r.randint(1, 75)
            return [cuda_trial(version, dtype, m, n, k)]
        trials += _with_repeat(rng, g, build_cuda, len(versions))
        for version in versions[4:]:          # the tensor-core versions at long K
            trials.append(cuda_trial(version, rng.choice([torch.float16, torch.bfloat16]), rng.randint(1, 600),
                                     8 * rng.randint(1, 75), 8 * rng.randint(LONG_K[0] // 8, LONG_K[1] // 8),
                                     " (long K; tolerance: a few times torch.matmul's error)"))
    return trials


#: Stage 6's speed cases, (label, (M, K, N)), bf16, from the bench's real-shape sweep: GPT-2 small's
#: MLP up-projection at 8192 tokens, an unaligned cube (rows of 4097 bf16: not 16-byte multiples),
#: and GPT-2 small's QKV projection at 512 tokens (few output tiles: a wave or less of the SMs).
A06_SHAPES = (("GPT-2 small mlp-up T=8192", gpt2_gemms(GPT2_MODELS["small"][0], 8192)["mlp-up"]),
              ("unaligned 4097^3", (4097, 4097, 4097)),
              ("GPT-2 small qkv T=512", gpt2_gemms(GPT2_MODELS["small"][0], 512)["qkv"]))


def _a06_perf(load):
    tri = load("a06_matmul.matmul_triton")
    cases = []
    for label, (m, k, n) in A06_SHAPES:
        cases.append(Perf(f"Triton matmul {label}: [{m}, {k}] x [{k}, {n}] bf16",
                          lambda g, m=m, k=k, n=n: {"a": _cuda_randn(g, m, k), "b": _cuda_randn(g, k, n)},
                          lambda i: tri.matmul(i["a"], i["b"]), lambda i: torch.matmul(i["a"], i["b"]),
                          "torch.matmul (cuBLAS)", matmul_flops(m, n, k), matmul_bytes(m, n, k, torch.bfloat16)))
    return cases


STAGE = Stage("a06_matmul", "Tiled matmul (CUDA + Triton)", _a06_trials, _a06_perf, perf_target=0.8,
              not_here=_a06_not_here)
#: ``python -m common.course.bench KEY`` runs this module of solutions/
BENCHES = {"a06": "a06_matmul.bench"}


# ----------------------------------------------------------------------------- host cost
def _hc_matmul(load, dev, dt):
    m = load("a06_matmul.matmul_triton")
    a, w = torch.randn(64, 64, device=dev, dtype=dt), torch.randn(64, 64, device=dev, dtype=dt)
    return (lambda: m.matmul(a, w)), (lambda: a @ w)


def _hc_matmul_gelu(load, dev, dt):
    m = load("a06_matmul.matmul_triton")
    a, w, b = torch.randn(64, 64, device=dev, dtype=dt), torch.randn(64, 64, device=dev, dtype=dt), torch.randn(64, device=dev, dtype=dt)
    return (lambda: m.matmul(a, w, b, activation="gelu_tanh")), (lambda: F.gelu(torch.addmm(b, a, w), approximate="tanh"))


def hostcost_cases() -> list:
    """This stage's eager host-cost cases (``python -m common.course.hostcost``): its entry points at a launch-bound
    shape, beside the PyTorch op each replaces."""
    from common.course.hostcost import Case
    return [
        Case("a06_matmul", "a06", "matmul vs a @ w; 64x64x64", 1, _hc_matmul),
        Case("a06_matmul_gelu", "a06", "matmul + bias + GELU vs addmm + F.gelu; 64x64x64", 1, _hc_matmul_gelu),
    ]


# ----------------------------------------------------------------------------- portability (common.course.portability)
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


def portability_launches(load, archs: list[Arch], full: bool) -> Iterator[Launch]:
    """The stage's Triton launches as its launcher makes them, for ``python -m common.course.portability``."""
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


# ----------------------------------------------------------------------------- CUDA builds (common.cuda_ext)
def cuda_ops() -> dict:
    """The CUDA extensions this stage builds (the CUDA matmul versions): a cold test run on a GPU prebuilds them
    in the background (tests/autograder.py)."""
    from common.cuda_ext import CourseOp
    return {
        "a06": CourseOp("a06_matmul.matmul_cuda", lambda m: m._op(), "test_a06_matmul.py"),
    }


# ----------------------------------------------------------------------------- results (make results)
def results_runs() -> dict:
    """The GPU runs behind this stage's files in lectures/results/ (``make results STAGE=...``): each a
    script and the files it makes (lectures/_tools/results.py)."""
    from lectures._tools.results import GAPS, SWEEP, Run, _same, ncu
    return {"a06": [Run("solutions/a06_matmul/run.sh", files=_same("a06_matmul.md", "a06_matmul.csv",
                                                                   "a06_matmul_tflops.png", "a06_matmul_quantization.png")),
                    SWEEP, Run("solutions/a06_matmul/run_v7.sh", files=_same("a06_v7_tiles.md")), ncu("a06"), GAPS]}
