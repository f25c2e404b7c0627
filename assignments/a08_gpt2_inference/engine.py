"""Assignment 8, the capstone: GPT-2 inference on your own kernels, against transformers.

    from transformers import GPT2LMHeadModel
    from assignments.a08_gpt2_inference.engine import GPT2Engine
    hf = GPT2LMHeadModel.from_pretrained("gpt2")            # or GPT2LMHeadModel(GPT2Config(...))
    engine = GPT2Engine.from_hf(hf, dtype=torch.bfloat16, max_batch=8, max_seq_len=1024)
    new_tokens = engine.generate([prompt_a, prompt_b], max_new_tokens=64)   # greedy, [B, 64]
    engine.generate(prompts, 64, do_sample=True, temperature=0.8, top_k=50, top_p=0.95, seed=0,
                    eos_token_id=50256)                      # sampled on the GPU; each sequence stops at EOS
    for step in engine.stream(prompts, 64):                   # each step's new tokens [B], on the host
        ...

Inference has two phases, and they want different kernels:

* **prefill**: the whole prompt at once, T tokens per sequence. Every matmul has
  B·T rows: compute-bound, the stage-6 tiled matmul and the stage-7 flash attention
  are the right tools. Prefill also writes every prompt token's K and V into the cache.
* **decode**: ONE new token per sequence per step. A matmul has B rows, so it reads
  each weight once to do a few FLOPs per byte: memory-bound (the roofline is "read
  every weight and the whole cache once per step"). Attention is one query against
  the cache: the flash-decoding kernel (decode_attention.py). And at batch 1 the GPU
  work per step is tens of microseconds spread over ~100 kernels, so launching them
  from Python costs more than running them: the step is captured in a CUDA graph once
  and replayed (``generate(..., cuda_graph=True)``, the default on a GPU).

The engine is built only from the course's kernels, each loaded from the SAME tree
as this file (your a06 matmul and a07 flash attention when you work in assignments/).
Every GEMM goes through :meth:`GPT2Engine.linear` (or :meth:`GPT2Engine.ln_linear`, a LayerNorm and
the GEMM after it): the a06 matmul for prefill (B·T rows), the a08 GEMV for a decode step (B <= 16
rows: a weight read, see gemv.py):

  prefill, per block                                     decode, per block (B rows)
  h, y = add_layernorm(attn_out, h, ln_1)  kernel 1      qkv = ln_linear(h, ln_1, W_attn, kv_cache=...)  gemv, the
  qkv  = linear(y, W_attn, b_attn)         a06 matmul          LayerNorm folded in (gemv.fold_layernorm) and K, V
  write_kv(qkv -> cache)                   kernel 3            written to the cache at lengths in its epilogue
  flash attention forward, causal          a07 kernel 1  decode_attention(q, cache, lengths + 1)  kernel 2
  a    = linear(attn, W_proj, b_proj)                    h = linear(attn, W_proj, residual=h)  residual in the epilogue
  h, y = add_layernorm(a, h, ln_2)                       m = ln_linear(h, ln_2, W_fc, "gelu_tanh")
  m    = linear(y, W_fc, b_fc, "gelu_tanh") GELU epilogue
  m    = linear(m, W_fc_proj, b_fc_proj)                 h = linear(m, W_fc_proj, residual=h)
  LM head  logits = linear(ln_f(h), wteᵀ)  tied weights, no copy (B rows: gemv, after the LayerNorm kernel)

A decode block is 6 kernels (the prefill's order, unfused, would be 9; 7 at GPT-2 large and XL, where
one LayerNorm of the two stays a kernel: gemv.fold_pays): at batch 1 a decode step is
launch- and ramp-bound, and each kernel removed is a few microseconds of idle bandwidth (lecture 8, §7).

The decode GEMV reads each block weight from a K-MAJOR copy made once at load (stage 2's lesson
again: transpose once, not per call): GPT-2 stores W [in, out] with out contiguous, and a GEMV of
one row streams W fastest when each output's K weights are one contiguous run of memory (gemv.py,
choose_config). The copy doubles the block weights' memory (GPT-2 XL in bf16: +2.9 GB); prefill's
a06 matmul keeps the stored layout, where its tiles run fastest.
``GPT2Engine(..., decode_gemv=False)`` sends the few-row GEMMs to the a06 matmul too, with no copy
and nothing folded: the LayerNorm kernel before it and a PyTorch add after it where the GEMV fuses
them (the engine before the GEMV, for before/after measurements); ``fuse_epilogues=False`` keeps the GEMV but
runs each LayerNorm as its own kernel before it and write_kv after c_attn (9 kernels a block instead
of 6, for before/after). ``pdl`` (default: on where the GPU supports it,
sm_90+, unless the environment sets ``COURSE_PDL=0``) launches the decode step's a08 kernels with
programmatic dependent launch, so each one's launch overlaps the tail of the one before
(gemv.PDL_NOTES); under the CPU interpreter it is always off.

Batches of prompts with different lengths are right-padded to the longest: causal
attention keeps every real token from seeing the padding after it, each sequence's
logits are read at its own last token, and from then on ``lengths[b]`` tells decode
attention how many cache positions of sequence b are real. Generation is greedy, or sampled
(``do_sample``: temperature, top-k, top-p, a seed; sampling.py, inside the captured step);
with ``eos_token_id`` each sequence stops at its end-of-sequence token (later steps give it the
pad id) and generate() returns once all have stopped; stream() yields each step's tokens.
Token ids are checked (range, integer dtype) before any kernel runs.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from einops import rearrange

from common import DEVICE, TRITON_INTERPRET, pdl_supported
from common.checks import FLOAT_DTYPES
from common.launch import fast, next_power_of_2

from ..a06_matmul.matmul_triton import matmul
from ..a07_flash_attention.flash_triton import attention_forward
from .decode_attention import MAX_HEAD_DIM, decode_attention
from .gemv import MAX_ROWS as GEMV_ROWS
from .gemv import fold_layernorm, fold_pays, gemv, sm_count
from .kv_cache import KVCache, write_kv
from .layernorm import add_layernorm, layernorm
from .sampling import WIDE_TOP_K, SamplingParams, argmax, sample


#: Under the CPU interpreter every program costs milliseconds of Python: wide tiles, few programs.
#: On a GPU: None, the a06 autotuner picks tiles per (M, N, K).
_INTERPRETER_TILES = (16, 256, 64, 4, 1) if TRITON_INTERPRET else None


def resolve_pdl(pdl: bool | None, device: torch.device) -> bool:
    """Whether the engine's kernels launch with programmatic dependent launch: ``pdl`` if given,
    else on unless the environment sets COURSE_PDL=0; never where the device cannot (before sm_90,
    the CPU interpreter: common.pdl_supported)."""
    want = (os.environ.get("COURSE_PDL", "1") != "0") if pdl is None else bool(pdl)
    return want and pdl_supported(device)


@triton.jit
def _embed_kernel(TOKENS, LENGTHS, WTE, WPE, H, NEW_LENGTHS, C, BLOCK_C: tl.constexpr, USE_PDL: tl.constexpr):
    """Given. Program b: H[b] = WTE[TOKENS[b]] + WPE[LENGTHS[b]] (fp32, rounded once: what the residual stream
    holds), and NEW_LENGTHS[b] = LENGTHS[b] + 1. The decode step's first kernel: PyTorch's two gathers, its
    add and its ``lengths + 1`` were four kernels (GPT-2 small on the H100: ~10 us a step, outside the PDL
    chain). The ids were checked on the host before the step ran (GPT2Engine._check_token_range)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    tok = tl.load(TOKENS + b).to(tl.int64)
    pos = tl.load(LENGTHS + b)
    cols = tl.arange(0, BLOCK_C)
    ok = cols < C
    h = tl.load(WTE + tok * C + cols, mask=ok, other=0.0).to(tl.float32)
    h += tl.load(WPE + pos.to(tl.int64) * C + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(H + b.to(tl.int64) * C + cols, h.to(H.dtype.element_ty), mask=ok)
    tl.store(NEW_LENGTHS + b, pos + 1)


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


def _check_integer(ids: torch.Tensor, name: str) -> None:
    """TypeError unless ``ids`` holds integers (bool and floating-point ids are refused, never rounded)."""
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"{name}: token ids must be integers, got a tensor of {ids.dtype}")


class GPT2Engine:
    """Greedy GPT-2 generation with a static KV cache, on the course's kernels."""

    def __init__(self, layers: list[Layer], wte: torch.Tensor, wpe: torch.Tensor, ln_f_w: torch.Tensor,
                 ln_f_b: torch.Tensor, *, n_head: int, eps: float, max_batch: int, max_seq_len: int,
                 decode_gemv: bool = True, pdl: bool | None = None, fuse_epilogues: bool = True):
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
        self._graphs: dict = {}            # decode: (B, mode) -> graph; prefill: ("prefill", B, T)
        # fp32 runs compare token for token with transformers' fp32 (cuBLAS without TF32): keep
        # every dot in IEEE fp32 then. 16-bit inputs use the tensor cores as usual.
        self._tf32 = False
        #: GEMMs of at most GEMV_ROWS rows (a decode step) run on the a08 GEMV; False: on the a06 matmul
        self.decode_gemv = decode_gemv
        #: decode path: fold each LayerNorm into the GEMV after it and write K, V in c_attn's GEMV epilogue
        #: (:meth:`ln_linear`); False: LayerNorm and write_kv kernels (3 more kernels a block, for before/after)
        self.fuse_epilogues = fuse_epilogues
        self._k_major: dict[int, torch.Tensor] = {}
        self._folded: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.prepare_decode_weights()
        #: programmatic dependent launch for the decode step's a08 kernels (gemv.PDL_NOTES)
        self.pdl = resolve_pdl(pdl, self.device)
        # generation state the captured steps read (device buffers: a replay picks up new values)
        self._seed = torch.zeros(1, dtype=torch.long, device=self.device)          # sampling's Philox key
        self._params = SamplingParams().tensor(self.device)                        # temperature, top_k, top_p
        self._done = torch.zeros(max_batch, dtype=torch.bool, device=self.device)  # sequence ended (EOS)
        self._eos = torch.full((self.MAX_EOS,), -1, dtype=torch.long, device=self.device)
        self._pad_id = torch.zeros((), dtype=torch.long, device=self.device)

    # ------------------------------------------------------------------ loading (given)
    @classmethod
    def from_hf(cls, model, *, dtype: torch.dtype | None = None, device: str | torch.device | None = None,
                max_batch: int = 1, max_seq_len: int | None = None, decode_gemv: bool = True,
                pdl: bool | None = None, fuse_epilogues: bool = True) -> GPT2Engine:
        """Take the weights of a transformers ``GPT2LMHeadModel`` (any size, random or pretrained).

        dtype: fp32/fp16/bf16 (default: the model's); device: default the kernel device
        (``common.DEVICE``); max_batch, max_seq_len: the KV cache's size (max_seq_len
        defaults to the model's n_positions). The weights are copied; the model is untouched.
        decode_gemv, pdl, fuse_epilogues: see the module docstring.
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
                   max_seq_len=max_seq_len or cfg.n_positions, decode_gemv=decode_gemv, pdl=pdl,
                   fuse_epilogues=fuse_epilogues)

    # ------------------------------------------------------------------ building blocks (given)
    def prepare_decode_weights(self) -> None:
        """The decode GEMV's copies of the block weights, made once (again after decode_gemv or fuse_epilogues
        changes): ``_k_major``, a K-MAJOR copy of a weight by the id of the stored [K, N] weight (the
        copy's .t() is contiguous, so the copy is a [K, N] view with K-stride 1: module docstring);
        ``_folded``, for c_attn and c_fc with fuse_epilogues in 16 bits where the fold pays at one row
        (:meth:`_fold_pays`: n_embd <= 1024, GPT-2 small and medium; at large and XL where the GEMV's grid fits one
        wave, XL's c_attn and large's c_fc), that copy with the LayerNorm before it folded in
        (gemv.fold_layernorm: (w_f, bias_f, colsum)); the plain copy too where a batch may have rows the fold
        does not pay for. Nothing without decode_gemv."""
        self._k_major.clear()
        self._folded.clear()
        if not self.decode_gemv:
            return
        # see ln_linear: 16 bits, and rows short enough for the GEMV to take their statistics cheaply
        fold_on = self.fuse_epilogues and self.dtype != torch.float32
        for layer in self.layers:
            for w in (layer.proj_w, layer.fc_proj_w):
                self._k_major[id(w)] = w.t().contiguous().t()
            for g, be, w, bias in ((layer.ln_1_w, layer.ln_1_b, layer.attn_w, layer.attn_b),
                                   (layer.ln_2_w, layer.ln_2_b, layer.fc_w, layer.fc_b)):
                fold = fold_on and self._fold_pays(1, w)
                if fold:
                    self._folded[id(w)] = fold_layernorm(g, be, w.t().contiguous().t(), bias)
                if not fold or not self._fold_pays(min(self.max_batch, GEMV_ROWS), w):   # (it pays at fewer rows if
                    self._k_major[id(w)] = w.t().contiguous().t()     # at more) the plain copy, for rows without it

    def _fold_pays(self, rows: int, w: torch.Tensor) -> bool:
        """gemv.fold_pays for ``rows`` rows times the stored weight w [K, N] on this engine's GPU."""
        return fold_pays(rows, w.shape[0], w.shape[1], sm_count(self.device), self.dtype)

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None,
               activation: str | None = None, *, residual: torch.Tensor | None = None) -> torch.Tensor:
        """act(x @ w + b) (+ residual): the a08 GEMV for at most GEMV_ROWS rows (a decode step's B
        tokens, a batch's last-token LM head), with the residual added in its epilogue; the a06
        Triton matmul otherwise (IEEE fp32 dots for fp32, see __init__), and the residual added
        after it. The choice depends on the shape only, so a captured step never changes."""
        if self._gemv_rows(x):
            return gemv(x, self._k_major.get(id(w), w), b, activation, residual=residual, pdl=self.pdl)
        y = matmul(x, w, b, activation, allow_tf32=self._tf32, config=_INTERPRETER_TILES)
        return y if residual is None else y + residual

    def ln_linear(self, h: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor, w: torch.Tensor,
                  b: torch.Tensor | None = None, activation: str | None = None, *,
                  kv_cache: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """act(LayerNorm(h) @ w + b), the LayerNorm (ln_w, ln_b, self.eps) before c_attn or c_fc.
        ``kv_cache`` = (k_cache, v_cache, start), for c_attn of one token per sequence: also append the
        output's k and v to the caches at position start[b] (write_kv's work).

        On the GEMV path (decode) with fuse_epilogues: ONE kernel in 16 bits where it pays (:meth:`_fold_pays`:
        1-2 rows of n_embd <= 1024; one row of up to 2048 where the GEMV fits one wave), the GEMV with the LayerNorm folded in (gemv.fold_layernorm: γ and β in
        the weight and bias, made at load; the row statistics in the GEMV's epilogue) and the cache write
        in its epilogue; else the LayerNorm kernel, then that GEMV. Not in fp32: the fold reassociates the
        LayerNorm's arithmetic, far below a 16-bit rounding, but in fp32, where the engine gives
        transformers' tokens, it can flip a near tie. Without the GEMV: the a08 LayerNorm kernel,
        :meth:`linear`, and write_kv."""
        on_gemv = self._gemv_rows(h)
        folded = self._folded.get(id(w)) if on_gemv and self._fold_pays(h.numel() // h.shape[-1], w) else None
        fused_kv = kv_cache if on_gemv and self.fuse_epilogues else None
        if folded is not None:
            w_f, b_f, colsum = folded
            y = gemv(h, w_f, b_f, activation, ln_colsum=colsum, eps=self.eps, kv_cache=fused_kv, pdl=self.pdl)
        elif on_gemv:
            y = gemv(layernorm(h, ln_w, ln_b, self.eps, pdl=self.pdl), self._k_major.get(id(w), w), b, activation,
                     kv_cache=fused_kv, pdl=self.pdl)
        else:
            y = self.linear(layernorm(h, ln_w, ln_b, self.eps, pdl=self.pdl), w, b, activation)
        if kv_cache is not None and fused_kv is None:
            write_kv(y.view(y.shape[0], 1, y.shape[-1]), *kv_cache, pdl=self.pdl)
        return y

    def embed(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(hid, new_lengths) for one token per sequence: hid [B, C] = wte[tokens] + wpe[lengths] (the residual
        stream), new_lengths = lengths + 1 (int32 [B]); one kernel (_embed_kernel). tokens: int64 [B] on the
        device (in range: checked where they come from), lengths: int32 [B]."""
        b = tokens.shape[0]
        hid = torch.empty((b, self.n_embd), dtype=self.dtype, device=self.device)
        new_lengths = torch.empty_like(lengths)
        if b:
            fast(_embed_kernel)[(b,)](tokens, lengths, self.wte, self.wpe, hid, new_lengths, self.n_embd,
                                      BLOCK_C=next_power_of_2(self.n_embd), USE_PDL=self.pdl,
                                      num_warps=4, **(dict(launch_pdl=True) if self.pdl else {}))
        return hid, new_lengths

    def _gemv_rows(self, x: torch.Tensor) -> bool:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        return self.decode_gemv and 0 < rows <= GEMV_ROWS

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

    # ------------------------------------------------------------------ prefill (given)
    def prefill(self, ids: torch.Tensor, lengths: Sequence[int] | None = None, *,
                all_logits: bool = False, cuda_graph: bool = False) -> torch.Tensor:
        """Run the prompts, fill the KV cache, and return the logits that pick the first new token.

        ids: int64 [B, T] on the engine's device, right-padded (any valid token id after a
        sequence's end); every id in [0, vocab_size), else ValueError (one check per call, before
        any kernel runs); lengths: each prompt's real length (default: all T). Starts a new
        batch: the cache's old contents are forgotten. Returns [B, vocab], the logits at each
        sequence's last real token; ``all_logits=True``: [B, T, vocab] at every position
        (padding positions hold garbage). ``cuda_graph=True`` (what generate() does on a GPU)
        replays a short prompt's forward pass from a CUDA graph, see :meth:`_prefill_graphed`.
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

    #: Prompts of up to this many tokens (B · padded T) are prefilled by CUDA-graph replay.
    GRAPH_PREFILL_TOKENS = 4096

    def _prompt_forward(self, ids: torch.Tensor, last: torch.Tensor | None = None) -> torch.Tensor:
        """The forward pass over [B, T] prompt tokens; writes K and V of positions 0..T-1 to the cache.

        Returns the final LayerNorm's output [B, T, C], or with ``last`` (int64 [B], device)
        the logits [B, vocab] at position last[b] of each sequence. Nothing here reads a value
        back to the host, so it can be captured in a CUDA graph.
        """
        b, t = ids.shape
        c, h, d = self.n_embd, self.n_head, self.head_dim
        cache = self.cache
        zeros = torch.zeros(b, dtype=torch.int32, device=self.device)
        x = self.wte[ids]                                             # [B, T, C] token embeddings
        pos = self.wpe[:t].expand(b, t, c)                            # position embeddings
        hid, y = add_layernorm(x, pos, self.layers[0].ln_1_w, self.layers[0].ln_1_b, self.eps)
        for i, layer in enumerate(self.layers):
            qkv = self.linear(y, layer.attn_w, layer.attn_b)          # [B, T, 3C]
            write_kv(qkv, cache.k[i, :b], cache.v[i, :b], zeros)
            q, k, v = rearrange(qkv, "b t (three h d) -> three b h t d", three=3, h=h)  # strided views
            att, _ = attention_forward(q, k, v, True, allow_tf32=self._tf32)
            att = self.linear(att.transpose(1, 2).reshape(b, t, c), layer.proj_w, layer.proj_b)
            hid, y = add_layernorm(att, hid, layer.ln_2_w, layer.ln_2_b, self.eps)
            m = self.linear(y, layer.fc_w, layer.fc_b, "gelu_tanh")
            m = self.linear(m, layer.fc_proj_w, layer.fc_proj_b)
            hid, y = add_layernorm(m, hid, *self.next_ln(i), self.eps)
        if last is None:
            return y
        return self.lm_head(y[torch.arange(b, device=self.device), last])

    def _bucket(self, t: int) -> int:
        """Prompt length padded to a multiple of 64 (fewer graphs), at most max_seq_len."""
        return min(-(-t // 64) * 64, self.max_seq_len)

    def _prefill_graphed(self, ids: torch.Tensor, b: int, t: int) -> torch.Tensor:
        """Prefill by CUDA-graph replay, one graph per (B, padded T).

        A short prompt's prefill is ~10 kernels per block that each run for microseconds:
        issuing them from Python costs more than running them (lecture 08 measures it).
        The prompt is right-padded to the bucket's length with token 0: causal attention keeps
        every real token from seeing the padding, and the cache slots the padding writes lie
        past ``lengths`` (decode overwrites them). The first prompt of a bucket runs eagerly
        (compiles, autotunes) and is then captured; later ones copy their ids in and replay.
        """
        tp = self._bucket(t)
        key = ("prefill", b, tp)
        if key not in self._graphs:
            static_ids = torch.zeros(b, tp, dtype=torch.long, device=self.device)
            static_last = torch.zeros(b, dtype=torch.long, device=self.device)
            static_ids[:, :t] = ids
            static_last.copy_(self.cache.lengths[:b])
            static_last -= 1
            out = self._prompt_forward(static_ids, static_last)     # eager: compile and tune first
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_out = self._prompt_forward(static_ids, static_last)
            self._graphs[key] = (graph, static_ids, static_last, static_out)
            return out
        graph, static_ids, static_last, static_out = self._graphs[key]
        static_ids[:, t:] = 0
        static_ids[:, :t] = ids
        static_last.copy_(self.cache.lengths[:b])
        static_last -= 1
        graph.replay()
        return static_out

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
        raise NotImplementedError("a08: write GPT2Engine.decode_step")

    # ------------------------------------------------------------------ generation (given)
    #: The mode of a plain generate(): greedy, no EOS, no top-p, no wide top-k (the decode graph's key is
    #: (B, mode))
    GREEDY = (False, False, False, False)
    #: At most this many end-of-sequence ids (transformers takes a list)
    MAX_EOS = 8
    #: generate() looks on the host whether every sequence has ended once per this many steps
    CHECK_EVERY = 8

    def generate(self, prompts, max_new_tokens: int, *, cuda_graph: bool | None = None, do_sample: bool = False,
                 temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0, seed: int | None = None,
                 generator: torch.Generator | None = None, eos_token_id: int | Sequence[int] | None = None,
                 pad_token_id: int | None = None, check_every: int | None = None) -> torch.Tensor:
        """Generate up to ``max_new_tokens`` tokens per prompt: int64 [B, n] on the device, n <= max_new_tokens.

        prompts: a list of 1-D token-id sequences (lists or tensors, lengths may differ) or an
        int64 [B, T] tensor (all length T). cuda_graph (default: on a GPU) captures the decode
        step once per batch size and kind of step and replays it, and replays short prompts' prefill
        from a graph per (B, padded T); False runs both eagerly (the profile's "before").

        Greedy by default. ``do_sample=True`` draws each token on the GPU (sampling.py, inside the
        captured step) after transformers' filters: ``temperature``, ``top_k`` (0: off), ``top_p``
        (1: off); the random stream is keyed by ``seed`` (or a draw from ``generator``, or from
        torch's global generator) and by each token's sequence and position: same seed, same tokens.

        ``eos_token_id`` (an id or a list): a sequence that produces it has ended; its later tokens
        are ``pad_token_id`` (default: the first eos id), and generation returns once every sequence
        has ended (looked at on the host every ``check_every`` steps, default CHECK_EVERY: a sync each
        time), n = the longest sequence's length, EOS included, as transformers returns it.
        """
        b, use_graph, mode, tok = self._begin(prompts, max_new_tokens, cuda_graph, do_sample, temperature, top_k,
                                              top_p, seed, generator, eos_token_id, pad_token_id)
        every = self.CHECK_EVERY if check_every is None else check_every
        if every < 1:
            raise ValueError(f"check_every: expected >= 1, got {every}")
        out = torch.empty(b, max_new_tokens, dtype=torch.long, device=self.device)
        out[:, 0] = tok
        n = max_new_tokens
        for i in range(1, max_new_tokens):
            if mode[1] and i % every == 0 and bool(self._done[:b].all()):   # a host sync, every few steps
                n = i
                break
            tok = self._step(i, b, use_graph, mode, tok)
            out[:, i] = tok
        out = out[:, :n]
        if mode[1]:              # cut the steps run after the last sequence ended (one sync)
            hit = (out[:, :, None] == self._eos).any(-1)
            ends = torch.where(hit.any(1), hit.int().argmax(1) + 1, n)
            out = out[:, :int(ends.max())]
        return out

    def stream(self, prompts, max_new_tokens: int, **options) -> Iterator[torch.Tensor]:
        """generate() one step at a time: yields each step's new tokens, int64 [B] on the host, as soon
        as they exist (a host sync per step), until max_new_tokens or every sequence has ended. The same
        options and the same tokens as :meth:`generate` (``check_every`` does not apply). The prompts are
        checked and prefilled at the call; the engine's cache is the stream's until it ends."""
        options.pop("check_every", None)
        b, use_graph, mode, tok = self._begin(prompts, max_new_tokens, options.pop("cuda_graph", None), **options)
        return self._stream(b, use_graph, mode, tok, max_new_tokens)

    def _stream(self, b, use_graph, mode, tok, max_new_tokens) -> Iterator[torch.Tensor]:
        eos = set(self._eos.tolist()) - {-1}
        ended = [False] * b
        for i in range(max_new_tokens):
            if i:
                tok = self._step(i, b, use_graph, mode, tok)
            host = tok.cpu()
            yield host
            ended = [e or t in eos for e, t in zip(ended, host.tolist())]
            if eos and all(ended):
                return

    def _begin(self, prompts, max_new_tokens, cuda_graph=None, do_sample=False, temperature=1.0, top_k=0, top_p=1.0,
               seed=None, generator=None, eos_token_id=None, pad_token_id=None):
        """Check the request, set the sampling and EOS buffers, prefill: (B, use_graph, mode, first tokens)."""
        ids, lengths = self.pad(prompts)
        b = len(lengths)
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: expected an int >= 1, got {max_new_tokens!r}")
        if max(lengths) + max_new_tokens - 1 > self.max_seq_len:
            raise ValueError(f"a prompt of {max(lengths)} tokens + {max_new_tokens} new ones needs "
                             f"{max(lengths) + max_new_tokens - 1} cache positions; max_seq_len is {self.max_seq_len}")
        use_graph = (self.device.type == "cuda") if cuda_graph is None else cuda_graph
        if use_graph and self.device.type != "cuda":
            raise ValueError(f"generate(cuda_graph=True): CUDA graphs need a CUDA device; this engine is on {self.device}")
        if do_sample:
            params = SamplingParams(temperature, top_k, top_p)       # checks them
            if generator is not None:
                seed = int(torch.randint(0, 2**62, (1,), generator=generator))
            elif seed is None:
                seed = int(torch.randint(0, 2**62, (1,)))
            elif not isinstance(seed, int):
                raise TypeError(f"seed: expected an int, got {type(seed).__name__}")
            self._params.copy_(params.tensor("cpu"))
            self._seed.fill_(seed)
        eos = [] if eos_token_id is None else [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
        if eos_token_id is not None:
            if not eos or len(eos) > self.MAX_EOS or not all(isinstance(e, int) and 0 <= e < self.vocab_size for e in eos):
                raise ValueError(f"eos_token_id: expected 1 to {self.MAX_EOS} ids in [0, {self.vocab_size}), got {eos_token_id!r}")
            pad = eos[0] if pad_token_id is None else pad_token_id
            if not isinstance(pad, int) or not 0 <= pad < self.vocab_size:
                raise ValueError(f"pad_token_id: expected an id in [0, {self.vocab_size}), got {pad!r}")
            self._eos.copy_(torch.tensor(eos + [-1] * (self.MAX_EOS - len(eos))))
            self._pad_id.fill_(pad)
            self._done[:b] = False
        else:
            self._eos.fill_(-1)
        mode = self.mode(do_sample, eos_token_id is not None, top_k, top_p)
        tok = self._next_token(self.prefill(ids, lengths, cuda_graph=use_graph), b, mode)
        return b, use_graph, mode, tok

    def mode(self, do_sample: bool, eos: bool, top_k: int = 0, top_p: float = 1.0) -> tuple[bool, bool, bool, bool]:
        """What a generate() call's decode graph depends on (its key is (B, mode)): (sampled, with EOS,
        with kernels C+D: top-p without top-k, for with top-k on sampling.py never needs them, wide top-k)."""
        do_sample = bool(do_sample)
        return (do_sample, bool(eos), do_sample and top_p < 1 and not 0 < top_k < self.vocab_size,
                do_sample and top_k > WIDE_TOP_K)

    def _next_token(self, logits: torch.Tensor, b: int, mode: tuple[bool, bool, bool, bool]) -> torch.Tensor:
        """The next token of each sequence from its logits [B, vocab]: greedy (argmax) or sampled (the
        position it takes keys the random stream); with EOS, ended sequences get the pad id. Device
        work only: it is part of the captured decode step."""
        do_sample, eos, nucleus, wide = mode
        if do_sample:      # without top-p, one kernel fewer (sample's nucleus_pass); a large top-k: wide
            tok = sample(logits, self._params, self._seed, self.cache.lengths[:b], nucleus_pass=nucleus, wide=wide,
                         pdl=self.pdl)
        elif logits.is_cuda:
            tok = argmax(logits, pdl=self.pdl)        # sampling.py's chunked argmax: at batch 1 a third of torch.argmax's time
        else:
            tok = logits.argmax(-1)
        if eos:
            done = self._done[:b]
            tok = torch.where(done, self._pad_id, tok)
            done |= (tok[:, None] == self._eos).any(-1)
        return tok

    def _step(self, i: int, b: int, use_graph: bool, mode: tuple, tok: torch.Tensor) -> torch.Tensor:
        """Decode step i (>= 1) of a generation: the next tokens [B] after ``tok``."""
        if use_graph and ((b, mode) in self._graphs or i > 1):   # step 1 ran eagerly: kernels compiled, tuned
            tok = self._replay(b, mode, tok)
        else:
            tok = self._next_token(self.decode_step(tok), b, mode)
        self.cache.host_lengths[:b] = [n + 1 for n in self.cache.host_lengths[:b]]
        return tok

    def pad(self, prompts) -> tuple[torch.Tensor, list[int]]:
        """Right-pad prompts to [B, T] int64 on the device; returns (ids, lengths).

        Token ids must be integers (TypeError otherwise: a float id is never rounded silently); a tensor
        on another device is moved to the engine's. Their range is checked by :meth:`prefill`."""
        if isinstance(prompts, torch.Tensor):
            if prompts.dim() != 2:
                raise ValueError(f"prompts: expected [B, T] token ids, got shape {tuple(prompts.shape)}")
            _check_integer(prompts, "prompts")
            return prompts.to(self.device, torch.long), [prompts.shape[1]] * prompts.shape[0]
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence):
            raise TypeError(f"prompts: expected a list of token-id sequences or an int64 [B, T] tensor, "
                            f"got {type(prompts).__name__}")
        seqs = []
        for i, p in enumerate(prompts):
            if isinstance(p, (str, bytes)):
                raise TypeError(f"prompts[{i}]: expected token ids (integers), got a {type(p).__name__}: tokenize first")
            try:
                s = p if isinstance(p, torch.Tensor) else torch.as_tensor(p)
            except (TypeError, ValueError, RuntimeError) as e:
                raise TypeError(f"prompts[{i}]: expected a sequence of token ids (integers), got {p!r:.80}") from e
            if s.numel() == 0:
                raise ValueError("prompts: expected one or more non-empty token sequences")
            _check_integer(s, f"prompts[{i}]")
            seqs.append(s.flatten().to("cpu", torch.long))
        if not seqs:
            raise ValueError("prompts: expected one or more non-empty token sequences")
        t = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), t, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, :len(s)] = s
        return ids.to(self.device), [len(s) for s in seqs]

    def _check_ids(self, ids, lengths) -> tuple[int, int]:
        if not isinstance(ids, torch.Tensor) or ids.dtype != torch.long or ids.dim() != 2:
            raise TypeError(f"ids: expected an int64 [B, T] tensor, got {getattr(ids, 'dtype', type(ids))} "
                            f"{tuple(getattr(ids, 'shape', ()))}")
        b, t = ids.shape
        if ids.device != self.device:
            raise ValueError(f"ids: expected a tensor on {self.device}, got one on {ids.device}")
        if not 1 <= b <= self.max_batch:
            raise ValueError(f"batch of {b}: the cache holds 1 to max_batch={self.max_batch} sequences")
        if not 1 <= t <= self.max_seq_len:
            raise ValueError(f"prompt length {t}: expected 1 to max_seq_len={self.max_seq_len}")
        if lengths is not None and (len(lengths) != b or not all(1 <= n <= t for n in lengths)):
            raise ValueError(f"lengths: expected {b} lengths in 1..{t}, got {list(lengths)}")
        self._check_token_range(ids)
        return b, t

    def _check_token_range(self, ids: torch.Tensor) -> None:
        """ValueError unless every id (padding included) lies in [0, vocab_size), before any kernel runs:
        an id out of range would make the embedding read out of bounds (on a GPU: a device-side assert
        that kills the process's CUDA context). One reduction and one host sync (.tolist()) per call;
        the search for the culprit runs only when there is one."""
        lo, hi = torch.stack(torch.aminmax(ids)).tolist()
        if lo >= 0 and hi < self.vocab_size:
            return
        bad = ((ids < 0) | (ids >= self.vocab_size)).nonzero()[0].tolist()
        raise ValueError(f"token id {ids[bad[0], bad[1]].item()} in sequence {bad[0]} at position {bad[1]} is out of "
                         f"range: expected 0 <= id < vocab_size={self.vocab_size}")

    def _replay(self, b: int, mode: tuple, tok: torch.Tensor) -> torch.Tensor:
        """One decode step and its token choice by CUDA-graph replay (captured on first use for batch size
        b and mode = (sampled, with EOS, with top-p, wide top-k))."""
        key = (b, mode)
        if key not in self._graphs:
            static_tok = tok.clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):              # records the kernels; runs nothing
                nxt = self._next_token(self.decode_step(static_tok), b, mode)
                static_tok.copy_(nxt)                  # the next replay starts from this token
            self._graphs[key] = (graph, static_tok)
        graph, static_tok = self._graphs[key]
        if tok is not static_tok:                      # after the first replay it already is
            static_tok.copy_(tok)
        graph.replay()
        return static_tok
