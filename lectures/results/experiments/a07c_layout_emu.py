"""Stage 7c (draft): a CPU emulation (numpy) of the consumer warpgroups' index math in
solutions/a07_flash_attention/flash_fwd_hopper.cu, per lane, with the documented wgmma layouts
(accumulator and register-A fragment): masks, online softmax, P packing, epilogue. It does not
model TMA, swizzle or descriptors. Passed on the draft (O rel err ~1e-3, L abs err < 1e-6).

    python lectures/results/experiments/a07c_layout_emu.py
"""
# Thread-level emulation of the consumer's index math in flash_fwd_hopper.cu (one head), using the
# documented wgmma layouts: accumulator i of lane l (g = l/4, t = l%4) of warp w at row 16w + g + 8*((i/2)%2),
# col 8*(i/4) + 2t + i%2; register-A fragment reg r: row g + 8*(r%2), col 8*(r/2) + 2t + e.
import numpy as np, math
BM = BN = 128
def bf16(x):
    x = np.asarray(x, np.float32).copy(); b = x.view(np.uint32)
    b += 0x7FFF + ((b >> 16) & 1); b &= 0xFFFF0000; return b.view(np.float32)
def run(q, k, v, causal):
    S, D = q.shape
    scale_log2 = np.float32(1.4426950408889634 / math.sqrt(D))
    O = np.full((S, D), np.nan, np.float32); L = np.full(S, np.nan, np.float32)
    pad = lambda x: np.concatenate([x, np.zeros((BM + BN, D), np.float32)])
    qp, kp, vp = pad(q), pad(k), pad(v)
    lanes = np.arange(32); g, t = lanes // 4, lanes % 4
    I = np.arange(BN // 2)
    for m_block in range((S + BM - 1) // BM):
        m0 = m_block * BM
        kv_end = min(S, m0 + BM) if causal else S
        n_tiles = (kv_end + BN - 1) // BN
        for c in range(2):
            for w in range(4):
                row_lo = m0 + c * 64 + w * 16 + g                  # [32]
                wg_row0 = m0 + c * 64
                o = np.zeros((32, D // 2), np.float32)
                m_run = np.full((32, 2), -np.inf, np.float32); l_run = np.zeros((32, 2), np.float32)
                for j in range(n_tiles):
                    n0 = j * BN
                    rows = row_lo[:, None] + 8 * ((I // 2) % 2)[None]          # [32, 64]
                    cols = n0 + 8 * (I // 4)[None] + 2 * t[:, None] + (I % 2)[None]
                    sc = np.einsum("lid,lid->li", qp[rows], kp[cols]).astype(np.float32)
                    if n0 + BN > S or (causal and n0 + BN - 1 > wg_row0):
                        bad = (cols >= S) | ((cols > rows) if causal else False)
                        sc = np.where(bad, -np.inf, sc)
                    mx = np.stack([sc[:, (I // 2) % 2 == h].max(1) for h in range(2)], 1)   # [32, 2]
                    mx = mx.reshape(8, 4, 2).max(1).repeat(4, 0)                         # shfl_xor 1, 2
                    m_new = np.maximum(m_run, mx * scale_log2)
                    b = np.where(m_new == -np.inf, 0, m_new)
                    alpha = np.exp2(m_run - b)
                    m_run = m_new
                    hsel = (I // 2) % 2
                    p = np.exp2(sc * scale_log2 - b[:, hsel]).astype(np.float32)
                    rs = np.stack([p[:, hsel == h].sum(1) for h in range(2)], 1)
                    l_run = l_run * alpha + rs
                    o *= alpha[:, (np.arange(D // 2) // 2) % 2]
                    # pack: pa[kk][r] = (p[8kk+2r], p[8kk+2r+1]); rebuild the warp's P [16, 128] from the A layout
                    P = np.zeros((16, BN), np.float32)
                    for kk in range(BN // 16):
                        for r in range(4):
                            for e in range(2):
                                P[g + 8 * (r % 2), 16 * kk + 8 * (r // 2) + 2 * t + e] = bf16(p[:, 8 * kk + 2 * r + e])
                    upd = P @ vp[n0:n0 + BN]                                    # [16, D]
                    Io = np.arange(D // 2)
                    orow = g[:, None] + 8 * ((Io // 2) % 2)[None]
                    ocol = 8 * (Io // 4)[None] + 2 * t[:, None] + (Io % 2)[None]
                    o += upd[orow, ocol]
                lt = l_run.reshape(8, 4, 2).sum(1).repeat(4, 0)
                for h in range(2):
                    row = row_lo + 8 * h
                    inv = np.where(lt[:, h] > 0, 1 / lt[:, h], 0)
                    for jj in range(D // 8):
                        for e in range(2):
                            ok = row < S
                            O[row[ok], (8 * jj + 2 * t + e)[ok]] = (o[:, 4 * jj + 2 * h + e] * inv)[ok]
                    ok = (row < S) & (t == 0)
                    L[row[ok]] = ((m_run[:, h] + np.log2(lt[:, h])) * np.log(2))[ok]
    return O, L
rng = np.random.default_rng(0)
for S in (1, 17, 128, 130, 300):
    for D in (64, 128):
        for causal in (False, True):
            q, k, v = (bf16(rng.standard_normal((S, D))) for _ in range(3))
            O, L = run(q, k, v, causal)
            s = q.astype(np.float64) @ k.T.astype(np.float64) / math.sqrt(D)
            if causal: s = np.where(np.tril(np.ones((S, S), bool)), s, -np.inf)
            lse = np.log(np.exp(s - s.max(1, keepdims=True)).sum(1)) + s.max(1)
            ro = np.exp(s - lse[:, None]) @ v
            eo = np.linalg.norm(O - ro) / np.linalg.norm(ro); el = np.abs(L - lse).max()
            print(f"S={S} D={D} causal={causal}: O rel err {eo:.1e}, L max abs err {el:.1e}, nan {np.isnan(O).sum()}")
            assert eo < 1e-2 and el < 1e-4 and not np.isnan(O).any() and not np.isnan(L).any()
print("emulation ok")
