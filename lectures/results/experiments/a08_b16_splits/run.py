"""Experiment (issue #28): the decode attention's key splits at GPT-2 XL, batch 16, prompt 500, where the attention
reads 54 MB of KV cache a block at 2.1 TB/s (a08_decode_profile_xl_b16.md). num_splits gives 2 splits there (4
programs an SM over 400 (sequence, head) pairs); here 2-9, the decode step timed as bench --step does (gemv + PDL),
plus batch 8 and the batch-1 cases' split counts for reference.
Run on a GPU: PYTHONPATH=. python lectures/results/experiments/a08_b16_splits/run.py"""
import statistics
import time

import torch

from common.roofline import measure_ceilings
from solutions.a08_gpt2_inference import bench
from solutions.a08_gpt2_inference import decode_attention as da
from solutions.a08_gpt2_inference import engine as eng_mod

DEFAULT = da.num_splits
gbps = measure_ceilings().gbps
print(f"copy {gbps:.0f} GB/s", flush=True)
for model, b, p, variants in (("xl", 16, 500, (None, 3, 4, 6, 9, None, 4)), ("large", 16, 500, (None, 3, 4, None))):
    t0 = time.perf_counter()
    torch.manual_seed(0)
    hf = bench.hf_gpt2(model, torch.bfloat16)
    engine = bench.engine_for(eng_mod, model, b, p, hf)
    del hf
    nbytes = bench.step_bytes(engine, b, p + 1 + bench.STEPS // 2)
    ref = None
    for n in variants:
        da.num_splits = DEFAULT if n is None else (lambda bh, s, n=n, **kw: n)
        da._CALLS.clear()
        bench.use_path(eng_mod, engine, decode_gemv=True, pdl=True)
        used = da.num_splits(b * engine.n_head, engine.max_seq_len)
        ms = bench.step_ms(engine, b, p, 3)
        bench.ready_for_decode(engine, b, p)
        logits = engine.decode_step(torch.arange(b, device=engine.device)).float()
        ref = logits if ref is None else ref
        err = float((logits - ref).norm() / ref.norm())
        print(f"{model} B{b} P{p} S_max {engine.max_seq_len} splits {used} ({'default' if n is None else 'forced'}): "
              f"{statistics.median(ms):.4f} ms (runs {' '.join(f'{x:.4f}' for x in ms)}), "
              f"{nbytes / statistics.median(ms) / 1e6 / gbps:.1%} of copy, logits vs first {err:.1e}", flush=True)
    da.num_splits = DEFAULT
    da._CALLS.clear()
    del engine
    torch.cuda.empty_cache()
    print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
