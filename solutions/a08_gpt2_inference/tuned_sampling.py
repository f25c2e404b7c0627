"""The tuned path's sampler (given; it REPLACES your sampling.py kernel where the engine runs tuned).

    from solutions.a08_gpt2_inference.tuned_sampling import sample, argmax
    tok = sample(logits, params, seed, positions, nucleus_pass=True, wide=False, pdl=False)  # int64 [B]
    tok = argmax(logits)                                # greedy: the first largest logit

The same filters and the same contract as sampling.py (transformers' temperature, top-k, top-p; the
Gumbel-max draw; the noise keyed by seed, token, position and row), made fast at batch 1, where a
row of 50257 logits is all the work there is: one program per row would leave all SMs but one idle,
and pass after pass over the row costs latency, not bandwidth. The row is cut into CHUNK-wide chunks,
one program each, and every pass that can be is done there. A chunk is not one range of ids but runs
of SPREAD ids spread over the row (``_chunk_cols``): a BPE vocabulary keeps its frequent tokens
together, and one chunk holding most of the likely tokens could not keep them all as candidates
(lectures/results/a08_sampling.md measures both layouts).

Two kernels, each ending in a **last-block merge**: every program of a row counts itself done on an
atomic counter (after a barrier, with release-acquire order), and the one that comes last, when all
the others' results are in memory, merges them (a launch fewer than a merge kernel of its own).

  A+B. ``_choose_kernel`` (B x NC programs, one read of the logits). A, per chunk: a draw by the
     **Gumbel-max trick**: with g_i = -log(-log(u_i)), u_i uniform from Philox keyed by (seed, row,
     position, token), argmax_i (x_i + g_i) is distributed as softmax(x) of the scaled logits x. An
     argmax splits over chunks, so the chunk's winner is kept. With a filter on, also the chunk's max
     m, Z = sum exp(x - m), and its **candidates**: at most KC tokens, every token above the largest
     one it leaves out (tau), found by two 64-bin histograms of (m - x) (``_candidates``).
     B, the row's last program: no filter, the token is the best chunk winner. A filter: every token
     above the largest tau is a candidate, so a threshold above it is exact. top-k: the k-th largest
     candidate (``_kth_key``: two histograms, then that bin's value); above tau, the token is the
     Gumbel-max among the kept candidates (A's noise). top-p, by **rejection**: the drawn token is in
     the nucleus iff the mass of the kept tokens more probable than it is below p * Z_k; when they
     are all candidates, B sums it, and if it is too large draws again among them (fresh noise), until
     one lands inside. A draw from a set that contains the nucleus, kept only when it lands inside, is
     a draw from the nucleus; so when the tokens above the largest tau hold p of the mass, a draw
     below it is rejected on the spot and the next one is drawn among them.
  C+D. ``_reject_kernel``, only where B could not decide. The nucleus reaches below the candidates
     (a flat distribution): C sums the mass above the drawn token over every chunk and keeps those
     tokens (up to KA a chunk); D (the last program) keeps the draw, or goes on with the rejection
     among those tokens, all in registers, so every mass it needs is exact. Only when a chunk had
     more than KA of them does one program go on over the whole row (``_exact_draw``, by inversion),
     which also serves a k-th largest below tau (top-k beyond the candidates, by a radix select over
     the whole row). Without top-p, or with top-k on (B never needs C then), the engine passes
     ``nucleus_pass=False``: C+D is not launched and B draws such a row exactly itself.
  With ``pdl=True`` both kernels launch as programmatic dependents, and A makes its noise (it needs
  no logits) before it waits for the kernel before (the LM head) to finish.

Greedy (``argmax``) is A+B without the noise: the first index of the largest logit, as torch.argmax
(faster than it at batch 1: lectures/results/a08_sampling.md). Every parameter is read from a device tensor and the random
stream is keyed by the position the token will take (``positions``, the cache lengths), not by a host
counter: a decode step that samples is still one CUDA-graph replay, and the same seed gives the same
tokens.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from common import TRITON_INTERPRET, pdl_supported
from common.checks import FLOAT_DTYPES, check_tensor
from common.launch import cdiv, fast, next_power_of_2

from .sampling import SamplingParams, check_sample_inputs  # noqa: F401 - the engine's params, one definition

#: Logits per chunk program and candidates each chunk keeps (the interpreter: small, so that
#: the tests' vocabularies of 8-200 tokens span several chunks and reach every path). KC 16, not 32:
#: top-k 50 cost less of a GPT-2 small decode step on the H100
CHUNK = 16 if TRITON_INTERPRET else 2048
KC = 4 if TRITON_INTERPRET else 16
#: A chunk is runs of SPREAD consecutive ids, every NC-th (_chunk_cols)
SPREAD = 4 if TRITON_INTERPRET else 16
#: ... and with ``wide`` (a top_k above WIDE_TOP_K): top-k 1000 stays on the fast path, where with KC its
#: k-th largest would lie below the 25 x 16 candidates and one program would draw, far more slowly
KC_WIDE = 8 if TRITON_INTERPRET else 64
WIDE_TOP_K = 4 if TRITON_INTERPRET else 100
#: C keeps a chunk's tokens above a rejected draw when there are at most KA (then the rejection chain
#: goes on in registers, not in one program over the row)
KA = 8 if TRITON_INTERPRET else 128
#: Warps of every program (a chunk's, and the last one of a row that merges). 16, not 8: four logits
#: a thread, so half the instructions; the merge's code is fetched cold in a decode step (the LM head
#: has just streamed its weights through L2), and at 8 warps that made it much slower than when warm
CHUNK_WARPS = 16
#: The candidate search's histograms: NB bins over RANGE below the chunk's max, then NB sub-bins of one
NB = 64
RANGE = 16.0
#: Vocabulary entries per step of _exact_draw's passes
BLOCK_V = 64 if TRITON_INTERPRET else 4096
#: At most this many rounds of _exact_draw (a round only ends without a token if rounding made the
#: nucleus empty, which p > 0 rules out)
MAX_ROUNDS = 64
#: B's drawn key when the token is no candidate (C reads it from the logits): the key of no finite or
#: infinite value (of one NaN pattern only)
NO_KEY = tl.constexpr(-2147483648)


@triton.jit
def _key(x):
    """An integer key in [0, 2^32) with the order of the fp32 values x (int64): _skey + 2^31."""
    return _skey(x).to(tl.int64) + 2147483648


@triton.jit
def _skey(x):
    """An int32 key with the order of the fp32 values x (signed: _key - 2^31)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _pack(x, cols):
    """int64 with the order of (x, -col): the key of x in the high word, the column in the low one."""
    return (_skey(x).to(tl.int64) << 32) + (4294967295 - cols.to(tl.int64))


@triton.jit
def _unpack(p):
    """(signed key, x, column) of packed candidates."""
    ks = (p >> 32).to(tl.int32)
    bits = tl.where(ks < 0, ks ^ 0x7FFFFFFF, ks)
    return ks, bits.to(tl.float32, bitcast=True), (4294967295 - (p & 4294967295)).to(tl.int32)


@triton.jit
def _kth_key(ks, xs, valid, k, hi, lo, NB: tl.constexpr):
    """The k-th largest of the int32 keys ks (of the values lo <= xs <= hi) where valid, as int64 (-2^31
    when fewer than k are valid). Two NB-bin histograms of d = (hi - x) * NB / (hi - lo), lo the smallest
    valid x (the caller's: a reduction less here): the bin, then the sub-bin, that holds the k-th largest; its members are almost always one
    value (or ties), whose key it is. Else (values closer than (hi - lo) / NB^2, or infinite): a radix
    select among them (_radix_kth)."""
    bins = tl.arange(0, NB)
    scale = NB / tl.maximum(hi - lo, 1e-30)
    d = tl.minimum(tl.maximum((hi - tl.where(valid, xs, hi)) * scale, 0.0), NB * 1.0)  # inf * 0: fallback
    b1 = tl.minimum(d, NB - 1.0).to(tl.int32)
    h1 = tl.histogram(b1, NB, mask=valid)
    j1 = tl.min(tl.where(tl.cumsum(h1, axis=0) >= k, bins, NB), axis=0)  # NB: fewer than k valid
    above = tl.sum(tl.where(bins < j1, h1, 0), axis=0)
    inb = valid & (b1 == j1)
    b2 = tl.minimum(tl.maximum((d - j1.to(tl.float32)) * NB, 0.0), NB - 1.0).to(tl.int32)
    h2 = tl.histogram(b2, NB, mask=inb)
    j2 = tl.min(tl.where(tl.cumsum(h2, axis=0) + above >= k, bins, NB), axis=0)
    rank = k - above - tl.sum(tl.where(bins < j2, h2, 0), axis=0)      # of the k-th among the sub-bin's
    ins = inb & (b2 == j2)
    kmax, nkmin = tl.reduce((tl.where(ins, ks, -2147483648), tl.where(ins, -ks, -2147483647)), 0, _max_both)
    kmin = -nkmin
    thr = tl.where(rank == 1, kmax, kmin).to(tl.int64)
    if (kmax != kmin) & (rank != 1):
        if rank != tl.sum(ins.to(tl.int32), axis=0):
            thr = _radix_kth(ks, ins, rank)
    return tl.where(j1 == NB, -2147483648, thr)


@triton.jit
def _radix_kth(ks, valid, k):
    """The k-th largest of the int32 keys ks where valid, as int64 (-2^31 when fewer than k are
    valid): a radix select, a byte at a time from the top, each byte's digit from a 256-bin histogram
    of the keys that match the digits found so far (4 histograms, not 32 counting passes)."""
    u = ks.to(tl.int64) + 2147483648                 # unsigned order, [0, 2^32)
    bins = tl.arange(0, 256)
    match = valid
    remaining = k                                    # the rank sought among the matching keys
    prefix = tl.full([], 0, tl.int64)
    for it in tl.static_range(4):
        shift = 24 - 8 * it
        dig = ((u >> shift) & 255).to(tl.int32)
        h = tl.histogram(dig, 256, mask=match)
        above = tl.sum(h, axis=0) - tl.cumsum(h, axis=0)          # keys with a larger digit
        digit = tl.max(tl.where((above < remaining) & (above + h >= remaining), bins, -1), axis=0)
        remaining -= tl.sum(tl.where(bins > digit, h, 0), axis=0)
        prefix = prefix | (digit.to(tl.int64) << shift)
        match = match & (dig == digit)
    few = tl.sum(valid.to(tl.int32), axis=0) < k
    return tl.where(few, -2147483648, prefix - 2147483648)


@triton.jit
def _gumbel(seed, row, pos, cols, rnd):
    """Gumbel noise -log(-log(u)) for each token of cols, u in [2^-24, 1 - 2^-24] from Philox keyed by
    (seed, token, position, row, round)."""
    z = cols * 0
    r0, _, _, _ = tl.philox(seed, cols.to(tl.uint32), (z + pos).to(tl.uint32), (z + row).to(tl.uint32),
                            (z + rnd).to(tl.uint32))
    u = tl.maximum((r0 >> 8).to(tl.int32), 1).to(tl.float32) * 5.9604644775390625e-08
    return -tl.log(-tl.log(u))


@triton.jit
def _scaled(base, cols, ok, temp):
    return tl.load(base + cols, mask=ok, other=float("-inf")).to(tl.float32) / temp


@triton.jit
def _candidates(x, ok, m, KC: tl.constexpr, NB: tl.constexpr, RANGE: tl.constexpr):
    """The chunk's candidates: a set `sel` of at most KC of its tokens such that every token left out
    is below every one kept, found by two NB-bin histograms (not a bisection: a reduction each step)
    of d = (m - x) * NB / RANGE: bins 0..j1 fit in KC, then bin j1 + 1 is cut into NB sub-bins. Any
    such set serves (B checks its thresholds against the largest left-out key); this one ends within
    RANGE / NB^2 of the KC-th largest. Returns (sel, how many it holds: from the histograms, no
    reduction over the chunk)."""
    bins = tl.arange(0, NB)
    d = tl.minimum(tl.maximum((m - x) * (NB / RANGE), 0.0), 4.0 * NB * NB)   # >= 0, monotone in -x
    b1 = tl.minimum(d, NB - 1.0).to(tl.int32)           # the last bin: everything RANGE or more below m
    h1 = tl.histogram(b1, NB, mask=ok)
    c1 = tl.cumsum(h1, axis=0)
    j1 = tl.max(tl.where((c1 <= KC) & (bins < NB - 1), bins, -1), axis=0)
    below = tl.sum(tl.where(bins <= j1, h1, 0), axis=0)
    inb = ok & (b1 == j1 + 1)
    b2 = tl.minimum(tl.maximum((d - (j1 + 1).to(tl.float32)) * NB, 0.0), NB - 1.0).to(tl.int32)
    h2 = tl.histogram(b2, NB, mask=inb)
    j2 = tl.max(tl.where(tl.cumsum(h2, axis=0) + below <= KC, bins, -1), axis=0)
    sel = ok & ((b1 <= j1) | (inb & (b2 <= j2)))
    return sel, below + tl.sum(tl.where(bins <= j2, h2, 0), axis=0)


@triton.jit
def _chunk_cols(c, NC, CHUNK: tl.constexpr, SPREAD: tl.constexpr):
    """Chunk c's CHUNK token ids (of NC chunks): runs of SPREAD consecutive ids, every NC-th run from
    run c on, so the chunks cover [0, NC * CHUNK) once. Not one contiguous range: a vocabulary puts its
    frequent tokens together (GPT-2's at low ids), and a chunk holding most of the likely ones could
    not keep them all as candidates (top-k would go the slow way); a run of SPREAD is one 32-byte
    sector of bf16 logits, so the loads waste nothing."""
    i = tl.arange(0, CHUNK)
    return ((i // SPREAD) * NC + c) * SPREAD + i % SPREAD


@triton.jit
def _max_both(a0, a1, b0, b1):
    return tl.maximum(a0, b0), tl.maximum(a1, b1)


@triton.jit
def _argmax_with(p0, k0, p1, k1):
    """(the larger packed p, the k that goes with it): an argmax that carries a payload."""
    take = p1 > p0
    return tl.where(take, p1, p0), tl.where(take, k1, k0)


@triton.jit
def _max4(a0, a1, a2, a3, b0, b1, b2, b3):
    return tl.maximum(a0, b0), tl.maximum(a1, b1), tl.maximum(a2, b2), tl.maximum(a3, b3)


@triton.jit
def _sum_max_max(a0, a1, a2, b0, b1, b2):
    return a0 + b0, tl.maximum(a1, b1), tl.maximum(a2, b2)


@triton.jit
def _choose_kernel(LOGITS, PARAMS, SEED, POS, WSF, WSI, CAND, CANDS, COUNT, OUT, V, s_row, NC,
                   GREEDY: tl.constexpr, CHUNK: tl.constexpr, SPREAD: tl.constexpr, KC: tl.constexpr, NB: tl.constexpr,
                   RANGE: tl.constexpr, NCP: tl.constexpr, MAX_ROUNDS: tl.constexpr, NUCLEUS: tl.constexpr,
                   BLOCK_V: tl.constexpr, USE_PDL: tl.constexpr):
    """A, then B in the row's last program. Program (row, c): chunk c of row `row`. Writes the chunk's
    winner (largest x + g; greedy: largest x, first index) to WSF[2] / WSI[0] (slot row * NC + c of
    each), and with a filter on: its m and Z to WSF[0] / WSF[1], its
    candidates, at most KC packed (x, column), every token above the largest key it leaves out, to CAND
    (unsorted, the rest of the KC slots empty) with their x + g to CANDS, and that key (tau) to
    WSI[n + 2B]. Then it counts itself done on COUNT[row]; the program that comes last (every other
    chunk's results are in memory by then) runs B (_finish)."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    n = tl.num_programs(0) * NC
    slot = row * NC + c
    cols = _chunk_cols(c, NC, CHUNK, SPREAD)
    ok = cols < V
    base = LOGITS + row.to(tl.int64) * s_row
    # the winner as the largest (key of s, -column): its value and the first index on a tie, in one
    # reduction (with a filter on, the same pass also takes m, the chunk's largest x)
    filt = False
    m = tl.full([], 0.0, tl.float32)
    if GREEDY:
        if USE_PDL:        # programmatic dependent launch: wait for the kernel before (the logits')
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        s = tl.load(base + cols, mask=ok, other=float("-inf")).to(tl.float32)
        packed = tl.max(_pack(s, cols), axis=0)
    else:
        # the noise needs no logits: with PDL it is made while the kernel before is still running
        g = _gumbel(tl.load(SEED), row, tl.load(POS + row), cols, 0)
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        x = _scaled(base, cols, ok, tl.load(PARAMS))
        s = tl.where(ok, x + g, float("-inf"))
        filt = (tl.load(PARAMS + 1) > 0) | (tl.load(PARAMS + 2) < 1.0)
        if filt:
            m, packed = tl.reduce((x, _pack(s, cols)), 0, _max_both)
        else:                                        # temperature alone: the winners are all B needs
            packed = tl.max(_pack(s, cols), axis=0)
    _, best, win = _unpack(packed)
    tl.store(WSF + 2 * n + slot, best)
    tl.store(WSI + slot, win)
    if not GREEDY:
        if filt:
            m_safe = tl.where(m == float("-inf"), 0.0, m)
            tl.store(WSF + slot, m)
            sel, n_sel = _candidates(x, ok, m_safe, KC, NB, RANGE)
            # Z, the largest x left out and the smallest kept (as -x), in one reduction
            z, left, nlo = tl.reduce((tl.exp(x - m_safe), tl.where(ok & ~sel, x, float("-inf")),
                                      tl.where(sel, -x, float("-inf"))), 0, _sum_max_max)
            tl.store(WSF + n + slot, z)
            tl.store(WSF + 4 * n + 2 * tl.num_programs(0) + slot, nlo)
            pos = tl.cumsum(sel.to(tl.int32), axis=0) - 1          # compacted by a cumsum
            out = CAND + slot.to(tl.int64) * KC
            tl.store(out + pos, _pack(x, cols), mask=sel)
            tl.store(CANDS + slot.to(tl.int64) * KC + pos, s, mask=sel)
            jk = tl.arange(0, KC)
            tl.store(out + jk, tl.full([KC], -9223372036854775808, tl.int64), mask=jk >= n_sel)
            tl.store(WSI + n + 2 * tl.num_programs(0) + slot, _skey(left))
    # the last of the row's NC programs merges: a barrier (this program's stores are done), then a
    # release-acquire count (they are visible to the program that sees NC - 1; it reads them past L1)
    tl.debug_barrier()
    if tl.atomic_add(COUNT + row, 1, sem="acq_rel", scope="gpu") == NC - 1:
        tl.store(COUNT + row, 0)                            # ready for the next call
        _finish(LOGITS, PARAMS, SEED, POS, WSF, WSI, CAND, CANDS, OUT, V, s_row, NC, row, GREEDY, NCP, KC, NB,
                MAX_ROUNDS, NUCLEUS, BLOCK_V)


@triton.jit
def _exact_draw(base, V, temp, top_k, top_p, seed, row, pos, m, z, lo0, z_kept0, rnd0,
                BLOCK_V: tl.constexpr, MAX_ROUNDS: tl.constexpr):
    """D's fallback, one program over the row: the token, drawn exactly. lo0 < 0: from scratch (top-k
    by a radix select over the key's 4 bytes, a 256-bin histogram a pass, then rounds from the kept set); else a rejection chain
    already under way: the next round draws among the tokens with key >= lo0, whose mass is z_kept0."""
    offs = tl.arange(0, BLOCK_V)
    thr = tl.full([], 0, tl.int64)                       # kept: key >= thr (0: every token)
    z_k = z
    if (lo0 < 0) & (top_k > 0) & (top_k < V):
        bins = tl.arange(0, 256)
        remaining = top_k
        for it in tl.static_range(4):                    # a byte at a time, from the top (as _radix_kth)
            shift = 24 - 8 * it
            counts = tl.zeros([256], tl.int32)
            for v0 in range(0, V, BLOCK_V):
                cols = v0 + offs
                ok = cols < V
                u = _key(_scaled(base, cols, ok, temp))
                match = ok & ((u >> (shift + 8)) == (thr >> (shift + 8)))
                counts += tl.histogram(((u >> shift) & 255).to(tl.int32), 256, mask=match)
            # above[j]: tokens with this prefix and a digit > j; the k-th largest has the digit j
            # with above[j] < remaining <= above[j] + counts[j]: the largest j with the second
            above = tl.sum(counts, axis=0) - tl.cumsum(counts, axis=0)
            digit = tl.max(tl.where(above + counts >= remaining, bins, -1), axis=0)
            remaining -= tl.sum(tl.where(bins > digit, counts, 0), axis=0)
            thr = thr | (digit.to(tl.int64) << shift)
        z_k = tl.full([], 0.0, tl.float32)
        for v0 in range(0, V, BLOCK_V):
            cols = v0 + offs
            ok = cols < V
            x = _scaled(base, cols, ok, temp)
            z_k += tl.sum(tl.where(ok & (_key(x) >= thr), tl.exp(x - m), 0.0), axis=0)
    lo = tl.where(lo0 < 0, thr, lo0)
    z_kept = tl.where(lo0 < 0, z_k, z_kept0)
    rnd = rnd0
    todo = True
    tok = tl.full([], 0, tl.int32)
    while todo:
        r0, _, _, _ = tl.philox(seed, (rnd + 0 * row).to(tl.uint32), pos.to(tl.uint32), row.to(tl.uint32),
                                (2147483647 + 0 * row).to(tl.uint32))      # not a Gumbel round's key
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
    return tok


@triton.jit
def _finish(LOGITS, PARAMS, SEED, POS, WSF, WSI, CAND, CANDS, OUT, V, s_row, NC, row,
            GREEDY: tl.constexpr, NCP: tl.constexpr, KC: tl.constexpr, NB: tl.constexpr, MAX_ROUNDS: tl.constexpr,
            NUCLEUS: tl.constexpr, BLOCK_V: tl.constexpr):
    """B, in the last program of row `row`: the token from the chunks' results (loaded with .cg: other
    programs wrote them); or, for C and D, WSI[n + row] = 1 (test the drawn token against the nucleus)
    / 2 (top-k beyond the candidates: draw in D), with the row's max, Z_k and the drawn token's key at
    WSF[3n + row], WSF[3n + B + row], WSI[n + B + row]. Without C and D (NUCLEUS false: the caller
    knows top_p is 1), a row that would need them is drawn here, exactly, in this program."""
    nb = tl.num_programs(0)
    n = nb * NC
    cs = tl.arange(0, NCP)
    okc = cs < NC
    slot = row * NC + cs
    # the best chunk winner (the first index on a tie) as the largest packed (key, -column); with a
    # filter on, the same reduction takes the row's max m and tau, the largest key a chunk left out
    # (every token with a larger key is a candidate, so a threshold above tau is exact)
    wp = tl.where(okc, _pack(tl.load(WSF + 2 * n + slot, mask=okc, other=0.0, cache_modifier=".cg"),
                             tl.load(WSI + slot, mask=okc, other=0, cache_modifier=".cg")), -9223372036854775808)
    need = 0
    if GREEDY:
        tok = _unpack(tl.max(wp, axis=0))[2]
    else:
        top_k = tl.load(PARAMS + 1).to(tl.int32)
        top_p = tl.load(PARAMS + 2)
        m_safe = tl.full([], 0.0, tl.float32)
        z_k = tl.full([], 0.0, tl.float32)
        key_t = tl.full([], 0, tl.int32)
        rnd = tl.full([], 0, tl.int32)
        if (top_k > 0) | (top_p < 1.0):
            mc = tl.load(WSF + slot, mask=okc, other=float("-inf"), cache_modifier=".cg")
            tc = tl.load(WSI + n + 2 * nb + slot, mask=okc, other=-2147483648, cache_modifier=".cg")
            nlo = tl.load(WSF + 4 * n + 2 * nb + slot, mask=okc, other=float("-inf"), cache_modifier=".cg")
            pw, m, tau_k, nlo = tl.reduce((wp, mc, tc, nlo), 0, _max4)
            tok = _unpack(pw)[2]
            m_safe = tl.where(m == float("-inf"), 0.0, m)
            j = tl.arange(0, NCP * KC)
            cand = tl.load(CAND + row.to(tl.int64) * NC * KC + j, mask=j < NC * KC, other=-9223372036854775808,
                           cache_modifier=".cg")
            ks, xs, cols = _unpack(cand)
            valid = cand != -9223372036854775808
            k_on = (top_k > 0) & (top_k < V)
            thr = tl.full([], -2147483648, tl.int64)
            exact = True
            kept = valid
            if k_on:                                 # top-k: the draw among the kept (A's noise, round 0)
                thr = _kth_key(ks, xs, valid, top_k, m_safe, -nlo, NB)
                exact = thr > tau_k                  # then every token at or above it is a candidate
                kept = valid & (ks >= thr)
                w = tl.where(kept, tl.exp(xs - m_safe), 0.0)
                z_k = tl.sum(w, axis=0)
                g = tl.where(kept, tl.load(CANDS + row.to(tl.int64) * NC * KC + j, mask=valid, other=float("-inf"),
                                           cache_modifier=".cg"), float("-inf"))
                pg, key_t = tl.reduce((tl.where(kept, _pack(g, cols), -9223372036854775808), ks), 0, _argmax_with)
                tok = _unpack(pg)[2]
            else:
                w = tl.where(valid, tl.exp(xs - m_safe), 0.0)
                z_k = tl.sum(tl.load(WSF + n + slot, mask=okc, other=0.0, cache_modifier=".cg") * tl.exp(mc - m_safe), axis=0)
                # the key of A's draw, if it is a candidate; if not, its key is below its chunk's tau, so
                # the nucleus test needs C (NO_KEY: C reads it from the logits)
                if top_p < 1.0:
                    key_t = tl.max(tl.where(valid & (cols == tok), ks, NO_KEY), axis=0)
            need = tl.where(exact, 0, 2)
            # top-p by rejection: the drawn token is in the nucleus iff the mass of the kept tokens more
            # probable than it is below p * Z_k; that mass is known here when they are all candidates
            # (its key >= tau); rejected, the next round draws among them (fresh noise), and so on.
            # A draw below tau is outside the nucleus for sure when the tokens above tau (all of them
            # candidates: T) already hold p * Z_k: then the next round draws among T, no C needed (any
            # superset of the nucleus serves as the next round's proposal; only a token inside is kept)
            go = exact & (top_p < 1.0)
            in_t = tl.zeros([], tl.int1)
            if go & ~k_on:                          # (with top-k on every kept token is above tau)
                in_t = tl.sum(tl.where(kept & (ks > tau_k), w, 0.0), axis=0) >= top_p * z_k
            while go:
                short = key_t < tau_k
                sure_out = short & in_t
                ref = tl.where(sure_out, tau_k, key_t)
                above = kept & (ks > ref)
                inside = (~short) & (tl.sum(tl.where(above, w, 0.0), axis=0) < top_p * z_k)
                need = tl.where(short & ~in_t, 1, need)   # the mass above needs every chunk: C and D
                rnd += 1
                go = (~(short & ~in_t)) & (~inside) & (rnd < MAX_ROUNDS)
                if go:
                    g = xs + _gumbel(tl.load(SEED), row, tl.load(POS + row), cols, rnd)
                    pg, key_t = tl.reduce((tl.where(above, _pack(g, cols), -9223372036854775808), ks), 0, _argmax_with)
                    tok = _unpack(pg)[2]
        else:                                        # temperature alone
            tok = _unpack(tl.max(wp, axis=0))[2]
        tl.store(WSF + 3 * n + row, m_safe)
        tl.store(WSF + 3 * n + nb + row, z_k)
        tl.store(WSI + n + row, need)
        tl.store(WSI + n + nb + row, key_t)
        tl.store(WSI + 2 * n + 2 * nb + row, rnd)
        if not NUCLEUS:
            if need != 0:
                tok = _exact_draw(LOGITS + row.to(tl.int64) * s_row, V, tl.load(PARAMS), top_k, top_p, tl.load(SEED),
                                  row, tl.load(POS + row), m_safe, z_k, tl.full([], -1, tl.int64),
                                  tl.full([], 0.0, tl.float32), tl.full([], 0, tl.int32), BLOCK_V, MAX_ROUNDS)
    tl.store(OUT + row, tl.minimum(tl.maximum(tok, 0), V - 1).to(tl.int64))


@triton.jit
def _reject_kernel(LOGITS, PARAMS, SEED, POS, WSF, WSI, ABOVE, COUNT, OUT, V, s_row, NC, CHUNK: tl.constexpr,
                   SPREAD: tl.constexpr, NCP: tl.constexpr, KA: tl.constexpr, BLOCK_V: tl.constexpr, MAX_ROUNDS: tl.constexpr,
                   USE_PDL: tl.constexpr):
    """C, then D in the row's last program; only where B asked (WSI[n + row] != 0). C, program (row, c),
    need 1: the mass exp(x - max) of chunk c's tokens more probable than the drawn one, to
    WSF[3n + 2B + row * NC + c], and those tokens (packed, when there are at most KA of them) to ABOVE,
    their count to WSI[2n + 3B + slot]. D: keep B's token if the row's mass above it is below p * Z (1);
    else the rejection chain goes on among the tokens above it: in registers when every chunk's fitted
    in ABOVE (each round a Gumbel-max draw among those above the last rejected token, with fresh noise,
    then the mass above the new one, exact since they are all there), else in one program over the
    row (_exact_draw, slowly), which also draws need 2 (program 0: top-k beyond the candidates)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    row = tl.program_id(0)
    c = tl.program_id(1)
    nb = tl.num_programs(0)
    n = nb * NC
    need = tl.load(WSI + n + row)
    top_p = tl.load(PARAMS + 2)
    z_k = tl.load(WSF + 3 * n + nb + row)
    run = (need == 2) & (c == 0)
    lo0 = tl.full([], -1, tl.int64)
    z_kept0 = tl.full([], 0.0, tl.float32)
    rnd0 = tl.full([], 0, tl.int32)
    if need == 1:
        cols = _chunk_cols(c, NC, CHUNK, SPREAD)
        ok = cols < V
        temp = tl.load(PARAMS)
        m = tl.load(WSF + 3 * n + row)
        x = _scaled(LOGITS + row.to(tl.int64) * s_row, cols, ok, temp)
        key_t = tl.load(WSI + n + nb + row)
        if key_t == NO_KEY:                          # B's token is no candidate: its key from the logits
            key_t = _skey(_scaled(LOGITS + row.to(tl.int64) * s_row, tl.load(OUT + row).to(tl.int32), True, temp))
        slot = row * NC + c
        above = ok & (_skey(x) > key_t)
        mass = tl.sum(tl.where(above, tl.exp(x - m), 0.0), axis=0)
        cnt = tl.sum(above.to(tl.int32), axis=0)
        tl.store(WSF + 3 * n + 2 * nb + slot, mass)
        tl.store(WSI + 2 * n + 3 * nb + slot, cnt)
        if cnt <= KA:                                # they fit: compacted by a cumsum, the rest empty
            dst = ABOVE + slot.to(tl.int64) * KA
            tl.store(dst + tl.cumsum(above.to(tl.int32), axis=0) - 1, _pack(x, cols), mask=above)
            ja = tl.arange(0, KA)
            tl.store(dst + ja, tl.full([KA], -9223372036854775808, tl.int64), mask=ja >= cnt)
        tl.debug_barrier()
        if tl.atomic_add(COUNT + row, 1, sem="acq_rel", scope="gpu") == NC - 1:
            tl.store(COUNT + row, 0)
            cs = tl.arange(0, NCP)
            slots = row * NC + cs
            mass = tl.sum(tl.load(WSF + 3 * n + 2 * nb + slots, mask=cs < NC, other=0.0, cache_modifier=".cg"), axis=0)
            run = mass >= top_p * z_k                        # rejected: the chain goes on
            fit = tl.max(tl.load(WSI + 2 * n + 3 * nb + slots, mask=cs < NC, other=0, cache_modifier=".cg"), axis=0) <= KA
            if run & fit:
                j = tl.arange(0, NCP * KA)
                packed = tl.load(ABOVE + row.to(tl.int64) * NC * KA + j, mask=j < NC * KA,
                                 other=-9223372036854775808, cache_modifier=".cg")
                ks, xs, ids = _unpack(packed)
                valid = packed != -9223372036854775808
                w = tl.where(valid, tl.exp(xs - m), 0.0)
                seed = tl.load(SEED)
                p_row = tl.load(POS + row)
                rnd = tl.load(WSI + 2 * n + 2 * nb + row)   # B's next fresh round
                ref = key_t
                tok = tl.full([], 0, tl.int32)
                go = True
                while go:
                    g = xs + _gumbel(seed, row, p_row, ids, rnd)
                    pg, ref = tl.reduce((tl.where(valid & (ks > ref), _pack(g, ids), -9223372036854775808), ks), 0,
                                        _argmax_with)
                    tok = _unpack(pg)[2]
                    rnd += 1
                    go = (tl.sum(tl.where(valid & (ks > ref), w, 0.0), axis=0) >= top_p * z_k) & (rnd < MAX_ROUNDS)
                tl.store(OUT + row, tl.minimum(tl.maximum(tok, 0), V - 1).to(tl.int64))
                run = False
            lo0 = key_t.to(tl.int64) + 2147483649       # _key of the next larger x
            z_kept0 = mass
            rnd0 = tl.full([], 1, tl.int32)
    if run:
        tok = _exact_draw(LOGITS + row.to(tl.int64) * s_row, V, tl.load(PARAMS), tl.load(PARAMS + 1).to(tl.int32),
                          top_p, tl.load(SEED), row, tl.load(POS + row), tl.load(WSF + 3 * n + row), z_k,
                          lo0, z_kept0, rnd0, BLOCK_V, MAX_ROUNDS)
        tl.store(OUT + row, tok.to(tl.int64))


def sample(logits: torch.Tensor, params: torch.Tensor, seed: torch.Tensor, positions: torch.Tensor, *,
           out: torch.Tensor | None = None, nucleus_pass: bool = True, wide: bool = False,
           pdl: bool = False) -> torch.Tensor:
    """One token per row of ``logits`` [B, V] (fp32/fp16/bf16, last dim contiguous), int64 [B].

    params: fp32 [3] = SamplingParams.tensor(); seed: int64 [1]; positions: int32 [B], the position
    each row's token will take (with the seed and the row, it keys the random stream: same seed,
    same tokens). All on the logits' device; nothing is read back to the host (graph-capturable).
    nucleus_pass=False leaves out kernels C and D (one launch) where the host knows top_p is 1 or top-k
    is on (0 < top_k < V: B never needs C then), as the engine does from its SamplingParams; a row that
    needs them is then drawn exactly in B's program, slowly.
    wide=True keeps KC_WIDE candidates a chunk instead of KC, for a top_k above WIDE_TOP_K (the engine
    sets it). Neither changes the distribution; the tokens can differ (another path, other noise).
    pdl=True (where common.pdl_supported): programmatic dependent launch; the noise is made before
    waiting for the kernel before, so ``seed`` and ``positions`` must not be that kernel's output.
    """
    check_sample_inputs(logits, params, seed, positions)
    return _choose(logits, params, seed, positions, out, greedy=False, nucleus=nucleus_pass,
                   kc=KC_WIDE if wide else KC, pdl=pdl)


def argmax(logits: torch.Tensor, *, out: torch.Tensor | None = None, pdl: bool = False) -> torch.Tensor:
    """Greedy: the index of each row's largest logit (the first one on a tie, as torch.argmax), int64
    [B]. logits [B, V] (fp32/fp16/bf16, last dim contiguous). Graph-capturable. pdl: as sample's."""
    check_tensor(logits, "logits", dtypes=FLOAT_DTYPES, ndim=2)
    if logits.stride(-1) != 1:
        raise ValueError(f"logits: the last dim must be contiguous, got strides {logits.stride()}")
    return _choose(logits, logits, logits, logits, out, greedy=True, pdl=pdl)


#: COUNT: per device, one int32 counter per row that the row's programs count themselves done on; the
#: last one resets it to 0, so a buffer is zeroed once, when it is made (grown only outside a capture)
_COUNTERS: dict = {}
#: every buffer ever handed out stays allocated: a captured CUDA graph keeps its address, not a reference
_KEEP: list = []


def _counters(device: torch.device, b: int) -> torch.Tensor:
    buf = _COUNTERS.get(device)
    if buf is None or buf.numel() < b:
        fresh = torch.zeros(max(b, 64), dtype=torch.int32, device=device)
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return fresh                 # zeroed by the graph's replays; not kept (the graph's memory)
        _KEEP.append(fresh)
        _COUNTERS[device] = buf = fresh
    return buf


def _choose(logits, params, seed, positions, out, greedy: bool, nucleus: bool = False, kc: int = KC,
            pdl: bool = False) -> torch.Tensor:
    """Launch A+B (and C+D when sampling) over ``logits`` [B, V] (checked). The kernels of one device
    share its counters: calls on two streams at once would have to be ordered by the caller."""
    b, v = logits.shape
    if out is None:
        out = torch.empty(b, dtype=torch.long, device=logits.device)
    if not b:
        return out
    nc = cdiv(v, CHUNK)
    n = b * nc
    dev, s_row = logits.device, logits.stride(0)
    wsf = torch.empty(5 * n + 2 * b, dtype=torch.float32, device=dev)     # m, Z, best | max, Z_k | masses | -lo
    wsi = torch.empty(3 * n + 3 * b, dtype=torch.int32, device=dev)   # winners | need, key | tau | round | count
    cand = torch.empty(1 if greedy else n * kc, dtype=torch.int64, device=dev)
    cands = torch.empty(1 if greedy else n * kc, dtype=torch.float32, device=dev)
    count = _counters(dev, b)
    ncp = next_power_of_2(nc)
    use_pdl = bool(pdl) and pdl_supported(dev)
    launch = dict(launch_pdl=True) if use_pdl else {}
    fast(_choose_kernel)[(b, nc)](logits, params, seed, positions, wsf, wsi, cand, cands, count, out, v, s_row, nc,
                                  GREEDY=greedy, CHUNK=CHUNK, SPREAD=SPREAD, KC=kc, NB=NB, RANGE=RANGE, NCP=ncp,
                                  MAX_ROUNDS=MAX_ROUNDS, NUCLEUS=nucleus, BLOCK_V=BLOCK_V, USE_PDL=use_pdl,
                                  num_warps=CHUNK_WARPS, **launch)
    if nucleus:
        above = torch.empty(n * KA, dtype=torch.int64, device=dev)
        fast(_reject_kernel)[(b, nc)](logits, params, seed, positions, wsf, wsi, above, count, out, v, s_row, nc,
                                      CHUNK=CHUNK, SPREAD=SPREAD, NCP=ncp, KA=KA, BLOCK_V=BLOCK_V, MAX_ROUNDS=MAX_ROUNDS,
                                      USE_PDL=use_pdl, num_warps=CHUNK_WARPS, **launch)
    return out
