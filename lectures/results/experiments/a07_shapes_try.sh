#!/bin/bash
# Stage-7 small-S / backward experiment on the H100 (a07_shapes_try.py's docstring says what it tries).
# One command from the repository root; at most 6 files into $OUT; bounded by the timeouts below
# (10 + 120 + 110 + 140 + 20 s = 400 s at worst, plus a few seconds of start-up; about 4-5 minutes expected):
#   OUT=/some/dir bash lectures/results/experiments/a07_shapes_try.sh
# 1. compile every config the timing uses (~280 kernels), 15 processes in parallel into Triton's disk cache
# 2. time the forward variants, then the backward ones (one process each, rows appended to the CSV as measured)
# 3. the per-shape table (best found vs shipped vs SDPA) -> summary.md
OUT=${OUT:-/tmp/a07_shapes}; export OUT; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
S=lectures/results/experiments/a07_shapes_try.py
rm -f "$OUT"/{shapes_try.csv,warm.log,time_fwd.log,time_bwd.log,summary.md}
timeout 10 nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader | tee "$OUT/gpu.txt"
$PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
t0=$(date +%s)
N=15
for i in $(seq 0 $((N - 1))); do
  timeout 120 $PY $S --warm $i $N >> "$OUT/warm.log" 2>&1 &
done
wait
echo "[sh] warm: $(( $(date +%s) - t0 )) s; $(grep -c 'compiled in' "$OUT/warm.log")/$N shards done" | tee -a "$OUT/warm.log"
grep -v "compiled in" "$OUT/warm.log" | head -5
for p in fwd bwd; do
  lim=$([ $p = fwd ] && echo 110 || echo 140)
  t1=$(date +%s)
  timeout $lim $PY $S --time $p > "$OUT/time_$p.log" 2>&1
  rc=$?
  echo "[sh] time $p: rc $rc in $(( $(date +%s) - t1 )) s (124 = hit its ${lim} s limit: the rest of its shapes missing)" | tee -a "$OUT/time_$p.log"
  grep -E "Error|Traceback|WRONG" "$OUT/time_$p.log" | head -5
done
timeout 20 $PY $S --report
echo "[sh] total $(( $(date +%s) - t0 )) s"
