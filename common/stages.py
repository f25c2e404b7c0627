"""What the grader checks for each stage: correctness trials and the performance cases.

The grader runs in two processes (common/grade/): the *judge*, which never imports the
submission, and a *worker*, which does. This module serves both:

* ``trials(rng)`` (judge): a list of :class:`Trial` built on *fresh* random inputs with shapes
  drawn at grading time (never announced, different on every run). Each trial's float64
  reference and tolerance are computed here, in the judge, and never leave it; the worker gets
  only the inputs and the name of the call to make (:class:`Trial`'s ``call`` and ``args``).
  Each stage's draws end with the shapes of an earlier draw again and new values, so an output
  memoised per shape fails; 16-bit matmuls are drawn at long K (Triton attention at long Nk) too
  and may be only a few times less accurate than torch.matmul (SDPA) on the same inputs
  (testing.calibrated_tol).
* the calls (worker): :data:`CALLS`, functions of (:class:`Run`, the trial's args) that run the
  submission and return its outputs. A call may report *facts* the judge checks (the largest
  tensor 7a created, the rows of a decode step's GEMMs).
* what each trial may not call (common.kernel_check, the same check the graded tests make): the
  worker traces aten ops (and on a GPU profiles kernels), the judge refuses what ``forbid`` names.
* ``perf(load)`` (worker, on a GPU): the submission against the PyTorch baseline it is graded
  against, with the FLOPs and bytes that place it on the roofline: one :class:`Perf`, or a list
  of them (stages 4-7: shapes from the benches' real-shape sweeps, common/shapes.py), whose
  speedups the grader combines by their geometric mean (common.grade.score). Each timed call gets
  a fresh input set (common.timing.bench_fresh), and its output is checked against the baseline's.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from . import DEVICE, HAS_CUDA, gpu
from . import reference as ref
from .profiling import fake_cuda, trace_ops
from .roofline import (attention_flops, elementwise_bytes, gpt2_decode_bytes, gpt2_decode_flops, matmul_bytes,
                       matmul_flops)
from .shapes import ATTENTION_HEADS, GPT2_MODELS, attention_batch, gpt2_gemms
from .kernel_check import (ATTENTION_KERNEL, ATTENTION_TILED, BIAS_KERNEL, DECODE_ATTENTION, ENGINE, FUSED_LINEAR,
                           GELU_KERNEL, GEMV_KERNEL, LAYERNORM_KERNEL, MATMUL_KERNEL, NOTHING, WRITE_KV, Forbidden,
                           attention_tile_bound, held_tensors, host_syncs, input_copies, largest_new_tensor,
                           tile_message)
from .testing import REL_TOL, calibrated_tol, random_gpt2, rel_error, torch_attention, torch_matmul

Load = Callable[[str], object]   # load("a03_fused_linear.fused_linear") -> module of the graded impl


class NeedsGPU(Exception):
    """This part of a stage needs a CUDA GPU."""


@dataclass
class Trial:
    """One check: what the worker runs (``call``, ``args``) and how the judge grades what comes back."""
    name: str
    call: str                                   # a key of CALLS: the worker runs CALLS[call](run, **args)
    args: dict                                  # the inputs (tensors, numbers, strings), all the worker gets
    ref: object                                 # float64 reference (tensor or tuple), computed by the judge
    tol: float                                  # relative-error tolerance
    exact: bool = False                         # compare integers exactly (counts)
    scale: object = None                        # magnitude of the summed terms (testing.rel_error)
    #: what the call may not run (common.kernel_check, the same check the graded tests make):
    #: aten ops traced on every trial, GPU kernels under the profiler on a GPU.
    forbid: Forbidden = NOTHING
    #: the args an output may share memory with (an in-place contract: add_bias_, write_kv, out=).
    #: Outputs never share memory with the other args, with each other or with earlier trials' outputs.
    inplace: tuple[str, ...] = ()
    #: the dtype of each output (None: not checked), e.g. 7a's logsumexp is float32 for any input
    dtypes: tuple | None = None
    #: the judge's checks of the facts the call reported: fn(facts) -> what is wrong, or None
    judge: Callable[[dict], str | None] | None = None


class Run:
    """What a call gets in the worker: ``load`` (the submission's modules) and ``fact`` (report a
    number or string for the judge to check)."""

    def __init__(self, load: Load):
        self.load = load
        self.facts: dict = {}

    def fact(self, key: str, value) -> None:
        self.facts[key] = value


#: The worker's calls, by name: the only code a trial makes the worker run.
CALLS: dict[str, Callable] = {}


def _call(fn: Callable) -> Callable:
    CALLS[fn.__name__] = fn
    return fn


@dataclass
class Perf:
    """A timed case: ``inputs(g)`` draws one input set (new storage, new values, on the GPU) from the
    CUDA generator ``g``; ``submission(inp)`` and ``baseline(inp)`` compute on it. The timing loop
    draws fresh values into an input set before every timed call and checks the submission's output
    against the baseline's on those values (common.timing.bench_fresh)."""
    label: str
    inputs: Callable[[torch.Generator], dict]
    submission: Callable[[dict], object]
    baseline: Callable[[dict], object]
    baseline_name: str
    flops: float
    bytes: float
    tol: float = 2e-2          # relative error allowed between submission and baseline at the timed size


@dataclass
class Stage:
    folder: str
    title: str
    trials: Callable[[random.Random], list[Trial]]
    #: the performance case, or several (one per shape): their speedups' geometric mean is scored
    perf: Callable[[Load], Perf | list[Perf]] | None = None
    perf_target: float = 0.9        # speed vs baseline that earns the full performance points
    #: relative error allowed between each timed call's output and the baseline's on the same inputs
    perf_tol: float = 2e-2
    gpu_only: bool = False
    extra: dict = field(default_factory=dict)
    #: what this GPU cannot run of the stage (an sm_90-only version on an A100), the grader's note on it
    not_here: Callable[[], list[str]] | None = None

    @property
    def key(self) -> str:
        return self.folder[:3]


def perf_cases(stage: Stage, load: Load) -> list[Perf]:
    """The stage's performance cases as a list (a stage may give one :class:`Perf` or several)."""
    p = stage.perf(load)
    return list(p) if isinstance(p, (list, tuple)) else [p]


def _gen(rng: random.Random) -> torch.Generator:
    return torch.Generator().manual_seed(rng.randrange(2**62))


def _randn(g: torch.Generator, *shape: int, dtype=torch.float32, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=g) * scale).to(device=DEVICE, dtype=dtype)


def _cuda_randn(g: torch.Generator, *shape: int, dtype=torch.bfloat16) -> torch.Tensor:
    """Random normal values drawn on the GPU (perf inputs: large, drawn before every timed call)."""
    return torch.randn(*shape, device="cuda", dtype=torch.float32, generator=g).to(dtype)


#: The dtype of a stage's i-th draw: DTYPE_CYCLE[i % 3]. Three draws cover every dtype, so a fault
#: in one dtype's path (LayerNorm statistics kept in 16 bits, say) is never let through by the luck
#: of a random pick; the first draw is fp32, whose tolerance is the tightest. Shapes and values
#: stay random.
DTYPE_CYCLE = (torch.float32, torch.bfloat16, torch.float16)


def _dtype_of_draw(i: int) -> torch.dtype:
    return DTYPE_CYCLE[i % len(DTYPE_CYCLE)]


def _pick_dtype(rng):
    """A random dtype: only for a trial whose kernel does not depend on it (the KV-cache copy)."""
    return rng.choice(DTYPE_CYCLE)


def _with_repeat(rng: random.Random, g: torch.Generator, build, n: int, repeat: int = 1) -> list[Trial]:
    """The trials of ``build(shape_rng, g, i)`` for i < n (a list each), each draw with shapes (and
    dtypes) from its own seeded ``shape_rng`` and values from ``g``; then the first ``repeat`` draws
    once more, the same shapes with new values from ``g``. Shapes drawn fresh never repeat, so only
    these catch a submission that memoises its outputs per shape (cached from an earlier call)."""
    seeds = [rng.randrange(2**62) for _ in range(n)]
    trials = [t for i, s in enumerate(seeds) for t in build(random.Random(s), g, i)]
    for i in range(repeat):
        for t in build(random.Random(seeds[i]), g, i):
            t.name += " [the shapes of an earlier trial again, new values]"
            trials.append(t)
    return trials


def _twice(name: str, call: str, args: dict, refs: tuple, tol: float, **kw) -> Trial:
    """A trial whose call runs the submission twice on the *same* input tensor, refilled between the
    calls with ``x2``'s values, and keeps both outputs: an output memoised by the input's address (or
    shape) leaves the second output wrong, one output buffer shared by the calls the first."""
    return Trial(f"{name}, called twice on one input tensor with new values (both outputs kept)", call, args, refs,
                 tol, **kw)


def _refilled(x: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
    """x with x2's values, in place (between the two calls of a ``_twice`` trial)."""
    with torch.no_grad():
        return x.copy_(x2)


# ----------------------------------------------------------------------------- a01
#: Host <-> device copies the student's counter must count as the harness does, on fake CUDA
#: tensors: (name, fn(x on cuda, h on the host)). Copies combined with a cast, device-to-device
#: and peer copies (no host transfer), non-blocking copies, copies into existing tensors.
A01_PROBES: dict[str, Callable] = {
    "to_host_with_cast": lambda x, h: x.to("cpu", torch.float64),
    "to_device_with_cast": lambda x, h: h.to(x.device, torch.float16),
    "double_then_cpu": lambda x, h: x.double().cpu(),
    "copy_into_host_float64": lambda x, h: torch.empty(h.shape, dtype=torch.float64).copy_(x),
    "to_device_non_blocking": lambda x, h: h.to(x.device, non_blocking=True),
    "device_to_device": lambda x, h: x.to(x.device).clone(),
    "cast_on_device": lambda x, h: x.to(torch.float16),
    "non_blocking_round_trip": lambda x, h: x.to("cpu", non_blocking=True).to(x.device, non_blocking=True),
}


if not HAS_CUDA or torch.cuda.device_count() > 1:
    # fake tensors on a second GPU: a CPU-only torch makes them without a driver; on a GPU machine the
    # fake mode asks the driver for that device, so a machine with one GPU leaves these out
    A01_PROBES["peer_copy"] = lambda x, h: x.to("cuda:1")
    A01_PROBES["peer_copy_with_cast"] = lambda x, h: x.to("cuda:1", torch.bfloat16)


def _a01_roundtrip(x, h, fin, fout, bias):
    """The round-trip Linear's copies (the given layer, written out): 4 with a bias, 2 without."""
    w = torch.randn(fout, fin, device="cuda")
    b = torch.randn(fout) if bias else None
    w_t = w.to("cpu").t().contiguous()
    y = x @ w_t.to(x.device)
    if b is None:
        return y
    return (y.to("cpu") + b).to(x.device)


def _a01_run(probe: str, lead: tuple, fin: int, fout: int, bias: bool, counter=None) -> list[int]:
    """Run one probe on fresh fake tensors, counted by ``counter`` (a TorchDispatchMode class with
    htod/dtoh) or, without one, by the harness's own trace."""
    with fake_cuda():
        x = torch.randn(*lead, fin, device="cuda")
        h = torch.randn(*lead, fin)
        fn = (lambda: _a01_roundtrip(x, h, fin, fout, bias)) if probe == "roundtrip" else (lambda: A01_PROBES[probe](x, h))
        if counter is None:
            with trace_ops() as t:
                fn()
            return [t.htod, t.dtoh]
        with counter() as c:
            fn()
        return [c.htod, c.dtoh]


@_call
def a01_counter(r: Run, probe: str, lead: tuple, fin: int, fout: int, bias: bool):
    mod = r.load("a01_roundtrip_linear.roundtrip_linear")
    return torch.tensor(_a01_run(probe, lead, fin, fout, bias, counter=mod.HostTransferCounter))


def _a01_trials(rng):
    trials = []
    probes = ["roundtrip"] * 3 + sorted(A01_PROBES)         # every kind of copy, every time
    for probe in probes:
        fin, fout = rng.randint(2, 300), rng.randint(2, 300)
        lead = tuple(rng.randint(1, 9) for _ in range(rng.randint(1, 3)))
        bias = rng.random() < 0.6
        args = dict(probe=probe, lead=lead, fin=fin, fout=fout, bias=bias)
        expected = torch.tensor(_a01_run(**args))
        what = f"RoundTripLinear {fin}->{fout} lead={lead} bias={bias}" if probe == "roundtrip" else probe
        trials.append(Trial(f"HostTransferCounter on {what} (htod, dtoh)", "a01_counter", args, expected, 0,
                            exact=True))
    return trials


# ----------------------------------------------------------------------------- a02
@_call
def a02_linear(r: Run, w, b, x):
    return r.load("a02_pretransposed_linear.pretransposed_linear").PretransposedLinear(w, b)(x)


@_call
def a02_linear_twice(r: Run, w, b, x, x2):
    layer = r.load("a02_pretransposed_linear.pretransposed_linear").PretransposedLinear(w, b)
    return layer(x), layer(_refilled(x, x2))


@_call
def a02_transfers(r: Run, bias: bool):
    return _count_layer(r.load("a02_pretransposed_linear.pretransposed_linear").PretransposedLinear, bias)


def _a02_trials(rng):
    g = _gen(rng)

    def build(r, g, i):
        dtype = _dtype_of_draw(i)
        fin, fout = r.randint(1, 400), r.randint(1, 700)
        lead = tuple(r.randint(1, 7) for _ in range(r.randint(1, 3)))
        bias = r.random() < 0.5
        w = _randn(g, fout, fin, dtype=dtype, scale=fin**-0.5)
        b = _randn(g, fout, dtype=dtype) if bias else None
        x = _randn(g, *lead, fin, dtype=dtype)
        return [Trial(f"PretransposedLinear {fin}->{fout} lead={lead} {dtype}", "a02_linear", dict(w=w, b=b, x=x),
                      ref.linear(x, w, b), REL_TOL[dtype], scale=ref.linear_scale(x, w, b), dtypes=(dtype,))]
    trials = _with_repeat(rng, g, build, 3)
    dtype = rng.choice(DTYPE_CYCLE)
    fin, fout, lead = rng.randint(1, 300), rng.randint(1, 300), (rng.randint(1, 5), rng.randint(1, 5))
    w, b = _randn(g, fout, fin, dtype=dtype, scale=fin**-0.5), _randn(g, fout, dtype=dtype)
    x, x2 = _randn(g, *lead, fin, dtype=dtype), _randn(g, *lead, fin, dtype=dtype)
    trials.append(_twice(f"PretransposedLinear {fin}->{fout} lead={lead} {dtype}", "a02_linear_twice",
                         dict(w=w, b=b, x=x, x2=x2), (ref.linear(x, w, b), ref.linear(x2, w, b)), REL_TOL[dtype],
                         scale=(ref.linear_scale(x, w, b), ref.linear_scale(x2, w, b))))
    bias = rng.random() < 0.5
    trials.append(Trial(f"host transfers per call, bias={bias}", "a02_transfers", dict(bias=bias),
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
    layer = mod.PretransposedLinear.from_linear(lin)
    m, n, k = 32 * 1024, 3072, 768
    return Perf("PretransposedLinear 32x1024 768->3072 bf16, no bias",
                lambda g: {"x": _cuda_randn(g, 32, 1024, 768)}, lambda i: layer(i["x"]),
                lambda i: F.linear(i["x"], lin.weight), "F.linear", matmul_flops(m, n, k),
                matmul_bytes(m, n, k, torch.bfloat16))


# ----------------------------------------------------------------------------- a03
@_call
def a03_add_bias(r: Run, y, b):
    return r.load("a03_fused_linear.add_bias").add_bias(y, b)


@_call
def a03_add_bias_twice(r: Run, y, b, x2):
    ab = r.load("a03_fused_linear.add_bias")
    return ab.add_bias(y, b), ab.add_bias(_refilled(y, x2), b)


@_call
def a03_add_bias_inplace(r: Run, y, b):
    r.load("a03_fused_linear.add_bias").add_bias_(y, b)
    return y


@_call
def a03_fused_linear(r: Run, w, b, x, backend: str):
    layer = r.load("a03_fused_linear.fused_linear").FusedLinear(w, b, backend)
    out, copies = input_copies(lambda: layer(x), **{**held_tensors(layer), "weight (as given)": w})
    r.fact("copies", copies)
    return out


@_call
def a03_fused_linear_twice(r: Run, w, b, x, x2, backend: str):
    layer = r.load("a03_fused_linear.fused_linear").FusedLinear(w, b, backend)
    return layer(x), layer(_refilled(x, x2))


@_call
def a03_transfers(r: Run):
    return _count_layer(r.load("a03_fused_linear.fused_linear").FusedLinear, True)


def _no_copies(facts: dict) -> str | None:
    """Judge: the call copied no input per call (common.kernel_check.input_copies)."""
    copies = facts.get("copies", [])
    return f"copied an input on every call ({'; '.join(copies)}): read it in place, as the contract says" \
        if copies else None


def _a03_trials(rng):
    g = _gen(rng)

    def bias_pair(r, g, i):
        dtype = _dtype_of_draw(i)
        shape = tuple(r.randint(1, 40) for _ in range(r.randint(1, 2))) + (r.randint(1, 1100),)
        y, b = _randn(g, *shape, dtype=dtype), _randn(g, shape[-1], dtype=dtype)
        expected = ref.add_bias(y, b)
        return [Trial(f"add_bias {shape} {dtype}", "a03_add_bias", dict(y=y, b=b), expected, REL_TOL[dtype],
                      forbid=BIAS_KERNEL, dtypes=(dtype,)),
                Trial(f"add_bias_ (in place) {shape} {dtype}", "a03_add_bias_inplace", dict(y=y.clone(), b=b),
                      expected, REL_TOL[dtype], forbid=BIAS_KERNEL, inplace=("y",), dtypes=(dtype,))]

    def linear(r, g, i):
        backend = ("addmm", "triton")[i % 2]
        dtype = _dtype_of_draw(i // 2)           # each backend in each dtype
        fin, fout = r.randint(1, 300), r.randint(1, 900)
        lead = tuple(r.randint(1, 6) for _ in range(r.randint(1, 3)))
        w = _randn(g, fout, fin, dtype=dtype, scale=fin**-0.5)
        b = _randn(g, fout, dtype=dtype)
        x = _randn(g, *lead, fin, dtype=dtype)
        return [Trial(f"FusedLinear({backend}) {fin}->{fout} lead={lead} {dtype}", "a03_fused_linear",
                      dict(w=w, b=b, x=x, backend=backend), ref.linear(x, w, b), REL_TOL[dtype],
                      scale=ref.linear_scale(x, w, b), forbid=FUSED_LINEAR[backend], dtypes=(dtype,),
                      judge=_no_copies)]
    trials = _with_repeat(rng, g, bias_pair, 3) + _with_repeat(rng, g, linear, 6, repeat=2)
    dtype = rng.choice(DTYPE_CYCLE)
    shape = (rng.randint(1, 20), rng.randint(1, 700))
    y, y2, b = _randn(g, *shape, dtype=dtype), _randn(g, *shape, dtype=dtype), _randn(g, shape[1], dtype=dtype)
    trials.append(_twice(f"add_bias {shape} {dtype}", "a03_add_bias_twice", dict(y=y, b=b, x2=y2),
                         (ref.add_bias(y, b), ref.add_bias(y2, b)), REL_TOL[dtype], forbid=BIAS_KERNEL))
    backend = rng.choice(["addmm", "triton"])
    fin, fout = rng.randint(1, 200), rng.randint(1, 300)
    w, b = _randn(g, fout, fin, dtype=dtype, scale=fin**-0.5), _randn(g, fout, dtype=dtype)
    x, x2 = _randn(g, 3, fin, dtype=dtype), _randn(g, 3, fin, dtype=dtype)
    trials.append(_twice(f"FusedLinear({backend}) {fin}->{fout} {dtype}", "a03_fused_linear_twice",
                         dict(w=w, b=b, x=x, x2=x2, backend=backend), (ref.linear(x, w, b), ref.linear(x2, w, b)),
                         REL_TOL[dtype], scale=(ref.linear_scale(x, w, b), ref.linear_scale(x2, w, b)),
                         forbid=FUSED_LINEAR[backend]))
    trials.append(Trial("FusedLinear host transfers per call", "a03_transfers", {}, torch.tensor([0]), 0, exact=True))
    return trials


def _a03_perf(load):
    fl = load("a03_fused_linear.fused_linear")
    lin = torch.nn.Linear(768, 3072, device="cuda", dtype=torch.bfloat16)
    layer = fl.FusedLinear.from_linear(lin)
    m, n, k = 32 * 1024, 3072, 768
    return Perf("FusedLinear 32x1024 768->3072 bf16", lambda g: {"x": _cuda_randn(g, 32, 1024, 768)},
                lambda i: layer(i["x"]), lambda i: F.linear(i["x"], lin.weight, lin.bias), "F.linear",
                matmul_flops(m, n, k), matmul_bytes(m, n, k, torch.bfloat16, bias=True))


# ----------------------------------------------------------------------------- a04 / a05
#: The GELU each GELU stage grades: (module, function name).
GELU_FN = {"a04": ("a04_cuda_gelu.fused_gelu", "fused_gelu"), "a05": ("a05_triton_gelu.gelu_triton", "gelu")}


@_call
def gelu(r: Run, stage: str, x):
    module, name = GELU_FN[stage]
    return getattr(r.load(module), name)(x)


@_call
def gelu_twice(r: Run, stage: str, x, x2):
    module, name = GELU_FN[stage]
    fn = getattr(r.load(module), name)
    return fn(x), fn(_refilled(x, x2))


def _gelu_trials(stage: str, label: str, rng):
    """Three draws, the first in fp32: only fp32's tolerance (1e-5) tells GPT-2's tanh GELU from the
    erf GELU (1e-4 apart; in bf16 and fp16 both round to nearly the same values). Errors are measured
    against |x| as well as the output (GELU(x) = x·Φ(x)): in fp32 the tanh form underflows to 0 below
    x = -10.1, where the exact value is 1e-38 to 1e-42, and a correct kernel must not fail there."""
    g = _gen(rng)

    def build(r, g, i):
        dtype = _dtype_of_draw(i)              # fp32 first
        lead = 50 if HAS_CUDA else 8          # the interpreter runs each block in Python: <= 1.5M elements
        shape = tuple(r.randint(1, lead) for _ in range(r.randint(1, 3))) + (r.randint(1, 3000),)
        x = _randn(g, *shape, dtype=dtype, scale=3.0)
        return [Trial(f"{label} {shape} {dtype}", "gelu", dict(stage=stage, x=x), ref.gelu_tanh(x), REL_TOL[dtype],
                      scale=x.abs(), forbid=GELU_KERNEL, dtypes=(dtype,))]
    trials = _with_repeat(rng, g, build, 3)
    dtype = rng.choice(DTYPE_CYCLE)
    shape = (rng.randint(1, 8), rng.randint(1, 2000))
    x, x2 = _randn(g, *shape, dtype=dtype, scale=3.0), _randn(g, *shape, dtype=dtype, scale=3.0)
    trials.append(_twice(f"{label} {shape} {dtype}", "gelu_twice", dict(stage=stage, x=x, x2=x2),
                         (ref.gelu_tanh(x), ref.gelu_tanh(x2)), REL_TOL[dtype], scale=(x.abs(), x2.abs()),
                         forbid=GELU_KERNEL))
    return trials


def _a04_trials(rng):
    if not HAS_CUDA:
        raise NeedsGPU("the CUDA op runs on a GPU (its sources are compile-checked by the tests on CPU)")
    return _gelu_trials("a04", "fused_gelu (CUDA)", rng)


def _a05_trials(rng):
    return _gelu_trials("a05", "gelu (Triton)", rng)


#: GELU's speed cases: GPT-2 small's MLP activation at 8192 tokens [8192, 4·768], and an odd size
#: (an odd element count: the last block is partial, no 16-byte alignment of the tail).
GELU_SHAPES = ((8192, 4 * GPT2_MODELS["small"][0]), (4099, 6397))


def _gelu_perf(stage: str, label: str):
    def perf(load):
        module, name = GELU_FN[stage]
        fn = getattr(load(module), name)
        cases = []
        for shape in GELU_SHAPES:
            n = math.prod(shape)
            cases.append(Perf(f"{label} {'x'.join(map(str, shape))} bf16",
                              lambda g, shape=shape: {"x": _cuda_randn(g, *shape)}, lambda i: fn(i["x"]),
                              lambda i: F.gelu(i["x"], approximate="tanh"), 'F.gelu(approximate="tanh")', 8.0 * n,
                              elementwise_bytes(n, torch.bfloat16)))
        return cases
    return perf


# ----------------------------------------------------------------------------- a06
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
    # linear_gelu: nn.Linear's weight [N, K] read in place (a weight copied per call is refused)
    m, n, k = rng.randint(1, small), rng.randint(1, small), rng.randint(1, small)
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


# ----------------------------------------------------------------------------- a07
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
        from .kernel_check import NewTensor
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
            + _long_attn_trials("triton", "Triton", rng, ATTENTION_KERNEL))


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


# ----------------------------------------------------------------------------- a08
A08_TINY = dict(vocab_size=257, n_positions=64, n_embd=64, n_layer=2)


def _nan(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


@_call
def a08_decode_attention(r: Run, qkv, k, v, lens, h: int, d: int, splits, out):
    dec = r.load("a08_gpt2_inference.decode_attention")
    return dec.decode_attention(qkv[:, :h * d].view(qkv.shape[0], h, d), k, v, lens, splits=splits, out=out)


def _decode_attention_trial(g, rng, splits_forced: bool, dtype: torch.dtype) -> Trial:
    b, h = rng.randint(2, 4 if not HAS_CUDA else 8), rng.randint(1, 4 if not HAS_CUDA else 16)
    d = rng.choice([16, 32, 64])
    s_max = rng.randint(2, 120 if not HAS_CUDA else 2000)
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
    """With and without a residual, in every dtype (DTYPE_CYCLE)."""
    return [t for dtype in DTYPE_CYCLE for t in _layernorm_pair(g, rng, dtype)]


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


def _write_kv_trial(g, rng) -> Trial:
    dtype = _pick_dtype(rng)
    b, h, d = rng.randint(1, 4), rng.randint(1, 4), rng.choice([16, 32, 64])
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
    return (f"stage 8 runs on {' and '.join(missing)}, which is not implemented yet: finish it, or try stage 8 "
            f"on the reference ones with --borrow {','.join(m.split()[1] for m in missing)} (pytest and the grader)")


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

    # (d) greedy generation, token for token with transformers' generate (float64) per prompt. A
    # step whose two best logits nearly tie could flip on rounding alone: such prompts are redrawn.
    new = 4
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
            + _layernorm_trials(g, rng) + [_write_kv_trial(g, rng)] + _gemv_trials(g, rng) + _engine_trials(g, rng))


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
    return Perf(f"GPT-2 decode step (n_embd {c}, {n_layer} layers), batch {b}, context {ctx}, "
                f"{str(dtype).replace('torch.', '')}", inputs, submission, lambda i: hf_step(i["tok"]),
                "transformers GPT2LMHeadModel, StaticCache", flops, nbytes, tol=tol)


#: GPT-2 small's shape; the initializer range of GPT-2 itself.
GPT2_SMALL = dict(vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, initializer_range=0.02)


#: bf16 through 12 layers: transformers itself is ~1.2e-2 (relative) from float64 at this shape,
#: so two correct bf16 implementations differ by up to ~2-3e-2; wrong logits are off by ~1.
A08_PERF_TOL = 6e-2


def _a08_perf(load):
    return a08_decode_case(load, GPT2_SMALL, batch=1, ctx=128, dtype=torch.bfloat16, tol=A08_PERF_TOL)


STAGES: list[Stage] = [
    Stage("a01_roundtrip_linear", "Round-trip Linear: transfer counter", _a01_trials),
    Stage("a02_pretransposed_linear", "Pre-transposed Linear", _a02_trials, _a02_perf),
    Stage("a03_fused_linear", "Bias kernel + fused Linear", _a03_trials, _a03_perf),
    Stage("a04_cuda_gelu", "Fused GELU (CUDA op)", _a04_trials, _gelu_perf("a04", "CUDA fused_gelu"), gpu_only=True),
    Stage("a05_triton_gelu", "Fused GELU (Triton)", _a05_trials, _gelu_perf("a05", "Triton gelu")),
    Stage("a06_matmul", "Tiled matmul (CUDA + Triton)", _a06_trials, _a06_perf, perf_target=0.8,
          not_here=_a06_not_here),
    Stage("a07_flash_attention", "Flash attention fwd+bwd", _a07_trials, _a07_perf, perf_target=0.7),
    Stage("a08_gpt2_inference", "GPT-2 inference: prefill + KV-cache decode", _a08_trials, _a08_perf, perf_target=1.0,
          perf_tol=A08_PERF_TOL),
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
