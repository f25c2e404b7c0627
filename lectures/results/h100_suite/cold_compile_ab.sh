#!/usr/bin/env bash
# Issue #13 on a fresh H100: what compiling an autotuner's configs in parallel threads
# (common.timing.precompile) saves on a cold machine, on the tests that tune the most. The same
# tests twice, each time with an empty Triton cache: COURSE_COMPILE_THREADS=16 (the default on
# a 16-core machine) first, so that any first-run cost falls on it, then 1 (one config after
# another, as Triton's autotuner compiles by itself). .ci/compile_log.py accounts for each test.
#   OUT=/some/dir bash lectures/results/h100_suite/cold_compile_ab.sh   -> $OUT/cold_ab_{16,1}.log
set -u
cd "$(dirname "$0")/../../.."
OUT=${OUT:-/tmp/cold_ab}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=.ci TORCH_EXTENSIONS_DIR=/tmp/ext-ab COURSE_PREBUILD=0
for threads in 16 1; do
  t0=$(date +%s)
  COURSE_COMPILE_THREADS=$threads TRITON_CACHE_DIR=/tmp/triton-ab-$threads COMPILE_LOG_JSON="$OUT/cold_ab_$threads.json" \
    timeout ${AB_TIMEOUT:-250} python3 -m pytest --impl solutions -p no:cacheprovider -p compile_log -v --durations=15 \
    "tests/test_a08_gpt2_inference.py::test_generate_gpt2_small_64_tokens[b1-len21]" \
    tests/test_a06_matmul.py::test_triton_autotuned_path tests/test_a05_triton_gelu.py > "$OUT/cold_ab_$threads.log" 2>&1
  echo "threads=$threads rc=$? wall $(( $(date +%s) - t0 )) s" | tee -a "$OUT/cold_ab_$threads.log"
  grep -E "passed|failed|TOTAL" "$OUT/cold_ab_$threads.log" | tail -3
done
