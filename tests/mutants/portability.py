"""Configs too big for a GPU's shared memory (issue #33). The launch configs are given code, so these
are caught by tests/test_portability.py's cross-compile (its ``given`` tests), not by graded tests:
each mutant must make a kernel that does not fit some GPU family reach that family."""
from . import Mutant

P = dict(tests="test_portability.py", marker="given")
MUTANTS = [
    # the matmul autotuner keeps every candidate, whatever the GPU's shared memory (the H100's 128x256
    # fp32 tiles: 385 KB)
    Mutant("a06_matmul", "matmul_triton.py", "autotuner ignores the GPU's shared memory",
           [("    return limits is None or smem_estimate(config, size, limits[0]) <= limits[1] - SMEM_MARGIN",
             "    return True")], expect=("shared memory", "B per block on sm_"), **P),
    # a fixed attention config launched as it is on every GPU (fp32 at d = 128: 257 KB on an H100,
    # 16-bit dQ at d = 128: 128 KB on an RTX card's 99 KB)
    Mutant("a07_flash_attention", "flash_configs.py", "fixed config without its fallback for smaller GPUs",
           [("    return fn, dict(_pick(kind, d, n, dtype)), True", "    return fn, dict(_pick(kind, d, n, dtype)), False")],
           expect=("shared memory", "B per block on sm_"), **P),
    # a table entry too big for the H100 itself: the fallback rescues it, but the H100 no longer runs its table
    Mutant("a07_flash_attention", "flash_configs.py", "dQ tile at d=128 too big for the H100",
           [('"dq": {64: _cfg(128, 64, 8, 3), 128: _cfg(128, 64, 8, 3)}}',
             '"dq": {64: _cfg(128, 64, 8, 3), 128: _cfg(128, 128, 8, 4)}}')],
           expect=("no longer run as they are", "_attn_bwd_dq"), **P),
]
