"""Two trees' eager host cost, side by side in one process: every common.course.hostcost case and the
training steps, each call of BEFORE measured in the same rounds as AFTER's and the bare launch, so a host's
drift (tens of percent within a minute, 2-3x between machines) moves them together. Separate processes, as
``hostcost_run.sh`` runs them, each see the host at another moment.

    python lectures/_tools/gpu/hostcost_ab.py BEFORE_TREE AFTER_TREE [--rounds 7] [--cases a06_matmul,...]
    (a tree: an impl path such as .hostcost_before/solutions, or "solutions")

Prints µs per eager call: bare launch, before, after, after/before, PyTorch's op; then the training steps (ms).
On a machine without a GPU the launches are stubbed (the wrappers' Python alone).
"""
from __future__ import annotations

import argparse
import cProfile
import contextlib
import io
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import common  # noqa: E402
from common.course import hostcost as hc  # noqa: E402
from common.impl import Impl  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--cases", default="")
    ap.add_argument("--no-training", action="store_true")
    ap.add_argument("--profile", default="", help="comma-separated cases to cProfile (after's calls)")
    args = ap.parse_args()
    before, after = Impl.get(args.before), Impl.get(args.after)
    stub = not common.HAS_CUDA
    dev, dt = common.DEVICE, (torch.bfloat16 if common.HAS_CUDA else torch.float32)
    keys = [k for k in args.cases.split(",") if k]
    with hc.stub_launches() if stub else contextlib.nullcontext():
        bx = torch.zeros(1, device=dev)
        print(f"{'case':<26} {'bare':>6} {'before':>8} {'after':>8} {'ratio':>6} {'torch':>7}   (us per eager call, median of "
              f"{args.rounds} rounds)")
        for case in hc.CASES:
            if (keys and case.key not in keys) or (case.cuda_only and stub):
                continue
            fb, t = case.make(before.load, dev, dt)
            fa, _ = case.make(after.load, dev, dt)
            for _ in range(3):
                fb(), fa(), t()
            bare, b, a, tt = hc.interleaved_us([lambda: hc.bare_launch(bx), fb, fa, t], rounds=args.rounds)
            print(f"{case.key:<26} {bare:6.1f} {b:8.1f} {a:8.1f} {a / b:6.2f} {tt:7.1f}", flush=True)
        for key in [k for k in args.profile.split(",") if k]:
            case = next(c for c in hc.CASES if c.key == key)
            fa, _ = case.make(after.load, dev, dt)
            for _ in range(3):
                fa()
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(2000):
                fa()
            prof.disable()
            s = io.StringIO()
            pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
            print(f"--- cProfile {key} (after, 2000 calls)\n" + s.getvalue()[-3500:])
    if stub or args.no_training:
        return 0
    print(f"\n{'training step':<34} {'before':>8} {'after':>8} {'ratio':>6} {'SDPA':>7}  (ms per eager step) "
          f"speed vs SDPA: before, after")
    mb = before.load("a07_flash_attention.flash_triton")
    ma = after.load("a07_flash_attention.flash_triton")
    for model, b, h, s in hc.TRAINING:
        sb = hc.training_step(lambda q, k, v: mb.flash_attention(q, k, v, True), b, h, s)
        sa = hc.training_step(lambda q, k, v: ma.flash_attention(q, k, v, True), b, h, s)
        sd = hc.training_step(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True), b, h, s)
        for _ in range(3):
            sb(), sa(), sd()
        tb, ta, td = hc.interleaved_us([sb, sa, sd], rounds=args.rounds, calls=20, runs=5)
        print(f"{model} B={b} H={h} S={s}".ljust(34) + f" {tb / 1e3:8.3f} {ta / 1e3:8.3f} {ta / tb:6.2f} {td / 1e3:7.3f}"
              f"  {td / tb:.2f}x, {td / ta:.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
