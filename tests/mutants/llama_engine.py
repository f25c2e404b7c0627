"""Buggy variants of stage 9's engine (engine.py: the decode step, and the given loading and prefill code).
Each must make at least one graded test of tests/test_a09_llama_inference.py fail: on a CPU the engine runs
under the Triton interpreter against transformers' Llama and Qwen 3 (tokens in fp32, logits in float64)."""
from . import Mutant

S = "a09_llama_inference"
ENG = "engine.py"
ATTEND = "att = self.attend(qkv[:, :h * d].view(b, h, d), k, v, new_lengths)"

MUTANTS = [
    # ---- the decode step: test_engine_generate_matches_transformers, test_engine_logits_against_transformers
    Mutant(S, ENG, "Llama decode writes the cache at lengths + 1",
           [("(k, v, lengths),\n", "(k, v, new_lengths),\n")]),
    Mutant(S, ENG, "Llama decode attends without the newest key", [(ATTEND, ATTEND.replace("new_lengths)", "lengths)"))]),
    Mutant(S, ENG, "Llama cache lengths not advanced", [("        lengths.copy_(new_lengths)\n", "")]),
    Mutant(S, ENG, "Llama query taken from the last columns",
           [(ATTEND, ATTEND.replace("qkv[:, :h * d]", "qkv[:, qkv.shape[1] - h * d:]"))]),
    Mutant(S, ENG, "Qwen 3 q and k norms dropped in decode",
           [("q_norm=layer.q_norm_w, k_norm=layer.k_norm_w)\n            att", "q_norm=None, k_norm=None)\n            att")]),
    Mutant(S, ENG, "Llama final norm skipped in decode",
           [("return self.lm_head(self.norm(hid, self.norm_w))", "return self.lm_head(hid)")]),
    Mutant(S, ENG, "Llama MLP residual dropped in decode",
           [("hid = self.linear(m, layer.down_w, residual=hid)", "hid = self.linear(m, layer.down_w)")]),
    # ---- the given loading code: the same tests
    Mutant(S, ENG, "k and v weights swapped at load",
           [("[a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]", "[a.q_proj.weight, a.v_proj.weight, a.k_proj.weight]")]),
    Mutant(S, ENG, "gate and up weights swapped at load",
           [("[mlp.gate_proj.weight, mlp.up_proj.weight]", "[mlp.up_proj.weight, mlp.gate_proj.weight]")]),
    Mutant(S, ENG, "Llama 3 rope scaling ignored",
           [("inv_freq = rope_frequencies(head_dim, theta, scaling)", "inv_freq = rope_frequencies(head_dim, theta)")]),
    Mutant(S, ENG, "untied LM head read from the embedding",
           [("lm_w = embed_w.t() if tied else", "lm_w = embed_w.t() if True else")]),
    Mutant(S, ENG, "attention_bias accepted",
           [('    for flag in ("attention_bias", "mlp_bias"):', '    for flag in ("mlp_bias",):')],
           grader=("from_hf refuses",)),
]
