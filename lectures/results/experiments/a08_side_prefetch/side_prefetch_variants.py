"""Experiment (issue #28): the captured decode step's side-stream L2 prefetch of attn.c_proj's weight (engine
``_prefetch_after_attention``, gemv.prefetch_l2) and variants of what it asks for: the whole weight (shipped), the
first share of each output's K weights (the part the GEMV reads first), the whole weight with L2's evict_last hint.
Each against the step without it (engine.weight_prefetch = False), in one run.
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

SHIPPED = eng_mod.prefetch_l2


@triton.jit
def _prefix_kernel(P, ROW_BYTES, PREFIX_LINES, TOTAL, LINES: tl.constexpr, LAST: tl.constexpr):
    i = tl.minimum(tl.program_id(0) * LINES + tl.arange(0, LINES), TOTAL - 1)
    row = i // PREFIX_LINES
    ptrs = P + row.to(tl.int64) * ROW_BYTES + (i - row * PREFIX_LINES).to(tl.int64) * 128
    if LAST:
        tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; // $0", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)
    else:
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)


def prefix(share: float, last: bool = False):
    def fetch(w):                     # w: K-major [K, N]; its rows of memory: w.t() [N, K]
        rows = w.t()
        n, k = rows.shape
        rb = k * rows.element_size()
        lines = max(1, min(cdiv(rb, 128), cdiv(int(share * rb), 128)))
        total = n * lines
        _prefix_kernel[(cdiv(total, 1024),)](rows.reshape(-1).view(torch.uint8), rb, lines, total, LINES=1024,
                                             LAST=last, num_warps=4)
    return fetch


VARIANTS = [("off", False, SHIPPED), ("whole (shipped)", True, SHIPPED), ("first half", True, prefix(0.5)),
            ("first quarter", True, prefix(0.25)), ("whole, evict_last", True, prefix(1.0, True)),
            ("off", False, SHIPPED), ("whole (shipped)", True, SHIPPED), ("first half", True, prefix(0.5))]
cases = [tuple(int(x) if i else x for i, x in enumerate(c.split(":"))) for c in sys.argv[1:]] or [
    ("large", 1, 100), ("medium", 1, 100), ("small", 1, 100), ("xl", 1, 100)]
gbps = measure_ceilings().gbps
print(f"copy {gbps:.0f} GB/s", flush=True)
for model, b, p in cases:
    t0 = time.perf_counter()
    torch.manual_seed(0)
    hf = bench.hf_gpt2(model, torch.bfloat16)
    engine = bench.engine_for(eng_mod, model, b, p, hf)
    del hf
    nbytes = bench.step_bytes(engine, b, p + 1 + bench.STEPS // 2)
    for name, on, fn in VARIANTS:
        eng_mod.prefetch_l2 = fn
        bench.use_path(eng_mod, engine, decode_gemv=True, pdl=True, weight_prefetch=on)
        ms = statistics.median(bench.step_ms(engine, b, p, 3))
        print(f"{model} B{b} P{p} {name:20s} {ms:.4f} ms  {nbytes / ms / 1e6 / gbps:.1%} of copy", flush=True)
    eng_mod.prefetch_l2 = SHIPPED
    del engine
    torch.cuda.empty_cache()
    print(f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
