"""Experiment (issue #28): the decode step with decode attention's L2 prefetch before the PDL wait, off and on
(on at every cache size: the bench's default turns it off where the caches exceed a quarter of L2).
Run on a GPU: PYTHONPATH=. python lectures/_tools/gpu/prefetch_experiment.py [model:batch:prompt ...]
(EXPERIMENTS.md, `a08 decode prefetch and merge`.)"""
import statistics
import sys
import time

import torch

from common.roofline import measure_ceilings
from solutions.a08_gpt2_inference import bench, decode_attention as da
from solutions.a08_gpt2_inference import engine as eng_mod

VARIANTS = [("no prefetch", 0), ("prefetch", da.PREFETCH_KEYS), ("no prefetch", 0), ("prefetch", da.PREFETCH_KEYS)]
cases = [tuple(int(x) if i else x for i, x in enumerate(c.split(":"))) for c in sys.argv[1:]] or [
    ("small", 1, 100), ("medium", 1, 100), ("large", 1, 100), ("xl", 1, 100), ("xl", 16, 500)]
gbps = measure_ceilings().gbps
print(f"copy {gbps:.0f} GB/s", flush=True)
da.PREFETCH_L2_SHARE = float("inf")
for model, b, p in cases:
    t0 = time.perf_counter()
    torch.manual_seed(0)
    hf = bench.hf_gpt2(model, torch.bfloat16)
    engine = bench.engine_for(eng_mod, model, b, p, hf)
    del hf
    nbytes = bench.step_bytes(engine, b, p + 1 + bench.STEPS // 2)
    ref = None
    for name, keys in VARIANTS:
        da.PREFETCH_KEYS = keys
        bench.use_path(eng_mod, engine, decode_gemv=True, pdl=True)
        ms = statistics.median(bench.step_ms(engine, b, p, 3))
        bench.ready_for_decode(engine, b, p)
        logits = engine.decode_step(torch.arange(b, device=engine.device)).float()
        ref = logits if ref is None else ref
        err = float((logits - ref).norm() / ref.norm())
        print(f"{model} B{b} P{p} {name:12s} {ms:.4f} ms  {nbytes / ms / 1e6 / gbps:.1%} of copy  logits vs first {err:.1e}",
              flush=True)
    del engine
    torch.cuda.empty_cache()
    print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
