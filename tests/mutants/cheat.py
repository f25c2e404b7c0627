"""Cheating variants: the PyTorch op where the stage asks for a kernel, the whole score matrix
where stage 7a asks for one tile at a time, outputs memoised per shape. Their numbers are
(nearly) right, so value tests alone pass them: each must be caught by the graded tests
(common.kernel_check's "is a kernel" check, the 7a memory check, a repeated shape) AND by the
grader alone (``python -m common.course.grade --no-tests``: ``grader=`` lists what its report says).

The answer looked up where the process holds it: a GELU that searches the garbage collector's
objects, the callers' frames and every module's globals for a float64 tensor of x's shape whose values
match GELU at three places, and returns it (or, found nowhere, x itself: a wrong answer). The graded
tests compute their references after the call, and the grader's references never enter the
submission's process, so it finds nothing."""
from . import Mutant

A05, A06, A07 = "a05_triton_gelu", "a06_matmul", "a07_flash_attention"

#: a05's gelu() looking for its answer in the process (GC, frames, module globals) instead of computing it
LOOKUP = '''    check_tensor(x, "x")
    import gc
    import math
    import sys

    n = x.numel()
    spots = [(i, float(x.reshape(-1)[i].item())) for i in sorted({0, n // 2, n - 1})] if n else []

    def gelu_at(v):
        return 0.5 * v * (1.0 + math.tanh(0.7978845608028654 * (v + 0.044715 * v ** 3)))

    def answer(t):
        if not (isinstance(t, torch.Tensor) and t is not x and t.dtype == torch.float64 and t.shape == x.shape):
            return False
        try:
            flat = t.reshape(-1)
            return all(abs(float(flat[i].item()) - gelu_at(v)) <= 1e-3 * (1.0 + abs(v)) for i, v in spots)
        except Exception:
            return False
    seen = list(gc.get_objects())
    f = sys._getframe(1)
    while f is not None:
        seen += list(f.f_locals.values())
        f = f.f_back
    for m in list(sys.modules.values()):
        seen += list(getattr(m, "__dict__", {}).values())
    for t in seen:
        if answer(t):
            return t.to(x.dtype)
    return x.clone()
    if plain_eager(x):'''


#: 7b backward replaced by autograd through the naive (materialised) attention.
NAIVE_BACKWARD = '''        with torch.enable_grad():
            qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
            s = qq.float() @ kk.float().transpose(-1, -2) / math.sqrt(q.shape[-1])
            if ctx.is_causal:
                nq, nk = s.shape[-2:]
                keep = torch.ones(nq, nk, dtype=torch.bool, device=s.device).tril(nk - nq)
                s = s.masked_fill(~keep, float("-inf"))
            oo = (torch.softmax(s, dim=-1) @ vv.float()).to(q.dtype)
            dq, dk, dv = torch.autograd.grad(oo, (qq, kk, vv), do)
        return dq, dk, dv, None'''

MUTANTS = [
    Mutant(A06, "matmul_triton.py", "torch.matmul instead of the kernel without epilogue",
           [("    c2 = out if out.dim() == 2 else out.view(m, n)",
             "    c2 = out if out.dim() == 2 else out.view(m, n)\n    if bias is None and activation is None:\n"
             "        return out.copy_(torch.matmul(a, b))\n")],
           expect=("aten.mm", "called PyTorch ops"), grader=("aten.mm",)),
    Mutant(A07, "flash_triton.py", "forward output from SDPA",
           [("        o, lse = attention_forward(q, k, v, bool(is_causal))\n",
             "        o, lse = attention_forward(q, k, v, bool(is_causal))\n"
             "        o = torch.nn.functional.scaled_dot_product_attention(\n"
             "            q, k, v, is_causal=bool(is_causal) and q.shape[-2] == k.shape[-2])\n")],
           expect=("scaled_dot_product_attention", "called PyTorch ops"), grader=("scaled_dot_product_attention",)),
    Mutant(A07, "flash_triton.py", "backward by autograd through naive attention",
           [("        dq, dk, dv = attention_backward(q, k, v, o, lse, do, ctx.is_causal)\n        return dq, dk, dv, None",
             NAIVE_BACKWARD)],
           expect=("aten._softmax", "called PyTorch ops"), grader=("aten._softmax",)),
    Mutant(A07, "flash_torch.py", "7a materialises the whole score matrix",
           [("    neg_inf = float(\"-inf\")\n    for m0 in range(0, nq, block_m):",
             "    neg_inf = float(\"-inf\")\n    s_all = (q.float() * scale) @ k.float().transpose(-1, -2)   # all of S, once\n"
             "    for m0 in range(0, nq, block_m):"),
            ("            s = qi @ k[..., n0:n1, :].float().transpose(-1, -2)       # [..., tile_m, tile_n]",
             "            s = s_all[..., m0:m1, n0:n1]")],
           expect=("tile", "never whole"), grader=("never whole",)),
    Mutant(A05, "gelu_triton.py", "the answer looked up in the process (gc, frames, module globals)",
           [("    check_tensor(x, \"x\")\n    if plain_eager(x):", LOOKUP)],
           expect=("relative error",), grader=("relative error",)),
    Mutant(A05, "gelu_triton.py", "outputs memoised per shape",
           [("    check_tensor(x, \"x\")\n    if plain_eager(x):\n        return _gelu(x)\n    return triton_gelu(x)",
             "    check_tensor(x, \"x\")\n    memo = globals().setdefault(\"_MEMO\", {})\n"
             "    key = (tuple(x.shape), x.dtype)\n    if key not in memo:\n        memo[key] = triton_gelu(x)\n"
             "    return memo[key]")],
           expect=("same shape",), grader=("earlier trial",)),
]
