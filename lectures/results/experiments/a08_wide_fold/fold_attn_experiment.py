"""Experiment (issue #28): at GPT-2 large and XL (n_embd 1280, 1600), the LayerNorm before c_attn folded into its
GEMV with the row loaded BEFORE the main loop (gemv.stat_k allowing 8 values a thread: STAT_K = 2048 >= K, so
PRELOAD), c_fc's LayerNorm kept as a kernel (its 640-800 programs would not fit one wave at the fold's registers);
and both folded. Decode step against the shipped one (LayerNorm kernels before both), in one run.
Run on a GPU: PYTHONPATH=. python lectures/_tools/gpu/fold_attn_experiment.py"""
import statistics
import time

import torch

from common.roofline import measure_ceilings
from solutions.a08_gpt2_inference import bench
from solutions.a08_gpt2_inference import engine as eng_mod
from solutions.a08_gpt2_inference import gemv as gv

MAX_K0 = gv.FOLD_MAX_K


def setup(engine, which):
    gv.FOLD_MAX_K = MAX_K0 if which == "none" else 2048
    gv.WIDE_STATS[0] = 128 if which == "none" else 256
    gv._PLANS.clear()
    gv._CALLS.clear()
    bench.use_path(eng_mod, engine, decode_gemv=True, pdl=True)
    if which == "c_attn":          # c_fc back to a LayerNorm kernel and its plain K-major copy
        for layer in engine.layers:
            engine._folded.pop(id(layer.fc_w), None)
            engine._k_major[id(layer.fc_w)] = layer.fc_w.t().contiguous().t()


VARIANTS = [("shipped", "none"), ("fold c_attn", "c_attn"), ("fold both", "both"), ("shipped", "none"),
            ("fold c_attn", "c_attn"), ("fold both", "both")]
cases = [("xl", 1, 100), ("large", 1, 100)]
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
    for name, which in VARIANTS:
        setup(engine, which)
        ms = statistics.median(bench.step_ms(engine, b, p, 3))
        bench.ready_for_decode(engine, b, p)
        logits = engine.decode_step(torch.arange(b, device=engine.device)).float()
        ref = logits if ref is None else ref
        err = float((logits - ref).norm() / ref.norm())
        print(f"{model} B{b} P{p} {name:12s} {ms:.4f} ms  {nbytes / ms / 1e6 / gbps:.1%} of copy  "
              f"logits vs first {err:.1e}  folded {len(engine._folded)}", flush=True)
    del engine
    torch.cuda.empty_cache()
    print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
