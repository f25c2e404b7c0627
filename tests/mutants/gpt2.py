"""Buggy variants of stage 8 (GPT-2 inference: fused residual + LayerNorm, flash-decoding
attention, the KV-cache write, the decode GEMV, the sampler, the engine's decode step). Each must make at least one graded
test of tests/test_a08_gpt2_inference.py fail. Everything runs under the Triton interpreter on
a CPU: the kernels against float64 with NaN past every sequence's length, the decode step
against transformers on a right-padded batch of different prompt lengths."""
from . import Mutant

S = "a08_gpt2_inference"
LN, DEC, KV, ENG, GV, SMP = "layernorm.py", "decode_attention.py", "kv_cache.py", "engine.py", "gemv.py", "sampling.py"

#: The decode step's attention call, the line most of the engine's mutants edit.
ATTEND = "att = decode_attention(q, cache.k[i, :b], cache.v[i, :b], new_lengths, pdl=pdl)"
WRITE = "kv_cache=(cache.k[i, :b], cache.v[i, :b], lengths))"
EMBED = "hid, new_lengths = self.embed(tokens, lengths)   # [B, C], the residual stream; keys to attend to (+ new one)"

MUTANTS = [
    # ---- kernel 1, residual + LayerNorm: test_add_layernorm, test_layernorm_*
    Mutant(S, LN, "unbiased variance", [("var = tl.sum(hc * hc, axis=0) / C", "var = tl.sum(hc * hc, axis=0) / (C - 1)")]),
    Mutant(S, LN, "residual not added",
           [("        h += tl.load(R + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)\n"
             "        h_out = h.to(H.dtype.element_ty)\n"
             "        tl.store(H + row * stride_h + cols, h_out, mask=ok)\n"
             "        h = h_out.to(tl.float32)",
             "        r = tl.load(R + row * stride_r + cols, mask=ok, other=0.0).to(tl.float32)\n"
             "        tl.store(H + row * stride_h + cols, (h + r).to(H.dtype.element_ty), mask=ok)")]),
    Mutant(S, LN, "padding lanes in the variance", [("hc = tl.where(ok, h - mean, 0.0)", "hc = h - mean")]),
    Mutant(S, LN, "mean over the block not the row", [("mean = tl.sum(h, axis=0) / C", "mean = tl.sum(h, axis=0) / BLOCK_C")]),
    Mutant(S, LN, "eps ignored", [("rstd = 1.0 / tl.sqrt(var + eps)", "rstd = 1.0 / tl.sqrt(var)")]),
    Mutant(S, LN, "eps outside the square root",
           [("rstd = 1.0 / tl.sqrt(var + eps)", "rstd = 1.0 / (tl.sqrt(var) + eps)")], grader=()),

    # ---- head sizes that are no power of two (issue #30): padded to BLOCK_D, the padding masked
    Mutant(S, DEC, "head padding not masked in decode attention",
           [("    d_ok = dim_mask(HEAD_DIM, BLOCK_D)                                     # constant True if HEAD_DIM == BLOCK_D",
             "    d_ok = tl.arange(0, BLOCK_D) < BLOCK_D")], grader=()),
    Mutant(S, KV, "head padding not masked in the KV-cache write",
           [("ok = (hs[:, None] < H) & (pos < S_MAX) & dim_mask(HEAD_DIM, BLOCK_D)[None, :]",
             "ok = (hs[:, None] < H) & (pos < S_MAX) & (tl.arange(0, BLOCK_D) < BLOCK_D)[None, :]")], grader=()),
    # ---- kernel 2a, one split of the keys: test_decode_attention*
    Mutant(S, DEC, "split drops the newest key",
           [("end = tl.minimum(start + per, length)", "end = tl.minimum(start + per, length - 1)")]),
    # A length cap just above what short tests draw: every sequence capped at 256 keys.
    Mutant(S, DEC, "every sequence capped at 256 keys",
           [("    length = tl.load(LENS + b)\n", "    length = tl.minimum(tl.load(LENS + b), 256)\n")],
           grader=("S_max=",)),
    Mutant(S, DEC, "every sequence reads the length of sequence 0",
           [("length = tl.load(LENS + b)", "length = tl.load(LENS)")]),
    Mutant(S, DEC, "acc not rescaled by alpha",
           [("acc = acc * alpha + tl.sum(p[:, None] * v.to(tl.float32), axis=0)",
             "acc = acc + tl.sum(p[:, None] * v.to(tl.float32), axis=0)")]),
    Mutant(S, DEC, "ragged key chunk not masked to -inf", [("        s = tl.where(ok, s, float(\"-inf\"))\n", "")]),
    Mutant(S, DEC, "exp instead of exp2",
           [("        p = tl.math.exp2(s - m_new)\n        alpha = tl.math.exp2(m_i - m_new)",
             "        p = tl.exp(s - m_new)\n        alpha = tl.exp(m_i - m_new)")]),
    Mutant(S, DEC, "split logsumexp without the sum",
           [("tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float(\"-inf\"))",
             "tl.where(seen, m_i, float(\"-inf\"))")]),
    # ---- kernel 2b, combine
    Mutant(S, DEC, "combine is a plain average of the splits",
           [("out = tl.sum(w[:, None] * o, axis=0) / tl.sum(w, axis=0)", "out = tl.sum(o, axis=0) / NUM_SPLITS")]),
    Mutant(S, DEC, "combine weights not normalised",
           [("out = tl.sum(w[:, None] * o, axis=0) / tl.sum(w, axis=0)", "out = tl.sum(w[:, None] * o, axis=0)")]),

    # ---- kernel 3, the KV-cache write: test_write_kv, test_kv_cache_size_and_errors
    Mutant(S, KV, "cache written one slot late", [("pos = tl.load(START + b) + t", "pos = tl.load(START + b) + t + 1")]),
    Mutant(S, KV, "k and v swapped",
           [("    tl.store(K_CACHE + dst, k, mask=ok)\n    tl.store(V_CACHE + dst, v, mask=ok)",
             "    tl.store(K_CACHE + dst, v, mask=ok)\n    tl.store(V_CACHE + dst, k, mask=ok)")]),
    Mutant(S, KV, "token index ignored", [("pos = tl.load(START + b) + t", "pos = tl.load(START + b)")]),
    Mutant(S, KV, "only the first head written", [("ok = (hs[:, None] < H) & (pos < S_MAX)", "ok = (hs[:, None] < 1) & (pos < S_MAX)")]),

    # ---- kernel 4, the decode GEMV: test_gemv*
    Mutant(S, GV, "split-K partials not all summed",
           [("for s in range(0, SPLIT_K):", "for s in range(0, SPLIT_K - 1):")]),
    Mutant(S, GV, "bias added to every split's partial sum",
           [("        tl.store(part + split * M * N, acc, mask=mask)\n",
             "        if HAS_BIAS:\n"
             "            acc += tl.load(BIAS + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]\n"
             "        tl.store(part + split * M * N, acc, mask=mask)\n")]),
    Mutant(S, GV, "W's column stride ignored (assumes N contiguous)",
           [("offs_n[None, :].to(tl.int64) * stride_wn", "offs_n[None, :].to(tl.int64)")]),
    Mutant(S, GV, "every split runs to the end of K", [("k_hi = tl.minimum(k_lo + K_PER_SPLIT, K)", "k_hi = K")]),
    Mutant(S, GV, "x's K stride ignored (assumes x contiguous)",
           [("offs_k[None, :] * stride_xk", "offs_k[None, :]")]),

    # ---- the sampler: test_sample_*
    Mutant(S, SMP, "top-k keeps one token too many",
           [("holds = tl.sum((key >= mid[:, None]).to(tl.int32), axis=1) >= k",
             "holds = tl.sum((key >= mid[:, None]).to(tl.int32), axis=1) > k")]),
    Mutant(S, SMP, "top-p measured over every token, not the top-k",
           [("e = tl.where(key >= kth[:, None], tl.exp(", "e = tl.where(key > -2147483649, tl.exp(")]),
    Mutant(S, SMP, "the draw without its noise (greedy)",
           [("tok = tl.argmax(tl.where(kept, x + g, float(\"-inf\")), axis=1)",
             "tok = tl.argmax(tl.where(kept, x, float(\"-inf\")), axis=1)")]),

    # ---- the decode step: test_decode_logits, test_generate_matches_transformers
    Mutant(S, ENG, "decode writes the cache at lengths + 1", [(WRITE, WRITE.replace("lengths))", "new_lengths))"))]),
    Mutant(S, ENG, "decode attends without the newest key", [(ATTEND, ATTEND.replace("new_lengths, pdl", "lengths, pdl"))]),
    Mutant(S, ENG, "decode attends to the longest length in the batch",
           [(ATTEND, ATTEND.replace("new_lengths, pdl", "new_lengths.max().expand(b).contiguous(), pdl"))]),
    Mutant(S, ENG, "position embedding not advanced",
           [(EMBED, EMBED.replace("self.embed(tokens, lengths)", "self.embed(tokens, lengths * 0)") + "\n"
             "        new_lengths = lengths + 1")]),
    Mutant(S, ENG, "position embedding at the prompt lengths",
           [(EMBED, EMBED.replace("self.embed(tokens, lengths)",
                                  "self.embed(tokens, torch.tensor(self.cache.host_lengths[:b], dtype=torch.int32, "
                                  "device=self.device))") + "\n        new_lengths = lengths + 1")]),
    Mutant(S, ENG, "cache lengths not advanced", [("        lengths.copy_(new_lengths)\n", "")]),
    Mutant(S, ENG, "query taken from the key columns", [("q = qkv[:, :c].view(b, h, d)", "q = qkv[:, c:2 * c].view(b, h, d)")]),
    Mutant(S, ENG, "final LayerNorm skipped",
           [("return self.lm_head(layernorm(hid, self.ln_f_w, self.ln_f_b, self.eps, pdl=pdl))",
             "return self.lm_head(hid)")]),
]
