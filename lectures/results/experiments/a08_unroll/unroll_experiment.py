"""Experiment (issue #28): the one-row GEMV's main loop unrolled 2 or 4 times (tl.range loop_unroll_factor), so
that each thread has 2-4 weight vectors in flight (the PTX issues the unrolled loads before the FMAs) at 38-40
registers instead of 31. Decode step against the shipped loop, in one run.
Run on a GPU: PYTHONPATH=. python lectures/_tools/gpu/unroll_experiment.py"""
import statistics
import time

import torch

from common.roofline import measure_ceilings
from solutions.a08_gpt2_inference import bench
from solutions.a08_gpt2_inference import engine as eng_mod
from solutions.a08_gpt2_inference import gemv as gv

VARIANTS = [("unroll 1 (shipped)", 1), ("unroll 2 if 1 wave", 0), ("unroll 1 (shipped)", 1),
            ("unroll 2 if 1 wave", 0)]
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
    for name, u in VARIANTS:
        gv.EXPERIMENT_UNROLL[0] = u
        gv._PLANS.clear()
        gv._CALLS.clear()
        bench.use_path(eng_mod, engine, decode_gemv=True, pdl=True)
        ms = statistics.median(bench.step_ms(engine, b, p, 3))
        bench.ready_for_decode(engine, b, p)
        logits = engine.decode_step(torch.arange(b, device=engine.device)).float()
        ref = logits if ref is None else ref
        err = float((logits - ref).norm() / ref.norm())
        print(f"{model} B{b} P{p} {name:20s} {ms:.4f} ms  {nbytes / ms / 1e6 / gbps:.1%} of copy  "
              f"logits vs first {err:.1e}", flush=True)
    del engine
    torch.cuda.empty_cache()
    print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
