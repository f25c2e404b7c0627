"""Assignment 6, Triton: a tiled, autotuned matmul with a fused bias / bias+GELU epilogue.

    from assignments.a06_matmul.matmul_triton import matmul, linear_gelu
    c = matmul(a, b)                                   # a [..., K] @ b [K, N]
    h = matmul(x, w_t, bias, activation="gelu_tanh")   # GPT-2 MLP up-projection, one kernel
    h = linear_gelu(x, weight, bias)                   # the same with nn.Linear's weight [N, K]

One program computes a BLOCK_M x BLOCK_N tile of C:
  1. grouped ordering: consecutive program ids sweep GROUP_M tile-rows column by column,
     so the programs running at the same moment share rows of A and columns of B in L2;
  2. walk K in BLOCK_K slices, ``acc = tl.dot(a, b, acc)`` (tensor cores; fp32 inputs use
     TF32 unless allow_tf32=False), accumulating in fp32;
  3. epilogue on the fp32 accumulator while it is still in registers: + bias[n], then
     GELU-tanh, then one cast and one store. Unfused, the same work is a GEMM that writes C
     plus an elementwise kernel that reads C and writes it again.
Block shapes, warps and pipeline stages are autotuned per (power-of-two bucket of M, N, K,
dtype, epilogue, layout): tuned on the first M of a bucket, reused for the rest; tiny weights
(fewer than TINY_WEIGHT elements) get one fixed config instead. Two layouts get their own path,
each measured in EXPERIMENTS.md (a06_try):
  * rows not on 16-byte boundaries (an odd K or N in 16-bit): Triton cannot pipeline those loads
    through shared memory, so the kernel prefetches the next K slice into registers (PREFETCH);
  * fp32 with TF32 and b N-major: TF32 wgmma wants b K-major, so the launch computes
    C^T = B^T A^T instead, with b in wgmma's register operand (SWAP_AB).
Under the Triton interpreter (CPU, ``import common``) a single small config is used.

Bench: ``python -m common.course.bench a06`` (H100 numbers in lectures/results/a06_matmul.md).
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from common import TRITON_INTERPRET, gpu
from common.checks import check_same, check_tensor
from common.launch import Prepared, cdiv, fast
from common.timing import autotune_bench, precompile

ACTIVATIONS = (None, "gelu_tanh")
#: Fixed config used by the tile-quantization sweep: (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages).
SWEEP_CONFIG = (128, 128, 64, 8, 4)
#: Shared memory a config's pipeline may fill: the GPU's per-block maximum (asked of the device) less
#: SMEM_MARGIN for what else a program keeps there (barriers, the cubin's static shared memory).
#: H100 (227 KB a block): the same configs as the 220 KB limit this replaced.
SMEM_MARGIN = 3 * 1024


def _configs() -> list[triton.Config]:
    if TRITON_INTERPRET:  # every config costs seconds when interpreted: one small one
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "PREFETCH": False},
                              num_warps=4, num_stages=1)]
    sets = [(_SQUARE + _LONG_K + _SKINNY + _UNALIGNED_SKINNY, False), (_UNALIGNED, True)]
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8, "PREFETCH": p},
                          num_warps=w, num_stages=s)
            for shapes, p in sets for m, n, k, w, s in dict.fromkeys(shapes)]


# Config sets (BLOCK_M, BLOCK_N, BLOCK_K, num_warps, num_stages); _config_set picks those a call tries.
#: Aligned rows, M > 64. 16-bit inputs keep the BLOCK_K = 64 ones (128 bytes a row); fp32 all that fit.
_SQUARE = [(128, 256, 64, 8, 3), (256, 128, 64, 8, 3), (128, 256, 64, 8, 4), (256, 128, 64, 8, 4), (128, 128, 64, 8, 4),
           (128, 128, 64, 4, 4), (128, 128, 32, 4, 4), (128, 256, 32, 8, 3), (64, 128, 64, 4, 4),
           (128, 64, 64, 4, 4), (64, 64, 64, 4, 4)]
#: 16-bit, K >= LONG_K (GPT-2's MLP down-projection, K = 4 d_model): K slices of 128 halve the loop's
#: trips where few output tiles run (faster at [512, 3072] x [3072, 768] on the H100:
#: EXPERIMENTS.md (a06_try), variant bk128).
_LONG_K = [(64, 128, 128, 4, 4), (128, 128, 128, 8, 3)]
LONG_K = 2048
#: Few rows (M <= 64: a decode step's B tokens): the GEMM is a weight read. Short, wide-K tiles give
#: more programs over N and more bytes in flight per program (stage 8 decodes with these).
_SKINNY = [(16, 64, 128, 4, 4), (16, 32, 256, 4, 3), (16, 128, 128, 4, 3), (32, 64, 128, 4, 4),
           (64, 64, 128, 4, 3), (64, 128, 64, 4, 4)]
#: Unaligned rows, M > 64, tried with PREFETCH beside the aligned set (which won where K is short, e.g.
#: the LM head [T, 768] x [768, 50257]): Triton does not pipeline such loads, so one stage (no
#: shared-memory ring to fill) and K slices of 32-64 (the prefetched slice lives in registers): the
#: unaligned shapes of lectures/results/a06_matmul_real_shapes.md (4097^3, [3000, 1000] x [1000, 777]).
_UNALIGNED = [(128, 128, 32, 8, 1), (128, 128, 64, 8, 1), (64, 128, 32, 4, 1), (128, 256, 32, 8, 1)]
#: Unaligned and M <= 64, tried beside _SKINNY (which won at M = 64), no PREFETCH (slower than these
#: configs): small per-thread tiles that do not spill (16x128x128 spilled); the LM head at one
#: token, [1, 768] x [768, 50257], in lectures/results/a06_matmul_real_shapes.md.
_UNALIGNED_SKINNY = [(16, 64, 64, 4, 1), (16, 128, 32, 4, 1), (16, 32, 128, 4, 1), (16, 128, 64, 8, 1)]


def _shape(c: triton.Config) -> tuple[int, int, int, int, int]:
    return c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"], c.num_warps, c.num_stages


def _config_set(m: int, k: int, size: int, aligned: bool) -> list[tuple[tuple[int, int, int, int, int], bool]]:
    """The (config, PREFETCH) pairs the autotuner tries for M rows, K, element size in bytes and
    row alignment: the aligned set always; unaligned rows add theirs and the tuner picks."""
    if m <= 64:
        base = _SKINNY
    elif size == 4:
        base = _SQUARE
    else:
        base = [c for c in _SQUARE if c[2] == 64] + (_LONG_K if k >= LONG_K else [])
    out = [(c, False) for c in base]
    if not aligned:
        out += [(c, False) for c in _UNALIGNED_SKINNY] if m <= 64 else [(c, True) for c in _UNALIGNED]
    return out


def smem_estimate(config: tuple[int, int, int, int, int], size: int, capability: tuple[int, int]) -> int:
    """An upper bound on the shared memory Triton (3.6) gives a config (BLOCK_M, BLOCK_N, BLOCK_K, warps,
    stages) of ``size``-byte inputs on a GPU of ``capability``: the larger of the ring of A and B slices
    and the epilogue's layout change of the fp32 tile. Hopper keeps every stage in the ring (wgmma reads
    its operands from shared memory); sm_80-89 one fewer (the slice being multiplied is in registers);
    sm_75 has no cp.async and so no ring, and its tl.dot runs on CUDA cores (FMA) with fp32 operands:
    one slice of each, counted at 4 bytes an element. tests/test_portability.py compiles the configs
    this lets through for every family in common.gpu.ARCHS and checks that they fit."""
    m, n, k, _, stages = config
    if capability >= (9, 0):
        ring = stages * (m + n) * k * size
    elif capability >= (8, 0):
        ring = max(stages - 1, 1) * (m + n) * k * size
    else:
        ring = (m + n) * k * 4
    return max(ring, m * n * 4 + 1024)


def fits(config: tuple[int, int, int, int, int], size: int, limits: tuple[tuple[int, int], int] | None) -> bool:
    """True if ``config`` fits a GPU with ``limits`` = (capability, shared memory per block) (common.gpu.limits;
    None: the interpreter, no limit)."""
    return limits is None or smem_estimate(config, size, limits[0]) <= limits[1] - SMEM_MARGIN


def configs_for(m: int, k: int, size: int, aligned: bool,
                limits: tuple[tuple[int, int], int] | None) -> list[tuple[tuple[int, int, int, int, int], bool]]:
    """The (config, PREFETCH) pairs the autotuner tries for this call on a GPU with ``limits``: the call's
    set (_config_set) less the pipelines that do not fit that GPU's shared memory. Never empty: where
    none fits, the smallest config with fewer stages (fit_config)."""
    pairs = _config_set(m, k, size, aligned)
    keep = [(c, p) for c, p in pairs if fits(c, size, limits)]
    if keep:
        return keep
    c, p = min(pairs, key=lambda cp: cp[0][0] * cp[0][1] * cp[0][2])
    return [(fit_config(c, size, limits), p)]


def fit_config(config: tuple[int, int, int, int, int], size: int,
               limits: tuple[tuple[int, int], int] | None) -> tuple[int, int, int, int, int]:
    """``config`` with as many pipeline stages as fit a GPU with ``limits`` (one at the least); a config
    that fits is returned as it is (on an H100 every fixed config of this file)."""
    m, n, k, w, s = config
    while s > 1 and not fits((m, n, k, w, s), size, limits):
        s -= 1
    return m, n, k, w, s


def _prune(configs, named_args, **kwargs):
    """Keep the call's config set (configs_for) on this GPU: its shared memory asked of the device."""
    if TRITON_INTERPRET:
        return configs   # one small config (_configs)
    a = named_args["a_ptr"]
    allowed = set(configs_for(named_args["M"], named_args["K"], a.element_size(),
                              _aligned(a, named_args["b_ptr"]), gpu.limits(a.device)))
    keep = [c for c in configs if (_shape(c), c.kwargs["PREFETCH"]) in allowed]
    return keep or _as_configs(allowed)


def _as_configs(pairs) -> list[triton.Config]:
    return [triton.Config({"BLOCK_M": m, "BLOCK_N": n, "BLOCK_K": k, "GROUP_M": 8, "PREFETCH": p}, num_warps=w,
                          num_stages=s) for (m, n, k, w, s), p in pairs]


def _aligned(*tensors: torch.Tensor) -> bool:
    """Every row of every tensor starts on a 16-byte boundary: what Triton's 16-byte copies
    (cp.async, pipelined through shared memory) need. An odd row length in 16-bit is not."""
    return all(t.data_ptr() % 16 == 0 and all(st * t.element_size() % 16 == 0
                                              for st, d in zip(t.stride(), t.shape) if st != 1 and d > 1)
               for t in tensors)


@triton.jit
def _tanh(x):
    # tanh(|x|) = (1 - e) / (1 + e) with e = exp(-2|x|) in (0, 1]: never overflows.
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x >= 0, t, -t)


@triton.jit
def _tanh_approx(x):
    # One MUFU.TANH instruction (PTX tanh.approx.f32, max relative error ~2^-11): plenty for
    # fp16/bf16 outputs, not for fp32. GPU only (the interpreter cannot run inline PTX).
    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=f,f", [x], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def _gelu_tanh(x, FAST: tl.constexpr = False):
    # GPT-2's gelu_new: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
    u = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    if FAST:
        t = _tanh_approx(u)
    else:
        t = _tanh(u)
    return 0.5 * x * (1.0 + t)


@triton.jit
def _tf32_rna(x):
    # fp32 x rounded to TF32 (10 mantissa bits; to nearest, ties away from zero: cvt.rna.tf32, what
    # cuBLAS does to fp32 inputs) by integer ops on its bits; NaN stays NaN. An op between the load
    # and tl.dot also makes Triton feed wgmma this operand from registers, in any layout.
    r = ((x.to(tl.uint32, bitcast=True) + 0x1000) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return tl.where(x == x, r, x)


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr, bias_ptr,  # bias_ptr is ignored unless HAS_BIAS
    M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn, stride_bias,
    HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr, INPUT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, DOT_FP32: tl.constexpr, FAST_TANH: tl.constexpr,
    PREFETCH: tl.constexpr, SWAP_AB: tl.constexpr,
):
    """C[M, N] = act(A[M, K] @ B[K, N] + bias[N]) for one BLOCK_M x BLOCK_N tile of C.

    Launched on a 1-D grid of cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N) programs. ACTIVATION is
    None or "gelu_tanh"; INPUT_PRECISION "tf32" or "ieee" (fp32 inputs only). EVEN_K: K is
    a multiple of BLOCK_K (no mask needed on K). DOT_FP32: cast a and b to fp32 before
    tl.dot (set only under the CPU interpreter, whose bf16 tl.dot is wrong in Triton 3.6).
    FAST_TANH: use the hardware tanh approximation in the GELU (16-bit outputs on a GPU).
    PREFETCH (speed only): a row of a or b does not start on a 16-byte boundary, so Triton
    cannot pipeline the loads through shared memory; load the next K slice into registers
    before this slice's tl.dot instead (software prefetch), so the loads overlap the math.
    SWAP_AB: the launcher passed (B^T, A^T, C^T) to compute C^T = B^T A^T (fp32 with TF32
    and b N-major, see ``matmul``): the bias runs along this launch's rows (offs_m, bias[M]),
    and a goes through _tf32_rna before tl.dot (which also makes wgmma read it from registers).
    """
    # TODO(a06 triton): write the kernel (see the handout and the module docstring).
    #  1. tile (pid_m, pid_n) from tl.program_id(0) in grouped order (GROUP_M tile-rows);
    #  2. offsets offs_m, offs_n, offs_k; pointers to the first A and B slices (use the
    #     strides: a and b may be views); fp32 accumulator; loop over cdiv(K, BLOCK_K)
    #     slices: load (mask on K unless EVEN_K; rows past M / columns past N may be
    #     wrapped with % M / % N instead of masked), a = _tf32_rna(a) if SWAP_AB,
    #     cast to fp32 if DOT_FP32, acc = tl.dot(a, b, acc, input_precision=INPUT_PRECISION),
    #     advance the pointers. Once that passes the tests, PREFETCH: the slice k + 1 loaded
    #     (masked past K) before slice k's tl.dot, carried to the next iteration;
    #  3. epilogue: + bias (fp32; bias[offs_n] broadcast over rows, or bias[offs_m] over columns
    #     if SWAP_AB) if HAS_BIAS, _gelu_tanh if ACTIVATION == "gelu_tanh" (pass FAST_TANH on),
    #     cast to c_ptr.dtype.element_ty, masked tl.store.


_matmul_autotuned = triton.autotune(
    configs=_configs(),
    # + the tensors' dtypes (Triton adds them); the strides: a layout or row alignment has its own best config
    key=["M", "N", "K", "stride_am", "stride_bk", "stride_bn", "HAS_BIAS", "ACTIVATION", "INPUT_PRECISION",
         "FAST_TANH", "SWAP_AB"],
    prune_configs_by={"early_config_prune": _prune},
    do_bench=autotune_bench,  # the course's shorter timer per config (common/timing.py)
    cache_results=True,       # a key tuned once on this machine is read from Triton's cache after that
)(triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})(matmul_kernel))


#: On a GPU, weights b of fewer than TINY_WEIGHT elements (N·K) are not autotuned: such a GEMM is a few
#: microseconds, launch-bound, and tuning it (a compile and a timing per candidate config, per bucket
#: of M) costs seconds that no config could win back. GPT-2's smallest weight is 768 x 768; tiny
#: models (the tests' two-layer GPT-2 with d_model = 64) run TINY_CONFIG.
TINY_WEIGHT = 1 << 17
TINY_CONFIG = (32, 64, 64, 4, 2)
#: The autotuner's pick (config, PREFETCH) per (power-of-two bucket of M, N, K, dtype, epilogue,
#: precision, layout, row alignment).
_TUNED: dict[tuple, tuple[tuple[int, int, int, int, int], bool]] = {}


@functools.lru_cache(maxsize=None)
def _fitted(config: tuple[int, int, int, int, int], size: int, device: int | None) -> tuple[int, int, int, int, int]:
    return fit_config(config, size, gpu.limits(torch.device("cuda", device) if device is not None else None))


def _bucket(m: int) -> int:
    return 1 << (m - 1).bit_length()


def matmul(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None, activation: str | None = None,
           *, out: torch.Tensor | None = None, allow_tf32: bool = True, fast_tanh: bool = True,
           config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """``act(a @ b + bias)`` in one Triton kernel.

    a: [..., K] (leading dims are flattened; a 2-D ``a`` may have any strides), b: [K, N]
    (any strides, e.g. ``weight.t()``), bias: [N] or None, all one dtype (float32, float16,
    bfloat16) on the kernel device. activation: None or "gelu_tanh". Returns a new
    contiguous [..., N] tensor of a's dtype, or writes ``out`` (contiguous, that shape and
    dtype) and returns it. Accumulates in fp32; float32 inputs use TF32 tensor cores
    unless ``allow_tf32=False``. With fp16/bf16 on a GPU the GELU uses the hardware tanh
    approximation unless ``fast_tanh=False``. ``config`` = (BLOCK_M, BLOCK_N, BLOCK_K, num_warps,
    num_stages) bypasses the autotuner (used by the benchmarks; b of fewer than TINY_WEIGHT
    elements runs TINY_CONFIG on a GPU), with fewer stages on a GPU whose shared memory needs it (fit_config).
    """
    # Everything below up to the launch is a function of the inputs' metadata (shapes, strides, dtypes,
    # devices, 16-byte alignment) and the options: computed once per key by _plan (the checks with their
    # messages, the layout, the config, the grid), a dict lookup after that.
    try:
        key = (a.shape, a.stride(), a.dtype, a.device, a.data_ptr() % 16, b.shape, b.stride(), b.dtype, b.device,
               b.data_ptr() % 16, None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
               None if out is None else (out.shape, out.dtype, out.device, out.is_contiguous()),
               activation, allow_tf32, fast_tanh, config)
        plan = _PLANS.get(key)
    except (AttributeError, TypeError):   # not tensors (the checks in _plan say so), or a config given as a list
        key, plan = None, None
    if plan is None:
        plan = _plan(a, b, bias, activation, out, allow_tf32, fast_tanh, config)
        if plan.grid is not None and key is not None:   # not a call that tunes first (its plan comes next call)
            _PLANS[key] = plan
    m, n, k = plan.m, plan.n, plan.k
    if out is None:
        out = torch.empty(plan.out_shape, device=a.device, dtype=a.dtype)
    if m == 0 or n == 0:
        return out
    a2 = a if a.dim() == 2 else a.reshape(-1, k)
    c2 = out if out.dim() == 2 else out.view(m, n)      # a view object costs host time: only when needed
    x, y, z = (b.t(), a2.t(), c2.t()) if plan.swap else (a2, b, c2)
    args = (x, y, z, bias if bias is not None else c2, *plan.ints)
    if plan.grid is None:
        # The autotuner tunes per exact M; a model calls matmul with many M (B·T changes with every
        # batch of prompts). Tune once per power-of-two bucket of M and launch the bucket's choice
        # directly after that (less host work per call, too).
        mm, nn = plan.ints[0], plan.ints[1]
        grid = lambda META: (cdiv(mm, META["BLOCK_M"]) * cdiv(nn, META["BLOCK_N"]),)  # noqa: E731
        precompile(_matmul_autotuned, grid, *args, **plan.meta)  # the candidate configs, in parallel threads
        _matmul_autotuned[grid](*args, **plan.meta)
        best = _matmul_autotuned.best_config
        _TUNED[plan.tune_key] = (_shape(best), best.kwargs["PREFETCH"])
        return out
    plan.launch(*args)
    return out


#: matmul's plan per key (the inputs' metadata and the options): see _plan.
_PLANS: dict[tuple, _Plan] = {}


def _plan(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, activation: str | None,
          out: torch.Tensor | None, allow_tf32: bool, fast_tanh: bool, config) -> _Plan:
    """The checks (a clear error for a bad input) and every decision of a matmul call that depends only
    on its key: shapes, the layout (swap), the integer arguments, the config and the grid (None: the
    call tunes its bucket of M first)."""
    check_tensor(a, "a", min_ndim=1)
    check_tensor(b, "b", ndim=2)
    check_same(a, b, "a, b")
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {activation!r}")
    k, n = b.shape
    if a.shape[-1] != k:
        raise ValueError(f"a, b: inner dimensions differ: a {tuple(a.shape)} @ b {tuple(b.shape)}")
    if bias is not None:
        check_tensor(bias, "bias", ndim=1)
        check_same(a, bias, "a, bias")
        if bias.shape[0] != n:
            raise ValueError(f"bias: expected shape ({n},), got {tuple(bias.shape)}")
    a2 = a if a.dim() == 2 else a.reshape(-1, k)
    m = a2.shape[0]
    out_shape = (*a.shape[:-1], n)
    if out is not None:
        check_tensor(out, "out", dtypes=(a.dtype,), contiguous=True)
        check_same(a, out, "a, out")
        if tuple(out.shape) != out_shape:
            raise ValueError(f"out: expected shape {out_shape}, got {tuple(out.shape)}")
    if m == 0 or n == 0:
        return _Plan(m, n, k, out_shape, False, (), {}, (1,), None)
    c2 = torch.empty((m, n), dtype=a.dtype, device="meta")         # the layout of out.view(m, n)
    tf32 = allow_tf32 and a.dtype == torch.float32
    # fp32 with TF32 and b N-major (a row-major weight [K, N]): TF32 wgmma reads an operand in shared
    # memory K-major only, so b would be transposed by 4-byte copies (a few times slower than cuBLAS).
    # Computing C^T = B^T A^T instead puts b where wgmma's A goes (from registers, any layout) and a
    # K-major a where its B goes (EXPERIMENTS.md (a06_try), tf32_swap). Timed at
    # M >= 1793 only: few rows (M <= 64) keep the skinny configs, unswapped, as before.
    swap = tf32 and m > 64 and b.stride(1) == 1 and n > 1 and a2.stride(1) == 1 and k > 1
    x, y, z, mm, nn = (b.t(), a2.t(), c2.t(), n, m) if swap else (a2, b, c2, m, n)
    ints = (mm, nn, k, x.stride(0), x.stride(1), y.stride(0), y.stride(1), z.stride(0), z.stride(1),
            bias.stride(0) if bias is not None else 0)
    meta = dict(HAS_BIAS=bias is not None, ACTIVATION=activation, INPUT_PRECISION="tf32" if tf32 else "ieee",
                DOT_FP32=TRITON_INTERPRET and a.dtype == torch.bfloat16,
                FAST_TANH=fast_tanh and not TRITON_INTERPRET and a.dtype != torch.float32, SWAP_AB=swap)
    aligned = _aligned(x, y)
    prefetch = mm > 64 and not aligned   # an explicit config's PREFETCH; the autotuner tries both
    if config is None and n * k < TINY_WEIGHT and not TRITON_INTERPRET:
        config = TINY_CONFIG
    if config is not None and not TRITON_INTERPRET:   # a GPU with less shared memory: fewer stages
        config = _fitted(tuple(config), a.element_size(), a.device.index)
    tune_key = None
    if config is None:
        tune_key = (_bucket(m), n, k, a.dtype, bias is not None, activation, meta["INPUT_PRECISION"],
                    meta["FAST_TANH"], b.stride(0) == 1, aligned, swap)
        tuned = _TUNED.get(tune_key)
        if tuned is None:
            return _Plan(m, n, k, out_shape, swap, ints, meta, None, tune_key)
        config, prefetch = tuned
    bm, bn, bk, warps, stages = config
    grid = (cdiv(mm, bm) * cdiv(nn, bn),)
    meta.update(BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, PREFETCH=prefetch, EVEN_K=k % bk == 0,
                num_warps=warps, num_stages=stages)
    return _Plan(m, n, k, out_shape, swap, ints, meta, grid, tune_key, fast(matmul_kernel).prepare(grid, **meta))


class _Plan(NamedTuple):
    m: int
    n: int
    k: int
    out_shape: tuple
    swap: bool
    ints: tuple                 # the kernel's integer arguments: M, N, K and the strides
    meta: dict                  # its constexprs and launch options
    grid: tuple | None          # None: tune this bucket of M first (tune_key)
    tune_key: tuple | None = None
    launch: Prepared | None = None   # the kernel's launch with this plan's grid and meta (common.launch)


def linear_gelu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """GELU-tanh(x @ weight.T + bias) with nn.Linear's weight [N, K]: one kernel, no copy of weight."""
    check_tensor(weight, "weight", ndim=2)
    return matmul(x, weight.t(), bias, activation="gelu_tanh")


def best_config(key_hint: str = "") -> str:
    """The autotuner's choices so far, one line per (M, N, K, ...) key (for the bench notes)."""
    lines = [f"{k}: {c}" for k, c in _matmul_autotuned.cache.items() if key_hint in str(k)]
    return "\n".join(lines)
