#!/usr/bin/env bash
# Native autograd (common.course.native) on the GPU, in one call (about 5 minutes): build the extension, its tests,
# stage 7's GPU tests, then the host-cost bench's flash cases and training steps (native against Python
# autograd in the same rounds).
#   OUT=$OUT bash lectures/_tools/gpu/native_run.sh [tests|bench|all]
set -u
OUT=${OUT:-/tmp/native_out}; mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext} TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-/tmp/tc} PYTHONPATH=. PYTHONUNBUFFERED=1
PY=${PY:-python3}
WHAT=${1:-all}
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/env.txt"
$PY -c "
import time; t = time.time()
from common.course import native
m = native.load(wait=True)
print('[native] extension', 'ready' if m else 'unavailable: ' + native.reason, f'in {time.time() - t:.0f} s')" 2>&1 | tee "$OUT/build.txt"
if [ "$WHAT" != bench ]; then
  timeout 300 $PY -m pytest --impl solutions tests/test_native.py -q -n 0 -x > "$OUT/test_native.log" 2>&1
  echo "[native] test_native rc=$? $(tail -1 "$OUT/test_native.log")"
  timeout 400 $PY -m pytest --impl solutions tests/test_a07_flash_attention.py tests/test_hostcost.py -q -n 8 > "$OUT/test_a07.log" 2>&1
  echo "[native] a07+hostcost rc=$? $(tail -1 "$OUT/test_a07.log")"
fi
if [ "$WHAT" != tests ]; then
  timeout 300 $PY -m common.course.hostcost --impl solutions --cases ${CASES:-a07_fwd,a07_fwd_bwd} --out "$OUT/hc" > "$OUT/hc.log" 2>&1
  echo "[native] hostcost rc=$?"; grep "\[hostcost\]" "$OUT/hc.log"
fi
