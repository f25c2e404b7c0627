"""Stage 1, the round-trip Linear: the student's host-transfer counter against the harness's own count."""
from __future__ import annotations

from collections.abc import Callable

import torch

from .. import HAS_CUDA
from ..profiling import fake_cuda, trace_ops
from .base import Run, Stage, Trial, _call


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


STAGE = Stage("a01_roundtrip_linear", "Round-trip Linear: transfer counter", _a01_trials)
