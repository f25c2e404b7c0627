"""What the GPU at hand can do, asked of the device: never an H100's numbers written into a kernel.

    from common import gpu
    gpu.capability()                 # (8, 9) on an RTX 4090; None without a CUDA GPU
    gpu.sm()                         # "sm_89"
    gpu.describe()                   # "NVIDIA GeForce RTX 4090 (sm_89)"
    gpu.shared_memory_per_block()    # 101376: bytes one block may use (the opt-in maximum)
    gpu.sm_count(), gpu.l2_bytes()   # from torch.cuda.get_device_properties
    gpu.missing(9, 0, "stage 7c uses Hopper's TMA and wgmma")   # None, or why this GPU cannot

``ARCHS`` lists the GPU families the course is checked against without owning them: the
cross-compile test (tests/test_portability.py, common/course/portability.py) compiles every Triton kernel
for each and checks it against that family's limits. Each number there is NVIDIA's published limit
for the architecture (CUDA C++ Programming Guide, "Technical Specifications per Compute
Capability"); a kernel asks the device it runs on (the functions below), never this table.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch


@dataclass(frozen=True)
class Arch:
    """One GPU architecture: its compute capability and the per-block limits a kernel must fit."""
    name: str                    # "sm_86"
    capability: tuple[int, int]
    smem_per_block: int          # bytes of shared memory one block may use (opt-in maximum)
    gpus: str                    # the cards students have with it
    regs_per_block: int = 65536  # 32-bit registers one block may use
    max_regs_per_thread: int = 255
    #: what the course's kernels lack on it (README's "Which GPU" table says the same)
    notes: str = ""

    @property
    def arch(self) -> int:
        """Triton's ``GPUTarget`` arch: 86 for sm_86."""
        return self.capability[0] * 10 + self.capability[1]


#: The families the course is checked against (cross-compiled on any machine, run on the H100).
ARCHS = {
    "sm_90": Arch("sm_90", (9, 0), 232448, "H100, H200", notes="the course's measured GPU"),
    "sm_80": Arch("sm_80", (8, 0), 166912, "A100, A30"),
    "sm_86": Arch("sm_86", (8, 6), 101376, "RTX 30xx, A10, A40, RTX A6000"),
    "sm_89": Arch("sm_89", (8, 9), 101376, "RTX 40xx, L4, L40"),
    "sm_75": Arch("sm_75", (7, 5), 65536, "T4 (Colab's free GPU), RTX 20xx",
                  notes="no bf16 tensor cores, no cp.async: Triton 3.6 compiles tl.dot to FMA (CUDA cores) "
                        "and emulates bf16 conversions"),
}


def _index(device) -> int:
    if device is None:
        return torch.cuda.current_device()
    device = torch.device(device) if not isinstance(device, torch.device) else device
    return device.index if device.index is not None else torch.cuda.current_device()


def capability(device=None) -> tuple[int, int] | None:
    """(major, minor) of the CUDA GPU ``device`` (default: the current one); None without a CUDA GPU."""
    if not torch.cuda.is_available():
        return None
    return tuple(torch.cuda.get_device_capability(device))


def sm(device=None) -> str:
    """"sm_89" for an RTX 4090; "cpu" without a CUDA GPU."""
    cap = capability(device)
    return f"sm_{cap[0]}{cap[1]}" if cap else "cpu"


def describe(device=None) -> str:
    """"NVIDIA GeForce RTX 4090 (sm_89)"; "no CUDA GPU" without one."""
    if not torch.cuda.is_available():
        return "no CUDA GPU"
    return f"{torch.cuda.get_device_name(device)} ({sm(device)})"


def missing(major: int, minor: int, what: str, device=None, *, exact: bool = False) -> str | None:
    """None if ``device`` has compute capability >= (major, minor) (``exact``: == it), else the reason
    it cannot run ``what``, naming both: "stage 7c uses Hopper's TMA and wgmma: it needs an sm_90 GPU
    (H100, H200); this GPU is NVIDIA A100-SXM4-80GB (sm_80)". For skips, refusals and the grader's notes."""
    cap = capability(device)
    ok = cap is not None and (cap == (major, minor) if exact else cap >= (major, minor))
    if ok:
        return None
    need = f"sm_{major}{minor}" + ("" if exact else "+")
    known = next((a.gpus for a in ARCHS.values() if a.capability == (major, minor)), "")
    return (f"{what}: it needs an {need} GPU{f' ({known})' if exact and known else ''}; "
            f"this {'GPU is ' + describe(device) if cap else 'machine has no CUDA GPU'}")


#: What the course's CUDA code needs beyond the oldest GPU it is checked for (sm_75): feature ->
#: (compute capability, exactly that one, what it uses). The Triton stages run on all of ARCHS.
NEEDS = {
    "a06 v5": ((8, 0), False, "matmul version 5 uses mma.sync m16n8k16 and cp.async"),
    "a06 v6": ((8, 0), False, "matmul version 6 uses mma.sync m16n8k16 and cp.async"),
    "a06 v7": ((9, 0), True, "matmul version 7 uses Hopper's TMA and wgmma (sm_90a code)"),
    "a07c": ((9, 0), True, "stage 7c uses Hopper's TMA, wgmma and setmaxnreg (sm_90a code)"),
}


def why_not(feature: str, device=None) -> str | None:
    """None if this GPU runs ``feature`` (a key of NEEDS), else why not, naming the GPU found."""
    (major, minor), exact, what = NEEDS[feature]
    return missing(major, minor, what, device, exact=exact)


@lru_cache(maxsize=None)
def _props(index: int):
    return torch.cuda.get_device_properties(index)


def shared_memory_per_block(device=None) -> int | None:
    """Bytes of shared memory one block may use on ``device`` (the opt-in maximum: what Triton and
    cudaFuncSetAttribute can grant; 227 KB on an H100, 99 KB on RTX 30xx/40xx, 64 KB on a T4).
    None without a CUDA GPU."""
    if not torch.cuda.is_available():
        return None
    index = _index(device)
    value = getattr(_props(index), "shared_memory_per_block_optin", None)
    if not value:   # an older torch lacks the field: ask Triton's driver (the number it checks against)
        from triton.runtime import driver
        value = driver.active.utils.get_device_properties(index)["max_shared_mem"]
    return int(value)


def sm_count(device=None) -> int | None:
    """Streaming multiprocessors of ``device`` (132 on an H100 SXM, 82 on an RTX 3090); None without a GPU."""
    return _props(_index(device)).multi_processor_count if torch.cuda.is_available() else None


def l2_bytes(device=None) -> int | None:
    """L2 cache size of ``device`` in bytes (50 MB on an H100, 6 MB on an RTX 3090); None without a GPU."""
    return int(_props(_index(device)).L2_cache_size) if torch.cuda.is_available() else None


def limits(device=None) -> tuple[tuple[int, int], int] | None:
    """(capability, shared memory per block) of ``device``: what a kernel's config must fit; None
    without a CUDA GPU or for a CPU tensor's device (the Triton interpreter has no such limits)."""
    if device is not None and torch.device(device).type != "cuda":
        return None
    if not torch.cuda.is_available():
        return None
    return _limits(_index(device))


@lru_cache(maxsize=None)
def _limits(index: int) -> tuple[tuple[int, int], int]:
    return capability(index), shared_memory_per_block(index)
