"""Experiment (issue #28): decode attention with fewer key splits where the cache is short (S_max <= 256: at most
4 chunks of 64 keys a program), so that the combine kernel goes (splits = 1) or has less to do.
Run on a GPU: PYTHONPATH=. python lectures/_tools/gpu/split_experiment.py"""
import statistics
import time

import torch

from common.roofline import measure_ceilings
from solutions.a08_gpt2_inference import bench
from solutions.a08_gpt2_inference import decode_attention as da
from solutions.a08_gpt2_inference import engine as eng_mod

DEFAULT = da.num_splits
import sys
BN0 = da.BLOCK_N
if "--block" in sys.argv:   # second run: narrower key chunks, more splits busy at short contexts
    VARIANTS = [("default", (None, 64)), ("BN32 rule", ("rule", 32)), ("BN32 s4", (4, 32)), ("BN32 s8", (8, 32)),
                ("BN16 s8", (8, 16)), ("default", (None, 64)), ("BN32 rule", ("rule", 32)), ("BN32 s8", (8, 32))]
    cases = [("small", 1, 100), ("medium", 1, 100), ("large", 1, 100), ("xl", 1, 100), ("xl", 16, 500)]
else:
    VARIANTS = [(n, (v, 64)) for n, v in [("default", None), ("splits=1", 1), ("splits=2", 2), ("default", None),
                                          ("splits=1", 1), ("splits=2", 2)]]
    cases = [("medium", 1, 100), ("small", 1, 100), ("large", 1, 100), ("xl", 1, 100), ("xl", 4, 100)]
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
    for name, (n, bn) in VARIANTS:
        da.BLOCK_N = bn
        da.num_splits = DEFAULT if n is None else (lambda bh, s, bn=bn, **kw: DEFAULT(bh, s, block_n=bn)) \
            if n == "rule" else (lambda bh, s, n=n, **kw: n)
        da._CALLS.clear()
        bench.use_path(eng_mod, engine, decode_gemv=True, pdl=True)
        used = da.num_splits(b * engine.n_head, engine.max_seq_len)
        ms = statistics.median(bench.step_ms(engine, b, p, 3))
        bench.ready_for_decode(engine, b, p)
        logits = engine.decode_step(torch.arange(b, device=engine.device)).float()
        ref = logits if ref is None else ref
        err = float((logits - ref).norm() / ref.norm())
        print(f"{model} B{b} P{p} S_max {engine.max_seq_len} {name:9s} ({used} splits) {ms:.4f} ms  "
              f"{nbytes / ms / 1e6 / gbps:.1%} of copy  logits vs first {err:.1e}", flush=True)
    da.num_splits = DEFAULT
    da.BLOCK_N = BN0
    da._CALLS.clear()
    del engine
    torch.cuda.empty_cache()
    print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
