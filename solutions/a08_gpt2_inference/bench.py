"""Stage 8 benchmark: GPT-2 generation on the course's kernels against transformers.

    python -m solutions.a08_gpt2_inference.bench                 # GPT-2 small and medium (H100: ~15 min)
    python -m solutions.a08_gpt2_inference.bench --models small --batches 1 8 --quick
    python -m assignments.a08_gpt2_inference.bench               # your engine
    python -m solutions.a08_gpt2_inference.bench --impl path/to/submission

Decode at the memory wall (no transformers comparison; GPU only; see each mode's function):
    python -m solutions.a08_gpt2_inference.bench --gemv [--sweep xl]   # per-kernel decode-GEMM GB/s vs cuBLAS
    python -m solutions.a08_gpt2_inference.bench --step                # decode-step time and % of bandwidth
    python -m solutions.a08_gpt2_inference.bench --profile             # per-kernel time, gaps, PDL on/off
    python -m solutions.a08_gpt2_inference.bench --sampling            # sampling and EOS cost per step vs greedy
    python -m solutions.a08_gpt2_inference.bench --core-vs-tuned       # the decode step: core against tuned path
(--step and --profile compare the tuned path's variants: the a06 matmul for its GEMMs, the a08
gemv, the gemv with programmatic dependent launch; --core-vs-tuned the engine's core, the impl's
kernels as they are, against the tuned path over them; --models / --batches / --prompts select the cases.)

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

from common.gpu import shared_memory_per_block
from common.impl import Impl, add_impl_argument, command_line, results_dir
from common.roofline import gpt2_decode_bytes, measure_ceilings
from common.testing import random_gpt2

MODULE = __spec__.name if __spec__ is not None else __name__
MODELS = {"small": dict(n_embd=768, n_layer=12, n_head=12), "medium": dict(n_embd=1024, n_layer=24, n_head=16),
          "large": dict(n_embd=1280, n_layer=36, n_head=20), "xl": dict(n_embd=1600, n_layer=48, n_head=25)}
#: The models of the full comparison with transformers when --models is not given.
DEFAULT_MODELS = ["small", "medium"]
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
    graph, static_tok = engine._graphs[(b, engine.GREEDY)]
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
        step = (lambda: engine.decode_step(tok)) if mode == "eager" else (lambda: engine._replay(b, engine.GREEDY, tok))
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
    ap.add_argument("--models", nargs="+", default=None, choices=list(MODELS),
                    help=f"default: {' '.join(DEFAULT_MODELS)} (--gemv: all four; --profile: small xl)")
    ap.add_argument("--prompts", "--prompt", nargs="+", type=int, default=None,
                    help="prompt lengths (default 128 960; --step and --profile: 100)")
    ap.add_argument("--batches", nargs="+", type=int, default=None, help="default 1 8 64 (--step, --profile: 1)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="3 reps")
    ap.add_argument("--no-compiled", action="store_true", help="skip transformers + torch.compile")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--gemv", action="store_true", help="per-kernel decode-GEMM bandwidth: gemv, a06 matmul, cuBLAS")
    mode.add_argument("--step", action="store_true", help="decode-step GPU time only (no transformers), three paths")
    mode.add_argument("--profile", action="store_true", help="decode-step profile: kernels, bytes, gaps, three paths")
    mode.add_argument("--sampling", action="store_true",
                      help="cost of sampling (temperature, top-k, top-p) and of the EOS check per decode step vs greedy")
    mode.add_argument("--core-vs-tuned", action="store_true",
                      help="decode-step GPU time on the engine's core (your kernels) and on the tuned path")
    ap.add_argument("--sweep", nargs="*", default=[], choices=list(MODELS),
                    help="--gemv: also time a few other configs per GEMM of these models (e.g. --sweep xl)")
    ap.add_argument("--runs", type=int, default=2, help="--step: timing runs per case (median reported)")
    add_impl_argument(ap, MODULE)
    ap.add_argument("--out", default=None, help="csv/md path prefix (default: results_dir(impl)/a08_gpt2_inference)")
    args = ap.parse_args(argv)
    impl = Impl.get(args.impl)
    if not torch.cuda.is_available():
        raise SystemExit("the stage-8 benchmark needs a CUDA GPU (CPU: pytest runs the engine interpreted)")
    if args.gemv or args.step or args.profile or args.sampling or args.core_vs_tuned:
        return memory_wall(args, impl, argv)
    args.models = args.models or DEFAULT_MODELS
    args.prompts = args.prompts or [128, 960]
    args.batches = args.batches or [1, 8, 64]
    args.out = args.out or str(results_dir(impl) / "a08_gpt2_inference")
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


# =============================================================================== decode at the memory wall
#: The tuned path's ways to run a decode step, for before/after in one run (GPT2Engine.set_path's options).
PATHS = {"a06 matmul": dict(decode_gemv=False, pdl=False),
         "gemv": dict(decode_gemv=True, pdl=False),
         "gemv + PDL, unfused": dict(decode_gemv=True, pdl=True, fuse_epilogues=False),
         "gemv + PDL": dict(decode_gemv=True, pdl=True)}
#: --core-vs-tuned: the engine's core (the impl's kernels as they are) and its tuned path (the default options)
CORE_VS_TUNED = {"core": dict(tuned=False), "tuned": dict(tuned=True)}
#: --step's cases when --models/--batches/--prompts are not given: the course's floors (batch 1, prompt
#: 100, every size; XL at batch 16 and prompt 500).
STEP_CASES = [("small", 1, 100), ("medium", 1, 100), ("large", 1, 100), ("xl", 1, 100), ("xl", 16, 500)]
STEPS = 50          # replays per timing run (--step, --profile)


def memory_wall(args, impl: Impl, argv) -> None:
    """--gemv, --step, --profile: each writes its markdown (+ csv) to results_dir(impl) and prints it last."""
    out_dir = Path(args.out).parent if args.out else results_dir(impl)
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = command_line(MODULE, argv)
    gbps_copy = measure_ceilings().gbps
    head = (f"{impl}, {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton_version()}; "
            f"copy bandwidth {gbps_copy:.0f} GB/s (1 GiB device-to-device copy, bytes read + written)")
    print(head, flush=True)
    if args.gemv:
        text = gemv_table(impl, args.models or list(MODELS), args.sweep, gbps_copy, head, cmd, out_dir)
    elif args.step:
        cases = (STEP_CASES if args.models is None and args.batches is None and args.prompts is None else
                 [(m, b, p) for m in (args.models or ["small", "xl"]) for b in (args.batches or [1])
                  for p in (args.prompts or [100])])
        text = step_table(impl, cases, args.runs, gbps_copy, head, cmd, out_dir)
    elif args.core_vs_tuned:
        cases = (STEP_CASES if args.models is None and args.batches is None and args.prompts is None else
                 [(m, b, p) for m in (args.models or ["small", "xl"]) for b in (args.batches or [1])
                  for p in (args.prompts or [100])])
        text = step_table(impl, cases, args.runs, gbps_copy, head, cmd, out_dir, CORE_VS_TUNED, "a08_core_vs_tuned")
    elif args.sampling:
        cases = [(m, b, p) for m in (args.models or ["small"]) for b in (args.batches or [1, 8])
                 for p in (args.prompts or [128])]
        text = sampling_table(impl, cases, args.runs, head, cmd, out_dir)
    else:
        cases = [(m, b, p) for m in (args.models or ["small", "xl"]) for b in (args.batches or [1])
                 for p in (args.prompts or [100])]
        text = profile_table(impl, cases, gbps_copy, head, cmd, out_dir)
    print(text)


#: --sampling: the ways of choosing a token compared with greedy (generate()'s options)
SAMPLING = {"greedy": {}, "greedy + EOS": dict(eos_token_id=0),
            "T=0.8": dict(do_sample=True, temperature=0.8),
            "T=0.8, top-k 50": dict(do_sample=True, temperature=0.8, top_k=50),
            "T=0.8, top-p 0.9": dict(do_sample=True, temperature=0.8, top_p=0.9),
            "T=0.8, top-k 50, top-p 0.9": dict(do_sample=True, temperature=0.8, top_k=50, top_p=0.9)}


def sampling_table(impl: Impl, cases, runs: int, head: str, cmd: str, out_dir: Path) -> str:
    """What choosing the token costs per decode step: the GPU time of one graph replay (decode step +
    token choice: argmax, or the sampling kernel, plus the EOS bookkeeping) for each of SAMPLING,
    against greedy in the same run (target: sampling within 5 % of greedy at batch 1). And the EOS
    check's host syncs: generate(64) wall time with an EOS id that never comes (the host looks every
    CHECK_EVERY steps) against generate(64) without EOS. Writes a08_sampling.md. H100: about 1 minute."""
    eng_mod = impl.load("a08_gpt2_inference.engine")
    rows = [f"# Stage 8: the cost of sampling per decode step\n\n{head}\n\n`{cmd}`\n",
            "| model | batch | prompt | token choice | step GPU ms | vs greedy |", "|---|---|---|---|---|---|"]
    walls = ["", "| model | batch | prompt | generate(64) ms, no EOS | with an EOS that never comes | ratio |",
             "|---|---|---|---|---|---|"]
    for model, b, p in cases:
        torch.manual_seed(0)
        hf = hf_gpt2(model, torch.bfloat16)
        engine = eng_mod.GPT2Engine.from_hf(hf, max_batch=b, max_seq_len=p + NEW + STEPS + 8)
        del hf
        ids = torch.randint(1, engine.vocab_size, (b, p), device="cuda")
        base = None
        for name, kw in SAMPLING.items():
            engine.generate(ids, 3, **kw)                         # compiles, captures this mode's graph
            mode = engine.mode(kw.get("do_sample", False), "eos_token_id" in kw, kw.get("top_k", 0), kw.get("top_p", 1.0))
            graph, _ = engine._graphs[(b, mode)]
            ms = statistics.median(replay_ms(engine, graph, b, p, runs))
            base = base or ms
            rows.append(f"| {model} | {b} | {p} | {name} | {ms:.4f} | {ms / base - 1:+.1%} |")
            print(rows[-1], flush=True)
        plain = wall(lambda: engine.generate(ids, NEW), 5)
        unseen = min(set(range(engine.vocab_size)) - set(engine.generate(ids, NEW).flatten().tolist()))
        assert engine.generate(ids, NEW, eos_token_id=unseen).shape[1] == NEW
        eos = wall(lambda: engine.generate(ids, NEW, eos_token_id=unseen), 5)
        walls.append(f"| {model} | {b} | {p} | {plain:.2f} | {eos:.2f} | {eos / plain:.3f} |")
        print(walls[-1], flush=True)
        del engine
        torch.cuda.empty_cache()
    text = "\n".join(rows + walls) + "\n"
    (out_dir / "a08_sampling.md").write_text(text)
    return text


def triton_version() -> str:
    import triton
    return triton.__version__


# ------------------------------------------------------------------------------- per-kernel GEMM bandwidth
def l2_bytes() -> int:
    """This GPU's L2 (common.gpu; 50 MB on an H100): the rotation reads >= 3x it between two reads of one
    weight copy."""
    from common import gpu
    return gpu.l2_bytes() or 50 * 2**20


def gemm_shapes(c: int, vocab: int = 50257) -> dict[str, tuple[int, int, bool]]:
    """A GPT-2 block's decode GEMMs and the LM head: name -> (K, N, stored k_contiguous). The Conv1D
    weights are stored [K, N] row-major (N contiguous), and the engine's decode reads a K-major copy of
    each; the LM head reads wteᵀ, a K-contiguous view of wte [vocab, C], in both phases."""
    return {"qkv": (c, 3 * c, False), "proj": (c, c, False), "fc": (c, 4 * c, False), "fc_proj": (4 * c, c, False),
            "lm_head": (c, vocab, True)}


def rotated_ms(call, copies: int, reps: int = 15) -> float:
    """GPU ms per call of ``call(i)``, i = 0 .. copies-1 (each on its own copy of the weight), captured back
    to back in one CUDA graph and replayed ``reps`` times: the median over replays of (replay time / copies).
    Consecutive reads of one weight copy are >= 3 L2 sizes apart, so every call reads its weight from HBM;
    the graph takes the host out (a 1 MB weight is read in under a microsecond, a launch from Python takes
    tens). What is left per call is the kernel and its share of the gaps between kernels in a graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(copies):
            call(i)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(copies):
            call(i)
    graph.replay()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / copies)
    del graph
    return statistics.median(times)


def sweep_configs(gv, m: int, k: int, n: int, k_contiguous: bool, sms: int, smem: int) -> list[tuple]:
    """A few configs around choose_config's pick on ``sms`` SMs with ``smem`` bytes of shared memory a block
    (other column counts, splits, warps, stages, the other path)."""
    bn, bk, sp, w, st = gv.choose_config(m, n, k, torch.bfloat16, k_contiguous, sms, smem=smem)
    dot = gv.use_dot(m)
    out = [(bn, bk, sp, w, st, dot), (bn, bk, max(1, sp // 2), w, st, dot), (bn, bk, sp * 2, w, st, dot)]
    if dot:
        out += [(b2, k2, s2, 4, s3, True) for b2, k2 in ((32, 128), (64, 64), (64, 128), (64, 256), (128, 128))
                for s2 in (1, 2, 4) for s3 in (4, 6, 8) if s3 * gv.dot_stage_bytes(b2, k2, 2) <= smem]
    else:
        out += [(b2, bk, s2, w2, 1, False) for b2 in (4, 8, 16) for s2 in (1, 2) for w2 in (4, 8)]
        out += [(32, 128, 1, 4, 4, True)]                                   # tl.dot even at M <= 2
    return list(dict.fromkeys(c for c in out if c[0] >= 1 and c[1] >= 1 and not (c[5] and (c[0] < 16 or c[1] < 16))))


def gemv_table(impl: Impl, models: list[str], sweep: list[str], gbps_copy: float, head: str, cmd: str,
               out_dir: Path) -> str:
    """Per-kernel decode-GEMM bandwidth (bf16, M = 1, 4 and 16): the a08 gemv on the engine's decode layout
    (K-major; host config, launched alone and in a chain of PDL launches), the a06 matmul (autotuned, on
    the stored layout, as the engine used it before the gemv) and cuBLAS (torch.matmul on the stored
    layout and on the K-major one: the faster of the two counts) on GPT-2's decode GEMMs; GB/s = weight
    bytes / time per call; the gemv's ratio to cuBLAS (>= 1: the gemv reads its weight at least as fast).
    Weights out of L2 (rotated_ms). Writes a08_gemv.{md,csv}. H100 estimate: 2-4 minutes, +1-2 with --sweep xl."""
    gv = Impl.get("solutions").load("a08_gpt2_inference.tuned_gemv")     # the tuned path's GEMV
    mm = impl.load("a06_matmul.matmul_triton").matmul
    dt, rows, sweeps = torch.bfloat16, [], []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    smem = shared_memory_per_block()                   # what gemv's choose_config is given on this GPU
    # the copy bandwidth measured the same way: 64 MB copies rotated in a graph
    src = [torch.empty(32 * 2**20, dtype=dt, device="cuda").normal_() for _ in range(3)]
    dst = [torch.empty_like(t) for t in src]
    copy_gbps = 2 * src[0].nbytes / rotated_ms(lambda i: dst[i].copy_(src[i]), 3) / 1e6
    del src, dst
    print(f"copy bandwidth, 64 MB copies in a graph (read + written): {copy_gbps:.0f} GB/s", flush=True)
    for model in models:
        c = MODELS[model]["n_embd"]
        for name, (k, n, kc) in gemm_shapes(c).items():
            wbytes = k * n * 2
            copies = max(3, -(-3 * l2_bytes() // wbytes))
            ws = [(torch.randn(n, k, device="cuda", dtype=dt) * k**-0.5).t() for _ in range(copies)]   # K-major
            stored = ws if kc else [w.contiguous() for w in ws]                                       # N-major
            for m in (1, 4, 16):
                xs = [torch.randn(m, k, device="cuda", dtype=dt) for _ in range(copies)]
                t0 = time.perf_counter()
                ref = torch.matmul(xs[0], ws[0])
                got = gv.gemv(xs[0], ws[0])
                err = float((got.float() - ref.float()).norm() / ref.float().norm())
                calls = {"gemv": lambda i: gv.gemv(xs[i], ws[i]),
                         "gemv_pdl": lambda i: gv.gemv(xs[i], ws[i], pdl=True),
                         "a06": lambda i: mm(xs[i], stored[i]), "cublas_stored": lambda i: torch.matmul(xs[i], stored[i]),
                         "cublas_kmajor": lambda i: torch.matmul(xs[i], ws[i])}
                ms = {}
                for key, call in calls.items():
                    try:
                        ms[key] = rotated_ms(call, copies)
                    except Exception as e:  # noqa: BLE001 - reported as NaN, the others still timed
                        print(f"{model} {name} M={m} {key}: FAILED: {type(e).__name__}: {e}", flush=True)
                        torch.cuda.synchronize()
                        ms[key] = float("nan")
                ms["cublas"] = min(ms["cublas_stored"], ms["cublas_kmajor"])
                cfg = gv.choose_config(m, n, k, dt, True, sms, smem=smem)
                row = dict(model=model, gemm=name, M=m, K=k, N=n, layout="wte.t()" if kc else "K-major copy of [K, N]",
                           weight_MB=wbytes / 1e6, config=str(cfg), rel_err_vs_cublas=err,
                           **{f"{key}_us": v * 1e3 for key, v in ms.items()},
                           **{f"{key}_GBps": wbytes / v / 1e6 for key, v in ms.items()})
                row["gemv_vs_cublas"] = ms["cublas"] / ms["gemv"]
                row["gemv_pdl_vs_cublas"] = ms["cublas"] / ms["gemv_pdl"]
                row["a06_vs_cublas"] = ms["cublas"] / ms["a06"]
                rows.append(row)
                print(f"{model} {name} M={m}: gemv {row['gemv_GBps']:.0f} GB/s ({row['gemv_vs_cublas']:.2f}x cuBLAS), "
                      f"PDL chain {row['gemv_pdl_GBps']:.0f}, a06 {row['a06_GBps']:.0f}, cuBLAS {row['cublas_GBps']:.0f}"
                      f" GB/s; config {cfg}; rel. err vs cuBLAS {err:.1e} ({time.perf_counter() - t0:.0f} s)",
                      flush=True)
                if model in sweep:
                    for cand in sweep_configs(gv, m, k, n, True, sms, smem):
                        try:
                            t = rotated_ms(lambda i: gv.gemv(xs[i], ws[i], config=cand), copies)
                            sweeps.append(dict(model=model, gemm=name, M=m, config=str(cand), us=t * 1e3,
                                               GBps=wbytes / t / 1e6, vs_cublas=ms["cublas"] / t))
                        except Exception as e:  # noqa: BLE001 - a config that does not compile is reported
                            sweeps.append(dict(model=model, gemm=name, M=m, config=str(cand), us=float("nan"),
                                               GBps=float("nan"), vs_cublas=float("nan"), error=type(e).__name__))
            del ws, xs, stored
            torch.cuda.empty_cache()
    _write_csv(out_dir / "a08_gemv.csv", rows)
    lines = [f"# Stage 8: decode GEMMs, gemv vs a06 matmul vs cuBLAS ({torch.cuda.get_device_name()})", "",
             head + f"; the same copy timed as below (64 MB, rotated in a graph): {copy_gbps:.0f} GB/s.", "",
             f"Command: `{cmd}`", "",
             "bf16, x [M, K] @ W [K, N]; the gemv reads W K-major (the engine's decode copy; the LM head's wteᵀ), "
             "the a06 matmul the stored layout (Conv1D: N-major). GB/s = weight bytes / GPU time per call; each call reads its own copy "
             f"of the weight (copies rotated so that >= {3 * l2_bytes() // 2**20} MB lie between two reads of one "
             "copy: out of L2), back to back in a CUDA graph, median of 15 replays. `PDL chain`: the same calls "
             "launched with programmatic dependent launch. cuBLAS: torch.matmul on both layouts, the faster "
             "(PyTorch's defaults). `x cuBLAS` = cuBLAS time / gemv time (>= 1.00: the gemv reads the weight at "
             "least as fast). Last column: the gemv's output against cuBLAS's (relative error; bf16 rounding is ~1e-3, "
             "a wrong kernel ~1).", "",
             "| model | GEMM | M | K -> N | weight MB | gemv GB/s | PDL chain GB/s | a06 GB/s | cuBLAS GB/s "
             "| gemv x cuBLAS | PDL x cuBLAS | a06 x cuBLAS | gemv config | gemv vs cuBLAS output |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['gemm']} | {r['M']} | {r['K']} -> {r['N']} | {r['weight_MB']:.1f} | "
                     f"{r['gemv_GBps']:,.0f} | {r['gemv_pdl_GBps']:,.0f} | {r['a06_GBps']:,.0f} | "
                     f"{r['cublas_GBps']:,.0f} | {r['gemv_vs_cublas']:.2f} | {r['gemv_pdl_vs_cublas']:.2f} | "
                     f"{r['a06_vs_cublas']:.2f} | `{r['config']}` | {r['rel_err_vs_cublas']:.1e} |")
    big = [r for r in rows if r["model"] == "xl" and r["weight_MB"] >= 10]
    if big:
        worst = min(big, key=lambda r: r["gemv_vs_cublas"])
        lines += ["", f"GPT-2 XL, weights >= 10 MB ({len(big)} GEMM x M cases): lowest gemv / cuBLAS ratio "
                      f"{worst['gemv_vs_cublas']:.2f} ({worst['gemm']}, M={worst['M']}); floor 1.00: "
                      f"{'met' if worst['gemv_vs_cublas'] >= 1.0 else 'NOT met'}."]
    if sweeps:
        _write_csv(out_dir / "a08_gemv_sweep.csv", sweeps)
        lines += ["", "### Config sweep (gemv, the same timing)", "",
                  "| model | GEMM | M | config (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages[, tl.dot]) | GB/s | x cuBLAS |",
                  "|---|---|---|---|---|---|"]
        for r in sweeps:
            lines.append(f"| {r['model']} | {r['gemm']} | {r['M']} | `{r['config']}` | {r['GBps']:,.0f} | "
                         f"{r['vs_cublas']:.2f} |")
    text = "\n".join(lines) + "\n"
    (out_dir / "a08_gemv.md").write_text(text)
    return text


def _write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


# ------------------------------------------------------------------------------- the decode step
def engine_for(eng_mod, name: str, batch: int, ctx: int, hf=None):
    """A random-weight GPT-2 of size ``name`` in bf16 (or the weights of ``hf``) as the engine, its cache
    sized for this case: batch sequences of ctx + 2·STEPS positions (decode attention's splits follow
    the cache's length)."""
    if hf is None:
        torch.manual_seed(0)
        hf = hf_gpt2(name, torch.bfloat16)
    engine = eng_mod.GPT2Engine.from_hf(hf, max_batch=batch, max_seq_len=min(ctx + 2 * STEPS + 8, 1024))
    torch.cuda.empty_cache()
    return engine


def use_path(eng_mod, engine, tuned: bool = True, **options) -> None:
    """Switch the engine's decode path (PATHS: the tuned path's options; CORE_VS_TUNED), remake its decode
    weights, and drop its captured graphs (GPT2Engine.set_path)."""
    engine.set_path(tuned, **options)
    torch.cuda.empty_cache()


def ready_for_decode(engine, b: int, ctx: int) -> None:
    """A batch of b sequences with ctx tokens in the cache, without a prefill (timing needs none: random
    K and V stand in for the prompt's)."""
    engine.batch = b
    g = torch.Generator(device=engine.device).manual_seed(1)
    for t in (engine.cache.k, engine.cache.v):
        t[:, :b, :, :ctx].normal_(0.0, 0.5, generator=g)
    engine.cache.lengths[:b].fill_(ctx)
    engine.cache.host_lengths[:b] = [ctx] * b


def captured_step(engine, b: int, ctx: int):
    """The decode step for batch b, run once eagerly (compiles, tunes) and captured: (graph, static token)."""
    tok = torch.zeros(b, dtype=torch.long, device=engine.device)
    ready_for_decode(engine, b, ctx)
    engine.decode_step(tok)
    engine._replay(b, engine.GREEDY, tok)
    torch.cuda.synchronize()
    return engine._graphs[(b, engine.GREEDY)]


def step_ms(engine, b: int, ctx: int, runs: int) -> list[float]:
    """GPU ms per decode step, per run: STEPS graph replays back to back between two CUDA events, the
    context reset to ctx before each run (it grows by STEPS during one)."""
    graph, _ = captured_step(engine, b, ctx)
    return replay_ms(engine, graph, b, ctx, runs)


def replay_ms(engine, graph, b: int, ctx: int, runs: int) -> list[float]:
    """GPU ms per replay of a captured decode step, per run: the context reset to ctx, one replay to
    warm up, then STEPS replays back to back between two CUDA events."""
    out = []
    for _ in range(runs):
        engine.cache.lengths[:b].fill_(ctx)
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(STEPS):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / STEPS)
    return out


def step_table(impl: Impl, cases, runs: int, gbps_copy: float, head: str, cmd: str, out_dir: Path,
               paths: dict = PATHS, name: str = "a08_decode_step") -> str:
    """Decode-step GPU time (graph replay) per (model, batch, prompt) and path (``paths``: PATHS, or
    CORE_VS_TUNED): ms/step, the bytes a step must read (weights + KV cache at the mean context of the run)
    over that time, and that against the copy bandwidth. Writes ``name``.{md,csv}. H100 estimate for the
    default cases: 4-6 minutes (building the random-weight models dominates: XL is 1.6 B parameters,
    initialised on the CPU)."""
    eng_mod = impl.load("a08_gpt2_inference.engine")
    rows = []
    by_model: dict[str, list] = {}
    for m, b, p in cases:
        by_model.setdefault(m, []).append((b, p))
    for model, bps in by_model.items():
        t0 = time.perf_counter()
        torch.manual_seed(0)
        hf = hf_gpt2(model, torch.bfloat16)
        print(f"{model}: built in {time.perf_counter() - t0:.0f} s", flush=True)
        for b, p in bps:
            engine = engine_for(eng_mod, model, b, p, hf)
            nbytes = step_bytes(engine, b, p + 1 + STEPS // 2)
            first = None
            for path, kw in paths.items():
                use_path(eng_mod, engine, **kw)
                try:
                    ms = step_ms(engine, b, p, runs)
                except Exception as e:  # noqa: BLE001 - e.g. a capture that fails: say so, time the others
                    print(f"{model} B={b} P={p} {path}: FAILED: {type(e).__name__}: {e}", flush=True)
                    rows.append(dict(model=model, batch=b, prompt=p, path=path, pdl=engine.pdl, runs_ms="failed",
                                     step_ms=float("nan"), step_MB=nbytes / 1e6, GBps=float("nan"),
                                     of_copy=float("nan"), logits_vs_first_path=float("nan"),
                                     error=f"{type(e).__name__}: {str(e)[:200]}"))
                    torch.cuda.synchronize()
                    continue
                med = statistics.median(ms)
                # the same step's logits on every path (bf16: the paths round differently, ~1e-2 apart)
                ready_for_decode(engine, b, p)
                logits = engine.decode_step(torch.arange(b, device=engine.device)).float()
                first = logits if first is None else first
                err = float((logits - first).norm() / first.norm())
                rows.append(dict(model=model, batch=b, prompt=p, path=path, pdl=engine.pdl,
                                 runs_ms=" ".join(f"{x:.4f}" for x in ms), step_ms=med, step_MB=nbytes / 1e6,
                                 GBps=nbytes / med / 1e6, of_copy=nbytes / med / 1e6 / gbps_copy,
                                 logits_vs_first_path=err))
                print(f"{model} B={b} P={p} {path}: {med:.4f} ms/step ({rows[-1]['of_copy']:.0%} of copy) "
                      f"runs {rows[-1]['runs_ms']}; logits vs the first path: {err:.1e}", flush=True)
            del engine
            torch.cuda.empty_cache()
        del hf
        torch.cuda.empty_cache()
    _write_csv(out_dir / f"{name}.csv", rows)
    floors = {"small": 0.30, "medium": 0.40, "large": 0.50, "xl": 0.60}
    if paths is CORE_VS_TUNED:
        title = "the decode step on the engine's core and on its tuned path"
        what = ("Paths: `core`, the engine on the impl's own kernels as the handout has them written (LayerNorm, "
                "GEMV, KV write, decode attention as kernels of their own: 9 a block, no programmatic dependent "
                "launch); `tuned`, the tuned path over them (tuned.py: the tuned GEMV with its K-major weights "
                "and fused epilogues, programmatic dependent launch, the one-kernel embedding), the reference "
                "engine's default. `logits`: one eager step's logits against the core's on the same cache "
                "(relative error; bf16 paths round differently, a wrong kernel is off by ~1).")
    else:
        title = "the decode step against the memory wall"
        what = ("Paths: the a06 matmul for the decode GEMMs (the engine before the gemv; LayerNorm "
                "and residual adds as their own kernels); the a08 gemv with the fused epilogues (the LayerNorms "
                "folded into the GEMV after them where it pays, tuned_gemv.fold_pays: all but the last at small "
                "and medium, one a block at large and XL; the KV-cache write in c_attn's GEMV, the residual adds "
                "in the projections': 6 kernels a block, 7 at large and XL); the same with programmatic dependent "
                "launch on every a08 kernel of the step, without the fusions (`unfused`: LayerNorm and write_kv as "
                "kernels of their own, 9 a block, the step before them) and with them. `logits`: one eager "
                "step's logits against the a06 path's on the same cache (relative error; bf16 paths round "
                "differently, a wrong kernel is off by ~1).")
    lines = [f"# Stage 8: {title} ({torch.cuda.get_device_name()})", "",
             head + ".", "", f"Command: `{cmd}`", "",
             f"bf16, random weights; one decode step replayed from its CUDA graph, {STEPS} replays between two "
             f"CUDA events per run, median of {runs} runs (each listed). Bytes: every weight once + the KV cache "
             f"at the run's mean context (prompt + 1 + {STEPS // 2}). `of copy`: those bytes / time, over the copy "
             "bandwidth. " + what, "",
             "| model | batch | prompt | path | ms/step | runs | MB/step | GB/s | of copy | floor | logits |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fl = 0.65 if (r["model"], r["batch"], r["prompt"]) == ("xl", 16, 500) else (
            floors[r["model"]] if r["batch"] == 1 and r["prompt"] == 100 else None)
        mark = "-" if fl is None or r["path"] == "a06 matmul" else (
            f"{fl:.0%}: {'met' if r['of_copy'] >= fl else 'NOT met'}")
        if "error" in r:
            mark = f"FAILED: {r['error'][:80]}"
        lines.append(f"| {r['model']} | {r['batch']} | {r['prompt']} | {r['path']} | {r['step_ms']:.4f} | "
                     f"{r['runs_ms']} | {r['step_MB']:,.0f} | {r['GBps']:,.0f} | {r['of_copy']:.1%} | {mark} | "
                     f"{r['logits_vs_first_path']:.1e} |")
    text = "\n".join(lines) + "\n"
    (out_dir / f"{name}.md").write_text(text)
    return text


#: Kernel name (substring) -> kind, for the profile. GEMMs are told apart by their order in the step.
KINDS = (("_matvec_kernel", "gemm"), ("matmul_kernel", "gemm"), ("_decode_split", "attention split"),
         ("_decode_combine", "attention combine"), ("_add_layernorm", "residual + LayerNorm"),
         ("_write_kv", "KV-cache write"), ("index", "embedding gather"), ("_embed_kernel", "embedding gather"),
         ("reduce_kernel", "argmax"), ("_choose_kernel", "argmax"))
GEMMS = ("qkv", "proj", "fc", "fc_proj")


def kind_bytes(engine, b: int, ctx: int, splits: int) -> dict[str, float]:
    """Bytes each kind of kernel must move once (bf16): weights, and activations in and out; ``splits``:
    decode attention's key slices per (sequence, head)."""
    c, v, s, n_head = engine.n_embd, engine.vocab_size, engine.wte.element_size(), engine.n_head
    return {"qkv": (c * 3 * c + 3 * c + b * 4 * c) * s, "proj": (c * c + c + 2 * b * c) * s,
            "fc": (c * 4 * c + 4 * c + 5 * b * c) * s, "fc_proj": (4 * c * c + c + 5 * b * c) * s,
            "lm_head": (v * c + b * c + b * v) * s, "attention split": (2 * b * ctx * c + b * c) * s,
            "attention combine": b * n_head * splits * (64 + 1) * 4 + b * c * s,
            "residual + LayerNorm": (4 * b * c + 2 * c) * s, "KV-cache write": 4 * b * c * s,
            "embedding gather": 2 * b * c * s, "argmax": b * v * s}


def step_kernels(engine, graph, n: int = 5) -> list[list[tuple[float, float, str]]]:
    """n replays of the step under torch.profiler: per step, its GPU activities (start us, end us, name) in
    order of start (kernels, and the graph's memcpy/memset nodes)."""
    from torch.profiler import ProfilerActivity, profile
    graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            graph.replay()
        torch.cuda.synchronize()
    ev = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA)
    per = len(ev) // n
    return [ev[i * per:(i + 1) * per] for i in range(n)]


def classify(engine, step: list) -> list[str]:
    kinds, g = [], 0
    for _, _, name in step:
        k = next((kind for pat, kind in KINDS if pat in name), "other (PyTorch)")
        if k == "gemm":
            k = GEMMS[g % 4] if g < 4 * engine.n_layer else "lm_head"
            g += 1
        kinds.append(k)
    return kinds


def gaps(step: list) -> tuple[float, float, list[float]]:
    """(span, busy, gaps): the step's first start to last end, the time some activity runs (the union of
    the intervals), and each gap between an activity's start and the latest end before it (negative: the
    two overlap, as PDL lets them)."""
    span = step[-1][1] - step[0][0]
    busy, cur_s, cur_e, out, last_end = 0.0, step[0][0], step[0][1], [], step[0][1]
    for s, e, _ in step[1:]:
        out.append(s - last_end)
        last_end = max(last_end, e)
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = max(span, last_end - step[0][0])
    return span, busy, out


def profile_table(impl: Impl, cases, gbps_copy: float, head: str, cmd: str, out_dir: Path) -> str:
    """Where a decode step's time goes, per (model, batch, prompt) and path: GPU time and bytes by kind of
    kernel, the gaps between consecutive kernels of the replayed graph (torch.profiler's kernel start and
    end times), kernels per block, the share of the step in kernels vs gaps, ms/step (CUDA events, no
    profiler) and its share of the bandwidth limit; one block's timeline. Writes a08_decode_profile.md and
    a08_decode_timeline.png. H100 estimate for small and XL: 3-5 minutes."""
    eng_mod = impl.load("a08_gpt2_inference.engine")
    dec = impl.load("a08_gpt2_inference.decode_attention")
    lines = [f"# Stage 8: where a decode step's time goes ({torch.cuda.get_device_name()})", "", head + ".", "",
             f"Command: `{cmd}`", "",
             "bf16, random weights, the decode step replayed from its CUDA graph. Kernel times and gaps from "
             "torch.profiler (CUPTI) over 5 replays (mean per step); `ms/step` from CUDA events without the "
             f"profiler ({STEPS} replays). Gap = a kernel's start minus the latest end before it (negative: "
             "overlap, which PDL allows). busy = time with some kernel running / the step's span.", ""]
    summary = ["| model | B | P | path | ms/step | of copy | kernels/step | kernels/block | busy | gaps | "
               "mean gap us | overlaps |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    timelines = {}
    details = []
    for model, b, p in cases:
        engine = engine_for(eng_mod, model, b, p)
        nbytes = step_bytes(engine, b, p + 1 + STEPS // 2)
        kb = kind_bytes(engine, b, p + 1 + STEPS // 2, dec.num_splits(b * engine.n_head, engine.max_seq_len))
        for path, kw in PATHS.items():
            use_path(eng_mod, engine, **kw)
            try:
                ms = statistics.median(step_ms(engine, b, p, 1))
            except Exception as e:  # noqa: BLE001 - say so, profile the other paths
                summary.append(f"| {model} | {b} | {p} | {path} | FAILED: {type(e).__name__}: {str(e)[:120]} "
                               "| | | | | | | |")
                print(summary[-1], flush=True)
                torch.cuda.synchronize()
                continue
            graph, _ = engine._graphs[(b, engine.GREEDY)]
            engine.cache.lengths[:b].fill_(p)
            steps = step_kernels(engine, graph)
            stats = [gaps(st) for st in steps]
            span = statistics.mean(s for s, _, _ in stats)
            busy = statistics.mean(bz for _, bz, _ in stats)
            all_gaps = [g for _, _, gs in stats for g in gs]
            pos = [g for g in all_gaps if g > 0]
            kinds = classify(engine, steps[0])
            per_kind: dict[str, list] = {}
            for st in steps:
                for (s, e, _), k in zip(st, classify(engine, st)):
                    per_kind.setdefault(k, []).append(e - s)
            n_k = len(steps[0])
            blk = [i for i, k in enumerate(kinds) if k == "qkv"]
            per_block = blk[1] - blk[0] if len(blk) > 1 else float("nan")
            summary.append(f"| {model} | {b} | {p} | {path} | {ms:.4f} | {nbytes / ms / 1e6 / gbps_copy:.1%} | "
                           f"{n_k} | {per_block} | {busy / span:.0%} | {1 - busy / span:.0%} | "
                           f"{statistics.mean(pos) if pos else 0:.2f} | {sum(g < 0 for g in all_gaps) / len(steps):.0f} |")
            details += ["", f"### {model}, batch {b}, prompt {p}: {path}", "",
                        f"{ms:.4f} ms/step, {nbytes / 1e6:,.0f} MB/step, {nbytes / ms / 1e6:,.0f} GB/s = "
                        f"{nbytes / ms / 1e6 / gbps_copy:.1%} of copy; in the profile: span {span:.1f} us, kernels "
                        f"busy {busy:.1f} us ({busy / span:.0%}), gaps {span - busy:.1f} us over {n_k - 1} "
                        f"boundaries ({sum(pos) / len(steps):.1f} us of positive gaps per step, "
                        f"{sum(g < 0 for g in all_gaps) / len(steps):.0f} overlaps)", "",
                        "| kernel | per step | us each | us per step | share of busy | bytes each | GB/s |",
                        "|---|---|---|---|---|---|---|"]
            for k, ts in sorted(per_kind.items(), key=lambda kv: -sum(kv[1])):
                cnt = len(ts) / len(steps)
                each = statistics.mean(ts)
                by = kb.get(k)
                details.append(f"| {k} | {cnt:.0f} | {each:.2f} | {sum(ts) / len(steps):.1f} | "
                               f"{sum(ts) / len(steps) / busy:.0%} | {f'{by / 1e6:.3f} MB' if by else '-'} | "
                               f"{f'{by / each / 1e3:,.0f}' if by else '-'} |")
            # one block's timeline (the middle block), for the lecture's figure
            mid = blk[len(blk) // 2] if blk else 0
            end = blk[len(blk) // 2 + 1] if len(blk) > len(blk) // 2 + 1 else min(mid + 12, n_k)
            t0 = steps[0][mid][0]
            timelines[(model, b, p, path)] = [(s - t0, e - t0, k) for (s, e, _), k in
                                              zip(steps[0][mid:end], kinds[mid:end])]
            details += ["", "One block (the middle one), first replay: kernel, start and end (us from the block's "
                        "first kernel), gap before it:", "", "```"]
            prev = None
            for s, e, k in timelines[(model, b, p, path)]:
                details.append(f"{k:22s} {s:8.2f} {e:8.2f}  gap {s - prev:+6.2f}" if prev is not None else
                               f"{k:22s} {s:8.2f} {e:8.2f}")
                prev = e if prev is None else max(prev, e)
            details.append("```")
            print(summary[-1], flush=True)
        del engine
        torch.cuda.empty_cache()
    _timeline_png(timelines, out_dir / "a08_decode_timeline.png")
    text = "\n".join(lines + summary + details) + "\n"
    (out_dir / "a08_decode_profile.md").write_text(text)
    return text


def _timeline_png(timelines: dict, path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001 - the markdown has the same numbers
        print("timeline plot skipped:", e)
        return
    colors = {"qkv": "C0", "proj": "C0", "fc": "C0", "fc_proj": "C0", "lm_head": "C0", "attention split": "C1",
              "attention combine": "C1", "residual + LayerNorm": "C2", "KV-cache write": "C3"}
    keys = list(timelines)
    fig, axes = plt.subplots(len(keys), 1, figsize=(12, 1.3 * len(keys) + 1), squeeze=False)
    span = max(e for tl in timelines.values() for _, e, _ in tl)
    for ax, key in zip(axes[:, 0], keys):
        for i, (s, e, k) in enumerate(timelines[key]):     # two lanes: a kernel that overlaps the one
            lane = (i % 2) * 1.1                              # before it (PDL) shows beside it
            ax.broken_barh([(s, max(e - s, 0.05))], (lane, 1), color=colors.get(k, "C7"))
            if e - s > 0.06 * span:
                ax.text((s + e) / 2, lane + 0.5, k, ha="center", va="center", fontsize=6, color="white")
        ax.set_xlim(0, span * 1.01)
        ax.set_ylim(-0.1, 2.2)
        ax.set_yticks([])
        ax.set_ylabel(f"{key[0]} B{key[1]}\n{key[3]}", rotation=0, ha="right", va="center", fontsize=8)
    axes[-1, 0].set_xlabel("us from the block's first kernel (GPT-2 block, decode step replayed from its graph)")
    fig.suptitle("One transformer block of a decode step: GEMMs (blue), attention (orange), LayerNorm (green), "
                 "KV write (red)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
