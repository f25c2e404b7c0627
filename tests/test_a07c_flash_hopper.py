"""Stage 7c (advanced, optional): the Hopper flash-attention forward in CUDA (TMA + wgmma,
warp-specialised producer/consumer warpgroups), a07_flash_attention/flash_hopper.py.

GPU tests run on an sm_90 GPU only (H100/H200) and skip elsewhere with the reason. They check
O and L against common.reference.attention (float64, materialised matrix) on fresh random
bf16 inputs, S in {1, 17, 128, 1000, 4096} (no multiple of the 128-row tiles but 128 and
4096), d 64 and 128, causal and not, B*H > 1; against SDPA's own error on the same inputs
(common.testing.assert_as_accurate_as_torch); and that every call is the stage's kernel
(no SDPA / cuBLAS kernel: common.kernel_check). The bad-input tests and the source compile
check run on a CPU.

    python -m pytest tests/test_a07c_flash_hopper.py --impl solutions -q -rs
    bash solutions/a07_flash_attention/run_hopper.sh       # H100: build, these tests, memcheck, benchmark
"""
import pytest
import torch
import torch.nn.functional as F

from common import HAS_CUDA, gpu, is_hopper
from common import reference as ref
from common.impl import REPO
from common.kernel_check import ATTENTION_KERNEL, assert_is_kernel
from common.testing import assert_as_accurate_as_torch, assert_close, randn

STAGE = "a07_flash_attention"
MOD = f"{STAGE}.flash_hopper"
HOPPER = is_hopper()
hopper_only = pytest.mark.skipif(not HOPPER, reason=(gpu.why_not("a07c") if HAS_CUDA else None)
                                 or "stage 7c needs an sm_90 GPU (H100/H200): TMA, wgmma, setmaxnreg")
BF16 = torch.bfloat16

SEQ_LENS = (1, 17, 128, 1000, 4096)


@pytest.fixture
def fa3(impl):
    return impl.load(MOD)


def qkv(b, h, s, d, device="cuda"):
    return [randn(b, h, s, d, dtype=BF16, device=device) for _ in range(3)]


def run(fa3, q, k, v, causal):
    """The kernel's (O, L), checked to be the stage's own work (no SDPA, cuBLAS or softmax kernel)."""
    return assert_is_kernel(lambda: fa3.flash_attention_hopper(q, k, v, causal=causal), ATTENTION_KERNEL,
                            "flash_attention_hopper")


def check_against_reference(o, lse, q, k, v, causal, *, sdpa=True):
    b, h, s, d = q.shape
    assert isinstance(o, torch.Tensor) and isinstance(lse, torch.Tensor), "expected a tuple (O, L) of tensors"
    assert o.dtype == BF16 and tuple(o.shape) == (b, h, s, d), f"O: {o.dtype} {tuple(o.shape)}"
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (b, h, s), f"L: {lse.dtype} {tuple(lse.shape)}"
    assert o.is_contiguous() and lse.is_contiguous()
    ro, rl = ref.attention(q, k, v, is_causal=causal)
    assert torch.isfinite(o).all(), f"O has {int((~torch.isfinite(o)).sum())} non-finite values"
    assert_close(o, ro, dtype=BF16, name="O")
    # L in fp32 from fp32 scores (bf16 products are exact in fp32): 1e-5 as stage 7's check_lse,
    # with ex2.approx / lg2.approx inside. Widen to 1e-4 only if the GPU says so (and note it).
    assert_close(lse, rl, dtype=torch.float32, rel_tol=1e-5, name="L")
    if sdpa:
        so = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        assert_as_accurate_as_torch(o, ro, so, dtype=BF16, name="O")


@pytest.mark.gpu
@hopper_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("s", SEQ_LENS)
def test_hopper_forward_matches_float64(fa3, s, d, causal):
    b, h = (1, 2) if s >= 4096 else (2, 3)
    q, k, v = qkv(b, h, s, d)
    o, lse = run(fa3, q, k, v, causal)
    check_against_reference(o, lse, q, k, v, causal)


@pytest.mark.gpu
@hopper_only
@pytest.mark.parametrize("d", [64, 128])
def test_hopper_same_shape_new_values(fa3, d):
    """Two calls of one shape with new values (a cache per shape fails), large-magnitude scores
    (the running max must move: inputs scaled by 4) and B*H = 5."""
    for scale in (1.0, 4.0):
        q, k, v = (t * scale for t in qkv(1, 5, 333, d))
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        for causal in (False, True):
            o, lse = run(fa3, q, k, v, causal)
            check_against_reference(o, lse, q, k, v, causal, sdpa=False)


@pytest.mark.gpu
@hopper_only
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", [64, 128])
def test_hopper_many_tiles_per_block(fa3, d, causal):
    """More work tiles than SMs (13 query blocks x B*H = 40: 520 tiles, S = 1537 ragged): the
    persistent blocks walk several tiles each, the next tile's Q and K/V loads overlapping this
    one's end; causal tiles differ in length. Called twice: the tile counter is reset per launch."""
    q, k, v = qkv(2, 20, 1537, d)
    for _ in range(2):
        o, lse = run(fa3, q, k, v, causal)
        check_against_reference(o, lse, q, k, v, causal, sdpa=False)


@pytest.mark.gpu
@hopper_only
def test_hopper_causal_first_rows(fa3):
    """Causal row 0 sees key 0 only: O[..., 0, :] = V[..., 0, :] and L = q0·k0/sqrt(d) exactly
    (up to bf16 rounding); row 1 sees keys 0 and 1. Catches an off-by-one on the diagonal."""
    q, k, v = qkv(2, 2, 130, 128)
    o, lse = run(fa3, q, k, v, True)
    assert_close(o[..., 0, :], v[..., 0, :].double(), dtype=BF16, name="O row 0")
    s00 = (q[..., 0, :].double() * k[..., 0, :].double()).sum(-1) / 128 ** 0.5
    assert_close(lse[..., 0], s00, dtype=torch.float32, rel_tol=1e-5, name="L row 0")


# ----------------------------------------------------------------------------- bad input (CPU)
@pytest.mark.given
def test_bad_input(impl):
    """Clear errors before anything is built; all of these run on a CPU."""
    mod = impl.load(MOD)
    f = mod.flash_attention_hopper
    q = torch.randn(1, 2, 8, 64).to(BF16)
    with pytest.raises(TypeError, match="dtype"):
        f(q.float(), q.float(), q.float())
    with pytest.raises(TypeError, match="dtype"):
        f(q.half(), q.half(), q.half())
    with pytest.raises(TypeError, match="torch.Tensor"):
        f(q.tolist(), q, q)
    with pytest.raises(ValueError, match="4 dims"):
        f(q[0], q[0], q[0])
    with pytest.raises(ValueError, match="one shape"):
        f(q, q[:, :, :7].contiguous(), q)
    with pytest.raises(ValueError, match="head dim"):
        x = torch.randn(1, 2, 8, 32).to(BF16)
        f(x, x, x)
    with pytest.raises(ValueError, match="head dim"):
        x = torch.randn(1, 2, 8, 96).to(BF16)
        f(x, x, x)
    with pytest.raises(ValueError, match="contiguous"):
        t = torch.randn(1, 8, 2, 64).to(BF16).transpose(1, 2)     # [B, H, S, d] view of [B, S, H, d]
        f(t, t, t)
    with pytest.raises(ValueError, match="S >= 1"):
        x = torch.randn(1, 2, 0, 64).to(BF16)
        f(x, x, x)
    with pytest.raises(ValueError, match="expected a tensor on 'cuda'"):
        f(q, q, q)                                              # a legal input, on the CPU


@pytest.mark.given
def test_off_hopper_says_so(impl, monkeypatch):
    """Off sm_90 the wrapper refuses with a RuntimeError naming the GPU found (CPU: faked)."""
    mod = impl.load(MOD)
    if HOPPER:
        pytest.skip("this is an sm_90 GPU")
    if not HAS_CUDA:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
        with pytest.raises(RuntimeError, match=r"sm_90.*A100.*sm_80"):
            mod._require_hopper(torch.device("cuda", 0))
        monkeypatch.undo()
        with pytest.raises(RuntimeError, match="no CUDA GPU"):
            mod._require_hopper(torch.device("cuda", 0))
        return
    q = torch.randn(1, 2, 8, 64, device="cuda").to(BF16)
    name = torch.cuda.get_device_name()
    with pytest.raises(RuntimeError, match="sm_90") as e:
        mod.flash_attention_hopper(q, q, q)
    assert name in str(e.value)


@pytest.mark.nvcc
def test_hopper_sources_compile():
    """nvcc (sm_90a, with and without -DA07C_SM90A) and the host compiler accept the kernel and the
    binding, solution and stub (no GPU needed)."""
    from common.cuda_ext import compile_check
    for tree in ("solutions", "assignments"):
        d = REPO / tree / STAGE
        compile_check([d / "flash_fwd_hopper.cu"])
        compile_check([d / "flash_fwd_hopper.cu"], extra_flags=("-DA07C_SM90A",))
    compile_check([REPO / "solutions" / STAGE / "binding.cpp"])


@pytest.mark.nvcc
def test_hopper_kernel_keeps_wgmma_async():
    """ptxas (sm_90a) neither serialises the wgmma's (warning C7510: a function call such as printf
    in the kernel, or accumulators it cannot keep in registers) nor spills: either costs most of
    the speed, and both show without a GPU."""
    import subprocess

    from common.cuda_ext import nvcc_path
    src = REPO / "solutions" / STAGE / "flash_fwd_hopper.cu"
    r = subprocess.run([nvcc_path(), "-c", str(src), "-o", "/dev/null", "-std=c++17", "-O3",
                        "-gencode=arch=compute_90a,code=sm_90a", "-DA07C_SM90A", "--expt-relaxed-constexpr",
                        f"-I{REPO / 'common'}", "-Xptxas", "-v"], capture_output=True, text=True)
    log = r.stdout + r.stderr
    assert r.returncode == 0, log
    assert "C7510" not in log and "serialized" not in log, f"ptxas serialises the wgmma's:\n{log}"
    spills = [ln for ln in log.splitlines() if "spill" in ln and not ln.strip().startswith("0 bytes stack frame, 0 bytes spill")]
    assert not spills, "register spills:\n" + "\n".join(spills)


@pytest.mark.nvcc
def test_hopper_tma_plan_and_descriptors_emulated():
    """The kernel's host code and shared-memory plan, checked on a CPU: tests/a07c/
    host_check.cu runs launch()'s make_map calls against a mock cuTensorMapEncodeTiled that
    enforces the driver's documented limits (dims {d, S, B*H}, byte strides multiple of 16, box
    <= 256, 128-byte inner box for SWIZZLE_128B, zero fill) and checks each expect-tx count against
    the full boxes TMA delivers (rows past S included); layout_emu.py then emulates the TMA
    copies (swizzle, zero fill), decodes every wgmma descriptor of Plan<D> (K-major Q/K, MN-major
    V: start, LBO, SBO) byte by byte, models the mbarrier protocol (counts, expect-tx, parity) under
    random schedules, and runs the consumers' per-lane math against float64."""
    import subprocess
    import sys
    script = REPO / "tests" / "a07c" / "layout_emu.py"
    r = subprocess.run([sys.executable, str(script), "--quick"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "emulation ok" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
