"""Time sampling.py's kernels alone (GPU): us per call, CUDA-graph replay of 20 calls, median of 50,
bf16 logits [B, 50257], "peaked" (N(0, 3^2)), "flat" (N(0, 0.55^2), a random-weight model's spread) and
"sorted" (peaked, in descending order: the likely tokens at the lowest ids, as a BPE vocabulary puts its
frequent tokens). sample() is called as the engine calls it (nucleus_pass, wide from the parameters).

    PYTHONPATH=. python lectures/_tools/gpu/sampling_kernels.py [--old path/to/an/old/sampling.py]

--old: also time another version of sampling.py (e.g. `git show f4a0c39:solutions/a08_gpt2_inference/
sampling.py > /tmp/old_sampling.py`, the one-program-a-row kernel) on the same inputs.
Numbers in lectures/results/a08_sampling.md."""
import argparse
import importlib.util
import inspect
import sys

import torch

from solutions.a08_gpt2_inference import sampling as smp
from solutions.a08_gpt2_inference.bench import rotated_ms

CONFIGS = ((1.0, 0, 1.0), (0.8, 50, 1.0), (0.8, 0, 0.9), (0.8, 50, 0.9), (0.8, 100, 1.0), (0.8, 1000, 1.0))


def graph_us(fn, reps: int = 50) -> float:
    """us per call: 20 calls captured in one CUDA graph, the median over ``reps`` replays / 20."""
    return 1000 * rotated_ms(lambda i: fn(), copies=20, reps=reps)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", help="another sampling.py to time on the same inputs")
    args = ap.parse_args()
    old = None
    if args.old:
        spec = importlib.util.spec_from_file_location("old_sampling", args.old)
        old = importlib.util.module_from_spec(spec)
        sys.modules["old_sampling"] = old           # its @dataclass looks its module up there
        spec.loader.exec_module(old)
    print(torch.cuda.get_device_name())
    for b in (1, 8):
        for name, scale in (("peaked", 3.0), ("flat", 0.55), ("sorted", 3.0)):
            torch.manual_seed(0)
            lg = (torch.randn(b, 50257, device="cuda") * scale).to(torch.bfloat16)
            if name == "sorted":
                lg = lg.sort(-1, descending=True).values
            seed = torch.tensor([1], device="cuda")
            pos = torch.arange(b, dtype=torch.int32, device="cuda") + 100
            row = [f"B={b} {name}:", f"torch.argmax {graph_us(lambda: lg.argmax(-1)):.1f}",
                   f"argmax {graph_us(lambda: smp.argmax(lg)):.1f}"]
            for cfg in CONFIGS:
                pt = smp.SamplingParams(*cfg).tensor("cuda")
                t, k, p = cfg          # as the engine calls it
                kw = dict(nucleus_pass=p < 1 and not 0 < k < 50257, wide=k > smp.WIDE_TOP_K)
                cell = f"{cfg}: {graph_us(lambda: smp.sample(lg, pt, seed, pos, **kw)):.1f}"
                if old is not None:      # (the keywords it knows)
                    okw = {k: v for k, v in kw.items() if k in inspect.signature(old.sample).parameters}
                    cell += f" (old {graph_us(lambda: old.sample(lg, pt, seed, pos, **okw)):.1f})"
                row.append(cell)
            print(" | ".join(row), flush=True)


if __name__ == "__main__":
    main()
