#!/usr/bin/env bash
# Nsight Compute at the real-shape sweeps' losing shapes (gaps_ncu.py says which), each
# case in its own process, clocks not locked (--clock-control none: the clocks the benches run at).
# Sections: speed of light, compute workload, launch, occupancy, warp state, scheduler.
#   OUT=/some/dir bash lectures/_tools/gpu/gaps_ncu.sh
# Writes $OUT/gaps_ncu_CASE.txt (ncu's text report per kernel), $OUT/gaps_ncu_CASE.csv (the same, raw metrics) and
# $OUT/gaps_ncu.md (one line per kernel: gaps_ncu.py --summary).
set -u
OUT=${OUT:-/tmp/gaps_ncu}; mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext} PYTHONPATH=$PWD PYTHONUNBUFFERED=1
PY=${PY:-python3}
HERE=lectures/_tools/gpu
NCU=$(command -v ncu || echo "${CUDA_HOME:-/usr/local/cuda}/bin/ncu")
SECTIONS="--section SpeedOfLight --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy \
--section WarpStateStats --section SchedulerStats"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $("$NCU" --version | tail -1)" \
  | tee "$OUT/gaps_ncu.md"
for c in ${CASES:-mm_qkv2048 mm_mlpdown8192 mm_proj8192 attn_fwd512 attn_fb1537}; do
  t0=$(date +%s)
  timeout ${T_CASE:-240} "$NCU" --profile-from-start off --clock-control none $SECTIONS -o "$OUT/gaps_ncu_$c" -f \
    $PY $HERE/gaps_ncu.py "$c" > "$OUT/gaps_ncu_$c.log" 2>&1
  rc=$?
  "$NCU" --import "$OUT/gaps_ncu_$c.ncu-rep" --page details > "$OUT/gaps_ncu_$c.txt" 2>&1
  "$NCU" --import "$OUT/gaps_ncu_$c.ncu-rep" --csv --page raw > "$OUT/gaps_ncu_$c.csv" 2>&1
  echo "[ncu] $c rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc -ne 0 ] && tail -5 "$OUT/gaps_ncu_$c.log"
done
$PY $HERE/gaps_ncu.py --summary "$OUT" | tee -a "$OUT/gaps_ncu.md"
