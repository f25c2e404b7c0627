"""Experiment (issue #28): check and time the persistent decode kernel (persistent.py, this folder) against the
engine's kernel-by-kernel step. From the repository root:

    PYTHONPATH=. python lectures/results/experiments/a08_persistent/persistent_check.py      # CPU: a tiny model
    PYTHONPATH=. python lectures/results/experiments/a08_persistent/persistent_check.py --models xl --batches 1 \
        --time --sweep 4096:1024:4:2 2048:1024:4:4      # GPU: ms/step both ways, configs tile:kc_4c:warps:per_sm
"""
from __future__ import annotations

import argparse
import statistics
import time

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))

from common import TRITON_INTERPRET  # noqa: E402
from common.testing import random_gpt2
from solutions.a08_gpt2_inference import engine as eng
from persistent import PersistentDecode  # this folder (sys.path below)

SIZES = {"tiny": dict(vocab_size=257, n_positions=96, n_embd=96, n_layer=2, n_head=3),
         "small": dict(n_embd=768, n_layer=12, n_head=12), "medium": dict(n_embd=1024, n_layer=24, n_head=16),
         "large": dict(n_embd=1280, n_layer=36, n_head=20), "xl": dict(n_embd=1600, n_layer=48, n_head=25)}


def blocks_both_ways(engine, b, ctx, seed=0):
    """hid after every block: the kernel-by-kernel step's and the persistent kernel's, from one cache."""
    g = torch.Generator(device=engine.device).manual_seed(seed)
    for t in (engine.cache.k, engine.cache.v):
        t[:, :b, :, :ctx].normal_(0.0, 0.5, generator=g)
    engine.cache.lengths[:b].fill_(ctx)
    engine.batch = b
    tok = torch.randint(0, engine.vocab_size, (b,), generator=g, device=engine.device)
    saved = engine.cache.k.clone(), engine.cache.v.clone()
    # reference: the engine's own step, stopped before the LM head (ln_f input = hid)
    captured = {}
    layernorm = eng.layernorm

    def grab(x, *a, **kw):
        captured["hid"] = x.clone()
        return layernorm(x, *a, **kw)
    eng.layernorm = grab
    try:
        engine.decode_step(tok)
    finally:
        eng.layernorm = layernorm
    ref_k, ref_v = engine.cache.k.clone(), engine.cache.v.clone()
    engine.cache.k.copy_(saved[0]), engine.cache.v.copy_(saved[1])
    engine.cache.lengths[:b].fill_(ctx)
    pers = PersistentDecode(engine)
    lengths = engine.cache.lengths[:b]
    hid, _ = engine.embed(tok, lengths)
    pers.blocks(hid, lengths)
    pos = ctx
    err = float((hid.float() - captured["hid"].float()).norm() / captured["hid"].float().norm())
    kerr = float((engine.cache.k[:, :b, :, pos].float() - ref_k[:, :b, :, pos].float()).abs().max())
    verr = float((engine.cache.v[:, :b, :, pos].float() - ref_v[:, :b, :, pos].float()).abs().max())
    return err, kerr, verr, pers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="+", default=["tiny"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--ctx", type=int, default=100)
    ap.add_argument("--time", action="store_true")
    ap.add_argument("--sweep", nargs="*", default=[], help="configs tile:kc_4c:warps to time too")
    args = ap.parse_args()
    for name in args.models:
        t0 = time.perf_counter()
        hf = random_gpt2(0, **SIZES[name]) if name == "tiny" else random_gpt2(0, std=None, **SIZES[name])
        engine = eng.GPT2Engine.from_hf(hf, dtype=torch.bfloat16, max_batch=max(args.batches),
                                        max_seq_len=min(args.ctx + 80, hf.config.n_positions))
        del hf
        print(f"{name}: built in {time.perf_counter() - t0:.0f} s", flush=True)
        for b in args.batches:
            ctx = min(args.ctx, engine.max_seq_len - 40)
            err, kerr, verr, pers = blocks_both_ways(engine, b, ctx)
            print(f"{name} B={b} ctx={ctx}: hid rel err {err:.2e}, new K max err {kerr:.2e}, V {verr:.2e} "
                  f"meta {pers.meta} programs {pers.programs}", flush=True)
            k = getattr(pers, "compiled", None)
            if k is not None and hasattr(k, "n_regs"):
                print(f"  registers {k.n_regs}, spills {k.n_spills}", flush=True)
            if args.time and not TRITON_INTERPRET:
                time_both(engine, pers, b, ctx)
                for cfg in args.sweep:
                    tile, kc, warps, per_sm = (int(x) for x in cfg.split(":"))
                    pers.configure(tile=tile, kc_4c=kc, warps=warps, per_sm=per_sm)
                    print(f"  config tile={tile} kc_4c={kc} warps={warps} per_sm={per_sm}: {pers.meta}", flush=True)
                    try:
                        time_both(engine, pers, b, ctx, only="persistent", sync=1)
                        print(f"    registers {pers.n_regs}, resident {pers.resident}", flush=True)
                        time_both(engine, pers, b, ctx, only="persistent", sync=0)
                    except Exception as e:  # noqa: BLE001
                        print(f"  FAILED {type(e).__name__}: {str(e)[:300]}", flush=True)
                pers.configure()
                trace(engine, pers, b, ctx)


def time_both(engine, pers, b, ctx, reps=50, only=None, sync=1):
    from solutions.a08_gpt2_inference.bench import step_bytes
    nbytes = step_bytes(engine, b, ctx)
    lengths = engine.cache.lengths[:b]
    tok = torch.zeros(b, dtype=torch.long, device=engine.device)
    results = {}
    for name in ("kernels", "persistent") if only is None else (only,):
        engine.cache.lengths[:b].fill_(ctx)
        hid, _ = engine.embed(tok, lengths)
        if name == "kernels":
            fn = lambda: engine.decode_step(tok)  # noqa: E731
        else:
            def fn():
                h, nl = engine.embed(tok, lengths)
                pers.blocks(h, lengths, sync=sync)
                return engine.lm_head(eng.layernorm(h, engine.ln_f_w, engine.ln_f_b, engine.eps, pdl=engine.pdl))
        fn()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        ms = []
        for _ in range(3):
            engine.cache.lengths[:b].fill_(ctx)
            graph.replay()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(reps):
                graph.replay()
            e.record()
            torch.cuda.synchronize()
            ms.append(s.elapsed_time(e) / reps)
        med = statistics.median(ms)
        results[name] = med
        print(f"  {name}{sync}: {med:.4f} ms/step, {nbytes / med / 1e6:.0f} GB/s = {nbytes / med / 1e6 / 3000:.1%} of 3.0 TB/s "
              f"(runs {' '.join(f'{x:.4f}' for x in ms)})", flush=True)
    return results


def trace(engine, pers, b, ctx):
    """Per phase of the persistent kernel (globaltimer stamps of every program after its wait and at its end):
    the phase's span (latest end minus the previous phase's latest end), mean wait, and GB/s of its weights."""
    lengths = engine.cache.lengths[:b]
    engine.cache.lengths[:b].fill_(ctx)
    tok = torch.zeros(b, dtype=torch.long, device=engine.device)
    tr = torch.zeros(pers.programs, engine.n_layer, 5, 2, dtype=torch.int64, device=engine.device)
    for _ in range(3):
        h, _ = engine.embed(tok, lengths)
        pers.blocks(h, lengths, trace=tr)
    torch.cuda.synchronize()
    t = tr.double().cpu() / 1e3                              # us
    t -= t[:, 0, 0, 0].min()
    ends = t[:, :, :, 1].amax(0).flatten()                  # [L*5] latest end per phase, in order
    starts = t[:, :, :, 0].flatten(1)                        # [G, L*5] after-wait per program
    own_prev_end = torch.cat([t[:, :, :, 1].flatten(1)[:, :1] * 0 + t[:, 0, 0, 0:1], t[:, :, :, 1].flatten(1)[:, :-1]], 1)
    waits = (starts - own_prev_end).mean(0)                  # [L*5]
    c = engine.n_embd
    wbytes = {0: 3 * c * c * 2, 2: c * c * 2, 3: 4 * c * c * 2, 4: 4 * c * c * 2}
    names = ["A qkv", "B attention", "C proj", "D fc", "E fc_proj"]
    span = ends.clone()
    span[1:] = ends[1:] - ends[:-1]
    span = span.view(engine.n_layer, 5)
    waits = waits.view(engine.n_layer, 5)
    print(f"  trace: step span {ends[-1]:.1f} us over {engine.n_layer} layers ({ends[-1] / engine.n_layer:.2f} us a layer)")
    for p in range(5):
        sp = span[1:, p].median().item()
        gb = f", {wbytes[p] / sp / 1e3:.0f} GB/s" if p in wbytes else ""
        print(f"    {names[p]:12s} span {sp:6.2f} us (median over layers){gb}; mean wait after own previous phase "
              f"{waits[1:, p].mean():.2f} us", flush=True)


if __name__ == "__main__":
    main()
