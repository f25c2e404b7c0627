import statistics, sys, time
import torch
from common.roofline import measure_ceilings
from solutions.a08_gpt2_inference import bench, gemv as gv
from solutions.a08_gpt2_inference import engine as eng_mod
orig_prep = eng_mod.GPT2Engine.prepare_decode_weights
orig_fp = gv.fold_pays
def variant(stats, maxnreg):
    gv.FMA_MAX_REGISTERS = 32 if maxnreg else None
    gv._PLANS.clear()
    if stats:
        eng_mod.fold_pays = orig_fp
        eng_mod.GPT2Engine.prepare_decode_weights = orig_prep
    else:
        eng_mod.fold_pays = lambda m, k, stats_blocks=0: orig_fp(m, k, 0)
        def prep(self):
            orig_prep(self)
            self._fold_stats = False
        eng_mod.GPT2Engine.prepare_decode_weights = prep
VARIANTS = [("old (no stats, no maxnreg)", (False, False)), ("stats + maxnreg", (True, True)),
            ("stats, no maxnreg", (True, False)), ("no stats, maxnreg", (False, True)), ("old (no stats, no maxnreg)", (False, False))]
cases = [("small", 1, 100), ("medium", 1, 100), ("xl", 1, 100)]
gbps = measure_ceilings().gbps
for model, b, p in cases:
    torch.manual_seed(0)
    hf = bench.hf_gpt2(model, torch.bfloat16)
    engine = bench.engine_for(eng_mod, model, b, p, hf)
    del hf
    nbytes = bench.step_bytes(engine, b, p + 1 + bench.STEPS // 2)
    for name, v in VARIANTS:
        variant(*v)
        for pdl in (True, False):
            bench.use_path(eng_mod, engine, decode_gemv=True, pdl=pdl)
            ms = statistics.median(bench.step_ms(engine, b, p, 3))
            print(f"{model} B{b} {name:28s} pdl={pdl!s:5} {ms:.4f} ms {nbytes / ms / 1e6 / gbps:.1%}", flush=True)
    del engine
    torch.cuda.empty_cache()
