"""Stage 9 benchmark: one decode step of a Llama-shaped model, the engine against transformers (GPU).

    python -m solutions.a09_llama_inference.bench                        # Llama 3.2 1B's shape, batch 1 and 8
    python -m solutions.a09_llama_inference.bench --batches 1 --contexts 128 1024 --impl assignments
    make bench STAGE=a09 [IMPL=...] [ARGS="--batches 1"]

Each case: random weights (nothing downloaded) in bf16, a prompt of ``context`` tokens prefilled, then one
decode step timed as a CUDA-graph replay (GPU time alone): the engine's decode_step (the impl's path: the
core, or the tuned path where tuned.py exists) and transformers' LlamaForCausalLM with a StaticCache,
both graphed. Reported: the step's time, tokens/s (batch / step), the bytes a step must read
(stage.llama_decode_bytes: every weight once and the KV cache) over the step's time as a share of the
GPU's copy bandwidth (common.roofline.measure_ceilings), and the engine's speedup over transformers.
"""
from __future__ import annotations

import argparse

import torch

from common.impl import Impl, add_impl_argument
from common.roofline import measure_ceilings
from common.timing import bench_graph

MODULE = __spec__.name if __spec__ is not None else __name__


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--contexts", nargs="+", type=int, default=[128, 1024])
    ap.add_argument("--layers", type=int, default=None, help="fewer layers than the model's 16 (a quick look)")
    add_impl_argument(ap, MODULE)
    args = ap.parse_args(argv)
    impl = Impl.get(args.impl)
    if not torch.cuda.is_available():
        raise SystemExit("the stage-9 benchmark needs a CUDA GPU (CPU: pytest runs the engine interpreted)")
    from common.course.stages import LLAMA_1B, a09_decode_case
    cfg = dict(LLAMA_1B, **({"num_hidden_layers": args.layers} if args.layers else {}))
    gbps = measure_ceilings().gbps
    print(f"impl {impl}; copy bandwidth {gbps:.0f} GB/s")
    print(f"{'batch':>5} {'ctx':>5} {'engine ms':>10} {'hf ms':>8} {'tok/s':>8} {'% copy bw':>9} {'speedup':>8}")
    for b in args.batches:
        for ctx in args.contexts:
            case = a09_decode_case(impl.load, cfg, batch=b, ctx=ctx)
            inp = case.inputs(torch.Generator(device="cuda").manual_seed(0))
            mine = bench_graph(lambda: case.submission(inp)).median_ms
            theirs = bench_graph(lambda: case.baseline(inp)).median_ms
            print(f"{b:>5} {ctx:>5} {mine:>10.3f} {theirs:>8.3f} {b / mine * 1e3:>8.0f} "
                  f"{case.bytes / (mine * 1e-3) / 1e9 / gbps * 100:>8.0f}% {theirs / mine:>7.2f}x   {case.label}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
