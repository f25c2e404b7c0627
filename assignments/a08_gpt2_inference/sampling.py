"""Sampling the next token on the GPU (given code): temperature, top-k, top-p, a Philox stream.

    from assignments.a08_gpt2_inference.sampling import SamplingParams, sample
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95).to_device("cuda")
    tok = sample(logits, params.tensor, seed, positions)      # int64 [B]; no host sync

The filters are transformers' (``generate(do_sample=True)``), in its order: the logits are divided
by the temperature; top-k keeps the tokens whose scaled logit is at least the k-th largest (ties
kept); top-p keeps, of what is left, the most probable tokens whose probability mass before them
is below p (the token that crosses p included); the token is drawn from the softmax of the kept
logits. One program per row does it all in a few passes over the vocabulary, in fp32:

  1. max m and Z = Σ exp(x - m) of the scaled logits x (online, as in flash attention);
  2. top-k: the k-th largest x, found exactly by a radix select on the float's bits (8 counting
     passes of 4 bits each over an order-preserving integer key), and Z_k, the mass of the kept set;
  3. a draw by inversion: one uniform u from Philox, keyed by (seed, row, position, round); the
     token is the first (in vocabulary order) whose running sum of exp(x - m) over the kept set
     exceeds u · Z_kept;
  4. top-p, by rejection: the mass M of the kept tokens more probable than the drawn one is summed;
     M < p · Z_k: the token is in the nucleus, done. Otherwise the nucleus lies wholly above it: the
     next round draws again among the tokens more probable than it (their mass is M), and so on.
     A draw restricted to a set that contains the nucleus, kept only when it lands inside, is a draw
     from the nucleus; a few rounds suffice for the peaked distributions of a language model.

Every parameter is read from a device tensor and the random stream is keyed by the position the
token will take (``positions``, the cache lengths), not by a host counter: a decode step that
samples is still one CUDA-graph replay, and the same seed gives the same tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from common import TRITON_INTERPRET
from common.checks import FLOAT_DTYPES, check_same, check_tensor

#: Vocabulary entries per step of a pass (the interpreter: fewer, for small test vocabularies)
BLOCK_V = 64 if TRITON_INTERPRET else 2048
#: At most this many top-p rounds (each one at least halves nothing in the worst case, but a round
#: only ends without a token if rounding made the nucleus empty, which p > 0 rules out)
MAX_ROUNDS = 64


@triton.jit
def _key(x):
    """An integer key in [0, 2^32) with the order of the fp32 values x (int64)."""
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return key.to(tl.int64) + 2147483648


@triton.jit
def _scaled(base, cols, ok, temp):
    return tl.load(base + cols, mask=ok, other=float("-inf")).to(tl.float32) / temp


@triton.jit
def _sample_kernel(LOGITS, OUT, POS, PARAMS, SEED, V, s_row,
                   BLOCK_V: tl.constexpr, MAX_ROUNDS: tl.constexpr):
    """Program b: OUT[b] = a token drawn from row b of LOGITS [B, V] (row stride s_row), filtered by
    PARAMS = [temperature > 0, top_k (0: off), top_p (1: off)] (fp32), with the Philox stream of
    (SEED[0], b, POS[b], round)."""
    row = tl.program_id(0)
    base = LOGITS + row.to(tl.int64) * s_row
    temp = tl.load(PARAMS)
    top_k = tl.load(PARAMS + 1).to(tl.int32)
    top_p = tl.load(PARAMS + 2)
    seed = tl.load(SEED)
    pos = tl.load(POS + row)
    offs = tl.arange(0, BLOCK_V)

    # 1. max and sum of exp, online
    m = tl.full([], float("-inf"), tl.float32)
    z = tl.full([], 0.0, tl.float32)
    for v0 in range(0, V, BLOCK_V):
        cols = v0 + offs
        x = _scaled(base, cols, cols < V, temp)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        z = z * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new

    # 2. top-k: the key of the k-th largest x, 4 bits at a time from the top; then Z_k
    thr = tl.full([], 0, tl.int64)                       # kept: key >= thr (0: every token)
    z_kept = z
    if (top_k > 0) & (top_k < V):
        bins = tl.arange(0, 16)
        remaining = top_k
        for it in tl.static_range(8):
            shift = 28 - 4 * it
            counts = tl.zeros([16], tl.int32)
            for v0 in range(0, V, BLOCK_V):
                cols = v0 + offs
                ok = cols < V
                u = _key(_scaled(base, cols, ok, temp))
                match = ok & ((u >> (shift + 4)) == (thr >> (shift + 4)))
                dig = ((u >> shift) & 15).to(tl.int32)
                hit = (dig[:, None] == bins[None, :]) & match[:, None]
                counts += tl.sum(hit.to(tl.int32), axis=0)
            # above[j]: tokens with this prefix and a digit > j; the k-th largest has the digit j
            # with above[j] < remaining <= above[j] + counts[j]: the largest j with the second
            above = tl.sum(tl.where(bins[None, :] > bins[:, None], counts[None, :], 0), axis=1)
            digit = tl.max(tl.where(above + counts >= remaining, bins, -1), axis=0)
            remaining -= tl.sum(tl.where(bins > digit, counts, 0), axis=0)
            thr = thr | (digit.to(tl.int64) << shift)
        z_kept = tl.full([], 0.0, tl.float32)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + offs
            ok = cols < V
            x = _scaled(base, cols, ok, temp)
            z_kept += tl.sum(tl.where(ok & (_key(x) >= thr), tl.exp(x - m), 0.0), axis=0)
    z_k = z_kept

    # 3./4. draw by inversion among the kept tokens above `lo`; top-p rounds by rejection
    lo = thr
    rnd = 0
    todo = True
    tok = tl.full([], 0, tl.int32)
    while todo:
        r0, _, _, _ = tl.philox(seed, (rnd + 0 * row).to(tl.uint32), pos.to(tl.uint32), row.to(tl.uint32),
                                (0 * row).to(tl.uint32))
        target = tl.uint_to_uniform_float(r0) * z_kept
        carry = tl.full([], 0.0, tl.float32)
        first = tl.full([], 2147483647, tl.int32)
        last = tl.full([], -1, tl.int32)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + offs
            ok = cols < V
            x = _scaled(base, cols, ok, temp)
            kept = ok & (_key(x) >= lo)
            w = tl.where(kept, tl.exp(x - m), 0.0)
            run = tl.cumsum(w, axis=0) + carry
            first = tl.minimum(first, tl.min(tl.where(kept & (run > target), cols, 2147483647), axis=0))
            last = tl.maximum(last, tl.max(tl.where(kept, cols, -1), axis=0))
            carry += tl.sum(w, axis=0)
        tok = tl.where(first < 2147483647, first, last)   # rounding: u·Z past the running sum's end
        todo = False
        if top_p < 1.0:
            key_s = _key(_scaled(base, tok, True, temp))
            mass = tl.full([], 0.0, tl.float32)
            for v0 in range(0, V, BLOCK_V):
                cols = v0 + offs
                ok = cols < V
                x = _scaled(base, cols, ok, temp)
                u = _key(x)
                mass += tl.sum(tl.where(ok & (u >= thr) & (u > key_s), tl.exp(x - m), 0.0), axis=0)
            todo = (mass >= top_p * z_k) & (rnd + 1 < MAX_ROUNDS)
            lo = tl.where(todo, key_s + 1, lo)
            z_kept = tl.where(todo, mass, z_kept)
            rnd += 1
    tl.store(OUT + row, tok.to(tl.int64))


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
        """[temperature, top_k, top_p] as fp32 on ``device`` (what the kernel reads)."""
        return torch.tensor([self.temperature, self.top_k, self.top_p], dtype=torch.float32, device=device)


def sample(logits: torch.Tensor, params: torch.Tensor, seed: torch.Tensor, positions: torch.Tensor, *,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """One token per row of ``logits`` [B, V] (fp32/fp16/bf16, last dim contiguous), int64 [B].

    params: fp32 [3] = SamplingParams.tensor(); seed: int64 [1]; positions: int32 [B], the position
    each row's token will take (with the seed and the row, it keys the random stream: same seed,
    same tokens). All on the logits' device; nothing is read back to the host (graph-capturable).
    """
    check_tensor(logits, "logits", dtypes=FLOAT_DTYPES, ndim=2)
    check_tensor(params, "params", dtypes=(torch.float32,), ndim=1)
    check_tensor(seed, "seed", dtypes=(torch.int64,), ndim=1)
    check_tensor(positions, "positions", dtypes=(torch.int32,), ndim=1)
    for name, t in (("params", params), ("seed", seed), ("positions", positions)):
        check_same(logits, t, f"logits, {name}", dtype=False)
    b, v = logits.shape
    if params.numel() != 3 or seed.numel() < 1 or positions.shape[0] != b:
        raise ValueError(f"params [3], seed [1], positions [B={b}] expected, got {tuple(params.shape)}, "
                         f"{tuple(seed.shape)}, {tuple(positions.shape)}")
    if logits.stride(-1) != 1:
        raise ValueError(f"logits: the last dim must be contiguous, got strides {logits.stride()}")
    if out is None:
        out = torch.empty(b, dtype=torch.long, device=logits.device)
    if b:
        _sample_kernel[(b,)](logits, out, positions, params, seed, v, logits.stride(0),
                             BLOCK_V=BLOCK_V, MAX_ROUNDS=MAX_ROUNDS, num_warps=8)
    return out
