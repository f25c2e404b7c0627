#!/usr/bin/env bash
# Stage 6, CUDA v7 (persistent blocks, tile shape per problem) on the H100:
#   OUT=/some/dir bash solutions/a06_matmul/run_v7.sh      (from the repository root)
# 1. the CUDA tests on solutions/ (v7's every tile shape with many tiles per block included),
# 2. compute-sanitizer memcheck over each tile shape, 3. each tile shape and the kernel's own pick
# at every v7 shape of the real-shape sweep against cuBLAS (a06_v7_tiles.py, beside this script),
# 4. the v7 tests on the stubs (all must fail).
set -u
OUT=${OUT:-/tmp/a06_v7}
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext} PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
PY=${PY:-python3}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
t0=$(date +%s)
timeout ${T_TEST:-240} $PY -m pytest tests/test_a06_matmul.py --impl solutions -q -rfEs -k "cuda" > "$OUT/v7_test_solutions.log" 2>&1
echo "[v7] solutions CUDA tests rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/v7_test_solutions.log")"
grep -E "^(FAILED|ERROR)" "$OUT/v7_test_solutions.log" | head -10
t0=$(date +%s)
timeout ${T_SAN:-150} compute-sanitizer --tool memcheck $PY -c "
import torch
from common.impl import load
cu = load('a06_matmul.matmul_cuda', 'solutions')
for tile in (None, *cu.V7_TILES):
    for m, n, k in ((300, 264, 136), (1040, 2056, 200)):
        a = torch.randn(m, k, device='cuda', dtype=torch.bfloat16); b = torch.randn(k, n, device='cuda', dtype=torch.bfloat16)
        err = ((cu.matmul(a, b, 7, tile=tile).float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm()).item()
        print(tile, (m, n, k), f'{err:.1e}')
torch.cuda.synchronize()
" > "$OUT/v7_memcheck.log" 2>&1
echo "[v7] memcheck rc=$? in $(( $(date +%s) - t0 )) s: $(grep -E 'ERROR SUMMARY' "$OUT/v7_memcheck.log")"
t0=$(date +%s)
timeout ${T_TILES:-240} $PY lectures/_tools/gpu/a06_v7_tiles.py --out "$OUT" > "$OUT/a06_v7_tiles.log" 2>&1
echo "[v7] tiles rc=$? in $(( $(date +%s) - t0 )) s"
tail -3 "$OUT/a06_v7_tiles.log"
t0=$(date +%s)
timeout ${T_STUB:-200} $PY -m pytest tests/test_a06_matmul.py --impl assignments -q --tb=no -k "v7" > "$OUT/v7_test_assignments.log" 2>&1
echo "[v7] stub v7 tests rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/v7_test_assignments.log")"
