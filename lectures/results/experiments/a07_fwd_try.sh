#!/bin/bash
# Issue #5 forward experiment on the H100: each variant in its own process with a time limit
# (a warp-specialized kernel that hangs costs its timeout only). Logs under $OUT.
#   bash lectures/results/experiments/a07_fwd_try.sh
OUT=${OUT:-/tmp/a07_out}; mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=/tmp/ext PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
for v in sdpa ptr "ws 128x64w4s2" "ws 128x128w4s2" "pipe 128x64w8s2" "desc 128x64w8s2"; do
  timeout 60 python3 lectures/results/experiments/a07_fwd_try.py --time "$v" 2>&1 | tee -a "$OUT/fwd_try.log" | grep -E "TIME|Error" \
    || echo "[try] TIME $v: no result (rc ${PIPESTATUS[0]})" | tee -a "$OUT/fwd_try.log"
done
for i in 0 1 2 3 4 5; do
  timeout 25 python3 lectures/results/experiments/a07_fwd_try.py --check "ws 128x64w4s2" $i 2>&1 | tee -a "$OUT/fwd_try.log" | grep -E "check|Error" \
    || echo "[try] check ws case $i: no result (rc ${PIPESTATUS[0]}: 124 = hung)" | tee -a "$OUT/fwd_try.log"
done
echo done
