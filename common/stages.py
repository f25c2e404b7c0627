"""What the grader checks for each stage: correctness trials and the performance case.

Each stage gives
* ``trials(load, rng)``: a list of :class:`Trial` built on *fresh* random inputs with
  shapes drawn at grading time (never announced, different on every run). Each
  trial's reference is computed in float64 from a private copy of the inputs
  *before* the submission runs, so the submission can neither see nor alter it.
* forbidden aten ops per trial (checked on every trial with a dispatch trace, CPU and
  GPU: calling ``F.gelu`` or ``torch.matmul`` where a kernel was asked for fails) and
  forbidden GPU kernel names (checked with the profiler on a GPU: a PyTorch or cuBLAS
  kernel where the stage's own kernel should run fails).
* ``perf(load)`` on a GPU: the submission against the PyTorch baseline it is graded
  against, with the FLOPs and bytes that place it on the roofline.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from . import DEVICE, HAS_CUDA, is_hopper
from . import reference as ref
from .profiling import fake_cuda, trace_ops
from .roofline import attention_flops, elementwise_bytes, matmul_bytes, matmul_flops
from .testing import REL_TOL

Load = Callable[[str], object]   # load("a03_fused_linear.fused_linear") -> module of the graded impl

TORCH_ARITH = ("aten.add.", "aten.add_.", "aten.sub", "aten.mul", "aten.div", "aten.tanh", "aten.exp",
               "aten.gelu", "aten.pow", "aten.addcmul", "aten.sigmoid", "aten.where")
TORCH_GEMM = ("aten.mm", "aten.bmm", "aten.addmm", "aten.matmul", "aten.linear", "aten.baddbmm",
              "aten.einsum", "aten.dot", "aten.mv", "aten._scaled_mm")
TORCH_ATTENTION = ("aten._scaled_dot_product", "aten.scaled_dot_product", "aten._flash_attention",
                   "aten._efficient_attention", "aten._cudnn_attention")
#: GPU kernel names that mean PyTorch / cuBLAS / cuDNN did the work.
ATEN_KERNELS = ("at::native", "elementwise_kernel")
BLAS_KERNELS = ("gemm", "xmma", "cutlass", "cublas", "gemv", "splitK")
ATTN_KERNELS = ("flash_fwd", "flash_bwd", "fmha", "cudnn", "pytorch_flash", "efficient_attention")


class NeedsGPU(Exception):
    """This part of a stage needs a CUDA GPU."""


@dataclass
class Trial:
    name: str
    call: Callable[[], object]                  # runs the submission on its own copy of the inputs
    ref: object                                 # float64 reference (tensor or tuple), computed beforehand
    tol: float                                  # relative-error tolerance
    exact: bool = False                         # compare integers exactly (counts)
    scale: object = None                        # magnitude of the summed terms (testing.rel_error)
    forbidden_ops: tuple[str, ...] = ()
    forbidden_kernels: tuple[str, ...] = ()


@dataclass
class Perf:
    label: str
    submission: Callable[[], object]
    baseline: Callable[[], object]
    baseline_name: str
    flops: float
    bytes: float
    tol: float = 2e-2          # relative error allowed between submission and baseline at the timed size


@dataclass
class Stage:
    folder: str
    title: str
    trials: Callable[[Load, random.Random], list[Trial]]
    perf: Callable[[Load], Perf] | None = None
    perf_target: float = 0.9        # speed vs baseline that earns the full performance points
    gpu_only: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.folder[:3]


def _gen(rng: random.Random) -> torch.Generator:
    return torch.Generator().manual_seed(rng.randrange(2**62))


def _randn(g: torch.Generator, *shape: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * scale).to(device=DEVICE, dtype=dtype)


def _pick_dtype(rng):
    return rng.choice([torch.float32, torch.float16, torch.bfloat16])


# ----------------------------------------------------------------------------- a01
def _a01_trials(load, rng):
    mod = load("a01_roundtrip_linear.roundtrip_linear")
    trials = []
    for _ in range(3):
        fin, fout = rng.randint(2, 300), rng.randint(2, 300)
        lead = tuple(rng.randint(1, 9) for _ in range(rng.randint(1, 3)))
        bias = rng.random() < 0.6
        with fake_cuda():
            w = torch.randn(fout, fin, device="cuda")
            b = torch.randn(fout, device="cuda") if bias else None
            layer = mod.RoundTripLinear(w, b)
            x = torch.randn(*lead, fin, device="cuda")
            with trace_ops() as t:
                layer(x)
        expected = torch.tensor([t.htod, t.dtoh])

        def call(layer=layer, x=x):
            with fake_cuda():
                # fresh fake tensors of the same shapes inside a new fake mode
                lay = mod.RoundTripLinear(torch.randn(*layer.weight.shape, device="cuda"),
                                          None if layer.bias_host is None else torch.randn(layer.bias_host.shape[0], device="cuda"))
                xx = torch.randn(*x.shape, device="cuda")
                with mod.HostTransferCounter() as c:
                    lay(xx)
            return torch.tensor([c.htod, c.dtoh])
        trials.append(Trial(f"counter RoundTripLinear {fin}->{fout} lead={lead} bias={bias}", call, expected, 0, exact=True))
    return trials


# ----------------------------------------------------------------------------- a02
def _a02_trials(load, rng):
    mod = load("a02_pretransposed_linear.pretransposed_linear")
    g = _gen(rng)
    trials = []
    for _ in range(3):
        dtype = _pick_dtype(rng)
        fin, fout = rng.randint(1, 400), rng.randint(1, 700)
        lead = tuple(rng.randint(1, 7) for _ in range(rng.randint(1, 3)))
        w = _randn(g, fout, fin, dtype=dtype, scale=fin**-0.5)
        b = _randn(g, fout, dtype=dtype) if rng.random() < 0.5 else None
        x = _randn(g, *lead, fin, dtype=dtype)
        expected = ref.linear(x, w, b)
        trials.append(Trial(f"PretransposedLinear {fin}->{fout} lead={lead} {dtype}",
                            lambda w=w.clone(), b=None if b is None else b.clone(), x=x.clone(): mod.PretransposedLinear(w, b)(x),
                            expected, REL_TOL[dtype], scale=ref.linear_scale(x, w, b)))
    bias = rng.random() < 0.5
    trials.append(Trial(f"host transfers per call, bias={bias}", lambda: _count_layer(mod.PretransposedLinear, bias),
                        torch.tensor([2 if bias else 0]), 0, exact=True))
    return trials


def _count_layer(cls, bias, fin=64, fout=96):
    with fake_cuda():
        layer = cls(torch.randn(fout, fin, device="cuda"), torch.randn(fout, device="cuda") if bias else None)
        x = torch.randn(3, 5, fin, device="cuda")
        with trace_ops() as t:
            layer(x)
    return torch.tensor([t.host_transfers])


def _a02_perf(load):
    mod = load("a02_pretransposed_linear.pretransposed_linear")
    lin = torch.nn.Linear(768, 3072, bias=False, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(32, 1024, 768, device="cuda", dtype=torch.bfloat16)
    layer = mod.PretransposedLinear.from_linear(lin)
    m, n, k = 32 * 1024, 3072, 768
    return Perf("PretransposedLinear 32x1024 768->3072 bf16, no bias", lambda: layer(x),
                lambda: F.linear(x, lin.weight), "F.linear", matmul_flops(m, n, k), matmul_bytes(m, n, k, torch.bfloat16))


# ----------------------------------------------------------------------------- a03
def _a03_trials(load, rng):
    ab = load("a03_fused_linear.add_bias")
    fl = load("a03_fused_linear.fused_linear")
    g = _gen(rng)
    trials = []
    for _ in range(2):
        dtype = _pick_dtype(rng)
        shape = tuple(rng.randint(1, 40) for _ in range(rng.randint(1, 2))) + (rng.randint(1, 1100),)
        y, b = _randn(g, *shape, dtype=dtype), _randn(g, shape[-1], dtype=dtype)
        expected = ref.add_bias(y, b)
        trials.append(Trial(f"add_bias {shape} {dtype}", lambda y=y.clone(), b=b.clone(): ab.add_bias(y, b),
                            expected, REL_TOL[dtype], forbidden_ops=TORCH_ARITH, forbidden_kernels=ATEN_KERNELS))
        trials.append(Trial(f"add_bias_ (in place) {shape} {dtype}",
                            lambda y=y.clone(), b=b.clone(): (ab.add_bias_(y, b), y)[1],
                            expected, REL_TOL[dtype], forbidden_ops=TORCH_ARITH, forbidden_kernels=ATEN_KERNELS))
    for backend in ("addmm", "triton"):
        dtype = _pick_dtype(rng)
        fin, fout = rng.randint(1, 300), rng.randint(1, 900)
        lead = tuple(rng.randint(1, 6) for _ in range(rng.randint(1, 3)))
        w = _randn(g, fout, fin, dtype=dtype, scale=fin**-0.5)
        b = _randn(g, fout, dtype=dtype)
        x = _randn(g, *lead, fin, dtype=dtype)
        expected = ref.linear(x, w, b)
        trials.append(Trial(f"FusedLinear({backend}) {fin}->{fout} lead={lead} {dtype}",
                            lambda w=w.clone(), b=b.clone(), x=x.clone(), be=backend: fl.FusedLinear(w, b, be)(x),
                            expected, REL_TOL[dtype], scale=ref.linear_scale(x, w, b)))
    trials.append(Trial("FusedLinear host transfers per call", lambda: _count_layer(fl.FusedLinear, True),
                        torch.tensor([0]), 0, exact=True))
    return trials


def _a03_perf(load):
    fl = load("a03_fused_linear.fused_linear")
    lin = torch.nn.Linear(768, 3072, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(32, 1024, 768, device="cuda", dtype=torch.bfloat16)
    layer = fl.FusedLinear.from_linear(lin)
    m, n, k = 32 * 1024, 3072, 768
    return Perf("FusedLinear 32x1024 768->3072 bf16", lambda: layer(x), lambda: F.linear(x, lin.weight, lin.bias),
                "F.linear", matmul_flops(m, n, k), matmul_bytes(m, n, k, torch.bfloat16, bias=True))


# ----------------------------------------------------------------------------- a04 / a05
def _gelu_trials(fn_of, label, rng, kernel_forbidden=ATEN_KERNELS):
    g = _gen(rng)
    trials = []
    for _ in range(3):
        dtype = _pick_dtype(rng)
        shape = tuple(rng.randint(1, 50) for _ in range(rng.randint(1, 3))) + (rng.randint(1, 3000),)
        x = _randn(g, *shape, dtype=dtype, scale=3.0)
        expected = ref.gelu_tanh(x)
        trials.append(Trial(f"{label} {shape} {dtype}", lambda x=x.clone(): fn_of()(x), expected, REL_TOL[dtype],
                            forbidden_ops=TORCH_ARITH, forbidden_kernels=kernel_forbidden))
    return trials


def _a04_trials(load, rng):
    if not HAS_CUDA:
        raise NeedsGPU("the CUDA op runs on a GPU (its sources are compile-checked by the tests on CPU)")
    mod = load("a04_cuda_gelu.fused_gelu")
    return _gelu_trials(lambda: mod.fused_gelu, "fused_gelu (CUDA)", rng)


def _a05_trials(load, rng):
    mod = load("a05_triton_gelu.gelu_triton")
    return _gelu_trials(lambda: mod.gelu, "gelu (Triton)", rng)


def _gelu_perf(fn, label):
    n = 1 << 26
    x = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    return Perf(f"{label} 2^26 bf16", lambda: fn(x), lambda: F.gelu(x, approximate="tanh"),
                'F.gelu(approximate="tanh")', 8.0 * n, elementwise_bytes(n, torch.bfloat16))


# ----------------------------------------------------------------------------- a06
def _a06_trials(load, rng):
    tri = load("a06_matmul.matmul_triton")
    g = _gen(rng)
    trials = []
    small = 72 if not HAS_CUDA else 700
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        m, n, k = (rng.randint(1, small) for _ in range(3))
        a, b = _randn(g, m, k, dtype=dtype), _randn(g, k, n, dtype=dtype)
        expected = ref.matmul(a, b)
        tol = 2e-3 if dtype == torch.float32 else REL_TOL[dtype]  # fp32 dots run as tf32
        trials.append(Trial(f"Triton matmul {m}x{n}x{k} {dtype}", lambda a=a.clone(), b=b.clone(): tri.matmul(a, b),
                            expected, tol, forbidden_ops=TORCH_GEMM, forbidden_kernels=BLAS_KERNELS + ATEN_KERNELS))
    if HAS_CUDA:
        cu = load("a06_matmul.matmul_cuda")
        for version in (1, 2, 3, 4, 5, 6) + ((7,) if is_hopper() else ()):   # 1-4 fp32, 5-7 fp16/bf16
            dtype = torch.float32 if version <= 4 else rng.choice([torch.float16, torch.bfloat16])
            m, n, k = (rng.randint(1, 600) for _ in range(3))
            if version == 7:                  # TMA: K and N multiples of 8
                n, k = 8 * rng.randint(1, 75), 8 * rng.randint(1, 75)
            a, b = _randn(g, m, k, dtype=dtype), _randn(g, k, n, dtype=dtype)
            expected = ref.matmul(a, b)
            trials.append(Trial(f"CUDA matmul v{version} {m}x{n}x{k} {dtype}",
                                lambda a=a.clone(), b=b.clone(), v=version: cu.matmul(a, b, v), expected,
                                REL_TOL[dtype], forbidden_ops=TORCH_GEMM, forbidden_kernels=BLAS_KERNELS + ATEN_KERNELS))
    return trials


def _a06_perf(load):
    tri = load("a06_matmul.matmul_triton")
    n = 4096
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return Perf("Triton matmul 4096^3 bf16", lambda: tri.matmul(a, b), lambda: torch.matmul(a, b), "torch.matmul (cuBLAS)",
                matmul_flops(n, n, n), matmul_bytes(n, n, n, torch.bfloat16))


# ----------------------------------------------------------------------------- a07
def _attn_trials(fn, label, rng, forbidden_ops, forbidden_kernels):
    g = _gen(rng)
    trials = []
    for causal in (False, True):
        dtype = torch.float32 if not HAS_CUDA else rng.choice([torch.float16, torch.bfloat16])
        d = rng.choice([16, 32] if not HAS_CUDA else [16, 32, 64, 128])
        nq = rng.randint(1, 80 if not HAS_CUDA else 600)
        nk = nq if rng.random() < 0.5 else rng.randint(max(1, nq), (80 if not HAS_CUDA else 600) + nq)
        lead = (rng.randint(1, 2), rng.randint(1, 3))
        q, k, v = (_randn(g, *lead, n, d, dtype=dtype) for n in (nq, nk, nk))
        do = _randn(g, *lead, nq, d, dtype=dtype)
        o_ref, _ = ref.attention(q, k, v, causal)
        grads_ref = ref.attention_backward(q, k, v, do, causal)
        tol = 1e-4 if dtype == torch.float32 else 2e-2

        def fwd_bwd(q=q.clone(), k=k.clone(), v=v.clone(), do=do.clone(), causal=causal):
            q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
            o = fn()(q, k, v, causal)
            o.backward(do)
            return (o.detach(), q.grad, k.grad, v.grad)
        trials.append(Trial(f"{label} fwd+bwd lead={lead} Nq={nq} Nk={nk} d={d} causal={causal} {dtype}",
                            fwd_bwd, (o_ref, *grads_ref), tol, forbidden_ops=forbidden_ops,
                            forbidden_kernels=forbidden_kernels))
    return trials


def _a07_trials(load, rng):
    ft = load("a07_flash_attention.flash_torch")
    fx = load("a07_flash_attention.flash_triton")
    return (_attn_trials(lambda: ft.flash_attention_torch, "tiled PyTorch", rng, TORCH_ATTENTION, ATTN_KERNELS)
            + _attn_trials(lambda: fx.flash_attention, "Triton", rng, TORCH_ATTENTION + TORCH_GEMM + ("aten._softmax",),
                           ATTN_KERNELS + BLAS_KERNELS))


def _a07_perf(load):
    fx = load("a07_flash_attention.flash_triton")
    b, h, s, d = 4, 16, 4096, 128
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    return Perf("flash attention fwd B=4 H=16 S=4096 d=128 causal bf16", lambda: fx.flash_attention(q, k, v, True),
                lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True), "F.scaled_dot_product_attention",
                attention_flops(b * h, s, s, d, True), 4 * b * h * s * d * 2)


STAGES: list[Stage] = [
    Stage("a01_roundtrip_linear", "Round-trip Linear: transfer counter", _a01_trials),
    Stage("a02_pretransposed_linear", "Pre-transposed Linear", _a02_trials, _a02_perf),
    Stage("a03_fused_linear", "Bias kernel + fused Linear", _a03_trials, _a03_perf),
    Stage("a04_cuda_gelu", "Fused GELU (CUDA op)", _a04_trials,
          lambda load: _gelu_perf(load("a04_cuda_gelu.fused_gelu").fused_gelu, "CUDA fused_gelu"), gpu_only=True),
    Stage("a05_triton_gelu", "Fused GELU (Triton)", _a05_trials,
          lambda load: _gelu_perf(load("a05_triton_gelu.gelu_triton").gelu, "Triton gelu")),
    Stage("a06_matmul", "Tiled matmul (CUDA + Triton)", _a06_trials, _a06_perf, perf_target=0.8),
    Stage("a07_flash_attention", "Flash attention fwd+bwd", _a07_trials, _a07_perf, perf_target=0.7),
]


def by_key(key: str) -> Stage:
    for s in STAGES:
        if key in (s.key, s.folder):
            return s
    raise KeyError(f"no stage {key!r}; stages: {[s.key for s in STAGES]}")


def tensors(x) -> list[torch.Tensor]:
    """Flatten a result (tensor / tuple / list) into a list of tensors."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in tensors(item)]
    raise TypeError(f"expected tensors, got {type(x).__name__}")


def nan_safe(v: float) -> float | None:
    return None if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))) else v
