#!/usr/bin/env bash
# On the H100: the real-shape sweeps of stages 6 and 7 in one device call (< 600 s),
# eight files in $OUT (what a device call brings back):
#   a06_matmul_real_shapes.{md,csv,png}  python -m solutions.a06_matmul.bench --shapes real
#   a07_real_shapes.{md,csv,png}         python -m solutions.a07_flash_attention.bench --shapes real
#   a06_real.log, a07_real.log           the GPU, versions, every measured line, the time taken
# Usage (from the repository root):  OUT=/some/dir bash lectures/_tools/gpu/sweep_run.sh
# Budget (H100, by arithmetic, not yet measured): a06 ~61 bf16 + 6 fp32 shapes x ~2-2.5 s (one
# Triton autotune, ~9 configs x ~0.15 s, and three CUDA-graph timings) + cold Triton compiles
# ~30-50 s = ~3-3.5 min, plus building the CUDA extension for v7 the first time (~1-1.5 min,
# cached in TORCH_EXTENSIONS_DIR); a07 32 shapes x ~1 s + ~32 cold kernel compiles = ~1.5 min.
# The timeouts keep the whole call under 600 s; rows are written to the CSVs as they are measured,
# so a run cut short keeps its numbers (rebuild its report with --report-only CMD).
set -u
OUT=${OUT:-/tmp/sweep_out}
mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext}
PY=${PY:-python3}
info() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
}
info > "$OUT/a06_real.log" 2>&1
t0=$(date +%s)
timeout ${T_A06:-340} $PY -m solutions.a06_matmul.bench --shapes real --out "$OUT" >> "$OUT/a06_real.log" 2>&1
echo "[sweep] a06 rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/a06_real.log"
info > "$OUT/a07_real.log" 2>&1
t0=$(date +%s)
timeout ${T_A07:-200} $PY -m solutions.a07_flash_attention.bench --shapes real --out "$OUT" >> "$OUT/a07_real.log" 2>&1
echo "[sweep] a07 rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/a07_real.log"
grep -h -A7 "^## Floors" "$OUT/a06_matmul_real_shapes.md" "$OUT/a07_real_shapes.md" 2>/dev/null
