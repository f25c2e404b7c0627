"""The tuned path of the stage-9 engine (given code, not copied to assignments/).

    engine = LlamaEngine.from_hf(hf, tuned=True)                       # on your core kernels, tuned around them
    engine = LlamaEngine.from_hf(hf, tuned=True, fuse_epilogues=False)  # for before/after

Stage 8's tuned path (solutions/a08_gpt2_inference/tuned.py) made GPT-2's decode step a few fused GEMVs
with programmatic dependent launch; this one does the same for the Llama family's block (RMSNorm, rotary
embeddings, grouped-query attention, a SwiGLU MLP), REUSING a08's pieces: :class:`TunedLlamaPath` is a
a08 ``TunedPath`` (its token choice, ``next_token``, and its rules are inherited, not copied), and every
decode GEMM runs on a08's tuned GEMV (tuned_gemv.gemv), with two epilogues it gained for this stage:

* every decode GEMV (q|k|v, o, gate|up, down, the LM head, tied or untied) on tuned_gemv.gemv with a
  K-MAJOR copy of its weight made once at load (the LM head's ``embed.t()`` already is one: no copy), the
  residual adds in the o and down projections' epilogues, programmatic dependent launch (``pdl``) on every
  kernel of the step, your rmsnorm, apply_rope, write_kv and gqa_decode_attention included;
* the RMSNorm before q|k|v and before gate|up FOLDED into the GEMV after it (``fold_norm``): the norm's
  weight multiplied into W once (tuned_gemv.fold_rmsnorm), each row's rstd = rsqrt(mean(h²) + eps) computed
  in the GEMV's epilogue (``rms_fold=True``): the RMSNorm kernel is gone. In 16 bits only, and where
  tuned_gemv.fold_pays says the row statistics are cheap (a08's measured rule: 1-2 rows of at most 1024
  columns, or one row of at most 2048 where the grid fits one wave); never in fp32, where the engine gives
  transformers' tokens and the fold's reassociation could flip a near tie;
* SwiGLU in the gate|up GEMV's epilogue (``fuse_swiglu``): at load, the gate and up columns are interleaved
  (tuned_gemv.interleave_gate_up: column 2f the gate of feature f, 2f + 1 its up), so that any tile of
  BLOCK_N columns holds both halves of BLOCK_N / 2 features; the epilogue stores silu(gate)·up, rounded as
  transformers rounds it (``swiglu=True``): one kernel instead of the GEMV and the swiglu kernel, and the
  [B, 2F] intermediate never goes to memory. In every dtype (the same arithmetic as the swiglu kernel);
* the embedding gather and ``lengths + 1`` in one kernel (_embed_kernel), not PyTorch's two.

A decode block (batch 1, 16 bits, where the fold pays) is then: GEMV q|k|v (norm folded), apply_rope,
write_kv, attention (split + combine), GEMV o (+ residual), GEMV gate|up (norm folded, SwiGLU), GEMV down
(+ residual): 8 kernels instead of the core's 11. The speed of each: lectures/results/a09_decode.md
(``python -m solutions.a09_llama_inference.bench``).

Options: ``decode_gemv=False`` sends the decode GEMMs to the a06 matmul (nothing fused: the engine before the
GEMV); ``fuse_epilogues=False`` keeps the GEMV but runs every RMSNorm and the SwiGLU as kernels of their own;
``fold_norm`` ("auto": where fold_pays; True: wherever the GEMV runs, in 16 bits; False: never) and
``fuse_swiglu`` (bool) pick one fusion (default: both on with fuse_epilogues); ``pdl`` (default: on where the
GPU supports it, unless COURSE_PDL=0).
"""
from __future__ import annotations

import importlib

import torch
import triton
import triton.language as tl

from common import TRITON_INTERPRET
from common.launch import fast, next_power_of_2

from ..a08_gpt2_inference import tuned_gemv
from ..a08_gpt2_inference.tuned import TunedPath

#: Under the CPU interpreter: the a06 matmul's wide tiles (a08's engine._INTERPRETER_TILES); on a GPU it tunes
_INTERPRETER_TILES = (16, 256, 64, 4, 1) if TRITON_INTERPRET else None
FOLD_NORM = ("auto", True, False)


@triton.jit
def _embed_kernel(TOKENS, LENGTHS, EMB, H, NEW_LENGTHS, C, BLOCK_C: tl.constexpr, USE_PDL: tl.constexpr):
    """Program b: H[b] = EMB[TOKENS[b]] (the residual stream; Llama has no position embedding: the rotation
    carries the position) and NEW_LENGTHS[b] = LENGTHS[b] + 1. The decode step's first kernel, in place of
    PyTorch's gather and its ``lengths + 1``. The ids were checked on the host before the step ran."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    tok = tl.load(TOKENS + b).to(tl.int64)
    pos = tl.load(LENGTHS + b)
    cols = tl.arange(0, BLOCK_C)
    ok = cols < C
    tl.store(H + b.to(tl.int64) * C + cols, tl.load(EMB + tok * C + cols, mask=ok, other=0.0), mask=ok)
    tl.store(NEW_LENGTHS + b, pos + 1)


class TunedLlamaPath(TunedPath):
    """The tuned decode path of one Llama-family engine (see the module docstring): the engine's building
    blocks ``linear``, ``qkv_rope``, ``attend``, ``norm_gate_up``, ``embed``, ``norm`` (and a08's
    ``next_token``), faster. Your kernels it calls (rmsnorm, apply_rope, write_kv, gqa_decode_attention, swiglu,
    the a06 matmul) are looked up in the engine's own tree."""

    def __init__(self, engine, *, decode_gemv: bool = True, pdl: bool | None = None, fuse_epilogues: bool = True,
                 fold_norm: str | bool | None = None, fuse_swiglu: bool | None = None):
        fold_norm = ("auto" if fuse_epilogues else False) if fold_norm is None else fold_norm
        if fold_norm not in FOLD_NORM or isinstance(fold_norm, int) and not isinstance(fold_norm, bool):
            raise ValueError(f"fold_norm: expected one of {FOLD_NORM}, got {fold_norm!r}")
        #: fold each RMSNorm into the GEMV after it: "auto" (where tuned_gemv.fold_pays), True, False
        self.fold_norm = fold_norm
        #: the SwiGLU in the gate|up GEMV's epilogue (its weight's columns interleaved at load)
        self.fuse_swiglu = bool(fuse_epilogues if fuse_swiglu is None else fuse_swiglu)
        self._gate_up: dict[int, torch.Tensor] = {}
        super().__init__(engine, decode_gemv=decode_gemv, pdl=pdl, fuse_epilogues=fuse_epilogues)
        self._find_kernels()

    # ------------------------------------------------------------------ the engine's tree
    def _find_kernels(self) -> None:
        """Your kernels, from the engine's module where it imported them by these names, else from the modules
        of the engine's own tree (solutions/, assignments/ or a submission)."""
        pkg = self.core.__package__ or type(self.engine).__module__.rpartition(".")[0]
        root = pkg.rpartition(".")[0]
        where = {"rmsnorm": f"{pkg}.rmsnorm", "apply_rope": f"{pkg}.rope", "swiglu": f"{pkg}.swiglu",
                 "gqa_decode_attention": f"{pkg}.decode_attention",
                 "write_kv": f"{root}.a08_gpt2_inference.kv_cache", "matmul": f"{root}.a06_matmul.matmul_triton"}
        self.kernels = {name: getattr(self.core, name, None) or getattr(importlib.import_module(mod), name)
                        for name, mod in where.items()}

    # ------------------------------------------------------------------ weights, once
    def prepare_decode_weights(self) -> None:
        """The tuned GEMV's copies of the block weights, made once, keyed by the id of the engine's stored
        [K, N] weight: ``_k_major`` (a K-major copy: its .t() is contiguous), ``_gate_up`` (gate|up K-major with
        its columns interleaved, for the SwiGLU epilogue) and ``_folded`` (q|k|v's and gate|up's decode copy with
        the RMSNorm before it folded in, in 16 bits where the fold pays at one row: tuned_gemv.fold_rmsnorm).
        A plain copy is kept beside a folded one where some batch size up to max_batch does not fold. The LM
        head's weight (``embed.t()`` or the untied head's ``.t()``) is K-major already: read as it is."""
        self._k_major.clear()
        self._folded.clear()
        self._gate_up.clear()
        if not self.decode_gemv:
            return
        e = self.engine
        rows = min(e.max_batch, tuned_gemv.MAX_ROWS)
        for layer in e.layers:
            for w in (layer.o_w, layer.down_w):
                self._k_major[id(w)] = _k_major(w)
            for norm_w, w, gu in ((layer.attn_norm_w, layer.qkv_w, False), (layer.mlp_norm_w, layer.gate_up_w, True)):
                plain = _k_major(w)
                if gu and self.fuse_swiglu:
                    plain = tuned_gemv.interleave_gate_up(plain)
                fold_one, fold_all = self._fold(1, plain), self._fold(rows, plain)
                if fold_one:
                    self._folded[id(w)] = tuned_gemv.fold_rmsnorm(norm_w, plain)
                if not (fold_one and fold_all):
                    (self._gate_up if gu and self.fuse_swiglu else self._k_major)[id(w)] = plain

    def _fold(self, rows: int, w: torch.Tensor) -> bool:
        """Whether the RMSNorm before the decode weight w [K, N] folds into its GEMV at ``rows`` rows."""
        if not self.fold_norm or self.engine.dtype == torch.float32 or not 0 < rows <= tuned_gemv.MAX_ROWS:
            return False
        return self.fold_norm is True or self._fold_pays(rows, w)

    # ------------------------------------------------------------------ the building blocks
    def linear(self, x, w, b=None, activation=None, *, residual=None):
        """The engine's linear(x, w, residual=): the tuned GEMV (K-major weight, residual in its epilogue) for a
        decode step's rows, the a06 matmul otherwise (prefill; the residual added after it)."""
        if self._gemv_rows(x):
            return tuned_gemv.gemv(x, self._k_major.get(id(w), w), b, activation, residual=residual, pdl=self.pdl)
        y = self.kernels["matmul"](x, w, b, activation, allow_tf32=self.engine._tf32, config=_INTERPRETER_TILES)
        return y if residual is None else y + residual

    def _norm_gemv(self, h, norm_w, w, *, swiglu: bool = False):
        """RMSNorm(h) @ w on the decode GEMV: folded (one kernel) where :meth:`_fold` says so, else your rmsnorm
        kernel and the GEMV. ``swiglu``: w is gate|up, its interleaved copy's GEMV stores silu(gate)·up."""
        e = self.engine
        rows = h.numel() // h.shape[-1]
        folded = self._folded.get(id(w)) if self._fold(rows, w) else None
        if folded is not None:
            return tuned_gemv.gemv(h, folded, rms_fold=True, swiglu=swiglu, eps=e.eps, pdl=self.pdl)
        y = self.kernels["rmsnorm"](h, norm_w, e.eps, pdl=self.pdl)
        if not swiglu:
            return tuned_gemv.gemv(y, self._k_major.get(id(w), w), pdl=self.pdl)
        w_i = self._gate_up.get(id(w))
        if w_i is None:                   # made at load only where some batch size needs it: interleave now
            w_i = self._gate_up[id(w)] = tuned_gemv.interleave_gate_up(_k_major(w))
        return tuned_gemv.gemv(y, w_i, swiglu=True, pdl=self.pdl)

    def qkv_rope(self, h, norm_w, w, kv_cache, *, q_norm=None, k_norm=None):
        """The engine's qkv_rope(): q|k|v = RMSNorm(h) @ w on the GEMV (the norm folded in where it pays), then
        your apply_rope (Qwen 3's q/k norms with it) and write_kv of the rotated k and v, all with PDL."""
        e = self.engine
        if not self._gemv_rows(h):
            y = self.linear(self.kernels["rmsnorm"](h, norm_w, e.eps, pdl=self.pdl), w)
        else:
            y = self._norm_gemv(h, norm_w, w)
        b, width = y.shape[0], y.shape[-1]
        kc, vc, start = kv_cache
        qkv = y.view(b, 1, width)
        self.kernels["apply_rope"](qkv, e.cos, e.sin, start, e.n_head, e.n_kv_head, q_norm=q_norm, k_norm=k_norm,
                                   eps=e.eps, pdl=self.pdl)
        self.kernels["write_kv"](qkv[..., (e.n_head - e.n_kv_head) * e.head_dim:], kc, vc, start, pdl=self.pdl)
        return y

    def attend(self, q, k_cache, v_cache, lengths):
        """The engine's attend(): your gqa_decode_attention, with PDL."""
        return self.kernels["gqa_decode_attention"](q, k_cache, v_cache, lengths, pdl=self.pdl)

    def norm_gate_up(self, h, norm_w, w):
        """The engine's norm_gate_up(): swiglu(RMSNorm(h) @ w). On the GEMV with fuse_swiglu: one GEMV whose
        epilogue stores silu(gate)·up (and folds the norm where it pays); else the GEMV and your swiglu kernel."""
        e = self.engine
        if not self._gemv_rows(h):
            gu = self.linear(self.kernels["rmsnorm"](h, norm_w, e.eps, pdl=self.pdl), w)
            return self.kernels["swiglu"](gu, pdl=self.pdl)
        if self.fuse_swiglu:
            return self._norm_gemv(h, norm_w, w, swiglu=True)
        return self.kernels["swiglu"](self._norm_gemv(h, norm_w, w), pdl=self.pdl)

    def norm(self, h, w):
        """The engine's norm() (the final RMSNorm): your rmsnorm, with PDL."""
        return self.kernels["rmsnorm"](h, w, self.engine.eps, pdl=self.pdl)

    def embed(self, tokens: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The engine's embed() in one kernel (_embed_kernel): embed_w[tokens] and lengths + 1."""
        e = self.engine
        b = tokens.shape[0]
        hid = torch.empty((b, e.n_embd), dtype=e.dtype, device=e.device)
        new_lengths = torch.empty_like(lengths)
        if b:
            fast(_embed_kernel)[(b,)](tokens, lengths, e.embed_w, hid, new_lengths, e.n_embd,
                                      BLOCK_C=next_power_of_2(e.n_embd), USE_PDL=self.pdl,
                                      num_warps=4, **(dict(launch_pdl=True) if self.pdl else {}))
        return hid, new_lengths

    # ------------------------------------------------------------------ what a09 does not use of a08's path
    def ln_linear(self, *args, **kwargs):
        raise TypeError("TunedLlamaPath has no ln_linear (a GPT-2 block's LayerNorm + GEMV): the Llama engine calls "
                        "qkv_rope and norm_gate_up")


def _k_major(w: torch.Tensor) -> torch.Tensor:
    """A K-major copy of w [K, N] (w itself if it is K-major already): a [K, N] view with K-stride 1."""
    if w.stride(0) == 1 and w.t().is_contiguous():
        return w
    return w.t().contiguous().t()
