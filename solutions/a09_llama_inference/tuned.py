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
* the rotary embedding and the KV-cache write in the q|k|v GEMV's epilogue (``fuse_rope``), for layers without
  q/k norms (Llama; Qwen 3's per-head norms need a whole head in one program, which the one-row GEMV's few
  columns a program are not: there your apply_rope and write_kv run after the GEMV): at load each head's
  columns are interleaved (tuned_gemv.interleave_rope: 2i and 2i + 1 hold i and i + d/2, the pair one rotation
  mixes), the epilogue rotates q and k at the row's position from a cos | sin table (apply_rope's arithmetic),
  stores q|k|v in the engine's order and appends k and v to the caches (write_kv's work);
* the embedding gather and ``lengths + 1`` in one kernel (_embed_kernel), not PyTorch's two.

A Llama decode block (batch 1, 16 bits) is then: GEMV q|k|v (norm folded where it pays, rotation, KV write),
attention (split + combine), GEMV o (+ residual), GEMV gate|up (norm folded where it pays, SwiGLU), GEMV down
(+ residual): 6 kernels (7 where a norm stays a kernel) instead of the core's 11; Qwen 3's: 8 (its q/k norms
keep apply_rope and write_kv). The speed of each: lectures/results/a09_decode.md
(``python -m solutions.a09_llama_inference.bench``).

Options: ``decode_gemv=False`` sends the decode GEMMs to the a06 matmul (nothing fused: the engine before the
GEMV); ``fuse_epilogues=False`` keeps the GEMV but runs every RMSNorm, the SwiGLU, the rotation and the KV
write as kernels of their own;
``fold_norm`` ("auto": where fold_pays; True: wherever the GEMV runs, in 16 bits; False: never),
``fuse_swiglu`` and ``fuse_rope`` (bools) pick one fusion (default: all on with fuse_epilogues); ``pdl``
(default: on where the GPU supports it, unless COURSE_PDL=0).
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
def _embed_kernel(TOKENS, LENGTHS, EMB, H, NEW_LENGTHS, C, stride_tok, BLOCK_C: tl.constexpr, USE_PDL: tl.constexpr):
    """Program b: H[b] = EMB[TOKENS[b]] (the residual stream; Llama has no position embedding: the rotation
    carries the position) and NEW_LENGTHS[b] = LENGTHS[b] + 1. The decode step's first kernel, in place of
    PyTorch's gather and its ``lengths + 1``. The ids were checked on the host before the step ran."""
    if USE_PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    tok = tl.load(TOKENS + b * stride_tok).to(tl.int64)      # tokens may be a strided view (a column of ids)
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
                 fold_norm: str | bool | None = None, fuse_swiglu: bool | None = None, fuse_rope: bool | None = None):
        fold_norm = ("auto" if fuse_epilogues else False) if fold_norm is None else fold_norm
        if fold_norm not in FOLD_NORM or isinstance(fold_norm, int) and not isinstance(fold_norm, bool):
            raise ValueError(f"fold_norm: expected one of {FOLD_NORM}, got {fold_norm!r}")
        #: fold each RMSNorm into the GEMV after it: "auto" (where tuned_gemv.fold_pays), True, False
        self.fold_norm = fold_norm
        #: the SwiGLU in the gate|up GEMV's epilogue (its weight's columns interleaved at load)
        self.fuse_swiglu = bool(fuse_epilogues if fuse_swiglu is None else fuse_swiglu)
        #: the rotation and the KV-cache write in the q|k|v GEMV's epilogue (layers without q/k norms: Llama)
        self.fuse_rope = bool(fuse_epilogues if fuse_rope is None else fuse_rope)
        self._gate_up: dict[int, torch.Tensor] = {}
        self._qkv_rope: dict[int, torch.Tensor] = {}
        self._rope_w: set[int] = set()
        self._rope_tab = tuned_gemv.rope_table(engine.cos, engine.sin)     # fp32 [S_max, d]: cos | sin
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
        self._qkv_rope.clear()
        self._rope_w.clear()
        if not self.decode_gemv:
            return
        e = self.engine
        rows = min(e.max_batch, tuned_gemv.MAX_ROWS)
        for layer in e.layers:
            for w in (layer.o_w, layer.down_w):
                self._k_major[id(w)] = _k_major(w)
            rope = self.fuse_rope and layer.q_norm_w is None and layer.k_norm_w is None
            for norm_w, w, gu in ((layer.attn_norm_w, layer.qkv_w, False), (layer.mlp_norm_w, layer.gate_up_w, True)):
                plain = _k_major(w)
                if gu and self.fuse_swiglu:
                    plain, where = tuned_gemv.interleave_gate_up(plain), self._gate_up
                elif not gu and rope:
                    plain, where = tuned_gemv.interleave_rope(plain, e.head_dim), self._qkv_rope
                    self._rope_w.add(id(w))
                else:
                    where = self._k_major
                fold_one, fold_all = self._fold(1, plain), self._fold(rows, plain)
                if fold_one:
                    self._folded[id(w)] = tuned_gemv.fold_rmsnorm(norm_w, plain)
                if not (fold_one and fold_all):
                    where[id(w)] = plain

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

    def _norm_gemv(self, h, norm_w, w, *, swiglu: bool = False, kv_cache=None):
        """RMSNorm(h) @ w on the decode GEMV: folded (one kernel) where :meth:`_fold` says so, else your rmsnorm
        kernel and the GEMV. ``swiglu``: w is gate|up, its interleaved copy's GEMV stores silu(gate)·up.
        ``kv_cache``: w is q|k|v with the rotation fused (:meth:`qkv_rope`): its per-head interleaved copy's GEMV
        rotates q and k and appends k and v to the caches."""
        e = self.engine
        rows = h.numel() // h.shape[-1]
        rope = dict(kv_cache=kv_cache, rope=self._rope_tab) if kv_cache is not None else {}
        folded = self._folded.get(id(w)) if self._fold(rows, w) else None
        if folded is not None:
            return tuned_gemv.gemv(h, folded, rms_fold=True, swiglu=swiglu, eps=e.eps, pdl=self.pdl, **rope)
        y = self.kernels["rmsnorm"](h, norm_w, e.eps, pdl=self.pdl)
        if rope:
            return tuned_gemv.gemv(y, self._qkv_rope[id(w)], pdl=self.pdl, **rope)
        if not swiglu:
            return tuned_gemv.gemv(y, self._k_major.get(id(w), w), pdl=self.pdl)
        w_i = self._gate_up.get(id(w))
        if w_i is None:                   # made at load only where some batch size needs it: interleave now
            w_i = self._gate_up[id(w)] = tuned_gemv.interleave_gate_up(_k_major(w))
        return tuned_gemv.gemv(y, w_i, swiglu=True, pdl=self.pdl)

    def qkv_rope(self, h, norm_w, w, kv_cache, *, q_norm=None, k_norm=None):
        """The engine's qkv_rope(): q|k|v = RMSNorm(h) @ w on the GEMV (the norm folded in where it pays). With
        fuse_rope and no q/k norms (Llama): the rotation and the cache write in that GEMV's epilogue, one kernel
        for the four; else your apply_rope (Qwen 3's q/k norms with it) and write_kv after it, all with PDL."""
        e = self.engine
        if self._gemv_rows(h) and id(w) in self._rope_w:
            return self._norm_gemv(h, norm_w, w, kv_cache=kv_cache)
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
            fast(_embed_kernel)[(b,)](tokens, lengths, e.embed_w, hid, new_lengths, e.n_embd, tokens.stride(0),
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


# ----------------------------------------------------------------------------- portability (given)
#: (model, hidden C, q heads, KV heads, head dim, intermediate F, q/k norms) of the course's two models
GEOMETRIES = (("llama-3.2-1b", 2048, 32, 8, 64, 8192, False), ("qwen3-0.6b", 1024, 16, 8, 128, 3072, True))


def portability_launches(archs) -> list:
    """The tuned path's Triton launches at the two models' geometries, as it makes them on each GPU family of
    ``archs`` (common.gpu.Arch; tuned_gemv.choose_config on 132 SMs with the family's shared memory), for
    ``python -m common.course.portability`` (stage 9's stage.py yields them): the decode GEMVs with the epilogues
    this stage added (q|k|v: RMSNorm folded, rotation and KV write for Llama; gate|up: folded, SwiGLU; o and down:
    the residual) at 1 and 16 rows, PDL on sm_90, and the embedding kernel."""
    from common.course.portability import BF16, FP32, Launch, _dt
    out = []
    i32, f32 = _dt("int32"), _dt(FP32)
    for dt in (BF16, FP32):
        t = _dt(dt)
        for model, c, h, hkv, d, f, qk_norm in GEOMETRIES:
            out.append(Launch("a09", "_embed_kernel", f"{dt} {model} C={c}", _embed_kernel,
                              (_dt("int64"), i32, t, t, i32, c, 1), dict(BLOCK_C=next_power_of_2(c), USE_PDL=False,
                                                                      num_warps=4)))
            gemms = [("qkv", c, (h + 2 * hkv) * d, dict(rms=dt != FP32, rope=not qk_norm)),
                     ("gate_up", c, 2 * f, dict(rms=dt != FP32, swiglu=True)),
                     ("o", h * d, c, dict(residual=True)), ("down", f, c, dict(residual=True))]
            for name, k, n, ep in gemms:
                for m in (1, 16):
                    for arch in archs:
                        out += _gemv_launch(t, f32, i32, dt, model, name, m, k, n, ep, arch, hkv, d)
    return out


def _gemv_launch(t, f32, i32, dt, model, name, m, k, n, ep, arch, hkv, d) -> list:
    from common.course.portability import Launch
    from common.launch import cdiv
    gv = tuned_gemv
    bn, bk, splits, warps, stages = gv.choose_config(m, n, k, t, True, 132, smem=arch.smem_per_block, interpreter=False)
    dot = gv.use_dot(m)
    bm = gv.block_m(m, dot)
    per = cdiv(cdiv(k, bk), splits) * bk
    rope = ep.get("rope", False)
    launches = []
    for pdl in ((False, True) if arch.name == "sm_90" and m == 1 else (False,)):
        kwargs = dict(KV_WRITE=rope, HAS_BIAS=False, ACTIVATION=None, FAST_TANH=False,
                      HAS_RESIDUAL=ep.get("residual", False), LN_FOLD=False, PRELOAD=gv.preload(k, bm, warps),
                      ONE_TILE=gv.stat_k(k, bm, warps) >= k, STAT_K=gv.stat_k(k, bm, warps), SPLIT_K=splits,
                      COMBINE=gv.combine_chunk(splits, bm, bn, warps), USE_DOT=dot, DOT_FP32=False, BLOCK_M=bm,
                      BLOCK_N=bn, BLOCK_K=bk, W_K_CONTIG=True, FENCE=True, USE_PDL=pdl, num_warps=warps,
                      num_stages=stages)
        if ep.get("rms") or ep.get("swiglu") or rope:
            kwargs.update(RMS_FOLD=bool(ep.get("rms")), SWIGLU=bool(ep.get("swiglu")), ROPE=rope,
                          KV_HEADS=hkv if rope else 0)
        what = "+".join(x for x in ("rms", "swiglu", "rope", "residual") if ep.get(x)) or "plain"
        launches.append(Launch("a09", "_matvec_kernel",
                               f"{dt} {model} {name} M={m} {k}->{n} {what} {(bn, bk, splits, warps, stages)}"
                               f"{' PDL' if pdl else ''}", gv._matvec_kernel,
                               (t, t, f32, t, f32, i32, t, f32, m, n, k, per, k, 1, 1, k, n, n, 1e-5,
                                t, t, i32, hkv * 4096 * d, 4096 * d, d, 4096, d), kwargs, (arch.name,)))
    return launches
