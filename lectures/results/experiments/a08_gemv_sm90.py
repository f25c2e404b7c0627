"""What Triton 3.6 makes of stage 8's decode GEMV for an H100 (sm_90), compiled on a CPU (no GPU).

    python3 lectures/results/experiments/a08_gemv_sm90.py [--models small xl] [--rows 1 16] [--pdl]

Compile facts only, nothing timed: for every decode GEMM of the chosen GPT-2 sizes, the config
``gemv.choose_config`` picks on 132 SMs, and the kernel compiled exactly as that launch would
specialise it (pointers 16-byte aligned, integer arguments equal to 1 made constants, those divisible
by 16 marked so, as Triton's launcher does): registers and spills (cuobjdump), shared memory, the
global loads by width (PTX), cp.async copies, layout conversions left in the TTGIR. ``--pdl`` also
checks the SASS order of programmatic dependent launch: ACQBULK (griddepcontrol.wait) and PREEXIT
(griddepcontrol.launch_dependents) before the first global load, and prints the split-K ticket
sequence (stores, MEMBAR.GPU, BAR, ATOMG, strong loads). Used to shape the FMA path (issue #28):
a 2-D W tile reshuffled through shared memory every slice and took 140-255 registers; the shipped
3-D tile takes 56-84 with 16-byte loads. Needs only triton (its bundled ptxas and cuobjdump).
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"          # compile for the GPU even on a machine without one
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

import common  # noqa: E402
from solutions.a08_gpt2_inference import gemv as g  # noqa: E402

TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int32: "i32"}
BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
MODELS = {"small": 768, "medium": 1024, "large": 1280, "xl": 1600}


def launch_args(m, k, n, dtype, k_contiguous, act, pdl, sms=132):
    """(args, kwargs) of the _matvec_kernel launch gemv() makes for these shapes on `sms` SMs."""
    seen = {}

    class Capture:
        def __getitem__(self, grid):
            return lambda *a, **kw: seen.update(args=a, kw=kw, grid=grid)
    x = torch.empty(m, k, dtype=dtype)
    w = torch.empty(n, k, dtype=dtype).t() if k_contiguous else torch.empty(k, n, dtype=dtype)
    saved = g._matvec_kernel, g.sm_count, g.pdl_supported
    g._matvec_kernel, g.sm_count, g.pdl_supported = Capture(), (lambda d: sms), (lambda d: True)
    g._COUNTERS.setdefault(torch.device("cpu"), torch.zeros(g.COUNTERS, dtype=torch.int32))
    try:
        g.gemv(x, w, torch.empty(n, dtype=dtype), act, pdl=pdl,
               config=g.choose_config(m, n, k, dtype, k_contiguous, sms, interpreter=False))
    finally:
        g._matvec_kernel, g.sm_count, g.pdl_supported = saved
    kw = dict(seen["kw"], FENCE=True, FAST_TANH=dtype != torch.float32)
    return seen["args"], kw, seen["grid"]


def compile_for_sm90(fn, args, kw):
    names = fn.arg_names
    sig, const, attrs = {}, {}, {}
    options = {k: v for k, v in kw.items() if k not in names}
    for i, name in enumerate(names):
        if name in kw:
            sig[name], const[name] = "constexpr", kw[name]
            continue
        a = args[i]
        if isinstance(a, torch.Tensor):
            sig[name] = "*" + TYPES[a.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, int) and a == 1:
            sig[name], const[name] = "constexpr", 1
        elif isinstance(a, int):
            sig[name] = "i32"
            if a % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            sig[name] = "fp32"
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=options)


def facts(kernel) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(kernel.asm["cubin"])
    usage = subprocess.run([str(BIN / "cuobjdump"), "--dump-resource-usage", f.name], capture_output=True,
                           text=True).stdout
    sass = subprocess.run([str(BIN / "cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    r = re.search(r"REG:(\d+) STACK:(\d+)", usage)
    ops = [re.sub(r"\s+", " ", ln.split("*/")[1]).strip().split(" ;")[0] for ln in sass.splitlines()
           if ln.strip().startswith("/*") and len(ln.split("*/")) > 2]
    first_load = next((i for i, op in enumerate(ops) if re.search(r"\bLDG|LDGSTS", op)), len(ops))
    return dict(regs=int(r[1]), stack=int(r[2]), smem=kernel.metadata.shared,
                loads=dict(Counter(re.findall(r"ld\.global[\w:.]*", kernel.asm["ptx"]))),
                cp_async=kernel.asm["ptx"].count("cp.async.cg") + kernel.asm["ptx"].count("cp.async.ca"),
                layout_converts=kernel.asm["ttgir"].count("convert_layout"),
                pdl_before_first_load=("ACQBULK" in ops[:first_load], "PREEXIT" in ops[:first_load]),
                sync=[op for op in ops if re.search(r"MEMBAR|ATOMG|LDG.*STRONG", op)][:8])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["small", "xl"], choices=list(MODELS))
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 16])
    ap.add_argument("--pdl", action="store_true")
    a = ap.parse_args(argv)
    assert not common.TRITON_INTERPRET
    print(f"triton {triton.__version__}, target sm_90, bf16; config = (BLOCK_N, BLOCK_K, SPLIT_K, warps, stages)")
    for model in a.models:
        c = MODELS[model]
        for m in a.rows:
            for name, (k, n, kc) in {"qkv": (c, 3 * c, False), "proj": (c, c, False), "fc": (c, 4 * c, False),
                                     "fc_proj": (4 * c, c, False), "lm_head": (c, 50257, True)}.items():
                args, kw, grid = launch_args(m, k, n, torch.bfloat16, kc, "gelu_tanh" if name == "fc" else None, a.pdl)
                f = facts(compile_for_sm90(g._matvec_kernel, args, kw))
                cfg = (kw["BLOCK_N"], kw["BLOCK_K"], kw["SPLIT_K"], kw["num_warps"], kw["num_stages"])
                line = (f"{model:6s} M={m:2d} {name:8s} {'tl.dot' if kw['USE_DOT'] else 'FMA':6s} {cfg} grid {grid}: "
                        f"{f['regs']} registers, {f['stack']} B stack, {f['smem']} B shared, loads {f['loads']}, "
                        f"cp.async {f['cp_async']}, layout conversions {f['layout_converts']}")
                if a.pdl:
                    line += f", wait/launch_dependents before the first load {f['pdl_before_first_load']}"
                print(line, flush=True)
                if a.pdl and kw["SPLIT_K"] > 1 and name == "qkv":
                    print("    split-K sync (SASS):", "; ".join(f["sync"]))


if __name__ == "__main__":
    main()
