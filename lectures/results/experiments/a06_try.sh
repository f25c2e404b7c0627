#!/bin/bash
# Stage-6 floors experiment on the H100 (issue #12): each variant of a06_try.py in its own process
# with a time limit (a hang or crash costs its limit only), rows appended to the CSV as measured,
# the whole run bounded by BUDGET seconds (default 460: one device call of < 8 min). Files in $OUT:
#   gpu.txt (GPU, clocks, versions), a06_try.log (every line), a06_try.csv (every config timed),
#   a06_try.md (best config per variant and shape: TFLOP/s, ratio to cuBLAS, correct?)
# Usage, from the repository root:  OUT=/some/dir bash lectures/results/experiments/a06_try.sh
# Budget by arithmetic (not yet measured): 15 processes x ~6-8 s (torch + CUDA init) = ~100 s; ~170 cold
# Triton compiles x ~1.1 s (0.3-4.7 s each when compiled for sm_90 on the CPU that wrote this, a06_try_asm.log)
# = ~190 s, shipped's autotuner being ~50 of them; ~270 (shape, config) timings x ~0.2 s (CUDA-graph replay,
# 50 ms, L2 flushed, plus the float64 check) = ~60 s: ~6 min. BUDGET cuts the last variants if compiles are
# slower. tma_ws runs last (it hung in stage 7; its sm_90 PTX is the same as tma's, a06_try_asm.log).
set -u
OUT=${OUT:-/tmp/a06_try_out}; mkdir -p "$OUT"
PY=${PY:-python3}
BUDGET=${BUDGET:-460}
export PYTHONUNBUFFERED=1
T0=$(date +%s)
CSV="$OUT/a06_try.csv"; LOG="$OUT/a06_try.log"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
# variant:time limit (s); the limits sum to more than BUDGET: each is cut to what is left
for vt in shipped:120 occ:45 base:40 tf32_kmaj:40 tf32_cfg:40 tf32_reg:40 tf32_swap:40 splitk:60 bk128:40 tma:50 \
          unal_cfg:45 recomp:45 prefetch:45 gemv:25 pad:30 tma_ws:45; do
  v=${vt%%:*}; lim=${vt##*:}
  [ -n "${VARIANTS:-}" ] && [[ " $VARIANTS " != *" $v "* ]] && continue   # VARIANTS="shipped occ": those only
  left=$(( BUDGET - ($(date +%s) - T0) ))
  (( lim > left )) && lim=$left
  if (( lim < 15 )); then echo "[try] $v: skipped, budget spent" | tee -a "$LOG"; continue; fi
  t=$(date +%s)
  timeout -k 5 $lim $PY lectures/results/experiments/a06_try.py --time "$v" --csv "$CSV" >> "$LOG" 2>&1
  rc=$?
  echo "[try] $v: rc $rc in $(( $(date +%s) - t )) s (limit $lim s; 124 = timed out)" | tee -a "$LOG"
done
$PY lectures/results/experiments/a06_try.py --table "$CSV" "$OUT/a06_try.md" 2>&1 | tee -a "$LOG"
echo "[try] total $(( $(date +%s) - T0 )) s" | tee -a "$LOG"
