"""Assignment 8, the capstone: GPT-2 inference on your own kernels, against transformers.

    from transformers import GPT2LMHeadModel
    from solutions.a08_gpt2_inference.engine import GPT2Engine
    hf = GPT2LMHeadModel.from_pretrained("gpt2")            # or GPT2LMHeadModel(GPT2Config(...))
    engine = GPT2Engine.from_hf(hf, dtype=torch.bfloat16, max_batch=8, max_seq_len=1024)
    new_tokens = engine.generate([prompt_a, prompt_b], max_new_tokens=64)   # greedy, [B, 64]
    engine.generate(prompts, 64, do_sample=True, temperature=0.8, top_k=50, top_p=0.95, seed=0,
                    eos_token_id=50256)                      # sampled on the GPU; each sequence stops at EOS

Inference has two phases, and they want different kernels:

* **prefill**: the whole prompt at once, T tokens per sequence. Every matmul has B·T rows:
  compute-bound, the stage-6 tiled matmul and the stage-7 flash attention are the right tools.
  Prefill also writes every prompt token's K and V into the cache.
* **decode**: ONE new token per sequence per step. A matmul has B rows: memory-bound, the GEMV
  (gemv.py). Attention is one query against the cache: flash-decoding (decode_attention.py). At batch
  1 launching a step's ~100 kernels from Python costs more than running them: the step is captured
  in a CUDA graph once and replayed (``generate(..., cuda_graph=True)``, the default on a GPU).

The engine is built only from the course's kernels, each loaded from the SAME tree as this file
(your a06 matmul and a07 flash attention when you work in assignments/). Every GEMM goes through
:meth:`GPT2Engine.linear` (or :meth:`GPT2Engine.ln_linear`: a LayerNorm and the GEMM after it):

  prefill, per block                               decode, per block (B rows)
  h, y = add_layernorm(attn_out, h, ln_1)          qkv = ln_linear(h, ln_1, W_attn, kv_cache=...)  LayerNorm,
  qkv  = linear(y, W_attn, b_attn)   a06 matmul          gemv, write_kv at lengths
  write_kv(qkv -> cache)                           decode_attention(q, cache, lengths + 1)
  flash attention forward, causal    a07           h = linear(attn, W_proj, residual=h)   residual in the epilogue
  a    = linear(attn, W_proj, b_proj)              m = ln_linear(h, ln_2, W_fc, "gelu_tanh")
  h, y = add_layernorm(a, h, ln_2)                 h = linear(m, W_fc_proj, residual=h)
  m    = linear(y, W_fc, b_fc, "gelu_tanh")
  m    = linear(m, W_fc_proj, b_fc_proj)
  LM head  logits = linear(ln_f(h), wteᵀ)  tied weights, no copy (B rows: the GEMV)

Two paths run the same decode_step (:meth:`GPT2Engine.set_path`): the core, your kernels as they
are (your engine's default), and the tuned path (solutions/a08_gpt2_inference/tuned.py, the reference
engine's default). The request loop (padding, checks, generate, stream, CUDA graphs) is given code
in solutions/a08_gpt2_inference/generation.py.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from einops import rearrange

from common import DEVICE, TRITON_INTERPRET
from common.checks import FLOAT_DTYPES
from common.impl import load as load_given

from ..a06_matmul.matmul_triton import matmul
from ..a07_flash_attention.flash_triton import attention_forward
from .decode_attention import MAX_HEAD_DIM, decode_attention
from .gemv import MAX_ROWS as GEMV_ROWS
from .gemv import gemv
from .kv_cache import KVCache, write_kv
from .layernorm import add_layernorm, layernorm
from .sampling import SamplingParams, sample  # noqa: F401 - SamplingParams: the engine's sampling buffers

#: Given code that stays beside the reference (solutions/, never copied): the request loop, the tuned path.
GENERATION, TUNED = "a08_gpt2_inference.generation", "a08_gpt2_inference.tuned"
Generation = load_given(GENERATION, "solutions").Generation

#: Under the CPU interpreter every program costs milliseconds of Python: wide tiles, few programs.
#: On a GPU: None, the a06 autotuner picks tiles per (M, N, K).
_INTERPRETER_TILES = (16, 256, 64, 4, 1) if TRITON_INTERPRET else None


@dataclass
class Layer:
    """One transformer block's weights, in GPT-2's Conv1D layout: W is [in, out], y = x @ W + b."""
    ln_1_w: torch.Tensor
    ln_1_b: torch.Tensor
    attn_w: torch.Tensor      # [C, 3C]  (c_attn: q | k | v)
    attn_b: torch.Tensor
    proj_w: torch.Tensor      # [C, C]   (attn.c_proj)
    proj_b: torch.Tensor
    ln_2_w: torch.Tensor
    ln_2_b: torch.Tensor
    fc_w: torch.Tensor        # [C, 4C]  (mlp.c_fc)
    fc_b: torch.Tensor
    fc_proj_w: torch.Tensor   # [4C, C]  (mlp.c_proj)
    fc_proj_b: torch.Tensor


class GPT2Engine(Generation):
    """GPT-2 generation with a static KV cache, on the course's kernels."""

    def __init__(self, layers: list[Layer], wte: torch.Tensor, wpe: torch.Tensor, ln_f_w: torch.Tensor,
                 ln_f_b: torch.Tensor, *, n_head: int, eps: float, max_batch: int, max_seq_len: int,
                 tuned: bool | None = None, **options):
        self.layers, self.wte, self.wpe, self.ln_f_w, self.ln_f_b = layers, wte, wpe, ln_f_w, ln_f_b
        self.n_layer, self.n_head, self.eps = len(layers), n_head, eps
        self.vocab_size, self.n_embd = wte.shape
        self.head_dim = self.n_embd // n_head
        self.dtype, self.device = wte.dtype, wte.device
        if max_seq_len > wpe.shape[0]:
            raise ValueError(f"max_seq_len={max_seq_len} exceeds the model's {wpe.shape[0]} positions")
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        self.cache = KVCache(self.n_layer, max_batch, n_head, self.head_dim, max_seq_len, self.dtype, self.device)
        self.batch = 0                   # sequences in flight (set by prefill)
        # fp32 runs compare token for token with transformers' fp32 (cuBLAS without TF32): keep
        # every dot in IEEE fp32 then. 16-bit inputs use the tensor cores as usual.
        self._tf32 = False
        self._init_generation(max_batch)   # sampling and EOS buffers, captured graphs (generation.py)
        self.set_path(tuned, **options)

    def set_path(self, tuned: bool | None = None, **options) -> None:
        """Run the decode step on the core (``tuned=False``: your kernels as they are) or on the tuned path
        (True: tuned.TunedPath over your kernels; ``options``: its decode_gemv, pdl, fuse_epilogues). None:
        tuned for the reference engine (the solutions tree), core for yours. Drops the captured graphs."""
        if tuned is None:
            tuned = __package__.split(".")[0] == "solutions"
        if options and not tuned:
            raise TypeError(f"{', '.join(sorted(options))}: options of the tuned path; pass tuned=True")
        self.tuned = load_given(TUNED, "solutions").TunedPath(self, **options) if tuned else None
        #: programmatic dependent launch for the a08 kernels of the step (the tuned path's; never on the core)
        self.pdl = self.tuned.pdl if self.tuned is not None else False
        self._graphs.clear()

    # ------------------------------------------------------------------ loading (given)
    # ------------------------------------------------------------------ loading (given)
    @classmethod
    def from_hf(cls, model, *, dtype: torch.dtype | None = None, device: str | torch.device | None = None,
                max_batch: int = 1, max_seq_len: int | None = None, tuned: bool | None = None,
                **options) -> GPT2Engine:
        """Take the weights of a transformers ``GPT2LMHeadModel`` (any size, random or pretrained).

        dtype: fp32/fp16/bf16 (default: the model's); device: default the kernel device
        (``common.DEVICE``); max_batch, max_seq_len: the KV cache's size (max_seq_len
        defaults to the model's n_positions). The weights are copied; the model is untouched.
        tuned, options: see :meth:`set_path`.
        """
        cfg = model.config
        problems = []
        if cfg.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
            problems.append(f"activation_function={cfg.activation_function!r} (the kernels compute GELU-tanh)")
        if not getattr(cfg, "scale_attn_weights", True) or getattr(cfg, "scale_attn_by_inverse_layer_idx", False):
            problems.append("attention scaling other than 1/sqrt(d)")
        if getattr(cfg, "add_cross_attention", False):
            problems.append("cross-attention")
        if cfg.n_embd % cfg.n_head:
            problems.append(f"n_embd={cfg.n_embd} is not a multiple of n_head={cfg.n_head}")
        elif cfg.n_embd // cfg.n_head > MAX_HEAD_DIM:
            problems.append(f"head size {cfg.n_embd // cfg.n_head} (n_embd / n_head): the attention kernels take head "
                            f"sizes up to {MAX_HEAD_DIM} (a power of two or not: 80 and 96 run padded to 128)")
        if problems:
            raise ValueError(f"from_hf: this GPT-2 config is not supported: {'; '.join(problems)}")
        tr = model.transformer
        dtype = dtype or tr.wte.weight.dtype
        if dtype not in FLOAT_DTYPES:
            raise TypeError(f"dtype: expected one of {FLOAT_DTYPES}, got {dtype}")
        device = device or DEVICE

        def w(t):
            return t.detach().to(device=device, dtype=dtype).contiguous()

        layers = [Layer(w(b.ln_1.weight), w(b.ln_1.bias), w(b.attn.c_attn.weight), w(b.attn.c_attn.bias),
                        w(b.attn.c_proj.weight), w(b.attn.c_proj.bias), w(b.ln_2.weight), w(b.ln_2.bias),
                        w(b.mlp.c_fc.weight), w(b.mlp.c_fc.bias), w(b.mlp.c_proj.weight), w(b.mlp.c_proj.bias))
                  for b in tr.h]
        return cls(layers, w(tr.wte.weight), w(tr.wpe.weight), w(tr.ln_f.weight), w(tr.ln_f.bias),
                   n_head=cfg.n_head, eps=cfg.layer_norm_epsilon, max_batch=max_batch,
                   max_seq_len=max_seq_len or cfg.n_positions, tuned=tuned, **options)

    # ------------------------------------------------------------------ building blocks (given)
    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
               activation: str | None = None, *, residual: torch.Tensor | None = None) -> torch.Tensor:
        """act(x @ w + b) (+ residual): your GEMV for at most GEMV_ROWS rows (a decode step's B tokens, a
        batch's last-token LM head), the residual added in its epilogue; the a06 Triton matmul otherwise (IEEE
        fp32 dots for fp32, see __init__), the residual added after it. The choice depends on the shape only,
        so a captured step never changes."""
        if self.tuned is not None:
            return self.tuned.linear(x, w, b, activation, residual=residual)
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if 0 < rows <= GEMV_ROWS:
            return gemv(x, w, b, activation, residual=residual)
        y = matmul(x, w, b, activation, allow_tf32=self._tf32, config=_INTERPRETER_TILES)
        return y if residual is None else y + residual

    def ln_linear(self, h: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor, w: torch.Tensor,
                  b: torch.Tensor | None = None, activation: str | None = None, *,
                  kv_cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """act(LayerNorm(h) @ w + b), the LayerNorm (ln_w, ln_b, self.eps) before c_attn or c_fc: your LayerNorm
        kernel, then :meth:`linear`. ``kv_cache`` = (k_cache, v_cache, start), for c_attn of one token per
        sequence: also append the output's k and v to the caches at position start[b] (your write_kv). The
        tuned path does all three in one GEMV where it can (tuned.TunedPath.ln_linear)."""
        if self.tuned is not None:
            return self.tuned.ln_linear(h, ln_w, ln_b, w, b, activation, kv_cache=kv_cache)
        y = self.linear(layernorm(h, ln_w, ln_b, self.eps), w, b, activation)
        if kv_cache is not None:
            write_kv(y.view(y.shape[0], 1, y.shape[-1]), *kv_cache)
        return y

    def embed(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(hid, new_lengths) for one token per sequence: hid [B, C] = wte[tokens] + wpe[lengths] (the residual
        stream), new_lengths = lengths + 1 (int32 [B]). tokens: int64 [B] on the device (in range: checked where
        they come from), lengths: int32 [B]. The tuned path does it in one kernel."""
        if self.tuned is not None:
            return self.tuned.embed(tokens, lengths)
        return self.wte[tokens] + self.wpe[lengths], lengths + 1

    def lm_head(self, y: torch.Tensor) -> torch.Tensor:
        """Logits [..., vocab] = y @ wteᵀ (the tied token embedding, read as a transposed view)."""
        return self.linear(y, self.wte.t())

    def next_ln(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The LayerNorm that follows block i's MLP: block i+1's ln_1, or ln_f after the last block."""
        if i + 1 < self.n_layer:
            return self.layers[i + 1].ln_1_w, self.layers[i + 1].ln_1_b
        return self.ln_f_w, self.ln_f_b

    @property
    def kv_bytes_per_token(self) -> int:
        return KVCache.bytes_per_token(self.n_layer, self.n_head, self.head_dim, self.dtype)

    def _next_token(self, logits: torch.Tensor, b: int, mode: tuple[bool, bool, bool, bool]) -> torch.Tensor:
        """The next token of each sequence from its logits [B, vocab], greedy or sampled; with EOS, ended
        sequences get the pad id. Device work only: it is part of the captured decode step."""
        do_sample, eos = mode[:2]
        if self.tuned is not None:
            tok = self.tuned.next_token(logits, b, mode)
        elif do_sample:    # your sampler (sampling.py); the position the token takes keys its noise
            tok = sample(logits, self._params, self._seed, self.cache.lengths[:b])
        else:
            tok = logits.argmax(-1)
        if eos:
            done = self._done[:b]
            tok = torch.where(done, self._pad_id, tok)
            done |= (tok[:, None] == self._eos).any(-1)
        return tok

    # ------------------------------------------------------------------ prefill (given)
    def prefill(self, ids: torch.Tensor, lengths: Sequence[int] | None = None, *,
                all_logits: bool = False, cuda_graph: bool = False) -> torch.Tensor:
        """Run the prompts, fill the KV cache, and return the logits that pick the first new token.

        ids: int64 [B, T] on the engine's device, right-padded, every id in [0, vocab_size) (else
        ValueError, before any kernel runs); lengths: each prompt's real length (default: all T). Starts a
        new batch. Returns [B, vocab], the logits at each sequence's last real token; ``all_logits=True``:
        [B, T, vocab] at every position. ``cuda_graph=True`` replays a short prompt's forward pass from a
        CUDA graph (Generation._prefill_graphed).
        """
        b, t = self._check_ids(ids, lengths)
        if cuda_graph and self.device.type != "cuda":
            raise ValueError(f"prefill(cuda_graph=True): CUDA graphs need a CUDA device; this engine is on {self.device}")
        lengths = list(lengths) if lengths is not None else [t] * b
        self.batch = b
        cache = self.cache
        cache.lengths[:b].copy_(torch.tensor(lengths, dtype=torch.int32), non_blocking=True)
        cache.host_lengths[:b] = lengths
        if all_logits:
            return self.lm_head(self._prompt_forward(ids))
        if cuda_graph and b * self._bucket(t) <= self.GRAPH_PREFILL_TOKENS:
            return self._prefill_graphed(ids, b, t)
        last = cache.lengths[:b].long() - 1
        return self._prompt_forward(ids, last)

    def _prompt_forward(self, ids: torch.Tensor, last: torch.Tensor | None = None) -> torch.Tensor:
        """The forward pass over [B, T] prompt tokens; writes K and V of positions 0..T-1 to the cache.
        Returns the final LayerNorm's output [B, T, C], or with ``last`` (int64 [B], device) the logits
        [B, vocab] at position last[b] of each sequence. No host sync: it can be captured in a CUDA graph."""
        b, t = ids.shape
        h = self.n_head
        cache = self.cache
        zeros = torch.zeros(b, dtype=torch.int32, device=self.device)
        x = self.wte[ids]                                             # [B, T, C] token embeddings
        pos = self.wpe[:t].expand(b, t, self.n_embd)                  # position embeddings
        hid, y = add_layernorm(x, pos, self.layers[0].ln_1_w, self.layers[0].ln_1_b, self.eps)
        for i, layer in enumerate(self.layers):
            qkv = self.linear(y, layer.attn_w, layer.attn_b)          # [B, T, 3C]
            write_kv(qkv, cache.k[i, :b], cache.v[i, :b], zeros)
            q, k, v = rearrange(qkv, "b t (three h d) -> three b h t d", three=3, h=h)  # strided views
            att, _ = attention_forward(q, k, v, True, allow_tf32=self._tf32)
            att = self.linear(rearrange(att, "b h t d -> b t (h d)"), layer.proj_w, layer.proj_b)   # heads merged
            hid, y = add_layernorm(att, hid, layer.ln_2_w, layer.ln_2_b, self.eps)
            m = self.linear(y, layer.fc_w, layer.fc_b, "gelu_tanh")
            m = self.linear(m, layer.fc_proj_w, layer.fc_proj_b)
            hid, y = add_layernorm(m, hid, *self.next_ln(i), self.eps)
        if last is None:
            return y
        return self.lm_head(y[torch.arange(b, device=self.device), last])

    # ------------------------------------------------------------------ decode (YOUR WORK)
    def decode_step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One decode step for the batch that :meth:`prefill` started: logits [B, vocab].

        tokens: int64 [B] on the device, the newest token of each sequence (not yet in the
        cache). Sequence b's new token sits at position ``cache.lengths[b]``: embed it
        there, append its K and V to the cache at that slot (write_kv with start = lengths),
        attend over lengths[b] + 1 keys (decode_attention), run the MLP, and return the
        logits for the token after it. Advance ``self.cache.lengths`` by one (on the device,
        in place) before returning. No host synchronisation and no allocation that depends
        on values (it is captured in a CUDA graph): read the lengths from the device tensor,
        never with .item() or .tolist(). Uses the same kernels as prefill, with B rows.
        """
        # TODO(a08): the decode step. Follow prefill() above, with ONE token per sequence, and with the
        #   decode path's fused building blocks (given, above): ln_linear() and linear(..., residual=).
        #   lengths = self.cache.lengths[:B] (device, int32): the new token's position;
        #   hid, new_lengths = self.embed(tokens, lengths): the residual stream [B, C] = wte[tokens] + wpe[lengths],
        #   and lengths + 1 (the keys each sequence attends to, the new token's included);
        #   per block: qkv = self.ln_linear(hid, ln_1 weight and bias, c_attn weight and bias,
        #   kv_cache=(this layer's cache K [B, H, S_max, d], cache V, lengths)) [B, 3C] (it also appends the
        #   new K and V to the cache at position lengths[b], as write_kv would); q = qkv[:, :C].view(B, H, d);
        #   decode_attention(q, cache K, cache V, new_lengths); hid = self.linear(attention output [B, C],
        #   c_proj, residual=hid); m = self.ln_linear(hid, ln_2, c_fc, "gelu_tanh"); hid = self.linear(m,
        #   the MLP's c_proj, residual=hid); after the last block: logits = self.lm_head(layernorm(hid, ln_f));
        #   then advance self.cache.lengths in place (on the device: copy new_lengths in).
        #   Every GEMM through ln_linear/linear (B rows: they run your gemv). Speed only, on sm_90+: pass
        #   pdl=self.pdl to decode_attention and layernorm (programmatic dependent launch).
        # STUB: raise NotImplementedError("a08: write GPT2Engine.decode_step")
        # SOLUTION
        b, c, h, d = self.batch, self.n_embd, self.n_head, self.head_dim
        cache = self.cache
        lengths = cache.lengths[:b]
        pdl = self.pdl
        hid, new_lengths = self.embed(tokens, lengths)   # [B, C], the residual stream; keys to attend to (+ new one)
        for i, layer in enumerate(self.layers):
            qkv = self.ln_linear(hid, layer.ln_1_w, layer.ln_1_b, layer.attn_w, layer.attn_b,   # [B, 3C], and
                                 kv_cache=(cache.k[i, :b], cache.v[i, :b], lengths))          # K, V appended
            q = qkv[:, :c].view(b, h, d)
            att = decode_attention(q, cache.k[i, :b], cache.v[i, :b], new_lengths, pdl=pdl)
            hid = self.linear(att.view(b, c), layer.proj_w, layer.proj_b, residual=hid)
            m = self.ln_linear(hid, layer.ln_2_w, layer.ln_2_b, layer.fc_w, layer.fc_b, "gelu_tanh")
            hid = self.linear(m, layer.fc_proj_w, layer.fc_proj_b, residual=hid)
        lengths.copy_(new_lengths)
        return self.lm_head(layernorm(hid, self.ln_f_w, self.ln_f_b, self.eps, pdl=pdl))
        # END TODO(a08)

