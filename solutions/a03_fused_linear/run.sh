#!/usr/bin/env bash
# Stages 1-3 on the GPU machine: the Linear benchmark behind lectures/results/a01_a03_linear.{md,csv}.
#   OUT=/some/dir bash solutions/a03_fused_linear/run.sh        (from the repository root; about a minute)
set -u
OUT=${OUT:-/tmp/linear_out}; mkdir -p "$OUT"
PY=${PY:-python3}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/bench.log" 2>&1
timeout ${T_BENCH:-400} $PY -m solutions.a03_fused_linear.bench --out "$OUT" >> "$OUT/bench.log" 2>&1
echo "[linear] bench rc=$?"
tail -30 "$OUT/bench.log"
