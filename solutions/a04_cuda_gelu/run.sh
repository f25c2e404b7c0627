#!/usr/bin/env bash
# Stages 4-5 on the GPU machine, in one call: build, test (solutions and stubs), bench.
#   OUT=/some/dir bash solutions/a04_cuda_gelu/run.sh        (from the repository root)
# Logs and results go under $OUT; the summary is printed last.
set -u
OUT=${OUT:-/tmp/a04_a05_out}; mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext}
PY=${PY:-python3}
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# 1. Build the four extensions (solutions/assignments x precise/fast-math) in parallel.
t0=$(date +%s)
for tree in solutions assignments; do for fm in False True; do
  $PY -c "import common; from common.impl import load; load('a04_cuda_gelu.fused_gelu', '$tree').build($fm)" \
    > "/tmp/build_${tree}_${fm}.log" 2>&1 &
done; done; wait
echo "builds: $(( $(date +%s) - t0 )) s"; grep -il error /tmp/build_*.log && tail -20 /tmp/build_*.log

# 2. Tests: the solutions must pass; the stubs must pass no graded test. (SKIP_TESTS=1: bench only)
[ -z "${SKIP_TESTS:-}" ] && timeout 300 $PY -m pytest tests/test_a04_cuda_gelu.py tests/test_a05_triton_gelu.py --impl solutions -q -rfE \
  > "$OUT/pytest_solutions.log" 2>&1
[ -z "${SKIP_TESTS:-}" ] && timeout 200 $PY -m pytest tests/test_a04_cuda_gelu.py tests/test_a05_triton_gelu.py --impl assignments -q -m graded \
  > "$OUT/pytest_assignments_graded.log" 2>&1

# 3. Bench (writes a04_a05_gelu.md/.csv/.png).
timeout 400 $PY -m solutions.a04_cuda_gelu.bench ${BENCH_ARGS:-} --out "$OUT" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"

echo "=== pytest solutions";   grep -E "^(FAILED|ERROR)" "$OUT/pytest_solutions.log" 2>/dev/null | head -30; tail -1 "$OUT/pytest_solutions.log" 2>/dev/null
echo "=== pytest assignments (graded)"; tail -1 "$OUT/pytest_assignments_graded.log" 2>/dev/null
echo "=== bench";  tail -40 "$OUT/bench.log"
