"""Is the sampler exact? 600 chi-square tests on the H100 (GPU): p-values should be uniform.

    PYTHONPATH=. python lectures/_tools/gpu/sampling_pvalues.py

For peaked (N(0, 3^2)), flat (N(0, 0.55^2)) and sorted (peaked, in descending order) logits over GPT-2's
50257 tokens, and top-k 50, top-p 0.9, both, and top-k 1000 (wide), as the engine calls sample(): 50 seeds
of 20000 draws (one a row), each against transformers' warpers' distribution (the tests' _hf_probs and
_chi_square_p). Prints per case how many p-values fall below 1e-3, 0.01, 0.05 and how many draws fall
outside the kept tokens (must be 0). Numbers in lectures/results/a08_sampling.md."""
import sys

import torch

sys.path.insert(0, "tests")
from test_a08_gpt2_inference import _chi_square_p, _hf_probs  # noqa: E402

from solutions.a08_gpt2_inference import sampling as smp  # noqa: E402

CASES = [(0.8, 50, 1.0, False), (0.8, 0, 0.9, True), (0.8, 50, 0.9, False), (1.0, 1000, 1.0, False)]  # T, k, p, nucleus


def main() -> None:
    v, n = 50257, 20000
    allp = []
    for scale in (3.0, 0.55, -3.0):                    # negative: sorted in descending order
        for t, k, p, nuc in CASES:
            ps, outs = [], 0
            for seed in range(100, 150):
                g = torch.Generator().manual_seed(seed)
                logits = torch.randn(v, generator=g) * abs(scale)
                if scale < 0:
                    logits = logits.sort(descending=True).values
                rows = logits.cuda().expand(n, -1).contiguous()
                pos = torch.arange(n, dtype=torch.int32, device="cuda")
                probs = _hf_probs(logits, t, k, p)
                tok = smp.sample(rows, smp.SamplingParams(t, k, p).tensor("cuda"), torch.tensor([seed], device="cuda"),
                                 pos, nucleus_pass=nuc, wide=k > smp.WIDE_TOP_K).cpu()
                c = torch.bincount(tok, minlength=v).double()
                outs += int(c[probs == 0].sum())
                ps.append(_chi_square_p(c, probs))
            allp += ps
            ps = torch.tensor(ps)
            print(f"scale {scale} T={t} k={k} p={p} nuc={nuc}: outside {outs}, p<1e-3: {int((ps < 1e-3).sum())}, "
                  f"p<0.01: {int((ps < 0.01).sum())}, p<0.05: {int((ps < 0.05).sum())}/50, mean {ps.mean():.3f}, "
                  f"min {ps.min():.1e}", flush=True)
    a = torch.tensor(allp)
    print(f"all {len(a)}: p<1e-3 {int((a < 1e-3).sum())}, p<0.01 {int((a < 0.01).sum())}, p<0.05 {int((a < 0.05).sum())}, "
          f"p<0.5 {int((a < 0.5).sum())}, mean {a.mean():.3f}")


if __name__ == "__main__":
    main()
