#!/usr/bin/env bash
# Issue #13 on a fresh H100: the default suite (`pytest --impl solutions`, no --mutants) as an
# instructor runs it, first cold (empty Triton, extension and inductor caches: what a fresh
# machine sees; tests/autograder.py then gives it worker processes, a test file each) and then
# warm (the cache filled: one process). .ci/compile_log.py accounts for the compiles per test,
# across the workers too. RUNS="cold warm one four" adds warm runs forced into one process
# (COURSE_WORKERS=0) and into four workers (COURSE_WORKERS=4), for comparison on the same machine.
#   OUT=/some/dir bash lectures/results/h100_suite/suite_workers.sh   -> $OUT/suite_{cold,warm}_workers.log
set -u
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/suite_workers}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.ci${PYTHONPATH:+:$PYTHONPATH}
export TRITON_CACHE_DIR=/tmp/sw-triton TORCH_EXTENSIONS_DIR=/tmp/sw-ext TORCHINDUCTOR_CACHE_DIR=/tmp/sw-inductor
rm -rf "$TRITON_CACHE_DIR" "$TORCH_EXTENSIONS_DIR" "$TORCHINDUCTOR_CACHE_DIR"
echo "cpus $(nproc); $(nvidia-smi --query-gpu=name --format=csv,noheader)"
python3 -c "import os, torch, triton.knobs as k; d = os.path.join(os.path.dirname(torch.__file__), '_inductor', 'bin')
print('ptxas: triton', k.nvidia.ptxas.version, k.nvidia.ptxas.path, '| torch bin:', os.listdir(d) if os.path.isdir(d) else None)"
for run in ${RUNS:-cold warm}; do
  t0=$(date +%s)
  COURSE_WORKERS=$(case $run in one) echo 0;; four) echo 4;; esac) COMPILE_LOG_JSON="$OUT/compile_$run.json" timeout ${SUITE_TIMEOUT:-420} python3 -m pytest --impl solutions \
    -p compile_log -rfEs --durations=0 > "$OUT/suite_${run}_workers.log" 2>&1
  echo "$run: rc=$? wall $(( $(date +%s) - t0 )) s" | tee -a "$OUT/suite_${run}_workers.log"
  grep -E "worker processes|^(FAILED|ERROR)|passed|failed|TOTAL" "$OUT/suite_${run}_workers.log" | tail -8
done
