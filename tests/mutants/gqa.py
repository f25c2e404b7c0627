"""Buggy variants of stage 9's grouped-query attention (decode_attention.py: the split kernel of
gqa_decode_attention, its given launch code, and gqa_prefill_attention's stride mapping). Each must make
at least one graded test of tests/test_a09_llama_inference.py fail: on a CPU the kernels run under the
Triton interpreter against float64 with transformers' repeat_kv and NaN past every sequence's length."""
from . import Mutant

S = "a09_llama_inference"
GQA = "decode_attention.py"

MUTANTS = [
    # ---- the split kernel: test_gqa_decode_attention*
    Mutant(S, GQA, "query head h reads KV head h % Hkv",
           [("heads = j * GROUP + offs_g ", "heads = j + offs_g * HKV ")]),
    Mutant(S, GQA, "every sequence reads the length of sequence 0 (GQA)",
           [("    length = tl.load(LENS + b)\n", "    length = tl.load(LENS)\n")]),
    # A length cap just above what short tests draw (the CPU's longest: 600 keys), and one above the CPU's
    # sizes that only the GPU's long cases (1025 .. 8193 keys) reach.
    Mutant(S, GQA, "every sequence capped at 512 keys (GQA)",
           [("    length = tl.load(LENS + b)\n", "    length = tl.minimum(tl.load(LENS + b), 512)\n")]),
    Mutant(S, GQA, "every sequence capped at 4096 keys (GQA)",
           [("    length = tl.load(LENS + b)\n", "    length = tl.minimum(tl.load(LENS + b), 4096)\n")], gpu=True),
    Mutant(S, GQA, "split drops the newest key (GQA)",
           [("end = tl.minimum(start + per, length)", "end = tl.minimum(start + per, length - 1)")]),
    Mutant(S, GQA, "GQA acc not rescaled by alpha",
           [("acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)",
             "acc = tl.dot(p.to(v.dtype), v, acc, input_precision=PRECISION)")]),
    Mutant(S, GQA, "GQA ragged key chunk not masked to -inf",
           [("        s = tl.where(ok[None, :], s, float(\"-inf\"))\n", "")]),
    # splits combined without the max rescale: each split's logsumexp loses its running max
    Mutant(S, GQA, "GQA split logsumexp without its max",
           [("tl.where(seen, m_i + tl.math.log2(l_safe), float(\"-inf\"))",
             "tl.where(seen, tl.math.log2(l_safe), float(\"-inf\"))")]),
    Mutant(S, GQA, "GQA partial results written at the KV head's row",
           [("rows = b.to(tl.int64) * H + heads ", "rows = b.to(tl.int64) * HKV + j + offs_g * 0 ")]),
    Mutant(S, GQA, "GQA fp32 dots in TF32",
           [('PRECISION="ieee" if q.dtype == torch.float32 else "tf32"', 'PRECISION="tf32"')], gpu=True),
    # ---- the given launch code
    Mutant(S, GQA, "GQA scale 1 over d", [("LOG2E / math.sqrt(out_shape[2])", "LOG2E / out_shape[2]")]),
    Mutant(S, GQA, "GQA group of Hkv instead of H over Hkv",
           [("    group = h // hkv\n    split_kw", "    group = hkv\n    split_kw")]),
    # ---- prefill: test_gqa_prefill_attention*
    Mutant(S, GQA, "prefill query head h reads KV head h % Hkv",
           [('q4 = rearrange(q, "b (j g) t d -> (b j) g t d", g=g)', 'q4 = rearrange(q, "b (g j) t d -> (b j) g t d", g=g)'),
            ('return rearrange(o, "(b j) g t d -> b (j g) t d", b=b)', 'return rearrange(o, "(b j) g t d -> b (g j) t d", b=b)')]),
    Mutant(S, GQA, "prefill not causal",
           [("o, _ = attention_forward(q4, k4, v4, True, ", "o, _ = attention_forward(q4, k4, v4, False, ")]),
    Mutant(S, GQA, "prefill repeats K and V (copies)",
           [("k4 = k.flatten(0, 1)[:, None].expand(b * hkv, g, t_k, d)", "k4 = k.repeat_interleave(g, 1).flatten(0, 1).unflatten(0, (b * hkv, g))")],
           grader=("copied an input",)),
]
