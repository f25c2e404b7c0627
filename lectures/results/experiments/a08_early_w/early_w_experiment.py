"""Experiment (issue #28): the one-row GEMV (FMA path) loading each W tile one iteration ahead (PIPE_W: two tiles
in flight a thread), and its FIRST tile before the PDL wait (EARLY_W: weights depend on no kernel, so the first
loads overlap the previous kernel's tail). Decode step against the shipped one, in one run.
Run on a GPU: PYTHONPATH=. python lectures/_tools/gpu/early_w_experiment.py"""
import statistics
import time

import torch

from common.roofline import measure_ceilings
from solutions.a08_gpt2_inference import bench
from solutions.a08_gpt2_inference import engine as eng_mod
from solutions.a08_gpt2_inference import gemv as gv

VARIANTS = [("shipped", dict(early=False, pipe=False)), ("early", dict(early=True, pipe=False)),
            ("shipped", dict(early=False, pipe=False)), ("early", dict(early=True, pipe=False)),
            ("early + pipe", dict(early=True, pipe=True))]
cases = [("xl", 1, 100), ("small", 1, 100), ("medium", 1, 100), ("large", 1, 100)]
gbps = measure_ceilings().gbps
print(f"copy {gbps:.0f} GB/s", flush=True)
for model, b, p in cases:
    t0 = time.perf_counter()
    torch.manual_seed(0)
    hf = bench.hf_gpt2(model, torch.bfloat16)
    engine = bench.engine_for(eng_mod, model, b, p, hf)
    del hf
    nbytes = bench.step_bytes(engine, b, p + 1 + bench.STEPS // 2)
    ref = None
    for name, flags in VARIANTS:
        gv.EXPERIMENT.update(flags)
        gv._PLANS.clear()
        gv._CALLS.clear()
        bench.use_path(eng_mod, engine, decode_gemv=True, pdl=True)
        ms = statistics.median(bench.step_ms(engine, b, p, 3))
        bench.ready_for_decode(engine, b, p)
        logits = engine.decode_step(torch.arange(b, device=engine.device)).float()
        ref = logits if ref is None else ref
        err = float((logits - ref).norm() / ref.norm())
        print(f"{model} B{b} P{p} {name:14s} {ms:.4f} ms  {nbytes / ms / 1e6 / gbps:.1%} of copy  "
              f"logits vs first {err:.1e}", flush=True)
    del engine
    torch.cuda.empty_cache()
    print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
