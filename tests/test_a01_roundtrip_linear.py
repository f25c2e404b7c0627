"""Stage 1: counting the round trips of RoundTripLinear.

CPU: the student's HostTransferCounter on fake CUDA tensors, checked against the
harness's own counter; answers.toml. GPU: transfer_report against the profiler.
"""
import math
import tomllib

import pytest
import torch

from common.profiling import fake_cuda, profile, trace_ops
from common.course.stages import COPY_CLASSES, copy_class, fake_copies, one_copy
from tests.ids import bias_id

STAGE = "a01_roundtrip_linear"
MOD = f"{STAGE}.roundtrip_linear"


@pytest.fixture
def mod(impl):
    return impl.load(MOD)


def _count_layer(mod, bias: bool, in_f=48, out_f=80, lead=(3, 5)):
    with fake_cuda():
        w = torch.randn(out_f, in_f, device="cuda")
        b = torch.randn(out_f, device="cuda") if bias else None
        layer = mod.RoundTripLinear(w, b)
        x = torch.randn(*lead, in_f, device="cuda")
        with mod.HostTransferCounter() as mine:
            y = layer(x)
        with trace_ops() as ref:
            layer(x)
    assert tuple(y.shape) == (*lead, out_f) and y.device.type == "cuda", "the counter changed the layer's output"
    return mine, ref


@pytest.mark.parametrize("bias,expected", [(True, 4), (False, 2)])
def test_counter_roundtrip_linear(mod, bias, expected):
    mine, ref = _count_layer(mod, bias)
    assert ref.host_transfers == expected  # the harness's own count: the layer is given code
    assert (mine.htod, mine.dtoh) == (ref.htod, ref.dtoh), (
        f"HostTransferCounter saw htod={mine.htod}, dtoh={mine.dtoh}; the layer does htod={ref.htod}, dtoh={ref.dtoh}")
    assert mine.total == expected


SNIPPETS = {
    "to_cpu": lambda x, h: x.to("cpu"),
    "cpu_method": lambda x, h: x.cpu(),
    "there_and_back": lambda x, h: x.cpu().mul(2).to(x.device),
    "host_to_device": lambda x, h: h.to(x.device),
    "copy_into_host": lambda x, h: h.copy_(x),
    "device_only": lambda x, h: (x * 2 + 1).sum(),
    "host_only": lambda x, h: (h @ h.T).clone(),
    "device_clone": lambda x, h: x.clone().to(x.device),
    "cast_on_device": lambda x, h: x.to(torch.float16),
    "cast_on_host": lambda x, h: h.to(torch.float64),
    "copy_within_host": lambda x, h: torch.empty_like(h).copy_(h),
    "two_each_way": lambda x, h: [x.to("cpu"), h.to(x.device), x.sum().cpu(), (h + 1).to(x.device)],
    # a copy combined with a cast is still one host transfer; device-to-device and peer copies are none
    "to_host_with_cast": lambda x, h: x.to("cpu", torch.float64),
    "to_device_with_cast": lambda x, h: h.to(x.device, torch.float16),
    "copy_into_host_float64": lambda x, h: torch.empty(h.shape, dtype=torch.float64).copy_(x),
    "non_blocking": lambda x, h: h.to(x.device, non_blocking=True).to("cpu", non_blocking=True),
}
if not torch.cuda.is_available() or torch.cuda.device_count() > 1:   # fake tensors on a 2nd GPU (see common.course.stages)
    SNIPPETS["peer_copy"] = lambda x, h: x.to("cuda:1")
    SNIPPETS["peer_copy_with_cast"] = lambda x, h: x.to("cuda:1", torch.bfloat16)


@pytest.mark.parametrize("name", sorted(SNIPPETS))
def test_counter_matches_harness(mod, name):
    snippet = SNIPPETS[name]
    with fake_cuda():
        x = torch.randn(6, 6, device="cuda")
        h = torch.randn(6, 6)
        with mod.HostTransferCounter() as mine:
            snippet(x, h)
        with trace_ops() as ref:
            snippet(x, h)
    assert (mine.htod, mine.dtoh) == (ref.htod, ref.dtoh), (
        f"{name}: counted htod={mine.htod}, dtoh={mine.dtoh}; expected htod={ref.htod}, dtoh={ref.dtoh}")


def _pair_id(p):
    return f"{p[0]}->{p[1]}"


@pytest.mark.parametrize("pair,how,cast", fake_copies(),
                         ids=[f"{_pair_id(p)}-{h}-{'cast' if c else 'same_dtype'}" for p, h, c in fake_copies()])
def test_counter_classifies_copy(mod, pair, how, cast):
    """One copy of each class on fake tensors: host-to-device, device-to-host, device-to-device, peer
    (GPU to GPU) and within the host, by .to() and by copy_(), with and without a cast on the way."""
    src, dst = pair
    with fake_cuda():
        with mod.HostTransferCounter() as mine:
            one_copy(src, dst, how, cast)
        with trace_ops() as ref:
            one_copy(src, dst, how, cast)
    expected = COPY_CLASSES[pair]
    assert (ref.htod, ref.dtoh) == expected, f"the harness counts ({ref.htod}, {ref.dtoh}) for {pair}"
    assert (mine.htod, mine.dtoh) == expected, (
        f"a {copy_class(src, dst)} copy {src} -> {dst} by {how}{' with a cast' if cast else ''}: counted "
        f"htod={mine.htod}, dtoh={mine.dtoh}; expected htod={expected[0]}, dtoh={expected[1]} (only a copy between "
        "the host and a device is a host transfer; classify it by both ends, source and destination)")


def _real_pair(pair):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    if "cuda:1" in pair and torch.cuda.device_count() < 2:
        pytest.skip(f"a peer copy needs two GPUs; this machine has {torch.cuda.device_count()}")


def _real_copy(pair, how, cast, shape=(64, 96)):
    src, dst = pair
    a = torch.randn(*shape, device=src)
    out = torch.empty(*shape, dtype=torch.float16 if cast else a.dtype, device=dst)
    torch.cuda.synchronize()
    return (lambda: a.to(dst, out.dtype, copy=True)) if how == "to" else (lambda: out.copy_(a))


@pytest.mark.gpu
@pytest.mark.parametrize("cast", [False, True], ids=["same_dtype", "cast"])
@pytest.mark.parametrize("how", ["to", "copy_"])
@pytest.mark.parametrize("pair", list(COPY_CLASSES), ids=_pair_id)
def test_counter_classifies_real_copy(mod, pair, how, cast):
    """The counter on real tensors, one copy of each class (peer copies: two GPUs)."""
    _real_pair(pair)
    copy = _real_copy(pair, how, cast)
    with mod.HostTransferCounter() as mine:
        copy()
    torch.cuda.synchronize()
    expected = COPY_CLASSES[pair]
    assert (mine.htod, mine.dtoh) == expected, (
        f"a {copy_class(*pair)} copy {pair[0]} -> {pair[1]} by {how}{' with a cast' if cast else ''} on real "
        f"tensors: counted htod={mine.htod}, dtoh={mine.dtoh}; expected htod={expected[0]}, dtoh={expected[1]}")


@pytest.mark.gpu
@pytest.mark.parametrize("cast", [False, True], ids=["same_dtype", "cast"])
@pytest.mark.parametrize("how", ["to", "copy_"])
@pytest.mark.parametrize("pair", list(COPY_CLASSES), ids=_pair_id)
def test_transfer_report_classifies_copy(mod, pair, how, cast):
    """transfer_report on one copy of each class: a device-to-device or peer memcpy (Memcpy DtoD, PtoP) is
    no host transfer; the profiler's own count (common.profiling.profile) is the reference."""
    _real_pair(pair)
    copy = _real_copy(pair, how, cast)
    rep = mod.transfer_report(copy, calls=4)
    ref = profile(copy, calls=4)
    assert (ref.htod, ref.dtoh) == COPY_CLASSES[pair], f"the harness's profile counts ({ref.htod}, {ref.dtoh})"
    assert (rep.htod_per_call, rep.dtoh_per_call) == (ref.htod, ref.dtoh), (
        f"transfer_report on a {copy_class(*pair)} copy {pair[0]} -> {pair[1]} by {how}"
        f"{' with a cast' if cast else ''}: HtoD {rep.htod_per_call}, DtoH {rep.dtoh_per_call} per call; the "
        f"profiler shows HtoD {ref.htod}, DtoH {ref.dtoh} (a Memcpy DtoD or PtoP is no host transfer)")


def test_counter_keeps_results(mod):
    """Counting must not change values: run real (CPU) ops under the counter."""
    x = torch.randn(17, 9)
    w = torch.randn(9, 4)
    with mod.HostTransferCounter() as c:
        y = torch.relu(x @ w) + 1
    torch.testing.assert_close(y, torch.relu(x @ w) + 1)
    assert c.total == 0, f"no host<->device copy happened, but the counter says {c.total}"


@pytest.mark.gpu
@pytest.mark.parametrize("bias", [True, False], ids=bias_id)
def test_transfer_report_on_gpu(mod, bias):
    torch.manual_seed(0)
    lin = torch.nn.Linear(768, 3072, bias=bias, device="cuda")
    layer = mod.RoundTripLinear.from_linear(lin)
    x = torch.randn(8, 128, 768, device="cuda")
    rep = mod.transfer_report(lambda: layer(x))
    ref = profile(lambda: layer(x))
    assert (rep.htod_per_call, rep.dtoh_per_call) == (ref.htod, ref.dtoh)
    assert abs(rep.memcpy_share - ref.memcpy_share) < 0.15, (
        f"memcpy share {rep.memcpy_share:.3f}, profiler says {ref.memcpy_share:.3f}")
    assert rep.kernel_us_per_call > 0
    none = mod.transfer_report(lambda: torch.nn.functional.linear(x, lin.weight, lin.bias))
    assert none.htod_per_call == 0 and none.dtoh_per_call == 0 and none.memcpy_share == 0


def test_answers(impl):
    path = impl.path(STAGE) / "answers.toml"
    assert path.exists(), f"{path} is missing"
    ans = tomllib.loads(path.read_text())
    assert ans.get("transfers_with_bias") == 4, f"transfers_with_bias = {ans.get('transfers_with_bias')}: count again"
    assert ans.get("transfers_without_bias") == 2, (
        f"transfers_without_bias = {ans.get('transfers_without_bias')}: count again")
    share = float(ans.get("memcpy_share", math.nan))
    assert 0.5 < share <= 1.0, (
        f"memcpy_share = {share}: the share of GPU time in host copies, a fraction in (0.5, 1] for this layer")
    if torch.cuda.is_available():
        lin = torch.nn.Linear(768, 3072, device="cuda")
        layer = impl.load(MOD).RoundTripLinear.from_linear(lin)
        x = torch.randn(32, 1024, 768, device="cuda")
        measured = profile(lambda: layer(x), calls=3).memcpy_share
        assert abs(share - measured) < 0.15, f"memcpy_share = {share}, this GPU measures {measured:.3f}"
