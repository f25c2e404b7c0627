"""Stage 9: grouped-query decode attention's achieved bandwidth against PyTorch (GPU only).

    python -m solutions.a09_llama_inference.bench_attention                  # the table below, printed
    python -m solutions.a09_llama_inference.bench_attention --write          # and lectures/results/a09_gqa_attention.md
    python -m solutions.a09_llama_inference.bench_attention --impl assignments

One decode step's attention of one layer, bf16, every sequence at the full context (lengths = S_max), for
Llama-3.2-1B's heads (32 query heads, 8 KV heads, d 64) and Qwen3-0.6B's (16, 8, d 128), batch 1 and 16,
context 1024 and 4096. GB/s = the bytes the step must read and write (the grouped K and V cache once, q and
the output) / the median time of triton.testing.do_bench (L2 cleared before each call), for:
  gqa            the impl's gqa_decode_attention (one program per KV head and split);
  a08 per head   stage 8's decode_attention on the cache repeated per query head (repeat_kv done outside the
                 timing): what one program per query head reads, G times the bytes;
  sdpa gqa       F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True);
  sdpa repeat    the same on the repeated cache (transformers' repeat_kv, done outside the timing).
Every column is in the same units (the grouped cache's bytes over the time), so the columns compare as
speeds; "copy" is the device's measured copy bandwidth (common.roofline.measure_ceilings).
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from common.impl import Impl, add_impl_argument, command_line, results_dir

MODULE = __spec__.name if __spec__ is not None else __name__
#: name -> (query heads, KV heads, head dim)
MODELS = {"Llama-3.2-1B": (32, 8, 64), "Qwen3-0.6B": (16, 8, 128)}
BATCHES = (1, 16)
DEVICE = "cuda"
CONTEXTS = (1024, 4096)


def _repeat_kv(x: torch.Tensor, group: int) -> torch.Tensor:
    return x.repeat_interleave(group, dim=1)


def _case(mods, h: int, hkv: int, d: int, b: int, ctx: int, dtype=torch.bfloat16) -> dict[str, float]:
    """GB/s of each way for one case (the grouped cache's bytes over each median time)."""
    from triton.testing import do_bench
    gqa, dec = mods
    g = h // hkv
    q = torch.randn(b, h, d, device=DEVICE, dtype=dtype)
    k = torch.randn(b, hkv, ctx, d, device=DEVICE, dtype=dtype)
    v = torch.randn(b, hkv, ctx, d, device=DEVICE, dtype=dtype)
    lens = torch.full((b,), ctx, dtype=torch.int32, device=DEVICE)
    k_rep, v_rep = _repeat_kv(k, g).contiguous(), _repeat_kv(v, g).contiguous()
    out = torch.empty_like(q)
    ways = {
        "gqa": lambda: gqa.gqa_decode_attention(q, k, v, lens, out=out),
        "a08 per head": lambda: dec.decode_attention(q, k_rep, v_rep, lens, out=out),
        "sdpa gqa": lambda: F.scaled_dot_product_attention(q[:, :, None], k, v, enable_gqa=True),
        "sdpa repeat": lambda: F.scaled_dot_product_attention(q[:, :, None], k_rep, v_rep),
    }
    ref = F.scaled_dot_product_attention(q[:, :, None].float(), k_rep.float(), v_rep.float())[:, :, 0]
    err = (ways["gqa"]().float() - ref).norm().item() / ref.norm().item()
    assert err < 2e-2, f"gqa_decode_attention: relative error {err:.2e} against SDPA in fp32"
    nbytes = (2 * k.numel() + 2 * q.numel()) * k.element_size()
    gbps = {}
    for name, fn in ways.items():
        try:
            ms = do_bench(fn, warmup=25, rep=200, return_mode="median")
            gbps[name] = nbytes / ms / 1e6
        except RuntimeError as e:       # a backend that refuses the shape (said in the table)
            print(f"{name}: {type(e).__name__}: {str(e).splitlines()[0][:120]}")
            gbps[name] = float("nan")
    return gbps


def table(impl=None) -> str:
    from common.roofline import measure_ceilings
    load = Impl.get(impl).load
    mods = (load("a09_llama_inference.decode_attention"), load("a08_gpt2_inference.decode_attention"))
    copy = measure_ceilings().gbps
    rows = [f"GPU: {torch.cuda.get_device_name()}; bf16; copy bandwidth {copy:.0f} GB/s; GB/s = the grouped KV "
            "cache's bytes (+ q, out) / median time", "",
            "| model | H / Hkv, d | batch | context | gqa | % of copy | a08 per head | sdpa gqa | sdpa repeat |",
            "|---|---|---|---|---|---|---|---|---|"]
    for model, (h, hkv, d) in MODELS.items():
        for b in BATCHES:
            for ctx in CONTEXTS:
                r = _case(mods, h, hkv, d, b, ctx)
                rows.append(f"| {model} | {h} / {hkv}, {d} | {b} | {ctx} | {r['gqa']:.0f} | {100 * r['gqa'] / copy:.0f}% "
                            f"| {r['a08 per head']:.0f} | {r['sdpa gqa']:.0f} | {r['sdpa repeat']:.0f} |")
    return "\n".join(rows)


LEGEND = """\
`gqa`: the course's kernel, one program per (sequence, KV head, key split), each cache byte read once for the group.
`a08 per head`: stage 8's decode attention on the cache repeated to H heads (what a kernel per query head reads).
`sdpa gqa` / `sdpa repeat`: PyTorch's scaled_dot_product_attention with `enable_gqa=True`, and on a repeated cache.
At batch 1 a layer's cache is a few MB: a launch and the split combine weigh as much as the bytes."""


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_impl_argument(p, MODULE)
    p.add_argument("--write", action="store_true", help="also write a09_gqa_attention.md to the results folder")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("bench_attention needs a CUDA GPU")
    text = table(args.impl)
    print(text)
    if args.write:
        path = results_dir(args.impl) / "a09_gqa_attention.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# Grouped-query decode attention\n\n`{command_line(MODULE, argv)}`\n\n{text}\n\n{LEGEND}\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
