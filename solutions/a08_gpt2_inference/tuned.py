"""The tuned path of the stage-8 engine (given code, not copied to assignments/).

    engine = GPT2Engine.from_hf(hf, tuned=True)                 # on your core kernels, tuned around them
    engine = GPT2Engine.from_hf(hf, tuned=True, pdl=False, fuse_epilogues=False)   # for before/after

The engine's core (engine.py, your kernels) is correct and simple: a decode block is a LayerNorm
kernel, the GEMV, the KV write, decode attention, the GEMV with the residual, LayerNorm, two GEMVs.
At batch 1 that step is launch- and ramp-bound: each kernel is a few microseconds of idle bandwidth.
The tuned path keeps your LayerNorm, KV-write and decode-attention kernels and wraps them:

* every decode GEMM runs on tuned_gemv.gemv, which REPLACES your gemv: per-GPU config rules
  (tuned_gemv.choose_config), a K-MAJOR copy of each block weight made once at load (stage 2's lesson:
  transpose once; a GEMV of one row streams W fastest when each output's K weights are contiguous),
  the LayerNorm before c_attn and c_fc folded into the GEMV where it pays (tuned_gemv.fold_layernorm,
  fold_pays), the KV-cache write in c_attn's epilogue and the residual adds in the projections': a
  block is 6 kernels instead of 9 (7 at GPT-2 large and XL, where one LayerNorm stays a kernel);
* programmatic dependent launch (``pdl``, sm_90+: each kernel's launch overlaps the tail of the one
  before, tuned_gemv.PDL_NOTES) on every a08 kernel of the step, yours included (their USE_PDL hooks);
* the embedding and ``lengths + 1`` in one kernel (_embed_kernel), not four PyTorch ones;
* the sampler and greedy argmax of tuned_sampling.py, which REPLACE your sampler: the row split over
  many programs, and a wide top-k.

The speed of each: lectures/results/a08_decode_step.md, a08_decode_profile.md, a08_core_vs_tuned.md.
Options: ``decode_gemv=False`` sends the few-row GEMMs to the a06 matmul (no copy, nothing fused: the
engine before the GEMV); ``fuse_epilogues=False`` keeps the GEMV but runs each LayerNorm and write_kv
as their own kernels; ``pdl`` (default: on where the GPU supports it, unless COURSE_PDL=0).
"""
from __future__ import annotations

import os
import sys

import torch
import triton
import triton.language as tl

from common import pdl_supported
from common.launch import fast, next_power_of_2

from . import tuned_gemv, tuned_sampling


def resolve_pdl(pdl: bool | None, device: torch.device) -> bool:
    """Whether the engine's kernels launch with programmatic dependent launch: ``pdl`` if given,
    else on unless the environment sets COURSE_PDL=0; never where the device cannot (before sm_90,
    the CPU interpreter: common.pdl_supported)."""
    want = (os.environ.get("COURSE_PDL", "1") != "0") if pdl is None else bool(pdl)
    return want and pdl_supported(device)


@triton.jit
def _embed_kernel(TOKENS, LENGTHS, WTE, WPE, H, NEW_LENGTHS, C, stride_tok, BLOCK_C: tl.constexpr,
                  USE_PDL: tl.constexpr):
    """Program b: H[b] = WTE[TOKENS[b]] + WPE[LENGTHS[b]] (fp32, rounded once: what the residual stream
    holds), and NEW_LENGTHS[b] = LENGTHS[b] + 1. The decode step's first kernel, in place of PyTorch's two
    gathers, its add and its ``lengths + 1`` (four kernels outside the PDL chain). The ids were checked on
    the host before the step ran (Generation._check_token_range)."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    tok = tl.load(TOKENS + b * stride_tok).to(tl.int64)      # tokens may be a strided view (a column of ids)
    pos = tl.load(LENGTHS + b)
    cols = tl.arange(0, BLOCK_C)
    ok = cols < C
    h = tl.load(WTE + tok * C + cols, mask=ok, other=0.0).to(tl.float32)
    h += tl.load(WPE + pos.to(tl.int64) * C + cols, mask=ok, other=0.0).to(tl.float32)
    tl.store(H + b.to(tl.int64) * C + cols, h.to(H.dtype.element_ty), mask=ok)
    tl.store(NEW_LENGTHS + b, pos + 1)


class TunedPath:
    """The tuned decode path of one engine (see the module docstring): ``linear``, ``ln_linear``, ``embed``
    and ``next_token`` as the engine's, faster. Your kernels it calls are looked up in the engine's own
    tree (its engine module's ``layernorm``, ``write_kv``, ``matmul``) at every call."""

    def __init__(self, engine, *, decode_gemv: bool = True, pdl: bool | None = None, fuse_epilogues: bool = True):
        self.engine = engine
        self.core = sys.modules[type(engine).__module__]
        #: GEMMs of at most MAX_ROWS rows (a decode step) run on the tuned GEMV; False: on the a06 matmul
        self.decode_gemv = decode_gemv
        #: fold each LayerNorm into the GEMV after it and write K, V in c_attn's GEMV epilogue (:meth:`ln_linear`)
        self.fuse_epilogues = fuse_epilogues
        #: programmatic dependent launch for the decode step's a08 kernels (tuned_gemv.PDL_NOTES)
        self.pdl = resolve_pdl(pdl, engine.device)
        self.wide_top_k = tuned_sampling.WIDE_TOP_K
        self._k_major: dict[int, torch.Tensor] = {}
        self._folded: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self.prepare_decode_weights()

    def prepare_decode_weights(self) -> None:
        """The tuned GEMV's copies of the block weights, made once: ``_k_major``, a K-MAJOR copy of a weight by
        the id of the stored [K, N] weight (the copy's .t() is contiguous, so the copy is a [K, N] view with
        K-stride 1); ``_folded``, for c_attn and c_fc with fuse_epilogues in 16 bits where the fold pays at one
        row (:meth:`_fold_pays`), that copy with the LayerNorm before it folded in (tuned_gemv.fold_layernorm:
        (w_f, bias_f, colsum)); the plain copy too where a batch may have rows the fold does not pay for.
        Nothing without decode_gemv."""
        self._k_major.clear()
        self._folded.clear()
        if not self.decode_gemv:
            return
        e = self.engine
        fold_on = self.fuse_epilogues and e.dtype != torch.float32     # see ln_linear: not in fp32
        for layer in e.layers:
            for w in (layer.proj_w, layer.fc_proj_w):
                self._k_major[id(w)] = w.t().contiguous().t()
            for g, be, w, bias in ((layer.ln_1_w, layer.ln_1_b, layer.attn_w, layer.attn_b),
                                   (layer.ln_2_w, layer.ln_2_b, layer.fc_w, layer.fc_b)):
                fold = fold_on and self._fold_pays(1, w)
                if fold:
                    self._folded[id(w)] = tuned_gemv.fold_layernorm(g, be, w.t().contiguous().t(), bias)
                if not fold or not self._fold_pays(min(e.max_batch, tuned_gemv.MAX_ROWS), w):
                    self._k_major[id(w)] = w.t().contiguous().t()

    def _fold_pays(self, rows: int, w: torch.Tensor) -> bool:
        """tuned_gemv.fold_pays for ``rows`` rows times the stored weight w [K, N] on this engine's GPU."""
        return tuned_gemv.fold_pays(rows, w.shape[0], w.shape[1], tuned_gemv.sm_count(self.engine.device),
                                    self.engine.dtype)

    def _gemv_rows(self, x: torch.Tensor) -> bool:
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        return self.decode_gemv and 0 < rows <= tuned_gemv.MAX_ROWS

    def linear(self, x, w, b=None, activation=None, *, residual=None):
        """The engine's linear(): the tuned GEMV (K-major weight, residual in its epilogue) for a decode step's
        rows, the a06 matmul otherwise (the residual added after it)."""
        if self._gemv_rows(x):
            return tuned_gemv.gemv(x, self._k_major.get(id(w), w), b, activation, residual=residual, pdl=self.pdl)
        e = self.engine
        y = self.core.matmul(x, w, b, activation, allow_tf32=e._tf32, config=self.core._INTERPRETER_TILES)
        return y if residual is None else y + residual

    def ln_linear(self, h, ln_w, ln_b, w, b=None, activation=None, *, kv_cache=None):
        """The engine's ln_linear(). On the GEMV path with fuse_epilogues: ONE kernel in 16 bits where the fold
        pays (the LayerNorm folded into the weight and bias at load, the row statistics in the GEMV's
        epilogue) with the cache write in its epilogue; else your LayerNorm kernel, then the GEMV. Not in fp32:
        the fold reassociates the LayerNorm's arithmetic, far below a 16-bit rounding, but in fp32, where the
        engine gives transformers' tokens, it can flip a near tie. Without the GEMV: your LayerNorm kernel,
        :meth:`linear`, and your write_kv."""
        e, core = self.engine, self.core
        on_gemv = self._gemv_rows(h)
        folded = self._folded.get(id(w)) if on_gemv and self._fold_pays(h.numel() // h.shape[-1], w) else None
        fused_kv = kv_cache if on_gemv and self.fuse_epilogues else None
        if folded is not None:
            w_f, b_f, colsum = folded
            y = tuned_gemv.gemv(h, w_f, b_f, activation, ln_colsum=colsum, eps=e.eps, kv_cache=fused_kv, pdl=self.pdl)
        elif on_gemv:
            y = tuned_gemv.gemv(core.layernorm(h, ln_w, ln_b, e.eps, pdl=self.pdl), self._k_major.get(id(w), w), b,
                                activation, kv_cache=fused_kv, pdl=self.pdl)
        else:
            y = self.linear(core.layernorm(h, ln_w, ln_b, e.eps, pdl=self.pdl), w, b, activation)
        if kv_cache is not None and fused_kv is None:
            core.write_kv(y.view(y.shape[0], 1, y.shape[-1]), *kv_cache, pdl=self.pdl)
        return y

    def embed(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The engine's embed() in one kernel (_embed_kernel)."""
        e = self.engine
        b = tokens.shape[0]
        hid = torch.empty((b, e.n_embd), dtype=e.dtype, device=e.device)
        new_lengths = torch.empty_like(lengths)
        if b:
            fast(_embed_kernel)[(b,)](tokens, lengths, e.wte, e.wpe, hid, new_lengths, e.n_embd, tokens.stride(0),
                                      BLOCK_C=next_power_of_2(e.n_embd), USE_PDL=self.pdl,
                                      num_warps=4, **(dict(launch_pdl=True) if self.pdl else {}))
        return hid, new_lengths

    def next_token(self, logits: torch.Tensor, b: int, mode: tuple) -> torch.Tensor:
        """The engine's token choice before the EOS rule: tuned_sampling's sampler (without top-p, one kernel
        fewer: nucleus_pass; a large top-k: wide) or its chunked argmax on a GPU."""
        e = self.engine
        do_sample, _, nucleus, wide = mode
        if do_sample:
            return tuned_sampling.sample(logits, e._params, e._seed, e.cache.lengths[:b], nucleus_pass=nucleus,
                                         wide=wide, pdl=self.pdl)
        if logits.is_cuda:
            return tuned_sampling.argmax(logits, pdl=self.pdl)
        return logits.argmax(-1)
