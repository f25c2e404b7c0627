"""Experiment (issue #28): weights asked into L2 by a kernel on a SIDE stream of the decode graph, started when a
GEMV completes, so that the next GEMV's weight arrives while a latency-bound kernel (the attention, a LayerNorm)
leaves HBM idle. Unlike the in-kernel prefetch of commit 373b915 (EXPERIMENTS.md, `a08 weight prefetch after
latency`), nothing waits on the prefetch and it cannot start before the GEMV in front of it has finished.

Windows:  A = after c_attn's GEMV (during attention + combine): attn.c_proj's weight (whole), optionally the first
          share of c_fc's; B = after attn.c_proj (during ln_2, large/XL only): the first share of c_fc's;
          C = after mlp.c_proj (during the next ln_1, large/XL only): the first share of the next c_attn's.
Run on a GPU: PYTHONPATH=. python lectures/_tools/gpu/side_prefetch_experiment.py [model:batch:prompt ...]"""
import statistics
import sys
import time

import torch
import triton
import triton.language as tl

from common.launch import cdiv
from common.roofline import measure_ceilings
from solutions.a08_gpt2_inference import bench
from solutions.a08_gpt2_inference import engine as eng_mod
from solutions.a08_gpt2_inference.gemv import fold_pays, gemv
from solutions.a08_gpt2_inference.layernorm import layernorm
from solutions.a08_gpt2_inference.decode_attention import decode_attention

def decode_step(self, tokens):
    """The solution's decode step, its latency-bound kernels asking L2 for the next GEMV's weight: the attention's
    split programs for attn.c_proj's (plan A), ln_2's extra programs for the first share of c_fc's (B), ln_1's (and
    ln_f's) for the first share of c_attn's (the LM head's) (C)."""
    plan = self._plan
    b, c, h, d = self.batch, self.n_embd, self.n_head, self.head_dim
    cache = self.cache
    lengths = cache.lengths[:b]
    pdl = self.pdl
    ln_separate = not fold_pays(b, c)
    kmaj = lambda w: self._k_major.get(id(w), w)
    hid, new_lengths = self.embed(tokens, lengths)
    for i, layer in enumerate(self.layers):
        kv = (cache.k[i, :b], cache.v[i, :b], lengths)
        if ln_separate:
            pf = (kmaj(layer.attn_w), 0.0, plan["C"]) if plan.get("C") else None
            y = layernorm(hid, layer.ln_1_w, layer.ln_1_b, self.eps, pdl=pdl, prefetch=pf)
            qkv = gemv(y, kmaj(layer.attn_w), layer.attn_b, kv_cache=kv, pdl=pdl)
        else:
            qkv = self.ln_linear(hid, layer.ln_1_w, layer.ln_1_b, layer.attn_w, layer.attn_b, kv_cache=kv)
        q = qkv[:, :c].view(b, h, d)
        pf = (kmaj(layer.proj_w), 0.0, 1.0) if plan.get("A") else None
        att = decode_attention(q, cache.k[i, :b], cache.v[i, :b], new_lengths, pdl=pdl, prefetch=pf)
        hid = self.linear(att.view(b, c), layer.proj_w, layer.proj_b, residual=hid)
        if ln_separate:
            pf = (kmaj(layer.fc_w), 0.0, plan["B"]) if plan.get("B") else None
            y = layernorm(hid, layer.ln_2_w, layer.ln_2_b, self.eps, pdl=pdl, prefetch=pf)
            m = gemv(y, kmaj(layer.fc_w), layer.fc_b, "gelu_tanh", pdl=pdl)
        else:
            m = self.ln_linear(hid, layer.ln_2_w, layer.ln_2_b, layer.fc_w, layer.fc_b, "gelu_tanh")
        hid = self.linear(m, layer.fc_proj_w, layer.fc_proj_b, residual=hid)
    lengths.copy_(new_lengths)
    pf = (self.wte.t(), 0.0, plan["C"]) if plan.get("C") else None
    return self.lm_head(layernorm(hid, self.ln_f_w, self.ln_f_b, self.eps, pdl=pdl, prefetch=pf))


eng_mod.GPT2Engine.decode_step = decode_step

VARIANTS = [("none", {}), ("A", {"A": 1}), ("A B25 C33", {"A": 1, "B": 0.25, "C": 0.33}),
            ("B25 C33", {"B": 0.25, "C": 0.33}), ("A B40 C50", {"A": 1, "B": 0.4, "C": 0.5}),
            ("A B12 C16", {"A": 1, "B": 0.12, "C": 0.16}),
            ("none", {}), ("A", {"A": 1}), ("A B25 C33", {"A": 1, "B": 0.25, "C": 0.33})]
PROFILE = "--profile" in sys.argv
if PROFILE:
    sys.argv.remove("--profile")
    VARIANTS = [("none", {}), ("A", {"A": 1}), ("A B25 C33", {"A": 1, "B": 0.25, "C": 0.33})]
cases = [tuple(int(x) if i else x for i, x in enumerate(c.split(":"))) for c in sys.argv[1:]] or [
    ("xl", 1, 100), ("large", 1, 100), ("small", 1, 100), ("medium", 1, 100), ("xl", 16, 500)]
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
    for name, plan in VARIANTS:
        engine._plan = plan
        bench.use_path(eng_mod, engine, decode_gemv=True, pdl=True)
        ms = statistics.median(bench.step_ms(engine, b, p, 3))
        bench.ready_for_decode(engine, b, p)
        logits = engine.decode_step(torch.arange(b, device=engine.device)).float()
        ref = logits if ref is None else ref
        if PROFILE:
            graph, _ = bench.captured_step(engine, b, p)
            step = bench.step_kernels(engine, graph, 2)[1]
            mid = len(step) // 2
            t0k = step[mid][0]
            for s0, e0, nm in step[mid:mid + 14]:
                print(f"    {nm[:40]:40s} {(s0 - t0k):8.2f} {(e0 - t0k):8.2f}", flush=True)
        err = float((logits - ref).norm() / ref.norm())
        print(f"{model} B{b} P{p} {name:34s} {ms:.4f} ms  {nbytes / ms / 1e6 / gbps:.1%} of copy  "
              f"logits vs first {err:.1e}", flush=True)
    del engine
    torch.cuda.empty_cache()
    print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
