"""Work around a Triton-interpreter bug (triton 3.6): ``tl.dot`` on bfloat16 tiles.

The interpreter keeps bfloat16 tensors as raw uint16 numpy arrays and its
``create_dot`` multiplies those integers, so a bf16 ``tl.dot`` returns garbage on
the CPU (fp16, fp32 and fp8 are fine). :func:`patch_bf16_dot` makes it widen bf16
operands to fp32 first, which is what the tensor cores compute (exact products,
fp32 accumulation). No effect on a GPU; idempotent.
"""
from __future__ import annotations


def patch_bf16_dot() -> None:
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter as it

    builder = it.InterpreterBuilder
    if getattr(builder.create_dot, "_course_bf16_fix", False):
        return
    original = builder.create_dot

    def widen(h):
        if h.dtype == tl.bfloat16:
            data = (np.ascontiguousarray(h.data).astype(np.uint32) << 16).view(np.float32)
            return it.TensorHandle(data, tl.float32)
        return h

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return original(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    create_dot._course_bf16_fix = True
    builder.create_dot = create_dot
