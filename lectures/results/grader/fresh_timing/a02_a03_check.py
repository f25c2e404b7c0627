import torch
import common
from common import timing
from common.stages import by_key, perf_cases
from common.impl import load
for key in ("a02", "a03"):
    p = perf_cases(by_key(key), lambda m: load(m, "solutions"))[0]
    t = timing.bench_fresh(p.inputs, p.submission, p.baseline, max_calls=400)
    import statistics
    print(key, t.how, len(t.ms), statistics.median(t.ms), statistics.median(t.baseline_ms), max(t.errors), "MB", torch.cuda.max_memory_allocated() >> 20, flush=True)
