"""What one eager call of a Triton kernel costs through each way of registering it as a torch op,
and whether torch.compile(fullgraph=True) still traces each one (measured, not shipped).

    python lectures/_tools/hostcost_registration.py     # GPU: real launches; CPU: launches stubbed

The same one-kernel op (y = x, copied by a Triton kernel) five ways:
  direct           the Python function, no registration (what an eager call can run when nothing traces)
  custom_op        torch.library.custom_op + register_fake (stage 5's registration)
  triton_op        torch.library.triton_op + wrap_triton (torch.compile sees the kernel itself)
  Library.impl     Library.define + impl for the device's dispatch key + register_fake (stage 4's style, in Python)
  plain_eager      custom_op called only when common.launch.plain_eager says it is needed (stage 5's gelu)
Each: µs per eager call (median of batches, synchronised around each) and "fullgraph ok" when
torch.compile(fullgraph=True, backend="aot_eager") traces a function that calls it without a break and gets x back.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the repository root

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from common import DEVICE, HAS_CUDA  # noqa: E402
from common.course.hostcost import eager_us, stub_launches  # noqa: E402
from common.launch import cdiv, plain_eager  # noqa: E402


@triton.jit
def copy_kernel(X, Y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(Y + offs, tl.load(X + offs, mask=offs < n), mask=offs < n)


def body(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.numel()
    copy_kernel[(cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    return y


@torch.library.custom_op("hostcost_exp::copy_custom", mutates_args=())
def copy_custom(x: torch.Tensor) -> torch.Tensor:
    return body(x)


copy_custom.register_fake(lambda x: torch.empty(x.shape, dtype=x.dtype, device=x.device))


@torch.library.triton_op("hostcost_exp::copy_triton", mutates_args=())
def copy_triton(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    n = x.numel()
    torch.library.wrap_triton(copy_kernel)[(cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    return y


_lib = torch.library.Library("hostcost_exp", "FRAGMENT")
_lib.define("copy_lib(Tensor x) -> Tensor")
_lib.impl("copy_lib", body, "CUDA" if HAS_CUDA else "CPU")
torch.library.register_fake("hostcost_exp::copy_lib", lambda x: torch.empty(x.shape, dtype=x.dtype, device=x.device),
                            lib=_lib)
copy_lib = torch.ops.hostcost_exp.copy_lib.default


def copy_plain(x: torch.Tensor) -> torch.Tensor:
    return body(x) if plain_eager(x) else copy_custom(x)


VARIANTS = {"direct": body, "custom_op": copy_custom, "triton_op": copy_triton, "Library.impl": copy_lib,
            "plain_eager": copy_plain}


def traces(fn, x) -> str:
    import torch._dynamo
    torch._dynamo.reset()
    try:
        y = torch.compile(lambda t: fn(t * 1.0) + 0.0, fullgraph=True, backend="aot_eager")(x)
        return "yes" if torch.equal(y, x) else "wrong values"
    except Exception as e:  # noqa: BLE001 - a variant that does not trace is a result
        return f"no ({type(e).__name__})"
    finally:
        torch._dynamo.reset()


def main() -> None:
    x = torch.randn(4096, device=DEVICE)
    clock = "GPU, real launches" if HAS_CUDA else "CPU, launches stubbed (the Python alone)"
    print(f"one-kernel op, x [4096] fp32; {clock}; torch {torch.__version__}, triton {triton.__version__}")
    print(f"{'variant':<14} {'us/call':>8}  fullgraph (aot_eager)")
    ok = {name: traces(fn, x) if name != "direct" else "n/a (no op)" for name, fn in VARIANTS.items()}
    us = {name: [] for name in VARIANTS}
    with stub_launches() if not HAS_CUDA else _null():
        for _ in range(5):            # interleaved rounds, the best of each: a busy host hurts all alike
            for name, fn in VARIANTS.items():
                us[name].append(eager_us(lambda: fn(x), calls=200, runs=5))
    for name in VARIANTS:
        print(f"{name:<14} {min(us[name]):>8.1f}  {ok[name]}")


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


if __name__ == "__main__":
    main()
