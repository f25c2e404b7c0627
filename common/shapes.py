"""Real shapes: the GEMMs and the attention calls GPT-2 runs.

One list for the stage 6 and stage 7 real-shape sweeps (``bench.py --shapes real``) and for
the grader's speed cases (each stage's stage.py), so what is graded is a shape that was swept.
"""
from __future__ import annotations

#: GPT-2's four sizes: (d_model, n_head); the head size is 64 in all four.
GPT2_MODELS = {"small": (768, 12), "medium": (1024, 16), "large": (1280, 20), "xl": (1600, 25)}
GPT2_VOCAB = 50257


def gpt2_gemms(d_model: int, tokens: int, vocab: int = GPT2_VOCAB) -> dict[str, tuple[int, int, int]]:
    """The GEMMs of one GPT-2 layer and its LM head over ``tokens`` rows (B·T), name -> (M, K, N):
    x [M, K] @ W [K, N]."""
    d, t = d_model, tokens
    return {"qkv": (t, d, 3 * d), "attn-proj": (t, d, d), "mlp-up": (t, d, 4 * d), "mlp-down": (t, 4 * d, d),
            "lm-head": (t, d, vocab)}


#: Attention sweeps: head size -> heads. GPT-2's d = 64 with GPT-2 small's 12 heads; d = 128 with 16.
ATTENTION_HEADS = {64: 12, 128: 16}


def attention_batch(s: int, heads: int, budget: int = 1 << 18) -> int:
    """Batch size for a sweep at sequence length ``s``: B·H·S <= ``budget`` tokens·heads (at least
    one sequence), so every point moves about the same number of bytes and the whole sweep stays
    short: B·H = 512 at S = 512, 12 at S = 16384 with 12 heads."""
    return max(1, budget // (s * heads))
