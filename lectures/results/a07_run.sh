#!/bin/bash
# Stage 7 GPU session: tests, then a config sweep or the full benchmark.
#   bash lectures/results/a07_run.sh sweep|bench|tests
set -u
OUT=${OUT:-/tmp/a07_out}; mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=/tmp/ext
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
mode=${1:-bench}
if [ "$mode" != "bench" ] || [ "${2:-}" = "tests" ]; then
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest tests/test_a07_flash_attention.py --impl solutions -q -rs 2>&1 | tee "$OUT/pytest_solutions.log" | tail -25
fi
if [ "$mode" = "sweep" ]; then
  python3 -m solutions.a07_flash_attention.bench --sweep 2>&1 | tee "$OUT/sweep.log" | grep -E "BEST|sdpa|Error" 
elif [ "$mode" = "bench" ]; then
  python3 -m solutions.a07_flash_attention.bench 2>&1 | tee "$OUT/bench.log" | grep -vE "^\[a07\] (tiled|naive)" | tail -60
  cp lectures/results/a07_* "$OUT/" 2>/dev/null
fi
echo "done"
