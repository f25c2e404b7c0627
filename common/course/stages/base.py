"""What every stage's spec is made of: :class:`Trial`, :class:`Run` and the registered calls
(:data:`CALLS`), :class:`Perf`, :class:`Stage`, and the helpers the stages draw their inputs with."""
from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from common import DEVICE
from common.profiling import fake_cuda, trace_ops
from common.kernel_check import NOTHING, Forbidden

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


def _count_layer(cls, bias, fin=64, fout=96):
    """Host transfers of one call of a Linear layer class (stages 2 and 3), on fake CUDA tensors."""
    with fake_cuda():
        layer = cls(torch.randn(fout, fin, device="cuda"), torch.randn(fout, device="cuda") if bias else None)
        x = torch.randn(3, 5, fin, device="cuda")
        with trace_ops() as t:
            layer(x)
    return torch.tensor([t.host_transfers])


def _no_copies(facts: dict) -> str | None:
    """Judge: the call copied no input per call (common.kernel_check.input_copies)."""
    copies = facts.get("copies", [])
    return f"copied an input on every call ({'; '.join(copies)}): read it in place, as the contract says" \
        if copies else None


def tensors(x) -> list[torch.Tensor]:
    """Flatten a result (tensor / tuple / list) into a list of tensors."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in tensors(item)]
    raise TypeError(f"expected tensors, got {type(x).__name__}")


def nan_safe(v: float) -> float | None:
    return None if v is None or (isinstance(v, float) and (math.isnan(v) or math.isinf(v))) else v
