"""Where the host time of the eager calls that miss the host-cost floors goes, part by part (H100).

    python lectures/_tools/gpu/host_parts.py [--rounds 7]

Each group is measured in interleaved rounds (common.course.hostcost.interleaved_us: a host's drift moves the
parts together), µs per eager call, median of the rounds. ``before``: the solutions at .hostcost_before/solutions
(the previous commit's) with common.launch's and common.checks' code of before (``legacy``); the single
changes toggled one by one where named (``memo off``: Launcher.run without its prepared launches;
``tensor args``: prepared launches passing tensors, not their addresses). Toggling costs a few µs a call
itself: ``toggled to itself`` is the after side with the toggle, the fair baseline for ``before`` and the
single changes.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from common.course import hostcost as hc  # noqa: E402
from common import checks  # noqa: E402
from common import launch as cl  # noqa: E402
from common.impl import Impl  # noqa: E402


def _old_prepared_call(self, *args):
    """Prepared.__call__ before its launches took the tensors' addresses as integers (tensors passed on)."""
    if self.ready and torch._C._cuda_getDevice() == self.device and not cl._hooked():
        try:
            hit = self.kernels.get((tuple([args[i] for i in self.fixed_at]),
                                    *[(args[i].dtype, args[i].data_ptr() & 15 == 0, args[i].is_cuda)
                                      for i in self.tensor_at]))
        except (AttributeError, IndexError, RuntimeError, TypeError):
            hit = None
        if hit is not None:
            ck, direct, g = hit
            direct[0](g[0], g[1], g[2], cl._raw_stream(self.device), ck.function, direct[1], direct[2], None,
                      None, ck.packed_metadata, None, None, None, *args, *self.tail)
            return ck
    return self._through_launcher(args)


def _old_check_same(a, b, names, *, dtype=True, device=True):
    if device and a.device != b.device:
        raise ValueError(names)
    if dtype and a.dtype != b.dtype:
        raise TypeError(names)


_NEW = (cl.Launcher.run, cl.Prepared.__call__, checks.check_same)


def legacy(memo=False, ints=False, same=False):
    """Put back the common.launch / common.checks code of before the wrappers' cuts, part by part (True: old)."""
    cl.Launcher.run = cl.Launcher._run if memo else _NEW[0]
    cl.Prepared.__call__ = _old_prepared_call if ints else _NEW[1]
    checks.check_same = _old_check_same if same else _NEW[2]
    for mod in _USERS:                           # the wrappers imported check_same by name
        mod.check_same = checks.check_same


_USERS: list = []


def _find_users():
    """The modules that imported check_same by name (listed once per group: a scan per call costs a ms)."""
    _USERS[:] = [m for m in list(sys.modules.values()) if m is not checks
                 and getattr(m, "check_same", None) in (_NEW[2], _old_check_same)]


def toggled(fn, **old):
    def call():
        legacy(**old)
        try:
            return fn()
        finally:
            legacy()
    return call


def before(fn):
    return toggled(fn, memo=True, ints=True, same=True)


def group(title, parts, rounds):
    names = [n for n, _ in parts]
    _find_users()
    for _, fn in parts:
        for _ in range(5):
            fn()
    torch.cuda.synchronize()
    us = hc.interleaved_us([fn for _, fn in parts], rounds=rounds)
    print(f"\n## {title}")
    for n, u in zip(names, us):
        print(f"{u:8.1f}  {n}")
    sys.stdout.flush()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--before", default=".hostcost_before/solutions")
    args = ap.parse_args()
    impl, old = Impl.get("solutions"), Impl.get(args.before)
    dev, dt = "cuda", torch.bfloat16
    bx = torch.zeros(1, device=dev)
    bare = ("bare Triton launch", lambda: hc.bare_launch(bx))
    r = args.rounds

    # ---- a03 add_bias and FusedLinear(triton)
    ab, ab0 = impl.load("a03_fused_linear.add_bias"), old.load("a03_fused_linear.add_bias")
    fl, fl0 = impl.load("a03_fused_linear.fused_linear"), old.load("a03_fused_linear.fused_linear")
    y, b = torch.randn(8, 64, device=dev, dtype=dt), torch.randn(64, device=dev, dtype=dt)
    out = torch.empty_like(y)
    group("a03 add_bias, y [8, 64]", [
        bare,
        ("add_bias(y, b)", lambda: ab.add_bias(y, b)),
        ("before", before(lambda: ab0.add_bias(y, b))),
        ("add_bias, toggled to itself (the toggle's own cost)", toggled(lambda: ab.add_bias(y, b))),
        ("add_bias, memo off", toggled(lambda: ab.add_bias(y, b), memo=True)),
        ("add_bias, tensor args", toggled(lambda: ab.add_bias(y, b), ints=True)),
        ("add_bias, old check_same", toggled(lambda: ab.add_bias(y, b), same=True)),
        ("_check(y, b)", lambda: ab._check(y, b)),
        ("torch.empty_like(y)", lambda: torch.empty_like(y)),
        ("_launch(y, b, out)", lambda: ab._launch(y, b, out)),
        ("y + b", lambda: y + b),
    ], r)

    w, bias, x = (torch.randn(64, 64, device=dev, dtype=dt), torch.randn(64, device=dev, dtype=dt),
                  torch.randn(8, 64, device=dev, dtype=dt))
    layer, layer0 = fl.FusedLinear(w, bias, backend="triton"), fl0.FusedLinear(w, bias, backend="triton")
    addmm, addmm0 = fl.FusedLinear(w, bias, backend="addmm"), fl0.FusedLinear(w, bias, backend="addmm")
    group("a03 FusedLinear, [8, 64] x 64->64", [
        bare,
        ("FusedLinear(triton)", lambda: layer(x)),
        ("before", before(lambda: layer0(x))),
        ("FusedLinear(triton), toggled to itself", toggled(lambda: layer(x))),
        ("FusedLinear(addmm)", lambda: addmm(x)),
        ("FusedLinear(addmm) before", before(lambda: addmm0(x))),
        ("F.linear(x, w, bias)", lambda: F.linear(x, w, bias)),
    ], r)

    # ---- a08 gemv
    gm, gm0 = impl.load("a08_gpt2_inference.gemv"), old.load("a08_gpt2_inference.gemv")
    gx, gw, gb = (torch.randn(1, 768, device=dev, dtype=dt), torch.randn(768, 768, device=dev, dtype=dt),
                  torch.randn(768, device=dev, dtype=dt))
    ref = torch.addmm(gb.float(), gx.float(), gw.float())
    for f in (gm.gemv, gm0.gemv):
        got = f(gx, gw, gb)
        print("gemv vs fp32 addmm:", (got.float() - ref).abs().max().item())
    m, n, k, out_shape, grid, per, launch, parts = gm._checked_call(gx, gw, gb, None, None, None, None, None, None,
                                                                    False)
    print(f"gemv plan: grid {grid}, per {per}, out_shape {out_shape}")
    gy = torch.empty(out_shape, dtype=dt, device=dev)
    part = torch.empty((grid[1], m, n), dtype=torch.float32, device=dev)
    count = gm._counters(gx.device, grid[0])
    meta = gm.meta

    def key_only():
        key = (meta(gx), meta(gw), meta(gb), meta(None), meta(None), meta(None), None, None, None, False)
        return gm._CALLS.get(key)

    def launch_only():
        launch(gx, gw, gb, gy, part, count, gy, gy, m, n, k, per, gx.stride(0), gx.stride(1), gw.stride(0),
               gw.stride(1), gy.stride(0), gy.stride(0), 1e-5, gy, gy, gy, 0, 0, 0, 0, 1)

    group("a08 gemv + bias, [1, 768] x [768, 768]", [
        bare,
        ("gemv(x, w, b)", lambda: gm.gemv(gx, gw, gb)),
        ("before", before(lambda: gm0.gemv(gx, gw, gb))),
        ("gemv, toggled to itself", toggled(lambda: gm.gemv(gx, gw, gb))),
        ("gemv, tensor args", toggled(lambda: gm.gemv(gx, gw, gb), ints=True)),
        ("gemv, before's solution", lambda: gm0.gemv(gx, gw, gb)),
        ("gemv(x, w, b, out=y)", lambda: gm.gemv(gx, gw, gb, out=gy)),
        ("key + lookup", key_only),
        ("torch.empty(out_shape, dtype=, device=)", lambda: torch.empty(out_shape, dtype=dt, device=dev)),
        ("gx.new_empty(out_shape)", lambda: gx.new_empty(out_shape)),
        ("prepared launch alone (27 args)", launch_only),
        ("prepared launch alone, tensor args", toggled(launch_only, ints=True)),
        ("torch.addmm(b, x, w)", lambda: torch.addmm(gb, gx, gw)),
    ], r)

    # ---- a07 flash forward + backward
    fm, fm0 = impl.load("a07_flash_attention.flash_triton"), old.load("a07_flash_attention.flash_triton")
    q, kk, v = [torch.randn(1, 2, 64, 64, device=dev, dtype=dt, requires_grad=True) for _ in range(3)]
    do = torch.randn_like(q)
    flash = hc._step(lambda q, k, v: fm.flash_attention(q, k, v, True), q, kk, v, do)
    flash0 = hc._step(lambda q, k, v: fm0.flash_attention(q, k, v, True), q, kk, v, do)
    sdpa = hc._step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), q, kk, v, do)
    with torch.no_grad():
        o, lse = fm.attention_forward(q, kk, v, True)

    def one_thread(fn):
        def call():
            with torch.autograd.set_multithreading_enabled(False):
                fn()
        return call

    group("a07 flash forward + backward, B 1 H 2 S 64 d 64 causal", [
        bare,
        ("flash step (fwd + bwd)", flash),
        ("before", before(flash0)),
        ("flash step, toggled to itself", toggled(flash)),
        ("SDPA step (fwd + bwd)", sdpa),
        ("flash step, engine on one thread", one_thread(flash)),
        ("SDPA step, engine on one thread", one_thread(sdpa)),
        ("flash forward with grad (apply)", lambda: fm.flash_attention(q, kk, v, True)),
        ("SDPA forward with grad", lambda: F.scaled_dot_product_attention(q, kk, v, is_causal=True)),
        ("attention_forward alone", lambda: fm.attention_forward(q, kk, v, True)),
        ("attention_backward alone", lambda: fm.attention_backward(q, kk, v, o, lse, do, True)),
        ("torch.empty_like(q) x 3", lambda: (torch.empty_like(q), torch.empty_like(q), torch.empty_like(q))),
        ("torch.empty((3, 1, 2, 64, 64)).unbind(0)",
         lambda: torch.empty((3, 1, 2, 64, 64), dtype=dt, device=dev).unbind(0)),
        ("torch.empty(1, 2, 64, fp32)", lambda: torch.empty(1, 2, 64, dtype=torch.float32, device=dev)),
    ], r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
