#!/usr/bin/env bash
# Nsight Compute on the stages' benchmark cases (H100), the commands behind lectures/results/ncu_*.txt:
#   bash lectures/_tools/gpu/ncu_run.sh                      (from the repository root; writes lectures/results/)
#   OUT=/some/dir STAGES="a05 a03" bash lectures/_tools/gpu/ncu_run.sh
# For each stage: python3 -m common.course.ncu STAGE --impl solutions, i.e. ncu on one call of the grader's
# performance case (solutions/aNN_name/stage.py) and one of its PyTorch baseline, the stage's few metrics beside
# its roofline. Writes $OUT/ncu_STAGE.txt (command and machine on top, then the report) and
# $OUT/ncu_STAGE.log (ncu's progress and errors). Clocks: NCU_CLOCKS=none (default) leaves them
# unlocked, as the benchmarks run (ncu's own default, base, was not tried on the lent H100);
# NCU_CLOCKS=base to lock them. About a minute a stage; T_STAGE seconds at most each (300).
set -u
OUT=${OUT:-lectures/results}; mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext} PYTHONUNBUFFERED=1
PY=${PY:-python3}
NCU_CLOCKS=${NCU_CLOCKS:-none}
NCU_BIN=$($PY -c "from common.course.ncu import find_ncu; print(find_ncu() or '')")
[ -z "$NCU_BIN" ] && { echo "[ncu] no ncu found (PATH, \$NCU, /usr/local/cuda/bin, /opt/nvidia/nsight-compute/*)"; exit 2; }
export NCU=$NCU_BIN
ENV_LINE="$(date -u '+%Y-%m-%d %H:%M UTC'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1), \
$("$NCU" --version | tail -1), $($PY -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__)")"
echo "[ncu] $ENV_LINE"
for s in ${STAGES:-a05 a03 a06 a07}; do
  t0=$(date +%s)
  cmd="$PY -m common.course.ncu $s --impl solutions --ncu-args \"--clock-control $NCU_CLOCKS\""
  { echo "# $cmd   (lectures/_tools/gpu/ncu_run.sh)"
    echo "# $ENV_LINE"
    echo; } > "$OUT/ncu_$s.txt"
  timeout "${T_STAGE:-300}" $PY -m common.course.ncu "$s" --impl solutions --ncu-args "--clock-control $NCU_CLOCKS" \
    >> "$OUT/ncu_$s.txt" 2> "$OUT/ncu_$s.log"
  rc=$?
  echo "[ncu] $s rc=$rc in $(( $(date +%s) - t0 )) s"
  [ $rc -ne 0 ] && tail -15 "$OUT/ncu_$s.log"
done
head -c 3000 "$OUT"/ncu_a05.txt 2>/dev/null
