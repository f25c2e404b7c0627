"""Assignment 8, the sampler: the next token from the logits, with temperature, top-k and top-p, on the GPU.

    from assignments.a08_gpt2_inference.sampling import SamplingParams, sample
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95).tensor("cuda")
    tok = sample(logits, params, seed, positions)      # int64 [B]; no host sync

The filters are transformers' (``generate(do_sample=True)``), in its order:

1. temperature: the logits are divided by it (below 1: sharper, above 1: flatter);
2. top-k: keep the tokens whose scaled logit is at least the k-th largest (ties kept; 0: off);
3. top-p: of what is left, keep the most probable tokens whose probability mass BEFORE them
   (the more probable tokens' mass) is below p; the token that crosses p is kept (1: off);
4. draw from the softmax of the kept logits.

The draw uses the **Gumbel-max trick**: with g_i = -log(-log(u_i)), u_i uniform, argmax_i (x_i + g_i)
is distributed as softmax(x): one argmax over the kept tokens. The noise comes from Philox keyed by
(seed, token, position, row) (:func:`_gumbel`), every parameter from a device tensor: a decode step
that samples is one CUDA-graph replay, and the same seed gives the same tokens.

A program holds whole rows (BLOCK_V = V rounded up to a power of 2). Both filters keep the tokens
above a threshold, each found by bisection over the values' order (as integers: 33 halvings are
exact), one reduction over the row a step: no sort. The tuned path (tuned_sampling.py, not copied to
assignments/) splits a row over many programs, so that every SM reads part of it.

Run: ``pytest tests/test_a08_gpt2_inference.py -k sample``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from common.checks import FLOAT_DTYPES, check_same, check_tensor
from common import TRITON_INTERPRET
from common.launch import cdiv, fast, next_power_of_2


@triton.jit
def _gumbel(seed, row, pos, col):
    """Given. Gumbel noise -log(-log(u)), u uniform from Philox keyed by (seed, token, position, row)."""
    r0, _, _, _ = tl.philox(seed, col.to(tl.uint32), pos.to(tl.uint32), row.to(tl.uint32), (col * 0).to(tl.uint32))
    u = tl.maximum((r0 >> 8).to(tl.int32), 1).to(tl.float32) * 5.9604644775390625e-08
    return -tl.log(-tl.log(u))


@triton.jit
def _key(x):
    """Given. An int32 key with the order of the fp32 values x (as int64): x < y iff _key(x) < _key(y)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits).to(tl.int64)


@triton.jit
def _sample_kernel(LOGITS, PARAMS, SEED, POS, OUT, B, V, s_row, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr):
    """Rows [pid·BLOCK_R, +BLOCK_R) of LOGITS [B, V] (row stride s_row, last dim contiguous), one row of the
    tile each: OUT[row] = a token drawn from the row after transformers' filters. PARAMS: fp32
    [temperature, top_k, top_p]; SEED: int64 [1]; POS: int32 [B], the position the token will take (it keys
    the noise with the seed and the row). BLOCK_R rows a program: 1 at a GPT-2 vocabulary on a GPU, more
    for small vocabularies and under the interpreter (fewer, wider programs)."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_V)
    r_ok = rows < B
    ok = r_ok[:, None] & (cols < V)[None, :]
    temperature = tl.load(PARAMS)
    top_k = tl.load(PARAMS + 1).to(tl.int32)
    top_p = tl.load(PARAMS + 2)
    x = tl.load(LOGITS + rows[:, None].to(tl.int64) * s_row + cols[None, :], mask=ok, other=float("-inf"))
    x = tl.where(r_ok[:, None], x.to(tl.float32) / temperature, 0.0)   # [BLOCK_R, BLOCK_V], -inf past V
    key = tl.where(ok, _key(x), -2147483649)                           # the order of x; padding below all
    pos = tl.load(POS + rows, mask=r_ok, other=0)
    zero = cols[None, :] * 0 + rows[:, None] * 0
    g = _gumbel(tl.load(SEED), rows[:, None] + zero, pos[:, None] + zero, cols[None, :] + zero)
    # TODO(a08): the sampler. x holds BLOCK_R rows of scaled logits, key their order as integers (padding:
    #   below every real key), g each token's Gumbel noise. Every step is per row (axis=1; a per-row value v
    #   [BLOCK_R] broadcasts back as v[:, None]). Both filters keep the tokens whose key is >= a threshold,
    #   and both thresholds are found by BISECTION over the keys (33 halvings cover [-2^31 - 1, 2^31]),
    #   a reduction over the row per step (no sort):
    #   1. top-k: k = top_k if 0 < top_k < V, else V (off). kth = the largest key t with
    #      count(key >= t) >= k (start from lo = -2^31 - 1, where it holds, and hi = 2^31, where it does not;
    #      each step mid = (lo + hi) >> 1 replaces lo or hi, so it keeps holding at lo and not at hi):
    #      the k-th largest key. top-k keeps key >= kth (ties kept, as transformers).
    #   2. top-p, on those: e = exp(x - the row's max) where key >= kth, else 0; z = the row's sum of e.
    #      A token is in the nucleus iff the mass of the more probable tokens, sum(e where key > its key), is
    #      below top_p * z (top_p = 1: off, every token of the top-k). thr = the smallest key t with
    #      sum(e where key > t) < top_p * z (bisect from lo = kth - 1, where it does not hold, and hi = 2^31,
    #      where it does): the nucleus is key >= thr.
    #   3. tok [BLOCK_R] = the argmax over each row's kept tokens (key >= thr) of x + g (tl.argmax of
    #      tl.where(kept, x + g, -inf), axis=1): the Gumbel-max draw from the softmax of the kept logits.
    tok = rows * 0
    tl.store(OUT + rows, tok.to(tl.int64), mask=r_ok)


# ==================================================================== launch (given)
@dataclass(frozen=True)
class SamplingParams:
    """temperature > 0; top_k >= 0 (0: off); 0 < top_p <= 1 (1: off). transformers' meanings."""
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            raise ValueError(f"temperature: expected a number > 0 (0 is greedy: do_sample=False), got {self.temperature!r}")
        if not (isinstance(self.top_k, int) and 0 <= self.top_k < 2**24):
            raise ValueError(f"top_k: expected an int >= 0 (0: no top-k), got {self.top_k!r}")
        if not (isinstance(self.top_p, (int, float)) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p: expected 0 < top_p <= 1 (1: no top-p), got {self.top_p!r}")

    def tensor(self, device) -> torch.Tensor:
        """[temperature, top_k, top_p] as fp32 on ``device`` (what the kernels read)."""
        return torch.tensor([self.temperature, self.top_k, self.top_p], dtype=torch.float32, device=device)


MAX_VOCAB = 1 << 20     # rows longer than this do not fit one program (Triton's largest block)


def check_sample_inputs(logits: torch.Tensor, params: torch.Tensor, seed: torch.Tensor,
                        positions: torch.Tensor) -> None:
    """The checks of a sample() call (a clear error for a bad input)."""
    check_tensor(logits, "logits", dtypes=FLOAT_DTYPES, ndim=2)
    for name, t, dt in (("params", params, torch.float32), ("seed", seed, torch.int64),
                        ("positions", positions, torch.int32)):
        check_tensor(t, name, dtypes=(dt,), ndim=1)
        check_same(logits, t, f"logits, {name}", dtype=False)
    b = logits.shape[0]
    if params.numel() != 3 or seed.numel() < 1 or positions.shape[0] != b:
        raise ValueError(f"params [3], seed [1], positions [B={b}] expected, got {tuple(params.shape)}, "
                         f"{tuple(seed.shape)}, {tuple(positions.shape)}")
    if logits.stride(-1) != 1:
        raise ValueError(f"logits: the last dim must be contiguous, got strides {logits.stride()}")


def sample(logits: torch.Tensor, params: torch.Tensor, seed: torch.Tensor, positions: torch.Tensor, *,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of ``logits`` [B, V] (fp32/fp16/bf16, last dim contiguous), int64 [B].

    params: fp32 [3] = SamplingParams.tensor(); seed: int64 [1]; positions: int32 [B], the position
    each row's token will take (with the seed and the row, it keys the random stream: same seed,
    same tokens). All on the logits' device; nothing is read back to the host (graph-capturable).
    """
    check_sample_inputs(logits, params, seed, positions)
    b, v = logits.shape
    if not 1 <= v <= MAX_VOCAB:
        raise ValueError(f"logits: rows of {v} tokens; expected 1 to {MAX_VOCAB}")
    if out is None:
        out = torch.empty(b, dtype=torch.long, device=logits.device)
    if b:
        block = next_power_of_2(v)
        per = min(next_power_of_2(b), max(1, (1 << 14 if TRITON_INTERPRET else 1 << 12) // block))
        fast(_sample_kernel)[(cdiv(b, per),)](logits, params, seed, positions, out, b, v, logits.stride(0),
                                              BLOCK_R=per, BLOCK_V=block, num_warps=16 if block >= 8192 else 4)
    return out
