"""Experiment (issue #28), third run: the swapped tl.dot path (gemv.DOT_SWAP) at every GPT-2 size's decode GEMMs
at 4 and 16 rows (and 1: against the FMA path), a few configs each, against the shipped default and cuBLAS, to
choose choose_config's rule. Run: PYTHONPATH=. python lectures/results/experiments/gemv_rows/run3.py
"""
import torch

from solutions.a08_gpt2_inference import gemv as gv
from solutions.a08_gpt2_inference.bench import rotated_ms, l2_bytes, gemm_shapes, MODELS

CONFIGS = [(64, 128, 1, 4, 6), (64, 128, 2, 4, 6), (64, 128, 4, 4, 6), (64, 128, 1, 4, 4), (64, 256, 1, 4, 4),
           (64, 256, 2, 4, 4), (32, 128, 1, 4, 6), (32, 256, 1, 4, 6), (32, 256, 2, 4, 6), (64, 64, 1, 4, 8),
           (64, 64, 2, 4, 8), (128, 128, 1, 4, 4), (128, 64, 1, 4, 6)]


def use_swap(on):
    gv.DOT_SWAP = on
    gv._PLANS.clear()
    gv._CALLS.clear()


def main():
    dt = torch.bfloat16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for model in ("small", "medium", "large", "xl"):
        c = MODELS[model]["n_embd"]
        for name, (k, n, kc) in gemm_shapes(c).items():
            if name == "lm_head":
                continue
            wbytes = k * n * 2
            copies = max(3, -(-3 * l2_bytes() // wbytes))
            ws = [(torch.randn(n, k, device="cuda", dtype=dt) * k**-0.5).t() for _ in range(copies)]
            stored = [w.contiguous() for w in ws]
            for m in (1, 4, 16):
                xs = [torch.randn(m, k, device="cuda", dtype=dt) for _ in range(copies)]
                ref = xs[0].double() @ ws[0].double()
                cub = min(rotated_ms(lambda i: torch.matmul(xs[i], ws[i]), copies),
                          rotated_ms(lambda i: torch.matmul(xs[i], stored[i]), copies))
                res = []

                def t(label, call):
                    try:
                        out = call(0)
                        err = float((out.double() - ref).norm() / ref.norm())
                        ms = rotated_ms(call, copies)
                    except Exception as e:  # noqa: BLE001
                        res.append(f"{label}: FAILED {type(e).__name__}")
                        torch.cuda.synchronize()
                        return
                    res.append(f"{label} {wbytes / ms / 1e6:.0f}{'' if err < 1e-2 else ' WRONG'} ({cub / ms:.2f}x)")

                use_swap(False)
                t(f"default{gv.choose_config(m, n, k, dt, True, sms)}", lambda i: gv.gemv(xs[i], ws[i]))
                use_swap(True)
                for cfg in CONFIGS:
                    if cdiv(n, cfg[0]) * cfg[2] > 8 * sms:
                        continue
                    t(f"s{cfg}", lambda i, c=cfg: gv.gemv(xs[i], ws[i], config=(*c, True)))
                use_swap(False)
                print(f"{model} {name} {k}->{n} M={m}: cuBLAS {wbytes / cub / 1e6:.0f} GB/s | " + " | ".join(res),
                      flush=True)
            del ws, xs, stored
            torch.cuda.empty_cache()


def cdiv(a, b):
    return -(-a // b)


if __name__ == "__main__":
    main()
