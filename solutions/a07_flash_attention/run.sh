#!/bin/bash
# Stage 7 on a GPU (H100): everything one device call needs, logs under $OUT.
#   bash solutions/a07_flash_attention/run.sh sweep    # tests, then per-config kernel times at S=4096
#   bash solutions/a07_flash_attention/run.sh full     # full benchmark, then tests
#   bash solutions/a07_flash_attention/run.sh final    # tests, full benchmark, autotuned benchmark at S=4096
#   bash solutions/a07_flash_attention/run.sh bench    # full benchmark only
# The real-shape sweep (bench.py --shapes real): lectures/_tools/gpu/sweep_run.sh.
set -u
OUT=${OUT:-/tmp/a07_out}; mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=/tmp/ext
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
mode=${1:-bench}
tests() {
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest tests/test_a07_flash_attention.py --impl solutions -q -rs 2>&1 \
    | tee "$OUT/pytest_solutions.log" | tail -8
}
bench() {
  timeout ${BENCH_TIMEOUT:-420} python3 -m solutions.a07_flash_attention.bench 2>&1 | tee "$OUT/bench.log" \
    | grep -vE "^\[a07\] (tiled|naive|triton|sdpa|memory)" | tail -40
  cp lectures/results/a07_* "$OUT/" 2>/dev/null
}
case "$mode" in
  sweep) tests; python3 -m solutions.a07_flash_attention.bench --sweep 2>&1 | tee "$OUT/sweep.log" | grep -E "BEST|sdpa|Error" ;;
  full)  bench; tests ;;   # (the TMA-forward experiment it ran first: EXPERIMENTS.md, a07_tma_try)
  bench) bench ;;
  final) TEST_TIMEOUT=150 tests; BENCH_TIMEOUT=280 bench
         timeout 150 python3 -m solutions.a07_flash_attention.bench --tune 2>&1 | tee "$OUT/bench_tune.log" \
           | grep -E "autotune|^\| (64|128) "
         cp lectures/results/a07_flash_attention_tuned.* "$OUT/" 2>/dev/null ;;
esac
echo "done"
