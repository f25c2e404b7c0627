"""Stage 1, the round-trip Linear: the student's host-transfer counter against the harness's own count."""
from __future__ import annotations

from collections.abc import Callable

import torch

from common import HAS_CUDA
from common.profiling import fake_cuda, trace_ops
from common.course.stages.base import Run, Stage, Trial, _call


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


#: One copy from a source device to a destination device, and what it is: (htod, dtoh). Only a copy
#: between the host and a GPU is a host transfer; one within a GPU (device-to-device), between two
#: GPUs (peer) or within the host is none, with or without a dtype cast on the way.
COPY_CLASSES: dict[tuple[str, str], tuple[int, int]] = {
    ("cpu", "cuda:0"): (1, 0), ("cuda:0", "cpu"): (0, 1), ("cuda:0", "cuda:0"): (0, 0), ("cpu", "cpu"): (0, 0),
    ("cuda:0", "cuda:1"): (0, 0), ("cuda:1", "cuda:0"): (0, 0)}
COPY_NAMES = {(1, 0): "host-to-device", (0, 1): "device-to-host"}


def copy_class(src: str, dst: str) -> str:
    """'host-to-device', 'device-to-host', 'device-to-device', 'peer' or 'host' for a copy from src to dst."""
    kind = COPY_NAMES.get(COPY_CLASSES[(src, dst)])
    return kind or ("host" if src == dst == "cpu" else "device-to-device" if src == dst else "peer")


def copy_pairs(real: bool) -> list[tuple[str, str]]:
    """The (source, destination) pairs this machine can run: on real tensors (``real``, a GPU) the peer
    pairs need two GPUs; fake tensors (common.profiling.fake_cuda) on a CPU-only torch make a second
    GPU without a driver, while on a GPU machine the fake mode asks the driver for it."""
    two = torch.cuda.device_count() > 1 if (real or HAS_CUDA) else True
    return [p for p in COPY_CLASSES if two or "cuda:1" not in p]


def fake_copies() -> list[tuple[tuple[str, str], str, bool]]:
    """(pair, how, cast) of the copies checked on fake tensors: every pair by .to(), with and without a
    cast, and copy_() into host memory (a CPU-only torch refuses copy_() into a fake GPU tensor; the
    real-tensor checks on a GPU make those)."""
    return [(p, how, cast) for p in copy_pairs(real=False) for how in ("to", "copy_") for cast in (False, True)
            if how == "to" or p[1] == "cpu"]


def one_copy(src: str, dst: str, how: str, cast: bool) -> None:
    """One copy from ``src`` to ``dst`` (devices as in COPY_CLASSES): ``how`` "to" (aten._to_copy) or
    "copy_" (into a tensor on dst); ``cast``: to float16 on the way. Tensors made here (fake under
    fake_cuda, real otherwise)."""
    a = torch.randn(4, 6, device=src)
    dtype = torch.float16 if cast else a.dtype
    if how == "to":
        a.to(dst, dtype, copy=True)
    else:
        torch.empty(4, 6, dtype=dtype, device=dst).copy_(a)


@_call
def a01_copy(r: Run, src: str, dst: str, how: str, cast: bool, real: bool):
    """The student's counter on one copy: real tensors on a GPU (``real``), fake ones otherwise."""
    counter = r.load("a01_roundtrip_linear.roundtrip_linear").HostTransferCounter
    if real:
        a = torch.randn(4, 6, device=src)
        dst_t = torch.empty(4, 6, dtype=torch.float16 if cast else a.dtype, device=dst)
        torch.cuda.synchronize()
        with counter() as c:
            a.to(dst, dst_t.dtype, copy=True) if how == "to" else dst_t.copy_(a)
        torch.cuda.synchronize()
        return torch.tensor([c.htod, c.dtoh])
    with fake_cuda():
        with counter() as c:
            one_copy(src, dst, how, cast)
    return torch.tensor([c.htod, c.dtoh])


@_call
def a01_report(r: Run, src: str, dst: str, how: str, cast: bool):
    """The student's transfer_report (GPU) on one copy: Memcpy HtoD and DtoH per call."""
    report = r.load("a01_roundtrip_linear.roundtrip_linear").transfer_report
    a = torch.randn(64, 96, device=src)
    dst_t = torch.empty(64, 96, dtype=torch.float16 if cast else a.dtype, device=dst)
    rep = report((lambda: a.to(dst, dst_t.dtype, copy=True)) if how == "to" else (lambda: dst_t.copy_(a)), calls=4)
    return torch.tensor([rep.htod_per_call, rep.dtoh_per_call], dtype=torch.float64)


def _a01_copy_trials(rng) -> list[Trial]:
    """Every class of copy (COPY_CLASSES), as .to() and as copy_(), with and without a cast: the counter on
    fake tensors, on a GPU also on real ones, and there the profiler report too."""
    trials = []
    for (src, dst), how, cast in fake_copies():
        what = f"{copy_class(src, dst)} copy {src} -> {dst} by {'.to()' if how == 'to' else 'copy_()'}" + \
            (" with a cast to float16" if cast else "")
        trials.append(Trial(f"HostTransferCounter on a {what} (htod, dtoh)", "a01_copy",
                            dict(src=src, dst=dst, how=how, cast=cast, real=False),
                            torch.tensor(COPY_CLASSES[(src, dst)]), 0, exact=True))
    if HAS_CUDA:
        for (src, dst), cast in [(p, c) for p in copy_pairs(real=True) for c in (False, True)]:
            how = rng.choice(("to", "copy_"))
            what = f"{copy_class(src, dst)} copy {src} -> {dst} by {'.to()' if how == 'to' else 'copy_()'}" + \
                (" with a cast to float16" if cast else "")
            trials.append(Trial(f"HostTransferCounter on real tensors, a {what} (htod, dtoh)", "a01_copy",
                                dict(src=src, dst=dst, how=how, cast=cast, real=True),
                                torch.tensor(COPY_CLASSES[(src, dst)]), 0, exact=True))
            trials.append(Trial(f"transfer_report on a {what} (Memcpy HtoD, DtoH per call)", "a01_report",
                                dict(src=src, dst=dst, how=how, cast=cast), _profiled(src, dst, how, cast), 0,
                                exact=True))
    return trials


def _profiled(src: str, dst: str, how: str, cast: bool) -> torch.Tensor:
    """What the harness's profiler (common.profiling.profile) counts for the copy, per call, in the judge."""
    from common.profiling import profile
    a = torch.randn(64, 96, device=src)
    dst_t = torch.empty(64, 96, dtype=torch.float16 if cast else a.dtype, device=dst)
    rep = profile((lambda: a.to(dst, dst_t.dtype, copy=True)) if how == "to" else (lambda: dst_t.copy_(a)), calls=4)
    return torch.tensor([float(rep.htod), float(rep.dtoh)], dtype=torch.float64)


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
    return trials + _a01_copy_trials(rng)


STAGE = Stage("a01_roundtrip_linear", "Round-trip Linear: transfer counter", _a01_trials)
#: ``python -m common.course.bench KEY`` runs this module of solutions/ (stages 1-3 share the Linear track's bench)
BENCHES = {"a01": "a03_fused_linear.bench"}


# ----------------------------------------------------------------------------- results (make results)
def results_runs() -> dict:
    """The GPU runs behind this stage's files in lectures/results/ (``make results STAGE=...``): each a
    script and the files it makes (lectures/_tools/results.py)."""
    from solutions.a03_fused_linear.stage import results_runs as linear
    return {"a01": linear()["a01"]}
