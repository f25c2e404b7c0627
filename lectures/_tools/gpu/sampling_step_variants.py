"""sampling.py's CHUNK, KC and warps measured where they matter: inside a GPT-2 small decode step (GPU).

    PYTHONPATH=. python lectures/_tools/gpu/sampling_step_variants.py

For each variant (the module's constants set before the engine captures its step), and each token
choice (greedy, T, top-k 50, top-p 0.9, both): the span of one replay of the decode-step graph under
torch.profiler (first kernel start to last kernel end, median of 18 replays) and the sampling kernel's
own time. A loop of the kernel alone keeps its code in the instruction cache; in the step the LM head
has just streamed its weights through L2, so the kernels' code is fetched cold, and the ranking of the
variants can differ. Random weights, batch 1, prompt 128. Numbers in lectures/results/a08_sampling.md."""
import statistics

import torch

from solutions.a08_gpt2_inference import bench as B
from solutions.a08_gpt2_inference import engine as eng_mod
from solutions.a08_gpt2_inference import sampling as smp

CHOICES = {"greedy": {}, "T": dict(do_sample=True, temperature=0.8),
           "topk50": dict(do_sample=True, temperature=0.8, top_k=50),
           "topp": dict(do_sample=True, temperature=0.8, top_p=0.9),
           "both": dict(do_sample=True, temperature=0.8, top_k=50, top_p=0.9)}
VARIANTS = ((2048, 16, 16), (2048, 32, 16), (4096, 32, 16), (4096, 64, 16), (2048, 32, 8))   # CHUNK, KC, warps


def main() -> None:
    engine = B.engine_for(eng_mod, "small", 1, 128)
    ids = torch.randint(1, engine.vocab_size, (1, 128), device="cuda")
    print(torch.cuda.get_device_name())
    for chunk, kc, warps in VARIANTS:
        smp.CHUNK, smp.KC, smp.CHUNK_WARPS = chunk, kc, warps
        res = {}
        for name, kw in CHOICES.items():
            spans, own = [], []
            for _ in range(2):
                engine._graphs.clear()                 # captured anew with this variant
                engine.generate(ids, 3, **kw)
                graph, _ = engine._graphs[next(k for k in engine._graphs if k[0] == 1)]
                engine.cache.lengths[:1].fill_(128)
                steps = B.step_kernels(engine, graph, n=9)
                spans += [B.gaps(st)[0] for st in steps]
                own += [e - s for st in steps for s, e, nm in st if "_choose" in nm]
            res[name] = (statistics.median(spans), statistics.median(own) if own else 0.0)
        g = res["greedy"][0]
        print(f"CHUNK {chunk} KC {kc} warps {warps}: " + " | ".join(
            f"{n} {s:.1f} us ({100 * (s / g - 1):+.1f}%, kernel {c:.1f})" for n, (s, c) in res.items()), flush=True)


if __name__ == "__main__":
    main()
