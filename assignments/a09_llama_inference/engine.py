"""Assignment 9: a modern decoder (Llama 3, Qwen 3) on your kernels, built on the stage-8 engine.

    from transformers import LlamaForCausalLM                  # or Qwen3ForCausalLM
    from assignments.a09_llama_inference.engine import LlamaEngine
    hf = LlamaForCausalLM(LlamaConfig(...))                    # or .from_pretrained(...)
    engine = LlamaEngine.from_hf(hf, dtype=torch.bfloat16, max_batch=8, max_seq_len=2048)
    new_tokens = engine.generate([prompt_a, prompt_b], max_new_tokens=64)   # as GPT2Engine.generate

A Llama-family block is GPT-2's with four parts exchanged, each smaller in the bytes a decode step reads:

* **RMSNorm** for LayerNorm (no mean, no bias: one weight vector), rmsnorm.py;
* **rotary position embeddings** for the learned position table: q and k of every head rotated by
  angles that depend on the token's position (rope.py), applied to the fused QKV output in place
  (with Qwen 3's per-head q/k RMSNorm before the rotation);
* **grouped-query attention**: Hkv < H key/value heads, each shared by G = H / Hkv query heads, so the
  KV cache (the bytes decode attention reads every step) is G times smaller (decode_attention.py);
* a **SwiGLU** MLP: silu(x W_gate) * (x W_up), then W_down (swiglu.py), and no biases anywhere.

The engine is :class:`..a08_gpt2_inference.engine.GPT2Engine`'s family: the same request loop
(generation.py: padding, token checks, generate, stream, sampling, EOS, CUDA graphs), the same KV
cache (with Hkv heads), the a08 GEMV for the decode step's few rows and the a06 matmul for prefill's
many, a08's sampler. What differs is overridden here: the weights (:class:`LlamaLayer`), the embedding
(no position table), the LM head (tied or untied), prefill's forward pass and the decode step.

  prefill, per block                                    decode, per block (B rows)
  qkv = linear(y, W_qkv)          a06 matmul            qkv = qkv_rope(hid, norm, W_qkv, cache)  RMSNorm, gemv,
  apply_rope(qkv, start = 0)      (q/k norm first)            RoPE at lengths, write_kv
  write_kv(k | v -> cache)                              att = attend(q, cache, lengths + 1)    GQA flash-decoding
  gqa_prefill_attention(q, cache) a07 flash forward     hid = linear(att, W_o, residual=hid)
  a = linear(att, W_o)                                  m   = norm_gate_up(hid, norm, W_gu)    RMSNorm, gemv, SwiGLU
  hid, y = add_rmsnorm(a, hid)                          hid = linear(m, W_down, residual=hid)
  m = swiglu(linear(y, W_gate_up))
  hid, y = add_rmsnorm(linear(m, W_down), hid)
  LM head  logits = linear(norm(hid), W_lm)   tied: embed weightᵀ (a view), untied: lm_head weightᵀ

The decode step calls the engine's building blocks (:meth:`LlamaEngine.linear`, :meth:`qkv_rope`,
:meth:`attend`, :meth:`norm_gate_up`, :meth:`embed`, :meth:`norm`); a tuned path
(assignments/a09_llama_inference/tuned.py, ``TunedLlamaPath``) takes them over when it is loaded
(:meth:`LlamaEngine.set_path`), as stage 8's tuned path does for GPT2Engine.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange

from common import DEVICE
from common.checks import FLOAT_DTYPES
from common.impl import REPO
from common.impl import load as load_given

from ..a06_matmul.matmul_triton import matmul
from ..a08_gpt2_inference.decode_attention import MAX_HEAD_DIM
from ..a08_gpt2_inference.engine import _INTERPRETER_TILES, GPT2Engine
from ..a08_gpt2_inference.gemv import MAX_ROWS as GEMV_ROWS
from ..a08_gpt2_inference.gemv import gemv
from ..a08_gpt2_inference.kv_cache import KVCache, write_kv
from .decode_attention import gqa_decode_attention, gqa_prefill_attention
from .rmsnorm import add_rmsnorm, rmsnorm
from .rope import apply_rope, rope_cache, rope_frequencies
from .swiglu import swiglu

#: The tuned path (given code beside the reference, never copied): loaded when this file exists.
TUNED = "a09_llama_inference.tuned"
TUNED_FILE = REPO / "solutions" / "a09_llama_inference" / "tuned.py"
#: transformers' model_type of each architecture the engine runs
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM"}
#: A default KV cache this long at most (Llama 3's 131072 positions would take gigabytes a sequence)
DEFAULT_MAX_SEQ_LEN = 4096


@dataclass
class LlamaLayer:
    """One decoder block's weights, in the [in, out] layout (y = x @ W), copied once from transformers'
    nn.Linear weights ([out, in]); no biases."""
    attn_norm_w: torch.Tensor          # [C]                input_layernorm (RMSNorm)
    qkv_w: torch.Tensor                # [C, (H + 2·Hkv)·d] q_proj | k_proj | v_proj, each head d contiguous
    o_w: torch.Tensor                  # [H·d, C]           o_proj
    mlp_norm_w: torch.Tensor           # [C]                post_attention_layernorm (RMSNorm)
    gate_up_w: torch.Tensor            # [C, 2F]            gate_proj | up_proj
    down_w: torch.Tensor               # [F, C]             down_proj
    q_norm_w: torch.Tensor | None = None   # [d] Qwen 3's per-head RMSNorm of q (None: Llama)
    k_norm_w: torch.Tensor | None = None   # [d] and of k


def _rope_config(cfg) -> tuple[float, dict | None]:
    """(theta, scaling) from a config of any transformers version: 5.x keeps both in ``rope_parameters``
    (a dict with rope_theta and rope_type), older ones in ``rope_theta`` and ``rope_scaling``."""
    params = dict(getattr(cfg, "rope_parameters", None) or {})
    legacy = dict(getattr(cfg, "rope_scaling", None) or {})
    scaling = params or legacy
    theta = params.get("rope_theta", getattr(cfg, "rope_theta", None))
    if theta is None:
        theta = legacy.get("rope_theta", 10000.0)
    rope_type = scaling.get("rope_type", scaling.get("type", "default")) if scaling else "default"
    return float(theta), (None if rope_type == "default" else {**scaling, "rope_type": rope_type})


class LlamaEngine(GPT2Engine):
    """Llama 3 / Qwen 3 generation with a static KV cache, on the course's kernels (see the module docstring).
    Everything about requests (generate, stream, prefill's checks, sampling, EOS, CUDA graphs) is GPT2Engine's."""

    def __init__(self, layers: list[LlamaLayer], embed_w: torch.Tensor, lm_w: torch.Tensor, norm_w: torch.Tensor, *,
                 n_head: int, n_kv_head: int, head_dim: int, eps: float, inv_freq: torch.Tensor, max_batch: int,
                 max_seq_len: int, tuned: bool | None = None, **options):
        self.layers, self.embed_w, self.lm_w, self.norm_w = layers, embed_w, lm_w, norm_w
        self.n_layer, self.n_head, self.n_kv_head, self.head_dim, self.eps = len(layers), n_head, n_kv_head, head_dim, eps
        self.vocab_size, self.n_embd = embed_w.shape
        self.ffn = layers[0].down_w.shape[0] if layers else 0
        self.dtype, self.device = embed_w.dtype, embed_w.device
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        self.inv_freq = inv_freq
        self.cos, self.sin = rope_cache(inv_freq, max_seq_len, self.device)     # fp32 [S_max, d/2] each
        self.cache = KVCache(self.n_layer, max_batch, n_kv_head, head_dim, max_seq_len, self.dtype, self.device)
        self.batch = 0
        self._tf32 = False               # fp32 runs match transformers' fp32 token for token (see GPT2Engine)
        self._init_generation(max_batch)
        self.set_path(tuned, **options)

    def set_path(self, tuned: bool | None = None, **options) -> None:
        """The decode step's blocks on the core (``tuned=False``: your kernels as they are) or on the tuned path
        (True: tuned.TunedLlamaPath(self, **options), from assignments/a09_llama_inference/tuned.py). None: tuned
        for the reference engine (the solutions tree) where tuned.py exists, core otherwise. Drops the graphs."""
        if tuned is None:
            tuned = __package__.split(".")[0] == "solutions" and TUNED_FILE.exists()
        if options and not tuned:
            raise TypeError(f"{', '.join(sorted(options))}: options of the tuned path; pass tuned=True")
        if tuned and not TUNED_FILE.exists():
            raise ValueError(f"tuned=True: the tuned path ({TUNED_FILE.relative_to(REPO)}) is not "
                             "in this course tree; use tuned=False (the core path)")
        self.tuned = load_given(TUNED, "solutions").TunedLlamaPath(self, **options) if tuned else None
        self.pdl = self.tuned.pdl if self.tuned is not None else False
        self._graphs.clear()

    # ------------------------------------------------------------------ loading (given)
    @classmethod
    def from_hf(cls, model, *, dtype: torch.dtype | None = None, device: str | torch.device | None = None,
                max_batch: int = 1, max_seq_len: int | None = None, tuned: bool | None = None,
                **options) -> LlamaEngine:
        """Take the weights of a transformers ``LlamaForCausalLM`` or ``Qwen3ForCausalLM`` (random or pretrained).

        Any head count and GQA group, head_dim from the config (Qwen 3's is not hidden / heads), rope_theta
        and Llama 3's rope scaling, tied or untied embeddings, rms_norm_eps. Anything else (another
        architecture, biases, an activation other than SiLU, another RoPE type, sliding-window attention, a
        head dim over the attention kernels' maximum): ValueError naming it. dtype: fp32/fp16/bf16 (default:
        the model's); device: default ``common.DEVICE``; max_batch, max_seq_len: the KV cache's size
        (max_seq_len: default the model's max_position_embeddings, at most DEFAULT_MAX_SEQ_LEN). The weights
        are copied; the model is untouched. tuned, options: see :meth:`set_path`.
        """
        cfg = getattr(model, "config", None)
        model_type = getattr(cfg, "model_type", None)
        if model_type not in ARCHITECTURES or not hasattr(model, "model") or not hasattr(model, "lm_head"):
            hint = " (GPT-2: GPT2Engine, stage 8)" if model_type == "gpt2" else ""
            raise ValueError(f"from_hf: {type(model).__name__} (model_type={model_type!r}) is not supported{hint}; "
                             f"expected one of {', '.join(ARCHITECTURES.values())}")
        heads, kv_heads = cfg.num_attention_heads, getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        theta, scaling = _rope_config(cfg)
        problems = []
        if getattr(cfg, "hidden_act", "silu") != "silu":
            problems.append(f"hidden_act={cfg.hidden_act!r} (the MLP kernel computes SwiGLU: silu)")
        for flag in ("attention_bias", "mlp_bias"):
            if getattr(cfg, flag, False):
                problems.append(f"{flag}=True (the engine's GEMMs have no bias)")
        if getattr(cfg, "use_sliding_window", False) or any(t != "full_attention"
                                                            for t in getattr(cfg, "layer_types", None) or ()):
            problems.append("sliding-window attention (every layer must attend to the whole context)")
        if model_type == "llama" and getattr(cfg, "sliding_window", None):
            problems.append(f"sliding_window={cfg.sliding_window}")
        if heads % kv_heads:
            problems.append(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
        if head_dim > MAX_HEAD_DIM or head_dim % 2:
            problems.append(f"head_dim={head_dim}: the attention kernels take even head dims up to {MAX_HEAD_DIM}")
        if (scaling or {}).get("partial_rotary_factor", 1.0) != 1.0:
            problems.append(f"partial_rotary_factor={scaling['partial_rotary_factor']} (RoPE over the whole head)")
        if scaling is not None and scaling["rope_type"] != "llama3":
            problems.append(f"rope_type={scaling['rope_type']!r} (default and llama3 are supported)")
        if problems:
            raise ValueError(f"from_hf: this {model_type} config is not supported: {'; '.join(problems)}")
        inv_freq = rope_frequencies(head_dim, theta, scaling)
        m = model.model
        dtype = dtype or m.embed_tokens.weight.dtype
        if dtype not in FLOAT_DTYPES:
            raise TypeError(f"dtype: expected one of {FLOAT_DTYPES}, got {dtype}")
        device = device or DEVICE

        def w(t):                          # [out, in] nn.Linear weight(s) -> [in, out] contiguous
            return (torch.cat([x.detach() for x in t]) if isinstance(t, list) else t.detach()) \
                .to(device=device, dtype=dtype).t().contiguous()

        def vec(t):
            return t.detach().to(device=device, dtype=dtype).contiguous()

        layers = []
        for blk in m.layers:
            a, mlp = blk.self_attn, blk.mlp
            qn, kn = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
            layers.append(LlamaLayer(vec(blk.input_layernorm.weight), w([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]),
                                     w(a.o_proj.weight), vec(blk.post_attention_layernorm.weight),
                                     w([mlp.gate_proj.weight, mlp.up_proj.weight]), w(mlp.down_proj.weight),
                                     vec(qn.weight) if qn is not None else None, vec(kn.weight) if kn is not None else None))
        embed_w = vec(m.embed_tokens.weight)
        tied = model.lm_head.weight is m.embed_tokens.weight or \
            model.lm_head.weight.data_ptr() == m.embed_tokens.weight.data_ptr()
        lm_w = embed_w.t() if tied else vec(model.lm_head.weight).t()     # [C, V], a transposed view either way
        n_pos = getattr(cfg, "max_position_embeddings", DEFAULT_MAX_SEQ_LEN)
        if max_seq_len is not None and max_seq_len > n_pos:
            raise ValueError(f"max_seq_len={max_seq_len} exceeds the model's {n_pos} positions")
        return cls(layers, embed_w, lm_w, vec(m.norm.weight), n_head=heads, n_kv_head=kv_heads, head_dim=head_dim,
                   eps=cfg.rms_norm_eps, inv_freq=inv_freq, max_batch=max_batch,
                   max_seq_len=max_seq_len or min(n_pos, DEFAULT_MAX_SEQ_LEN), tuned=tuned, **options)

    # ------------------------------------------------------------------ building blocks (given)
    def linear(self, x: torch.Tensor, w: torch.Tensor, *, residual: torch.Tensor | None = None) -> torch.Tensor:
        """x @ w (+ residual): your a08 GEMV for at most GEMV_ROWS rows (a decode step's B tokens, the LM head
        of a batch's last tokens), the residual added in its epilogue; the a06 matmul otherwise (IEEE fp32 dots
        for fp32), the residual added after it. The choice depends on the shape only (a captured step never
        changes)."""
        if self.tuned is not None:
            return self.tuned.linear(x, w, residual=residual)
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if 0 < rows <= GEMV_ROWS:
            return gemv(x, w, residual=residual)
        y = matmul(x, w, allow_tf32=self._tf32, config=_INTERPRETER_TILES)
        return y if residual is None else y + residual

    def qkv_rope(self, h: torch.Tensor, norm_w: torch.Tensor, w: torch.Tensor,
                 kv_cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor], *, q_norm: torch.Tensor | None = None,
                 k_norm: torch.Tensor | None = None) -> torch.Tensor:
        """The attention's input for one token per sequence: qkv [B, (H + 2·Hkv)·d] = RMSNorm(h) @ w, its q and k
        heads rotated at position start[b] (after q_norm / k_norm, Qwen 3), k and v appended to the caches at slot
        start[b]. h: [B, C] the residual stream; kv_cache = (k_cache, v_cache [B, Hkv, S_max, d], start int32 [B]).
        Your rmsnorm, the GEMV, your apply_rope, your write_kv; the tuned path fuses them."""
        if self.tuned is not None:
            return self.tuned.qkv_rope(h, norm_w, w, kv_cache, q_norm=q_norm, k_norm=k_norm)
        k_cache, v_cache, start = kv_cache
        qkv = self.linear(rmsnorm(h, norm_w, self.eps), w)
        rows = qkv.view(qkv.shape[0], 1, qkv.shape[-1])
        apply_rope(rows, self.cos, self.sin, start, self.n_head, self.n_kv_head, q_norm=q_norm, k_norm=k_norm,
                   eps=self.eps)
        write_kv(rows[..., (self.n_head - self.n_kv_head) * self.head_dim:], k_cache, v_cache, start)
        return qkv

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Attention of one query per (sequence, head) q [B, H, d] over lengths[b] cached keys: [B, H, d] (your
        gqa_decode_attention)."""
        if self.tuned is not None:
            return self.tuned.attend(q, k_cache, v_cache, lengths)
        return gqa_decode_attention(q, k_cache, v_cache, lengths, pdl=self.pdl)

    def norm_gate_up(self, h: torch.Tensor, norm_w: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """The MLP's first half: swiglu(RMSNorm(h) @ w) [B, F], w = [gate | up] [C, 2F] (one GEMV for both)."""
        if self.tuned is not None:
            return self.tuned.norm_gate_up(h, norm_w, w)
        return swiglu(self.linear(rmsnorm(h, norm_w, self.eps), w))

    def embed(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(hid, new_lengths) for one token per sequence: hid [B, C] = embed_w[tokens] (no position table: the
        position enters through RoPE), new_lengths = lengths + 1 (int32 [B])."""
        if self.tuned is not None:
            return self.tuned.embed(tokens, lengths)
        return self.embed_w[tokens], lengths + 1

    def norm(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """RMSNorm(h) with weight w (the final norm before the LM head)."""
        if self.tuned is not None:
            return self.tuned.norm(h, w)
        return rmsnorm(h, w, self.eps, pdl=self.pdl)

    def lm_head(self, y: torch.Tensor) -> torch.Tensor:
        """Logits [..., vocab] = y @ lm_w (tied: the token embedding read as a transposed view; untied: lm_head's)."""
        return self.linear(y, self.lm_w)

    def next_norm(self, i: int) -> torch.Tensor:
        """The RMSNorm that follows block i's MLP: block i+1's input norm, or the final norm after the last."""
        return self.layers[i + 1].attn_norm_w if i + 1 < self.n_layer else self.norm_w

    @property
    def kv_bytes_per_token(self) -> int:
        return KVCache.bytes_per_token(self.n_layer, self.n_kv_head, self.head_dim, self.dtype)

    # ------------------------------------------------------------------ prefill (given)
    def _prompt_forward(self, ids: torch.Tensor, last: torch.Tensor | None = None) -> torch.Tensor:
        """The forward pass over [B, T] prompt tokens; writes K and V of positions 0..T-1 to the cache. Returns the
        final norm's output [B, T, C], or with ``last`` (int64 [B], device) the logits [B, vocab] at position
        last[b] of each sequence. No host sync: it can be captured in a CUDA graph (GPT2Engine.prefill calls it)."""
        b, t = ids.shape
        h, hkv, d = self.n_head, self.n_kv_head, self.head_dim
        cache = self.cache
        zeros = torch.zeros(b, dtype=torch.int32, device=self.device)
        hid = self.embed_w[ids]                                           # [B, T, C] the residual stream
        y = rmsnorm(hid, self.layers[0].attn_norm_w, self.eps)
        for i, layer in enumerate(self.layers):
            qkv = self.linear(y, layer.qkv_w)                             # [B, T, (H + 2·Hkv)·d]
            apply_rope(qkv, self.cos, self.sin, zeros, h, hkv, q_norm=layer.q_norm_w, k_norm=layer.k_norm_w,
                       eps=self.eps)
            write_kv(qkv[..., (h - hkv) * d:], cache.k[i, :b], cache.v[i, :b], zeros)
            q = rearrange(qkv[..., :h * d], "b t (h d) -> b h t d", h=h)  # a strided view
            att = gqa_prefill_attention(q, cache.k[i, :b, :, :t], cache.v[i, :b, :, :t], allow_tf32=self._tf32)
            a = self.linear(rearrange(att, "b h t d -> b t (h d)"), layer.o_w)
            hid, y = add_rmsnorm(a, hid, layer.mlp_norm_w, self.eps)
            m = swiglu(self.linear(y, layer.gate_up_w))
            hid, y = add_rmsnorm(self.linear(m, layer.down_w), hid, self.next_norm(i), self.eps)
        if last is None:
            return y
        return self.lm_head(y[torch.arange(b, device=self.device), last])

    # ------------------------------------------------------------------ decode (YOUR WORK)
    def decode_step(self, tokens: torch.Tensor) -> torch.Tensor:
        """One decode step for the batch that :meth:`prefill` started: logits [B, vocab].

        tokens: int64 [B] on the device, the newest token of each sequence (not yet in the cache). As
        GPT2Engine.decode_step: sequence b's new token sits at position ``cache.lengths[b]``; its K and V go to
        the cache at that slot; it attends over lengths[b] + 1 keys; advance ``self.cache.lengths`` by one on the
        device before returning. No host synchronisation, no allocation that depends on values (the step is
        captured in a CUDA graph). Every kernel through the building blocks above (the tuned path's too).
        """
        # TODO(a09): the decode step. Follow _prompt_forward() above with ONE token per sequence, through the
        #   decode blocks (given, above): embed, qkv_rope, attend, linear(..., residual=), norm_gate_up, norm.
        #   b = self.batch; lengths = self.cache.lengths[:b] (device, int32): the new token's position;
        #   hid, new_lengths = self.embed(tokens, lengths): the residual stream [B, C], and lengths + 1;
        #   per layer i: the caches k = self.cache.k[i, :b], v = self.cache.v[i, :b] ([B, Hkv, S_max, d]);
        #   qkv = self.qkv_rope(hid, layer.attn_norm_w, layer.qkv_w, (k, v, lengths), q_norm=layer.q_norm_w,
        #   k_norm=layer.k_norm_w) [B, (H + 2·Hkv)·d] (RMSNorm, one GEMV for q|k|v, RoPE, K and V appended);
        #   q = the first H·d columns as [B, H, d]; att = self.attend(q, k, v, new_lengths);
        #   hid = self.linear(att as [B, H·d], layer.o_w, residual=hid);
        #   m = self.norm_gate_up(hid, layer.mlp_norm_w, layer.gate_up_w); hid = self.linear(m, layer.down_w,
        #   residual=hid). After the last layer: copy new_lengths into lengths (in place), and return
        #   self.lm_head(self.norm(hid, self.norm_w)).
        raise NotImplementedError("a09: write LlamaEngine.decode_step")
