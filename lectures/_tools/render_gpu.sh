#!/usr/bin/env bash
# Execute the eight lecture notebooks on a GPU machine and write executed copies.
#
#   TORCH_EXTENSIONS_DIR=/tmp/ext bash lectures/_tools/render_gpu.sh OUT_DIR
#
# Needs only python3 with torch, triton, matplotlib and transformers (no Jupyter): the
# notebooks run through lectures/_tools/execute.py. The CUDA extensions of assignments 4
# and 6 are built in the background while the notebooks that do not need them run first;
# lecture 8 runs last, after the builds (it times host-bound decode steps). Writes
# OUT_DIR/NN_name.ipynb (executed) and OUT_DIR/render.log. Copy the notebooks to
# lectures/rendered/ and commit them. Limits: NB_TIMEOUT seconds per notebook (300),
# TOTAL_TIMEOUT for all (480); a copy cut short keeps the cells it finished.
set -u
OUT=${1:?usage: render_gpu.sh OUT_DIR}
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext} PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
LOG="$OUT/render.log"
{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton, matplotlib, numpy, transformers; print('torch', torch.__version__, '| triton', triton.__version__, '| matplotlib', matplotlib.__version__, '| numpy', numpy.__version__, '| transformers', transformers.__version__)"
} > "$LOG" 2>&1
BUILD_LOG=$(mktemp)
python3 -c "from common.cuda_ext import build_course_ops; build_course_ops('solutions')" > "$BUILD_LOG" 2>&1 &
timeout "${TOTAL_TIMEOUT:-480}" python3 lectures/_tools/execute.py --allow-errors --timeout "${NB_TIMEOUT:-300}" --out "$OUT" \
  lectures/01_*.ipynb lectures/02_*.ipynb lectures/03_*.ipynb lectures/05_*.ipynb \
  lectures/07_*.ipynb lectures/04_*.ipynb lectures/06_*.ipynb lectures/08_*.ipynb >> "$LOG" 2>&1
rc=$?
wait
cat "$BUILD_LOG" >> "$LOG"; rm -f "$BUILD_LOG" "$OUT"/*.tmp
grep -E "^\[execute\]|\[build\]|ERROR" "$LOG"
exit $rc
