"""Where one eager call of a course op spends its host time, piece by piece (GPU only).

    PYTHONPATH=. python lectures/_tools/gpu/launch_breakdown.py [IMPL]

IMPL: a tree whose gemv and matmul launch through common.launch.fast (the solutions before the prepared
launches, 6249f65: ``git archive 6249f65 solutions | tar -x -C DIR``, then DIR/solutions); a prepared launch
(common.launch.Prepared) skips the launcher this measures, and the script says so.
For stage 8's gemv ([1, 768] x [768, 768] + bias, bf16: hostcost's case) and a06's matmul (64x64x64): the
whole call, its launch through common.launch.fast, Triton's binder alone (argument binding and
specialisation), the compiled kernel's native launch function alone, and the wrapper's allocation(s).
µs per eager call, calls back to back, the median of 7 batches of 2000.
"""
import statistics
import sys
import time

import torch

from common.impl import Impl
from common.launch import Launcher, fast

impl = Impl.get(sys.argv[1] if len(sys.argv) > 1 else "solutions")
dev = torch.cuda.current_device()
raw = torch._C._cuda_getCurrentRawStream


def t(fn, n=2000):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    res = []
    for _ in range(7):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        res.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(res)


class Spy:
    """Records the last launch of a kernel through fast(): grid, args, kwargs (Launcher.run patched meanwhile)."""
    def __init__(self, kernel):
        self.launcher, self.last = fast(kernel), None

    def __enter__(self):
        run = self.run = Launcher.run

        def record(launcher, grid, *args, **kwargs):
            if launcher is self.launcher:
                self.last = (grid, args, kwargs)
            return run(launcher, grid, *args, **kwargs)
        Launcher.run = record
        return self

    def __exit__(self, *exc):
        Launcher.run = self.run


def pieces(name, call, kernel):
    call()
    with Spy(kernel) as spy:
        call()
    if spy.last is None:
        raise SystemExit(f"{name}: no launch went through common.launch.fast (a prepared launch?); run this on a "
                         "tree from before the prepared launches (see the top of this file)")
    grid, args, kwargs = spy.last
    launcher = fast(kernel)
    binder = launcher._binder
    bound, spec, options = binder(*args, **kwargs)
    key = (dev, tuple(spec), tuple(options.items()), *list(launcher._cache)[0][3:])
    ck, direct = launcher._cache[key] if key in launcher._cache else next(iter(launcher._cache.values()))
    g = grid(bound) if callable(grid) else grid
    g = (*g, 1, 1)[:3]
    vals = tuple(bound.values())
    rows = [("the whole call", call),
            # Launcher._run: the launch through Triton's binder and the launcher's key (since 6732a1a,
            # fast(kernel)[grid](...) itself takes a prepared launch for a grid of integers)
            (f"fast(kernel)[grid](...) ({len(args)} args, {len(kwargs)} kwargs)", lambda: launcher._run(grid, *args, **kwargs)),
            ("Triton's binder alone", lambda: binder(*args, **kwargs))]
    if direct is not None:
        rows.append(("native launch alone", lambda: direct[0](g[0], g[1], g[2], raw(dev), ck.function, direct[1], direct[2],
                                                               None, None, ck.packed_metadata, None, None, None, *vals)))
    for label, fn in rows:
        print(f"{name:8s} {label:52s} {t(fn):6.2f} us", flush=True)


g = impl.load("a08_gpt2_inference.gemv")
x, w, b = (torch.randn(1, 768, device="cuda", dtype=torch.bfloat16), torch.randn(768, 768, device="cuda", dtype=torch.bfloat16),
           torch.randn(768, device="cuda", dtype=torch.bfloat16))
pieces("gemv", lambda: g.gemv(x, w, b), g._matvec_kernel)
print(f"{'gemv':8s} {'torch.empty((1, 768)) + partials (2, 1, 768) fp32':52s} "
      f"{t(lambda: (torch.empty((1, 768), dtype=x.dtype, device=x.device), torch.empty((2, 1, 768), dtype=torch.float32, device=x.device))):6.2f} us")
m = impl.load("a06_matmul.matmul_triton")
a, wm = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16), torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
pieces("matmul", lambda: m.matmul(a, wm), m.matmul_kernel)
print(f"{'':8s} {'x.add_(0)':52s} {t(lambda: a.add_(0)):6.2f} us")
