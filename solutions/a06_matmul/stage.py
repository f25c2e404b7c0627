"""Stage 6, the tiled matmul (Triton, and the CUDA versions this GPU runs): trials, long K, speed cases."""
from __future__ import annotations

import torch

from common import HAS_CUDA, gpu
from common import reference as ref
from common.roofline import matmul_bytes, matmul_flops
from common.shapes import GPT2_MODELS, gpt2_gemms
from common.kernel_check import MATMUL_KERNEL, input_copies
from common.testing import REL_TOL, calibrated_tol, rel_error, torch_matmul
from common.stages.base import (Perf, Run, Stage, Trial, _call, _cuda_randn, _gen, _no_copies, _randn, _refilled,
                                _twice, _with_repeat)


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
