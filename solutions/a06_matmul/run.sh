#!/usr/bin/env bash
# Assignment 6 on the H100: the exact commands behind lectures/results/a06_matmul.*
#   OUT=/some/dir bash solutions/a06_matmul/run.sh      (from the repository root)
# 1. the stage's tests on solutions/, 2. the benchmark, 3. the stage's tests on the stubs.
# The real-shape sweep (bench.py --shapes real) has its own call: lectures/_tools/gpu/sweep_run.sh.
set -u
OUT=${OUT:-/tmp/a06_out}
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext}
PY=${PY:-python3}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/bench.log" 2>&1
t0=$(date +%s)
timeout ${T_TEST:-200} $PY -m pytest tests/test_a06_matmul.py --impl solutions -q -rfEs > "$OUT/test_solutions.log" 2>&1
echo "[a06] solutions tests rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/test_solutions.log")"
t0=$(date +%s)
timeout ${T_BENCH:-300} $PY -m solutions.a06_matmul.bench --out "$OUT" ${BENCH_ARGS:-} >> "$OUT/bench.log" 2>&1
echo "[a06] bench rc=$? in $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout ${T_STUB:-240} $PY -m pytest tests/test_a06_matmul.py --impl assignments -q > "$OUT/test_assignments.log" 2>&1
echo "[a06] stub tests rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/test_assignments.log")"
grep -E "FAILED|ERROR" "$OUT/test_solutions.log" | head -20
grep -A8 "^## Floors" "$OUT/a06_matmul.md" 2>/dev/null || tail -30 "$OUT/bench.log"
