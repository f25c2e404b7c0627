"""Stage 9's Triton launches for ``python -m common.course.portability`` (given, course tooling): every
kernel compiled for each GPU family a student may have, as the wrappers launch it at Llama-3.2-1B's,
Llama 3 8B's and Qwen3-0.6B's sizes. stage.py's ``portability_launches`` yields these."""
from __future__ import annotations

from collections.abc import Iterator

from common.course.portability import BF16, FP16, FP32, Launch, _dt, _next_pow2
from common.gpu import Arch


def kernel_launches(load, archs: list[Arch], full: bool) -> Iterator[Launch]:
    """RMSNorm, RoPE and SwiGLU (fp16 on sm_75 only unless ``full``)."""
    rms = load("a09_llama_inference.rmsnorm")
    rope = load("a09_llama_inference.rope")
    swi = load("a09_llama_inference.swiglu")
    i32, f32 = _dt("int32"), _dt(FP32)
    for dt in (FP32, BF16, FP16):
        only = None if full or dt != FP16 else ("sm_75",)
        t = _dt(dt)
        for n in (1024, 2048, 4096, 8192):          # BLOCK_N 1024 .. 8192, warps 2 .. 8 (rmsnorm's launch plan)
            block = _next_pow2(n)
            warps = rms.warps_for(block)
            yield Launch("a09", "_add_rmsnorm_kernel", f"{dt} BLOCK_N={block} warps={warps}", rms._add_rmsnorm_kernel,
                         (t, t, t, t, t, n, n, n, n, n, 1e-5),
                         dict(HAS_RESIDUAL=True, BLOCK_N=block, USE_PDL=False, num_warps=warps), only)
        # (n_head, n_kv_head, d, q/k norm): Llama-3.2-1B, Llama 3 8B, Qwen3-0.6B
        for h, kv, d, norm in ((32, 8, 64, False), (32, 8, 128, False), (16, 8, 128, True)):
            bh, bhalf = _next_pow2(h + kv), _next_pow2(d // 2)
            warps = 1 if bh * bhalf <= 256 else 2 if bh * bhalf <= 1024 else 4
            w = (h + 2 * kv) * d
            yield Launch("a09", "_rope_kernel", f"{dt} H={h} KV={kv} d={d} norm={norm} warps={warps}", rope._rope_kernel,
                         (t, f32, f32, i32, t, t, 1, 4096, w, w, d // 2, 1e-6),
                         dict(N_HEAD=h, N_KV_HEAD=kv, HALF=d // 2, BLOCK_H=bh, BLOCK_HALF=bhalf, HAS_Q_NORM=norm,
                              HAS_K_NORM=norm, USE_PDL=False, num_warps=warps), only)
        for f in (3072, 8192):
            block = min(swi.BLOCK_F, _next_pow2(f))
            yield Launch("a09", "_gated_product_kernel", f"{dt} F={f} BLOCK={block}", swi._gated_product_kernel,
                         (t, t, f, 2 * f, f), dict(BLOCK=block, USE_PDL=False, num_warps=4), only)


def gqa_launches(load, archs: list[Arch], full: bool) -> Iterator[Launch]:
    """The GQA split kernel as gqa_decode_attention launches it on each family (its BLOCK_N, warps and stages
    follow the family's limits: split_config), for Llama-3.2-1B's (G 4, d 64) and Qwen3-0.6B's (G 2, d 128)
    heads, one split and several. The combine is a08's _decode_combine, in a08's launches."""
    dec = load("a09_llama_inference.decode_attention")
    f = _dt(FP32)
    for arch in archs:
        for dt in (FP32, BF16, FP16) if full or arch.name == "sm_75" else (FP32, BF16):
            t = _dt(dt)
            for group, d, hkv in ((4, 64, 8), (2, 128, 8)):
                h = group * hkv
                block_n, warps, stages = dec.split_config(d, t, (arch.capability, arch.smem_per_block))
                for splits in (1, 16):
                    yield Launch("a09", "_gqa_decode_split",
                                 f"{dt} G={group} d={d} NUM_SPLITS={splits} BLOCK_N={block_n} warps={warps} "
                                 f"stages={stages}", dec._gqa_decode_split,
                                 (t, t, t, _dt("int32"), t, f, f, (h + 2 * hkv) * d, d, hkv * 4096 * d, 4096 * d, d,
                                  hkv * 4096 * d, 4096 * d, d, h * d, d, h, hkv, 0.18),
                                 dict(GROUP=group, BLOCK_G=dec.block_g(group), NUM_SPLITS=splits, HEAD_DIM=d,
                                      BLOCK_N=block_n, BLOCK_D=dec.block_d(d),
                                      PRECISION="ieee" if dt == FP32 else "tf32", USE_PDL=False, num_warps=warps,
                                      num_stages=stages), (arch.name,))


def launches(load, archs: list[Arch], full: bool) -> Iterator[Launch]:
    """Every stage-9 launch: the student's kernels (from ``load``'s tree) and the tuned path's (solutions/)."""
    from common.impl import Impl
    yield from kernel_launches(load, archs, full)
    yield from gqa_launches(load, archs, full)
    yield from Impl.get("solutions").load("a09_llama_inference.tuned").portability_launches(archs)
