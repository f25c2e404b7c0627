"""Stage 9 benchmark: Llama-3.2-1B and Qwen3-0.6B decode on the course's kernels, against the memory wall
and against transformers.

    python -m solutions.a09_llama_inference.bench                          # both models, B 1 and 16, P 128 and 2048
    python -m solutions.a09_llama_inference.bench --models llama-3.2-1b --batches 1 --prompts 128 --quick
    python -m solutions.a09_llama_inference.bench --no-compiled            # skip transformers + torch.compile
    python -m solutions.a09_llama_inference.bench --profile                # kernels of one replayed step, by name
    python -m solutions.a09_llama_inference.bench --models qwen3-0.6b --append   # add its rows to the earlier table
    python -m common.course.bench a09 --impl solutions                     # the same, through the course's driver
    python -m solutions.a09_llama_inference.bench --impl path/to/submission

Random weights of the real geometries in bf16, built with transformers' own configs (LlamaConfig for
Llama-3.2-1B: vocabulary 128256, hidden 2048, 16 layers, 32 heads, 8 KV heads, head_dim 64, intermediate
8192, tied embeddings, rope_theta 500000 with Llama 3's rope scaling; Qwen3Config for Qwen3-0.6B: vocabulary
151936, hidden 1024, 28 layers, 16 heads, 8 KV heads, head_dim 128, intermediate 3072, tied, q/k norms,
rms_norm_eps 1e-6). Greedy, no end-of-sequence stop. Per (model, batch B, prompt P):

  step ms         GPU time of one decode step replayed from its CUDA graph (the engine's default path: the
                  tuned path for the solutions; ``core ms``: the engine's core path, the impl's kernels as they
                  are): STEPS replays back to back between two CUDA events, median of --runs runs, the context
                  reset to P before each run (a08's replay_ms);
  MB/step         bytes the step must read: every weight once (the LM head reads the tied embedding whole) and
                  the KV cache at the run's mean context (P + 1 + STEPS / 2), all B sequences;
  GB/s, of copy   those bytes / step ms, and that over the device-to-device copy bandwidth measured in the
                  same run (a 1 GiB copy, bytes read + written: common.roofline.measure_ceilings);
  decode ms       (engine, transformers eager, transformers static cache + torch.compile) the wall time of
                  one decode step as a user sees it: (generate(64) - generate(1)) / 63, host work included;
  prefill ms      the prompt's forward pass, cache filled, logits of the last token (engine.prefill as
                  generate() runs it; transformers' forward with use_cache=True, logits_to_keep=1);
  tokens          greedy generate(64) token equality with transformers (eager, and compiled), as a fraction
                  (bf16: a near tie may flip late, so this is reported, not required).

The course's floors, each printed with its verdict: Llama-3.2-1B at batch 1 >= 60 % of copy, Qwen3-0.6B at
batch 1 >= 45 %, both >= 60 % at batch 16, and the engine's decode at least as fast as transformers' compiled
static-cache generate. Writes a09_decode.{md,csv} and a09_decode.png to common.impl.results_dir (--out).
``--profile``: torch.profiler's table of one graph-replayed step's kernels (name, count per step, total us),
for each case, so that a missed floor can be explained; printed and written to a09_decode_profile.md.
H100 estimate for the default cases: 10-20 minutes (torch.compile's compiles take most of it).
"""
from __future__ import annotations

import argparse
import csv
import statistics
import time
from pathlib import Path

import torch

from common.impl import Impl, add_impl_argument, command_line, results_dir

MODULE = __spec__.name if __spec__ is not None else __name__
#: model -> (transformers architecture, config). Random weights: initializer_range 0.05 (at transformers'
#: 0.02 a random model repeats one token: token equality would say little).
MODELS = {
    "llama-3.2-1b": ("llama", dict(vocab_size=128256, hidden_size=2048, num_hidden_layers=16, num_attention_heads=32,
                                   num_key_value_heads=8, head_dim=64, intermediate_size=8192, tie_word_embeddings=True,
                                   rms_norm_eps=1e-5, max_position_embeddings=131072, rope_theta=500000.0,
                                   rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                                     high_freq_factor=4.0, original_max_position_embeddings=8192),
                                   initializer_range=0.05)),
    "qwen3-0.6b": ("qwen3", dict(vocab_size=151936, hidden_size=1024, num_hidden_layers=28, num_attention_heads=16,
                                 num_key_value_heads=8, head_dim=128, intermediate_size=3072, tie_word_embeddings=True,
                                 rms_norm_eps=1e-6, max_position_embeddings=40960, rope_theta=1000000.0,
                                 initializer_range=0.05)),
}
#: Tiny configs of both architectures (``--models llama-tiny qwen3-tiny``): the bench's code paths in seconds
TINY = {"llama-tiny": ("llama", dict(vocab_size=131, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, intermediate_size=96, tie_word_embeddings=True,
                                     max_position_embeddings=256, initializer_range=0.3)),
        "qwen3-tiny": ("qwen3", dict(vocab_size=131, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     num_key_value_heads=2, head_dim=32, intermediate_size=80, tie_word_embeddings=False,
                                     max_position_embeddings=256, initializer_range=0.3))}
NEW = 64
STEPS = 50          # graph replays per timing run (a08's bench)


def floor(model: str, batch: int) -> float | None:
    """The course's decode floor for (model, batch): the fraction of the copy bandwidth a step must reach."""
    if batch == 16:
        return 0.60
    if batch == 1:
        return {"llama-3.2-1b": 0.60, "qwen3-0.6b": 0.45}.get(model)
    return None


def hf_model(name: str, dtype: torch.dtype = torch.bfloat16, device: str = "cuda"):
    """transformers' model of ``name`` (MODELS or TINY) with random weights, made on ``device`` in ``dtype``."""
    import transformers
    arch, cfg = {**MODELS, **TINY}[name]
    conf_cls, model_cls = ((transformers.LlamaConfig, transformers.LlamaForCausalLM) if arch == "llama" else
                           (transformers.Qwen3Config, transformers.Qwen3ForCausalLM))
    config = conf_cls(**cfg)
    torch.manual_seed(0)
    with torch.device(device):
        model = model_cls(config)
    model = model.to(dtype).eval()
    model.generation_config.eos_token_id = None            # generate as long as asked, as the engine does
    model.generation_config.pad_token_id = 0
    return model


def step_bytes(engine, b: int, ctx: int) -> int:
    """Bytes one decode step must read: every weight once (the tied LM head reads the embedding whole; untied:
    the head and B rows of the embedding) and the KV cache at ctx positions of all B sequences."""
    weights = sum(t.numel() for layer in engine.layers for t in (layer.attn_norm_w, layer.qkv_w, layer.o_w,
                                                                 layer.mlp_norm_w, layer.gate_up_w, layer.down_w,
                                                                 layer.q_norm_w, layer.k_norm_w) if t is not None)
    tied = engine.lm_w.data_ptr() == engine.embed_w.data_ptr()
    weights += engine.lm_w.numel() + engine.norm_w.numel() + (0 if tied else b * engine.n_embd)
    kv = b * ctx * 2 * engine.n_layer * engine.n_kv_head * engine.head_dim
    return (weights + kv) * engine.dtype.itemsize


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


def graph_step_ms(engine, b: int, ctx: int, runs: int) -> float:
    """GPU ms of one replayed decode step at context ctx (a08's captured_step and replay_ms: random K and V
    stand in for a prompt; STEPS replays between two events a run, the median of ``runs``)."""
    from ..a08_gpt2_inference import bench as a08
    graph, _ = a08.captured_step(engine, b, ctx)
    return statistics.median(a08.replay_ms(engine, graph, b, ctx, runs))


def profile_table(engine, b: int, ctx: int) -> list[str]:
    """torch.profiler over 5 replays of the captured step: per kernel name, launches and GPU us per step."""
    from ..a08_gpt2_inference import bench as a08
    graph, _ = a08.captured_step(engine, b, ctx)
    engine.cache.lengths[:b].fill_(ctx)
    steps = a08.step_kernels(engine, graph, 5)
    per: dict[str, list] = {}
    for st in steps:
        for s, e, name in st:
            per.setdefault(name.split("(")[0][:60], []).append(e - s)
    total = sum(sum(v) for v in per.values()) / len(steps)
    span = statistics.mean(st[-1][1] - st[0][0] for st in steps)
    lines = [f"{len(steps[0])} kernels a step, {total:.1f} us of kernels in a span of {span:.1f} us "
             f"({total / span:.0%} busy)", "", "| kernel | per step | us per step | share |", "|---|---|---|---|"]
    for name, ts in sorted(per.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"| `{name}` | {len(ts) / len(steps):.0f} | {sum(ts) / len(steps):.1f} | "
                     f"{sum(ts) / len(steps) / total:.0%} |")
    return lines


def _hf_part(row: dict, key: str, fn) -> None:
    """Run one transformers measurement; a failure becomes a note in the row, not a crash."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - an older or newer transformers may refuse a path
        row.setdefault("notes", []).append(f"{key}: {type(e).__name__}: {str(e).splitlines()[0][:100] if str(e) else ''}")
        print(f"  {key} failed: {type(e).__name__}: {e}", flush=True)
        torch.cuda.synchronize()


def bench_case(engine, hf, name: str, p: int, b: int, args, gbps_copy: float) -> dict:
    reps = args.reps
    ids = torch.randint(0, engine.vocab_size, (b, p), device=engine.device)
    mask = torch.ones_like(ids)
    row = {"model": name, "batch": b, "prompt": p}
    # ---- the engine: the step's GPU time (default path, then the core path), then generate() as a user runs it
    ctx = p + 1 + STEPS // 2
    nbytes = step_bytes(engine, b, ctx)
    step = graph_step_ms(engine, b, p, args.runs)
    row.update(step_ms=step, step_MB=nbytes / 1e6, GBps=nbytes / step / 1e6, of_copy=nbytes / step / 1e6 / gbps_copy)
    if engine.tuned is not None and not args.no_core:
        engine.set_path(False)
        row["core_step_ms"] = graph_step_ms(engine, b, p, args.runs)
        engine.set_path(True, **args.options)
    engine.generate(ids, NEW)                        # warm-up: compiles, captures the graphs
    pre = wall(lambda: engine.prefill(ids, cuda_graph=engine.device.type == "cuda"), reps)   # as generate() runs it
    g1 = wall(lambda: engine.generate(ids, 1), reps)
    g64 = wall(lambda: engine.generate(ids, NEW), reps)
    row.update(engine_prefill_ms=pre, engine_decode_ms=(g64 - g1) / (NEW - 1))
    ours = engine.generate(ids, NEW)
    if hf is None:
        return row

    # ---- transformers, eager (dynamic cache)
    def hf_gen(n, **kw):
        return lambda: hf.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)

    def eager():
        with torch.no_grad():
            hf_gen(NEW)()
            row["hf_prefill_ms"] = wall(lambda: hf(input_ids=ids, attention_mask=mask, use_cache=True,
                                                   logits_to_keep=1), reps)
            h1, h64 = wall(hf_gen(1), reps), wall(hf_gen(NEW), reps)
            row["hf_decode_ms"] = (h64 - h1) / (NEW - 1)
            row["tokens_equal_hf"] = float((hf_gen(NEW)()[:, p:] == ours).float().mean())
    _hf_part(row, "hf eager", eager)

    # ---- transformers, static cache + torch.compile (transformers compiles the decode step of a static cache)
    def compiled():
        from transformers import StaticCache
        try:
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
            c1, c64 = wall(run(1), reps), wall(run(NEW), reps)
            row["hfc_decode_ms"] = (c64 - c1) / (NEW - 1)
            cache.reset()
            row["tokens_equal_hf_compiled"] = float((hf_gen(NEW, **kw)()[:, p:] == ours).float().mean())
    if not args.no_compiled:
        _hf_part(row, "hf compiled", compiled)
    return row


def verdicts(rows: list[dict]) -> list[str]:
    """Each floor's verdict, one line a case."""
    out = []
    for r in rows:
        fl = floor(r["model"], r["batch"])
        case = f"{r['model']} B={r['batch']} P={r['prompt']}"
        if fl is not None:
            out.append(f"{case}: {r['of_copy']:.1%} of copy, floor {fl:.0%}: {'met' if r['of_copy'] >= fl else 'NOT met'}")
        if "hfc_decode_ms" in r:
            ok = r["engine_decode_ms"] <= r["hfc_decode_ms"]
            out.append(f"{case}: decode {r['engine_decode_ms']:.3f} ms/token vs transformers compiled "
                       f"{r['hfc_decode_ms']:.3f}: {'met' if ok else 'NOT met'} (at least as fast)")
        elif not r.get("skipped_compiled"):
            out.append(f"{case}: decode vs transformers compiled: not measured")
    return out


def earlier_rows(out: Path, rows: list[dict]) -> list[dict]:
    """The rows of ``out``.csv (an earlier run) for the cases ``rows`` does not have, numbers parsed back."""
    path = out.with_suffix(".csv")
    if not path.exists():
        return []
    have = {(r["model"], r["batch"], r["prompt"]) for r in rows}
    kept = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            row = {}
            for k, v in r.items():
                if v in ("", None):
                    continue
                if k == "notes":
                    row[k] = v.split("; ")
                elif k in ("model",):
                    row[k] = v
                elif k in ("batch", "prompt"):
                    row[k] = int(v)
                elif v in ("True", "False"):
                    row[k] = v == "True"
                else:
                    try:
                        row[k] = float(v)
                    except ValueError:
                        row[k] = v
            if (row.get("model"), row.get("batch"), row.get("prompt")) not in have:
                kept.append(row)
    return kept


def write(rows: list[dict], out: Path, gbps_copy: float, impl: Impl, cmd: str, profiles: list[str]) -> str:
    out.parent.mkdir(parents=True, exist_ok=True)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(out.with_suffix(".csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows([{k: ("; ".join(v) if isinstance(v, list) else v) for k, v in r.items()} for r in rows])

    def ms(v):
        return f"{v:.3f}" if isinstance(v, float) else "-"

    def frac(v):
        return f"{v:.0%}" if isinstance(v, float) else "-"
    lines = [f"# Stage 9: Llama-family decode, {impl} engine vs the memory wall and transformers "
             f"({_device_name()})", "", f"Command: `{cmd}`", "",
             f"torch {torch.__version__}, transformers {_transformers_version()}; copy bandwidth {gbps_copy:.0f} GB/s "
             "(1 GiB device-to-device copy, bytes read + written). bf16, random weights of the real geometries, "
             f"greedy. `step ms`: one decode step replayed from its CUDA graph (GPU time, {STEPS} replays a run, "
             "median of the runs), the engine's default path; `core`: its core path. `MB/step`: every weight once + "
             f"the KV cache at the mean context (prompt + 1 + {STEPS // 2}). `decode ms`: wall time a token "
             f"((generate({NEW}) - generate(1)) / {NEW - 1}), host included. `prefill ms`: the prompt's forward "
             "pass, logits of its last token. `tokens`: greedy token equality with transformers (eager / compiled).",
             "", "| model | B | prompt | step ms | core ms | MB/step | GB/s | of copy | floor | decode ms engine | "
             "hf eager | hf compiled | vs compiled | prefill ms engine | hf | tokens | notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fl = floor(r["model"], r["batch"])
        mark = "-" if fl is None else f"{fl:.0%}: {'met' if r['of_copy'] >= fl else 'NOT met'}"
        vs = (f"{r['hfc_decode_ms'] / r['engine_decode_ms']:.2f}x" if "hfc_decode_ms" in r else "-")
        tok = f"{frac(r.get('tokens_equal_hf'))} / {frac(r.get('tokens_equal_hf_compiled'))}"
        lines.append(f"| {r['model']} | {r['batch']} | {r['prompt']} | {r['step_ms']:.4f} | {ms(r.get('core_step_ms'))} | "
                     f"{r['step_MB']:,.0f} | {r['GBps']:,.0f} | {r['of_copy']:.1%} | {mark} | "
                     f"{r['engine_decode_ms']:.3f} | {ms(r.get('hf_decode_ms'))} | {ms(r.get('hfc_decode_ms'))} | {vs} | "
                     f"{r['engine_prefill_ms']:.2f} | {ms(r.get('hf_prefill_ms'))} | {tok} | "
                     f"{'; '.join(r.get('notes', [])) or ''} |")
    lines += ["", "Floors (the course's targets):", ""] + [f"- {v}" for v in verdicts(rows)]
    if profiles:
        lines += ["", "## Kernels of one replayed decode step (torch.profiler, mean of 5 replays)", ""] + profiles
    text = "\n".join(lines) + "\n"
    out.with_suffix(".md").write_text(text)
    _plot(rows, out.parent / f"{out.name}.png")
    return text


def _plot(rows: list[dict], path: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(max(8.0, 1.6 * len(rows)), 4.2))
        labels = [f"{r['model']}\nB {r['batch']} P {r['prompt']}" for r in rows]
        x = list(range(len(rows)))
        a1.bar(x, [100 * r["of_copy"] for r in rows], 0.6, label="decode step")
        for i, r in enumerate(rows):
            fl = floor(r["model"], r["batch"])
            if fl is not None:
                a1.plot([i - 0.3, i + 0.3], [100 * fl] * 2, color="k", lw=1.5)
        a1.set_xticks(x, labels, fontsize=7)
        a1.set_ylabel("% of copy bandwidth (black: the floor)")
        a1.set_ylim(0, 100)
        for off, key, lab in ((-0.2, "hf_decode_ms", "vs transformers eager"),
                              (0.2, "hfc_decode_ms", "vs static cache + torch.compile")):
            a2.bar([i + off for i in x], [r[key] / r["engine_decode_ms"] if key in r else 0 for r in rows], 0.4,
                   label=lab)
        a2.axhline(1.0, color="k", lw=0.8)
        a2.set_xticks(x, labels, fontsize=7)
        a2.set_ylabel("decode speedup (ms per token ratio)")
        a2.legend(fontsize=8)
        fig.suptitle("Stage 9: Llama-family decode (bf16)", fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    except Exception as e:  # noqa: BLE001 - the table is what matters
        print("plot skipped:", e)


def _device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"


def _transformers_version() -> str:
    import transformers
    return transformers.__version__


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=[*MODELS, *TINY])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    ap.add_argument("--prompts", "--prompt", nargs="+", type=int, default=[128, 2048])
    ap.add_argument("--reps", type=int, default=5, help="wall-time repetitions (median)")
    ap.add_argument("--runs", type=int, default=3, help="graph-replay timing runs (median)")
    ap.add_argument("--quick", action="store_true", help="3 reps, 2 runs")
    ap.add_argument("--no-compiled", action="store_true", help="skip transformers + torch.compile")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers entirely (the engine and the wall)")
    ap.add_argument("--no-core", action="store_true", help="skip the engine's core path's step time")
    ap.add_argument("--profile", action="store_true",
                    help="also print torch.profiler's table of one graph-replayed step's kernels per case")
    ap.add_argument("--tuned-options", nargs="*", default=[], metavar="KEY=VALUE",
                    help="options of the tuned path (e.g. fold_norm=True fuse_swiglu=False pdl=False)")
    add_impl_argument(ap, MODULE)
    ap.add_argument("--out", default=None, help="csv/md path prefix (default: results_dir(impl)/a09_decode)")
    ap.add_argument("--append", action="store_true",
                    help="keep the rows of the existing csv whose (model, batch, prompt) this run does not measure "
                         "(a run per model, each within a time limit, makes one table)")
    args = ap.parse_args(argv)
    if args.quick:
        args.reps, args.runs = 3, 2
    args.options = {}
    for kv in args.tuned_options:
        key, _, value = kv.partition("=")
        if not key or not _:
            ap.error(f"--tuned-options: expected KEY=VALUE, got {kv!r}")
        args.options[key] = {"True": True, "False": False, "None": None}.get(value, value)
    if min(args.batches) < 1 or min(args.prompts) < 1:
        ap.error("--batches and --prompts must be >= 1")
    return args


def main(argv=None):
    args = parse_args(argv)
    impl = Impl.get(args.impl)
    if not torch.cuda.is_available():
        raise SystemExit("the stage-9 benchmark needs a CUDA GPU (CPU: pytest runs the engine interpreted)")
    from common.roofline import measure_ceilings
    eng_mod = impl.load("a09_llama_inference.engine")
    out = Path(args.out or results_dir(impl) / "a09_decode")
    cmd = command_line(MODULE, argv)
    gbps_copy = measure_ceilings().gbps
    print(f"{impl}: {torch.cuda.get_device_name()}, copy bandwidth {gbps_copy:.0f} GB/s", flush=True)
    rows, profiles = [], []
    for name in args.models:
        hf = hf_model(name)
        engine = eng_mod.LlamaEngine.from_hf(hf, max_batch=max(args.batches),
                                             max_seq_len=max(args.prompts) + NEW + 2 * STEPS + 8,
                                             **({"tuned": True, **args.options} if args.options else {}))
        print(engine.cache.describe(), f"path: {'tuned' if engine.tuned is not None else 'core'}", flush=True)
        for b in args.batches:
            for p in args.prompts:
                t0 = time.perf_counter()
                row = bench_case(engine, None if args.no_hf else hf, name, p, b, args, gbps_copy)
                row["skipped_compiled"] = args.no_compiled or args.no_hf
                rows.append(row)
                print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      f"({time.perf_counter() - t0:.0f} s)", flush=True)
                if args.profile:
                    prof = [f"### {name}, batch {b}, prompt {p}", ""] + profile_table(engine, b, p) + [""]
                    print("\n".join(prof), flush=True)
                    profiles += prof
        del engine, hf
        torch.cuda.empty_cache()
    if args.append:
        rows = earlier_rows(out, rows) + rows
    text = write(rows, out, gbps_copy, impl, cmd, profiles)
    print(text)


if __name__ == "__main__":
    main()
