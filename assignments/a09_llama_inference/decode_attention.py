# PLACEHOLDER (owner: a09attn)
"""GQA decode and prefill attention (placeholder: a08's kernel and a07's on expanded copies)."""
from __future__ import annotations

import torch

from ..a07_flash_attention.flash_triton import attention_forward
from ..a08_gpt2_inference.decode_attention import decode_attention


def gqa_decode_attention(q, k_cache, v_cache, lengths, *, splits=None, out=None, pdl=False):
    b, h, d = q.shape
    hkv = k_cache.shape[1]
    g = h // hkv
    k = k_cache[:, :, None].expand(b, hkv, g, *k_cache.shape[2:]).reshape(b, h, *k_cache.shape[2:])
    v = v_cache[:, :, None].expand(b, hkv, g, *v_cache.shape[2:]).reshape(b, h, *v_cache.shape[2:])
    return decode_attention(q, k, v, lengths, splits=splits, out=out)


def gqa_prefill_attention(q, k, v, *, allow_tf32=True):
    b, h, t, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    g = h // hkv
    k = k[:, :, None].expand(b, hkv, g, tk, d).reshape(b, h, tk, d)
    v = v[:, :, None].expand(b, hkv, g, tk, d).reshape(b, h, tk, d)
    return attention_forward(q, k, v, True, allow_tf32=allow_tf32)[0]
