"""Experiment (issue #28): the GEMVs that follow a latency-bound kernel (a LayerNorm kernel: c_attn and c_fc at
large and XL, the LM head; the attention: attn.c_proj) prefetch their weight slab to L2 before the PDL wait.
Run on a GPU: PYTHONPATH=. python lectures/_tools/gpu/weight_prefetch_experiment.py"""
import statistics
import torch
from common.roofline import measure_ceilings
from solutions.a08_gpt2_inference import bench
from solutions.a08_gpt2_inference import engine as eng_mod

VARIANTS = [("none", set()), ("after LN + attn", {"ln", "attn"}), ("after attn", {"attn"}), ("after LN", {"ln"}),
            ("none", set()), ("after LN + attn", {"ln", "attn"})]
cases = [("small", 1, 100), ("medium", 1, 100), ("large", 1, 100), ("xl", 1, 100), ("xl", 16, 500)]
gbps = measure_ceilings().gbps
for model, b, p in cases:
    torch.manual_seed(0)
    hf = bench.hf_gpt2(model, torch.bfloat16)
    engine = bench.engine_for(eng_mod, model, b, p, hf)
    del hf
    nbytes = bench.step_bytes(engine, b, p + 1 + bench.STEPS // 2)
    ref = None
    for name, after in VARIANTS:
        eng_mod.PREFETCH_AFTER.clear()
        eng_mod.PREFETCH_AFTER.update(after)
        bench.use_path(eng_mod, engine, decode_gemv=True, pdl=True)
        ms = statistics.median(bench.step_ms(engine, b, p, 3))
        bench.ready_for_decode(engine, b, p)
        logits = engine.decode_step(torch.arange(b, device=engine.device)).float()
        ref = logits if ref is None else ref
        print(f"{model} B{b} P{p} {name:16s} {ms:.4f} ms {nbytes / ms / 1e6 / gbps:.1%} "
              f"logits vs first {float((logits - ref).norm() / ref.norm()):.1e}", flush=True)
    del engine
    torch.cuda.empty_cache()
