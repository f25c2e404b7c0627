"""Experiment (issue #28; slower than the shipped step, see EXPERIMENTS.md and run.log here): the whole decode
step's blocks in ONE persistent kernel.

    from persistent import PersistentDecode  # this folder on sys.path (persistent_check.py does it)
    step = PersistentDecode(engine)          # stacks the block weights once (K-major), like the gemv's copies
    step.blocks(hid, lengths)                # hid [B, C]: the residual stream, in place, through every block

Why. At batch 1 a decode step reads every weight once, so its speed limit is the memory bandwidth;
but the step is ~6 kernels a block (GPT-2 XL: ~290), and at each boundary the bandwidth idles: the next
kernel cannot start reading until the one before has finished and its writes are visible (PDL hides the
launch, not this drain). Lecture 8 §7 measures it: XL's GEMVs alone read at ~2 TB/s, the step at 1.6.

What a persistent kernel does instead. One program per SM, launched once per step; the programs walk
the same list of phases, layer after layer::

    A  qkv     = LayerNorm_1(h) @ W_attn + b     (K, V also appended to the cache)   column blocks
    B  att     = attention(q, cache)                                                   one (row, head) each
    C  h      += att @ W_proj + b                                                       column blocks
    D  f       = gelu(LayerNorm_2(h) @ W_fc + b)                                        column blocks
    E  h      += f @ W_fc_proj + b                                                      column blocks

Program p takes items p, p + G, p + 2G, ... of each phase (G programs). A phase's items need ALL of the
phase before (a GEMV's column needs every element of its input row), so each phase ends with a counter:
every program that did items of it adds how many (after a GPU-wide fence: its stores first), and a
program starting the next phase spins until the counter reaches the phase's item count. The point: a
program issues the loads of its FIRST weight tile of the next phase BEFORE it spins. Weights do not
depend on the step's activations, so HBM streams the next phase's weights while the last items of this
phase finish and the counter fills: the bubble at each boundary is filled with useful bytes. Inside a
phase the loads run one tile ahead (software pipelining by hand: the next item's tile is loaded before
the current one is multiplied).

Rules that make it correct:

* No deadlock: a program only ever waits for EARLIER phases, and every program is resident at once (G =
  the SM count, one program each: the launch checks the compiled kernel fits). On a GPU shared with
  another process that holds SMs, the spin could wait forever: this path is opt-in.
* Memory order: writer: stores, ``fence.acq_rel.gpu``, a CTA barrier, then the counter's atomic add
  (release); reader: the spin's atomic read (acquire), then every load of data another SM wrote this step
  goes through L2 (``.cg``), never a stale L1 line (the residual stream h is re-read every layer).
* Buffers are reused across layers (qkv, att, f, h in place): a phase of layer l+1 writes a buffer only
  after counters that imply every reader of layer l has finished (h: phase E of layer l waits for all of
  D, and D's LayerNorm reads h before D's counter fills).
* The counters start at 0: :meth:`PersistentDecode.blocks` zeroes them before each launch (a memset
  node in the captured graph).

Under the CPU interpreter the grid is one program: it walks every item in order and every spin is
already satisfied, which is how tests/test_a08_gpt2_inference.py checks the arithmetic without a GPU.
Numerics follow the kernel-by-kernel step: LayerNorm in fp32 rounded to the model's dtype before the
GEMV (the LayerNorm kernel's output), each sub-layer's output rounded before the residual add.
16-bit models, at most MAX_ROWS rows (the FMA path of the decode GEMV); anything else runs the
kernel-by-kernel step.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from common import TRITON_INTERPRET
from common.launch import cdiv, next_power_of_2

from solutions.a06_matmul.matmul_triton import _gelu_tanh
from solutions.a08_gpt2_inference.gemv import _fence_gpu, sm_count

#: Rows (sequences) a persistent step takes: the decode GEMV's CUDA-core (FMA) path.
MAX_ROWS = 2
#: Weight elements per tile at most (BLOCK_N columns x KC of K): 32 bf16 a thread at 8 warps.
TILE = 8192 if not TRITON_INTERPRET else 1 << 16
#: K chunk of the MLP's down projection (K = 4C).
KC_4C = 1024 if not TRITON_INTERPRET else 4096
#: Keys per step of the attention phase.
BLOCK_S = 64 if not TRITON_INTERPRET else 128
WARPS = 8


@triton.jit
def _wait(CNT, target, FENCE: tl.constexpr, SYNC: tl.constexpr = 1):
    """Spin until the counter CNT reaches ``target`` (acquire: what was stored before it is visible).
    SYNC 1: polls by atomic read; 2: by volatile load, then a fence (relaxed read + fence = acquire); 0: no wait
    (wrong results: for measuring the weight stream alone)."""
    if FENCE:
        if SYNC == 1:
            seen = tl.atomic_add(CNT, 0, sem="acquire", scope="gpu")
            while seen < target:
                seen = tl.atomic_add(CNT, 0, sem="acquire", scope="gpu")
        elif SYNC == 2:
            seen = tl.load(CNT, volatile=True)
            while seen < target:
                seen = tl.load(CNT, volatile=True)
            _fence_gpu()


@triton.jit
def _signal(CNT, count, FENCE: tl.constexpr, SYNC: tl.constexpr = 1):
    """Add ``count`` finished items to the counter CNT, after this program's stores are visible GPU-wide."""
    if SYNC != 0:
        if FENCE:
            _fence_gpu()
        tl.debug_barrier()
        tl.atomic_add(CNT, count, sem="release", scope="gpu")


@triton.jit
def _stamp(TR, idx, TRACE: tl.constexpr):
    if TRACE:
        tl.store(TR + idx, tl.extra.cuda.globaltimer())


@triton.jit
def _w_tile(W, col0, hi, chunk, K, BLOCK_N: tl.constexpr, KC: tl.constexpr):
    """The weight tile [BLOCK_N, KC] of K-major W [N, K] (row n holds column n's K weights): columns
    [col0, +BLOCK_N) below ``hi``, K rows [chunk·KC, +KC); masked lanes cost no memory traffic."""
    offs_n = col0 + tl.arange(0, BLOCK_N)
    offs_k = chunk * KC + tl.arange(0, KC)
    ok = (offs_n < hi)[:, None] & (offs_k < K)[None, :]
    return tl.load(W + offs_n[:, None].to(tl.int64) * K + offs_k[None, :], mask=ok, other=0.0,
                   eviction_policy="evict_first")


@triton.jit
def _ln_rows(H, M, C, eps, LN_W, LN_B, BLOCK_M: tl.constexpr, KC: tl.constexpr):
    """LayerNorm of H's rows [BLOCK_M, KC] (KC >= C; rows >= M and columns >= C: 0), in fp32, rounded to H's dtype
    (what the LayerNorm kernel hands the GEMV), then back to fp32. H read through L2 (.cg)."""
    offs_m = tl.arange(0, BLOCK_M)
    offs_k = tl.arange(0, KC)
    k_ok = offs_k < C
    ok = (offs_m < M)[:, None] & k_ok[None, :]
    h = tl.load(H + offs_m[:, None] * C + offs_k[None, :], mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
    mean = tl.sum(h, axis=1) / C
    hc = tl.where(ok, h - mean[:, None], 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(hc * hc, axis=1) / C + eps)
    g = tl.load(LN_W + offs_k, mask=k_ok, other=0.0).to(tl.float32)
    b = tl.load(LN_B + offs_k, mask=k_ok, other=0.0).to(tl.float32)
    y = hc * rstd[:, None] * g[None, :] + b[None, :]
    return tl.where(ok, y.to(H.dtype.element_ty).to(tl.float32), 0.0)


@triton.jit
def _gemv_phase(pid, G, WAIT, wait_target, DONE, W, BIAS, N, K, X, H, M, C, eps, LN_W, LN_B, OUT,
                KCACHE, VCACHE, LENS, s_cb, s_ch, s_cn, S_MAX,
                TR, tr_idx,
                MODE: tl.constexpr, HEAD_DIM: tl.constexpr, FAST_TANH: tl.constexpr, FENCE: tl.constexpr,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, KC: tl.constexpr, NCH: tl.constexpr,
                SYNC: tl.constexpr, TRACE: tl.constexpr):
    """One GEMV phase. Program pid takes the columns [pid·N/G, (pid+1)·N/G) (the same bytes of W for every
    program, give or take a column), in tiles of BLOCK_N columns, K in NCH chunks of KC:
    y[:, cols] = x @ W[:, cols] + BIAS[cols], W K-major [N, K].
      MODE 0 (qkv):     x = LayerNorm(H) (LN_W, LN_B); OUT = y; the k, v columns also to the caches at LENS[m]
      MODE 1 (proj, fc_proj): x = X [M, K]; H[:, cols] = round(y) + H[:, cols]
      MODE 2 (fc):      x = LayerNorm(H); OUT = gelu(y)
    The first tile is loaded BEFORE waiting for WAIT >= wait_target (the phase before: every program has
    signalled), each next tile before the current one is multiplied; DONE += 1 at the end."""
    lo = pid * N // G
    hi = (pid + 1) * N // G
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    # steps s = (tile s // NCH, chunk s % NCH); the weight tiles of steps s+1 and s+2 are in flight while
    # step s multiplies (the first two issued BEFORE the wait: HBM busy while we spin)
    n_steps = tl.cdiv(hi - lo, BLOCK_N) * NCH
    w0 = _w_tile(W, lo, hi, 0, K, BLOCK_N, KC)
    w1 = _w_tile(W, lo + (1 // NCH) * BLOCK_N, hi, 1 % NCH, K, BLOCK_N, KC)
    _wait(WAIT, wait_target, FENCE, SYNC)
    _stamp(TR, tr_idx, TRACE)
    offs_k = tl.arange(0, KC)
    if MODE != 1:
        x0 = _ln_rows(H, M, C, eps, LN_W, LN_B, BLOCK_M, KC)       # NCH == 1 (K == C <= KC)
    else:
        x0 = tl.load(X + offs_m[:, None] * K + offs_k[None, :], mask=m_ok[:, None] & (offs_k < K)[None, :],
                     other=0.0, cache_modifier=".cg").to(tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(0, n_steps):
        c = s % NCH
        col0 = lo + (s // NCH) * BLOCK_N
        w2 = _w_tile(W, lo + ((s + 2) // NCH) * BLOCK_N, hi, (s + 2) % NCH, K, BLOCK_N, KC)
        if NCH == 1:
            x = x0
        else:
            kk = c * KC + offs_k
            x = tl.load(X + offs_m[:, None] * K + kk[None, :], mask=m_ok[:, None] & (kk < K)[None, :],
                        other=0.0, cache_modifier=".cg").to(tl.float32)
        acc += tl.sum(x[:, None, :] * w0.to(tl.float32)[None, :, :], axis=2)
        w0 = w1
        w1 = w2
        if c == NCH - 1:
            _phase_out(acc, col0, hi, N, C, H, OUT, BIAS, KCACHE, VCACHE, LENS, M, s_cb, s_ch, s_cn, S_MAX,
                       MODE, HEAD_DIM, FAST_TANH, BLOCK_M, BLOCK_N)
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    _stamp(TR, tr_idx + 1, TRACE)
    _signal(DONE, 1, FENCE, SYNC)


@triton.jit
def _phase_out(acc, col0, hi, N, C, H, OUT, BIAS, KCACHE, VCACHE, LENS, M, s_cb, s_ch, s_cn, S_MAX,
               MODE: tl.constexpr, HEAD_DIM: tl.constexpr, FAST_TANH: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The column tile [col0, +BLOCK_N) (below hi) of a GEMV phase: bias, then per MODE (see _gemv_phase)."""
    offs_m = tl.arange(0, BLOCK_M)
    m_ok = offs_m < M
    offs_n = col0 + tl.arange(0, BLOCK_N)
    n_ok = offs_n < hi
    mask = m_ok[:, None] & n_ok[None, :]
    y = acc + tl.load(BIAS + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    if MODE == 1:
        dst = H + offs_m[:, None] * N + offs_n[None, :]
        r = tl.load(dst, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
        tl.store(dst, (y.to(H.dtype.element_ty).to(tl.float32) + r).to(H.dtype.element_ty), mask=mask)
    elif MODE == 2:
        y = _gelu_tanh(y, FAST_TANH)
        tl.store(OUT + offs_m[:, None] * N + offs_n[None, :], y.to(OUT.dtype.element_ty), mask=mask)
    else:
        y = y.to(OUT.dtype.element_ty)
        tl.store(OUT + offs_m[:, None] * N + offs_n[None, :], y, mask=mask)
        part = offs_n // C                                       # 0: q, 1: k, 2: v
        jj = offs_n - part * C
        pos = tl.load(LENS + offs_m, mask=m_ok, other=0)
        ok = mask & (pos < S_MAX)[:, None]
        dst = (offs_m[:, None].to(tl.int64) * s_cb + (jj // HEAD_DIM)[None, :].to(tl.int64) * s_ch
               + pos[:, None].to(tl.int64) * s_cn + (jj % HEAD_DIM)[None, :])
        tl.store(KCACHE + dst, y, mask=ok & (part == 1)[None, :])
        tl.store(VCACHE + dst, y, mask=ok & (part == 2)[None, :])


@triton.jit
def _attention_phase(pid, G, WAIT, wait_target, DONE, QKV, ATT, KCACHE, VCACHE, LENS, M, NH, C,
                     s_cb, s_ch, s_cn, qk_scale, TR, tr_idx,
                     HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, FENCE: tl.constexpr,
                     SYNC: tl.constexpr, TRACE: tl.constexpr):
    """Items (m, head): ATT[m, head] = softmax(q·Kᵀ / sqrt(d)) · V over the LENS[m] + 1 cached positions (the
    new one included), q = QKV[m, head] (scores in log2 units: qk_scale = log2(e) / sqrt(d))."""
    n_items = M * NH
    _wait(WAIT, wait_target, FENCE, SYNC)
    _stamp(TR, tr_idx, TRACE)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    offs_s = tl.arange(0, BLOCK_S)
    for it in range(pid, n_items, G):
        m = it // NH
        hd = it % NH
        length = tl.load(LENS + m) + 1
        q = tl.load(QKV + m * 3 * C + hd * HEAD_DIM + offs_d, mask=d_ok, other=0.0,
                    cache_modifier=".cg").to(tl.float32) * qk_scale
        kb = KCACHE + m.to(tl.int64) * s_cb + hd.to(tl.int64) * s_ch
        vb = VCACHE + m.to(tl.int64) * s_cb + hd.to(tl.int64) * s_ch
        m_i = tl.max(tl.full([BLOCK_S], float("-inf"), tl.float32), axis=0)
        l_i = tl.sum(tl.zeros([BLOCK_S], tl.float32), axis=0)
        acc = tl.zeros([BLOCK_D], tl.float32)
        for s0 in range(0, length, BLOCK_S):
            cols = s0 + offs_s
            ok = cols < length
            tile = cols[:, None].to(tl.int64) * s_cn + offs_d[None, :]
            k = tl.load(kb + tile, mask=ok[:, None] & d_ok[None, :], other=0.0, cache_modifier=".cg")
            s = tl.where(ok, tl.sum(k.to(tl.float32) * q[None, :], axis=1), float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=0))
            p = tl.math.exp2(s - m_new)
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, axis=0)
            v = tl.load(vb + tile, mask=ok[:, None] & d_ok[None, :], other=0.0, cache_modifier=".cg")
            acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)
            m_i = m_new
        out = acc / l_i
        tl.store(ATT + m * C + hd * HEAD_DIM + offs_d, out.to(ATT.dtype.element_ty), mask=d_ok)
    _stamp(TR, tr_idx + 1, TRACE)
    _signal(DONE, 1, FENCE, SYNC)


@triton.jit
def _decode_blocks_kernel(H, QKV, ATT, F, CNT, LENS, TR,
                          W_QKV, B_QKV, W_PROJ, B_PROJ, W_FC, B_FC, W_FP, B_FP, LN1_W, LN1_B, LN2_W, LN2_B,
                          KCACHE, VCACHE, s_cl, s_cb, s_ch, s_cn, S_MAX,
                          M, C, NH, N_LAYER, eps, qk_scale,
                          HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
                          BLOCK_M: tl.constexpr, FAST_TANH: tl.constexpr, FENCE: tl.constexpr,
                          BN_QKV: tl.constexpr, BN_PROJ: tl.constexpr, BN_FC: tl.constexpr, BN_FP: tl.constexpr,
                          KC_C: tl.constexpr, KC_4C: tl.constexpr, NCH_4C: tl.constexpr,
                          SYNC: tl.constexpr = 1, TRACE: tl.constexpr = False):
    """Every transformer block of one decode step (module docstring); CNT: int32 [N_LAYER, 5], zero. Each
    phase's counter is complete when all G programs have added 1."""
    pid = tl.program_id(0)
    G = tl.num_programs(0)
    for layer in range(N_LAYER):
        cnt = CNT + layer * 5
        l64 = tl.full((), 0, tl.int64) + layer
        kc = KCACHE + l64 * s_cl
        vc = VCACHE + l64 * s_cl
        tr = (pid * N_LAYER + layer) * 10          # TRACE: [G, N_LAYER, 5 phases, (after wait, end)]
        # A: qkv; waits for the previous layer's E (layer 0: h comes from the embedding kernel before,
        # and the wait on its own, still-zero counter for 0 returns at once)
        prev = CNT + tl.maximum(layer * 5 - 1, 0)
        _gemv_phase(pid, G, prev, tl.where(layer > 0, G, 0), cnt + 0,
                    W_QKV + l64 * 3 * C * C, B_QKV + l64 * 3 * C, 3 * C, C, H, H, M, C, eps,
                    LN1_W + l64 * C, LN1_B + l64 * C, QKV, kc, vc, LENS, s_cb, s_ch, s_cn, S_MAX,
                    TR, tr + 0, 0, HEAD_DIM, FAST_TANH, FENCE, BLOCK_M, BN_QKV, KC_C, 1, SYNC, TRACE)
        # B: attention
        _attention_phase(pid, G, cnt + 0, G, cnt + 1, QKV, ATT, kc, vc, LENS, M, NH, C,
                         s_cb, s_ch, s_cn, qk_scale, TR, tr + 2, HEAD_DIM, BLOCK_D, BLOCK_S, FENCE, SYNC, TRACE)
        # C: h += att @ W_proj + b
        _gemv_phase(pid, G, cnt + 1, G, cnt + 2,
                    W_PROJ + l64 * C * C, B_PROJ + l64 * C, C, C, ATT, H, M, C, eps,
                    LN2_W, LN2_B, H, kc, vc, LENS, s_cb, s_ch, s_cn, S_MAX,
                    TR, tr + 4, 1, HEAD_DIM, FAST_TANH, FENCE, BLOCK_M, BN_PROJ, KC_C, 1, SYNC, TRACE)
        # D: f = gelu(LayerNorm_2(h) @ W_fc + b)
        _gemv_phase(pid, G, cnt + 2, G, cnt + 3,
                    W_FC + l64 * 4 * C * C, B_FC + l64 * 4 * C, 4 * C, C, H, H, M, C, eps,
                    LN2_W + l64 * C, LN2_B + l64 * C, F, kc, vc, LENS, s_cb, s_ch, s_cn, S_MAX,
                    TR, tr + 6, 2, HEAD_DIM, FAST_TANH, FENCE, BLOCK_M, BN_FC, KC_C, 1, SYNC, TRACE)
        # E: h += f @ W_fc_proj + b
        _gemv_phase(pid, G, cnt + 3, G, cnt + 4,
                    W_FP + l64 * 4 * C * C, B_FP + l64 * C, C, 4 * C, F, H, M, C, eps,
                    LN2_W, LN2_B, H, kc, vc, LENS, s_cb, s_ch, s_cn, S_MAX,
                    TR, tr + 8, 1, HEAD_DIM, FAST_TANH, FENCE, BLOCK_M, BN_FP, KC_4C, NCH_4C, SYNC, TRACE)


def block_n(n: int, kc: int, programs: int, tile: int) -> int:
    """Columns per tile: enough for one program's share of N (cdiv(N, programs)) in one tile where that fits
    ``tile`` weight elements, else as many as fit (a power of 2, at least 1)."""
    return max(1, min(next_power_of_2(cdiv(n, programs)), max(1, tile // kc)))


class PersistentDecode:
    """The stacked K-major block weights and scratch buffers of one engine's persistent decode step."""

    def __init__(self, engine):
        e = engine
        if e.dtype == torch.float32:
            raise ValueError("PersistentDecode: 16-bit models only (fp32 runs the kernel-by-kernel step, which "
                             "gives transformers' tokens)")
        self.engine = e
        c, dev = e.n_embd, e.device

        def stack(ws):   # [L, N, K] contiguous: each layer's W [K, N] transposed once (K-major)
            return torch.stack([w.t().contiguous() for w in ws])

        L = e.layers
        self.w_qkv, self.w_proj = stack([l.attn_w for l in L]), stack([l.proj_w for l in L])
        self.w_fc, self.w_fp = stack([l.fc_w for l in L]), stack([l.fc_proj_w for l in L])
        self.b_qkv, self.b_proj = torch.stack([l.attn_b for l in L]), torch.stack([l.proj_b for l in L])
        self.b_fc, self.b_fp = torch.stack([l.fc_b for l in L]), torch.stack([l.fc_proj_b for l in L])
        self.ln1_w, self.ln1_b = torch.stack([l.ln_1_w for l in L]), torch.stack([l.ln_1_b for l in L])
        self.ln2_w, self.ln2_b = torch.stack([l.ln_2_w for l in L]), torch.stack([l.ln_2_b for l in L])
        rows = MAX_ROWS
        self.qkv = torch.empty(rows, 3 * c, dtype=e.dtype, device=dev)
        self.att = torch.empty(rows, c, dtype=e.dtype, device=dev)
        self.f = torch.empty(rows, 4 * c, dtype=e.dtype, device=dev)
        self.counters = torch.zeros(e.n_layer, 5, dtype=torch.int32, device=dev)
        self.configure()

    def configure(self, tile: int = TILE, kc_4c: int = KC_4C, warps: int = WARPS, per_sm: int = 1) -> None:
        """Tile shapes: K chunks of next_power_of_2(C) where K = C, ``kc_4c`` where K = 4C (MLP down), and
        column tiles of at most ``tile`` weight elements (:func:`block_n`); ``warps`` a program."""
        self.programs = 1 if TRITON_INTERPRET else sm_count(self.engine.device) * per_sm
        self._checked = set()
        c, g = self.engine.n_embd, self.programs
        kc_c = next_power_of_2(c)
        kc_4c = min(next_power_of_2(4 * c), max(kc_c, kc_4c))
        self.warps = warps
        self.meta = dict(KC_C=kc_c, KC_4C=kc_4c, NCH_4C=cdiv(4 * c, kc_4c),
                         BN_QKV=block_n(3 * c, kc_c, g, tile), BN_PROJ=block_n(c, kc_c, g, tile),
                         BN_FC=block_n(4 * c, kc_c, g, tile), BN_FP=block_n(c, kc_4c, g, tile))

    def blocks(self, hid: torch.Tensor, lengths: torch.Tensor, *, sync: int = 1, trace: torch.Tensor | None = None
               ) -> torch.Tensor:
        """Run every block on the residual stream ``hid`` [B, C] (in place; B <= MAX_ROWS) for new tokens at
        positions ``lengths`` [B] (int32): K and V appended there, attention over lengths + 1 positions."""
        e = self.engine
        b, c = hid.shape
        if not 0 < b <= MAX_ROWS:
            raise ValueError(f"PersistentDecode: 1 to {MAX_ROWS} rows, got {b}")
        if not hid.is_contiguous():
            raise ValueError("PersistentDecode: hid must be contiguous")
        k, v = e.cache.k, e.cache.v
        d = e.head_dim
        self.counters.zero_()
        args = ((hid, self.qkv, self.att, self.f, self.counters, lengths,
                 trace if trace is not None else self.counters,
                 self.w_qkv, self.b_qkv, self.w_proj, self.b_proj, self.w_fc, self.b_fc, self.w_fp, self.b_fp,
                 self.ln1_w, self.ln1_b, self.ln2_w, self.ln2_b,
                 k, v, k.stride(0), k.stride(1), k.stride(2), k.stride(3), k.shape[3],
                 b, c, e.n_head, e.n_layer, e.eps, 1.4426950408889634 / d ** 0.5), dict(
            HEAD_DIM=d, BLOCK_D=next_power_of_2(d), BLOCK_S=BLOCK_S, BLOCK_M=next_power_of_2(b),
            FAST_TANH=not TRITON_INTERPRET, FENCE=not TRITON_INTERPRET, num_warps=self.warps, num_stages=1,
            SYNC=sync, TRACE=trace is not None,
            **self.meta))
        grid = (self.programs,)
        key = (b, sync, trace is not None)
        if key not in self._checked and not TRITON_INTERPRET:
            self._check_resident(_decode_blocks_kernel.warmup(*args[0], grid=grid, **args[1]))
            self._checked.add(key)
        self.compiled = _decode_blocks_kernel[grid](*args[0], **args[1])
        return hid

    def _check_resident(self, k) -> None:
        """Every program must be resident at once (they wait for each other): refuse a grid the SMs cannot hold."""
        k._init_handles()                 # loads the binary: n_regs is known from here on
        props = torch.cuda.get_device_properties(self.engine.device)
        regs = getattr(props, "regs_per_multiprocessor", 65536)
        threads = 32 * self.warps
        per_sm = min(regs // max(k.n_regs * threads, 1), 2048 // threads, 32)
        smem = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
        if k.metadata.shared:
            per_sm = min(per_sm, smem // k.metadata.shared)
        self.resident = per_sm * props.multi_processor_count
        self.n_regs = k.n_regs
        if self.programs > self.resident:
            raise RuntimeError(f"PersistentDecode: {self.programs} programs, but only {self.resident} fit the GPU at "
                               f"once ({k.n_regs} registers a thread, {threads} threads, {k.metadata.shared} B shared): "
                               "they would wait for each other forever")
