"""Stage 8 benchmark: GPT-2 generation on the course's kernels against transformers.

    python -m solutions.a08_gpt2_inference.bench                 # GPT-2 small and medium (H100: ~15 min)
    python -m solutions.a08_gpt2_inference.bench --models small --batches 1 8 --quick
    python -m assignments.a08_gpt2_inference.bench               # your engine
    python -m solutions.a08_gpt2_inference.bench --impl path/to/submission

Three ways to run the same random-weight GPT-2 (bf16, greedy, no end-of-text stop):
  engine        the impl's GPT2Engine (--impl; default: the tree the command ran from): the course kernels, static KV cache, decode step
                replayed from a CUDA graph;
  hf eager      transformers' GPT2LMHeadModel.generate with its default (dynamic) cache;
  hf compiled   the same with cache_implementation="static": transformers compiles the
                decode step with torch.compile (mode "reduce-overhead", CUDA graphs).
Per (model, prompt length P, batch B):
  prefill tok/s   B·P / the time of the prompt's forward pass, cache filled, logits of the last
                  token: engine.prefill as generate() runs it (CUDA-graph replay for prompts of
                  <= 4096 padded tokens, eager above; the eager time is in the CSV too), and
                  transformers' forward with use_cache=True, logits_to_keep=1;
  decode tok/s    B·63 / (time of generate(64) - time of generate(1)): 63 decode steps,
                  host work included (that is what a user waits for);
  step GB/s       (engine) bytes a decode step must read (every weight once + the KV cache up to
                  the current length) / the GPU time of one replayed step; against the device
                  copy bandwidth measured in the same run, that is the decode roofline.
Times are medians of --reps runs after a warm-up run (compilation, autotuning, graph capture).
Writes a08_gpt2_inference.{md,csv} and a08_decode_speedup.png to common.impl.results_dir
(lectures/results/ for the solutions, lectures/results/<impl folder>/ otherwise).
"""
from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import torch

from common.impl import Impl, add_impl_argument, command_line, results_dir
from common.roofline import gpt2_decode_bytes, measure_ceilings
from common.testing import random_gpt2

MODULE = __spec__.name if __spec__ is not None else __name__
MODELS = {"small": dict(n_embd=768, n_layer=12, n_head=12), "medium": dict(n_embd=1024, n_layer=24, n_head=16)}
NEW = 64


def hf_gpt2(name: str, dtype: torch.dtype):
    return random_gpt2(0, std=None, **MODELS[name], initializer_range=0.1).to("cuda", dtype)


def wall(fn, reps: int) -> float:
    """Median wall time of fn() in ms, the GPU drained before and after each run."""
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def step_bytes(engine, b: int, ctx: int) -> int:
    """Bytes one decode step must read: every weight once and the KV cache up to ctx positions."""
    return gpt2_decode_bytes(engine.n_layer, engine.n_embd, engine.vocab_size, b, ctx, engine.wte.element_size())


def graph_step_ms(engine, ids, steps: int = 32) -> float:
    """GPU time of one replayed decode step: `steps` replays back to back between two events."""
    b = ids.shape[0]
    engine.prefill(ids)
    graph, static_tok = engine._graphs[b]
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()                                   # warm
    start.record()
    for _ in range(steps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def profile_step(engine, ids) -> str:
    """Where a decode step's time goes: kernels per step, GPU time by kernel, eager vs graph replay."""
    from torch.profiler import ProfilerActivity, profile
    b = ids.shape[0]
    lines = []
    for mode in ("eager", "graph"):
        engine.prefill(ids)
        tok = torch.zeros(b, dtype=torch.long, device="cuda")
        step = (lambda: engine.decode_step(tok)) if mode == "eager" else (lambda: engine._replay(b, tok))
        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t0 = time.perf_counter()
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            wall_ms = (time.perf_counter() - t0) * 1e3 / 5
        kern = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA and e.name not in ("Memset", "Memcpy"):
                k = e.name.split("(")[0][:40]
                n, us = kern.get(k, (0, 0.0))
                kern[k] = (n + 1, us + e.device_time / 5)
        gpu_us = sum(us for _, us in kern.values())
        n_k = sum(n for n, _ in kern.values()) / 5
        lines.append(f"decode step B={b}, {mode}: {wall_ms * 1e3:.0f} us wall per step, {gpu_us:.0f} us of kernels, "
                     f"{n_k:.0f} kernels per step")
        if mode == "graph":
            for k, (n, us) in sorted(kern.items(), key=lambda kv: -kv[1][1])[:8]:
                lines.append(f"    {k:40s} {n / 5:5.0f} per step {us:8.1f} us ({100 * us / gpu_us:.0f}%)")
    return "\n".join(lines)


def profile_prefill(engine, ids) -> str:
    """Where a short prefill's wall time goes: eager vs graph replay, kernels, and the Python functions."""
    import cProfile
    import io
    import pstats
    from torch.profiler import ProfilerActivity, profile
    b, t = ids.shape
    lines = []
    for graph in (False, True):
        engine.prefill(ids, cuda_graph=graph)
        ms = wall(lambda: engine.prefill(ids, cuda_graph=graph), 5)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.prefill(ids, cuda_graph=graph)
            torch.cuda.synchronize()
        kern = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                and e.name not in ("Memset", "Memcpy")]
        gpu_us = sum(e.device_time for e in kern)
        lines.append(f"prefill B={b} T={t}, {'graph' if graph else 'eager'}: {ms * 1e3:.0f} us wall, "
                     f"{gpu_us:.0f} us of kernels, {len(kern)} kernels"
                     + (f" -> {ms * 1e3 / max(len(kern), 1):.0f} us of wall per kernel" if not graph else ""))
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(3):
        engine.prefill(ids)
    torch.cuda.synchronize()
    pr.disable()
    buf = io.StringIO()
    pstats.Stats(pr, stream=buf).sort_stats("tottime").print_stats(12)
    body = [ln for ln in buf.getvalue().splitlines() if ln.strip()][-13:]
    lines.append("eager prefill, Python functions by own time (3 calls):")
    lines += ["    " + ln for ln in body]
    return "\n".join(lines)


def bench_case(engine, hf, name, p, b, reps, gbps_copy, skip_compiled):
    from transformers import StaticCache
    vocab = engine.vocab_size
    ids = torch.randint(0, vocab, (b, p), device="cuda")
    mask = torch.ones_like(ids)
    row = {"model": name, "prompt": p, "batch": b}

    # ---- engine
    engine.generate(ids, NEW)                        # warm-up: compiles, autotunes, captures the graph
    # graph (what generate() runs) and eager, interleaved rep by rep so neither gets the warmer GPU
    pairs = [(wall(lambda: engine.prefill(ids, cuda_graph=True), 1), wall(lambda: engine.prefill(ids), 1))
             for _ in range(reps)]
    pre, pre_eager = (statistics.median(x) for x in zip(*pairs))
    g1 = wall(lambda: engine.generate(ids, 1), reps)
    g64 = wall(lambda: engine.generate(ids, NEW), reps)
    row.update(engine_prefill_tok_s=b * p / pre * 1e3, engine_prefill_eager_tok_s=b * p / pre_eager * 1e3,
               engine_decode_tok_s=b * (NEW - 1) / (g64 - g1) * 1e3,
               engine_decode_ms=(g64 - g1) / (NEW - 1))
    step = graph_step_ms(engine, ids)
    nbytes = step_bytes(engine, b, p + 16)
    row.update(engine_step_gpu_ms=step, step_gbps=nbytes / step / 1e6, step_of_copy=nbytes / step / 1e6 / gbps_copy)

    # ---- transformers, eager (dynamic cache)
    def hf_gen(n, **kw):
        return lambda: hf.generate(ids, attention_mask=mask, max_new_tokens=n, do_sample=False, **kw)
    with torch.no_grad():
        hf_gen(NEW)()
        pre_hf = wall(lambda: hf(input_ids=ids, attention_mask=mask, use_cache=True, logits_to_keep=1), reps)
        g1_hf = wall(hf_gen(1), reps)
        g64_hf = wall(hf_gen(NEW), reps)
    row.update(hf_prefill_tok_s=b * p / pre_hf * 1e3, hf_decode_tok_s=b * (NEW - 1) / (g64_hf - g1_hf) * 1e3)

    # ---- transformers, static cache + torch.compile (one compile per batch size: the cache is reused)
    if not skip_compiled:
        try:      # sized as generate(cache_implementation="static") sizes it; reused across calls
            cache = StaticCache(config=hf.config, max_cache_len=p + NEW)
        except TypeError:  # older transformers
            cache = StaticCache(config=hf.config, max_batch_size=b, max_cache_len=p + NEW, device="cuda",
                                dtype=torch.bfloat16)
        kw = dict(past_key_values=cache)
        with torch.no_grad():
            for _ in range(3):                        # compile, then warm the CUDA graphs
                cache.reset()
                hf_gen(NEW, **kw)()

            def run(n):
                def f():
                    cache.reset()
                    hf_gen(n, **kw)()
                return f
            c1 = wall(run(1), reps)
            c64 = wall(run(NEW), reps)
        row.update(hfc_prefill_tok_s=b * p / c1 * 1e3, hfc_decode_tok_s=b * (NEW - 1) / (c64 - c1) * 1e3)
        # same tokens as the engine (bf16: a near-tie may flip late; report, do not fail)
        with torch.no_grad():
            cache.reset()
            ref = hf_gen(NEW, **kw)()[:, p:]
        row["tokens_equal_hf_compiled"] = float((engine.generate(ids, NEW) == ref).float().mean())
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    ap.add_argument("--prompts", nargs="+", type=int, default=[128, 960])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="3 reps")
    ap.add_argument("--no-compiled", action="store_true", help="skip transformers + torch.compile")
    add_impl_argument(ap, MODULE)
    ap.add_argument("--out", default=None, help="csv/md path prefix (default: results_dir(impl)/a08_gpt2_inference)")
    args = ap.parse_args(argv)
    impl = Impl.get(args.impl)
    args.out = args.out or str(results_dir(impl) / "a08_gpt2_inference")
    if not torch.cuda.is_available():
        raise SystemExit("the stage-8 benchmark needs a CUDA GPU (CPU: pytest runs the engine interpreted)")
    reps = 3 if args.quick else args.reps
    eng_mod = impl.load("a08_gpt2_inference.engine")
    gbps_copy = measure_ceilings().gbps            # device-to-device copy, bytes read + written
    print(f"{impl}: {torch.cuda.get_device_name()}, copy bandwidth {gbps_copy:.0f} GB/s", flush=True)
    rows = []
    for name in args.models:
        torch.manual_seed(0)                          # the same prompts on every run
        hf = hf_gpt2(name, torch.bfloat16)
        engine = eng_mod.GPT2Engine.from_hf(hf, max_batch=max(args.batches), max_seq_len=max(args.prompts) + NEW)
        print(engine.cache.describe(), flush=True)
        engine.generate(torch.zeros(1, 128, dtype=torch.long, device="cuda"), 3)   # graph for B=1
        prof = profile_step(engine, torch.zeros(1, 128, dtype=torch.long, device="cuda"))
        prof += "\n" + profile_prefill(engine, torch.randint(0, engine.vocab_size, (1, 128), device="cuda"))
        print(prof, flush=True)
        (Path(args.out).parent / f"a08_profile_{name}.txt").write_text(prof + "\n")
        for b in args.batches:
            for p in args.prompts:
                t0 = time.perf_counter()
                row = bench_case(engine, hf, name, p, b, reps, gbps_copy, args.no_compiled)
                rows.append(row)
                print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
        del engine, hf
        torch.cuda.empty_cache()
    write(rows, Path(args.out), gbps_copy, impl, command_line(MODULE, argv))


def write(rows, out: Path, gbps_copy: float, impl: Impl, cmd: str):
    out.parent.mkdir(parents=True, exist_ok=True)
    keys = sorted({k for r in rows for k in r}, key=lambda k: list(rows[0]).index(k) if k in rows[0] else 99)
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    lines = [f"# Stage 8: GPT-2 generation, {impl} engine vs transformers ({torch.cuda.get_device_name()})", "",
             f"bf16, random weights, greedy, 64 new tokens; copy bandwidth {gbps_copy:.0f} GB/s. "
             f"Command: `{cmd}`", "",
             "| model | prompt | batch | prefill tok/s engine | hf eager | ratio | decode tok/s engine | hf eager "
             "| hf compiled | vs eager | vs compiled | step GPU ms | step GB/s | of copy |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        hfc = r.get("hfc_decode_tok_s")
        cells = [r["model"], r["prompt"], r["batch"], f"{r['engine_prefill_tok_s']:,.0f}", f"{r['hf_prefill_tok_s']:,.0f}",
                 f"{r['engine_prefill_tok_s'] / r['hf_prefill_tok_s']:.2f}x", f"{r['engine_decode_tok_s']:,.0f}",
                 f"{r['hf_decode_tok_s']:,.0f}", f"{hfc:,.0f}" if hfc else "-",
                 f"{r['engine_decode_tok_s'] / r['hf_decode_tok_s']:.2f}x",
                 f"{r['engine_decode_tok_s'] / hfc:.2f}x" if hfc else "-",
                 f"{r['engine_step_gpu_ms']:.3f}", f"{r['step_gbps']:,.0f}", f"{100 * r['step_of_copy']:.0f}%"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows)), 4.2))
        labels = [f"{r['model']}\nP {r['prompt']}\nB {r['batch']}" for r in rows]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["engine_decode_tok_s"] / r["hf_decode_tok_s"] for r in rows], 0.4,
               label="vs transformers eager")
        if all("hfc_decode_tok_s" in r for r in rows):
            ax.bar([i + 0.2 for i in x], [r["engine_decode_tok_s"] / r["hfc_decode_tok_s"] for r in rows], 0.4,
                   label="vs transformers static cache + torch.compile")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks(list(x), labels, fontsize=7)
        ax.set_ylabel("decode speedup (tokens/s ratio)")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
        ax.set_title("Stage 8: GPT-2 decode, course engine vs transformers (bf16)")
        fig.tight_layout()
        fig.savefig(out.parent / "a08_decode_speedup.png", dpi=120)
    except Exception as e:  # the table is what matters
        print("plot skipped:", e)


if __name__ == "__main__":
    main()
