#!/usr/bin/env bash
# The grader before and after fresh-input timing, on the GPU machine, from the repository root:
#   OLD=path/to/a/checkout/of/the/old/commit STEP=before OUT=/some/dir bash lectures/_tools/gpu/grader_run.sh
#   STEP=after  OUT=/some/dir bash ...     the new grader on solutions/, graded tests included (full marks?)
#   STEP=gpu    OUT=/some/dir bash ...     the GPU-only tests of the new timing and the GPU mutants
#   STEP=compare OUT=/some/dir bash ...    before.json vs after.json (lectures/_tools/compare_grades.py)
# Both grades time stages 2-8 of solutions/ on the same machine, one after the other, with the same
# build caches (the kernels are the same files).
set -u
OUT=${OUT:-/tmp/fresh}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/course-ext}
PY=${PY:-python3}
STAGES=${STAGES:-a02,a03,a04,a05,a06,a07,a08}
case ${STEP:-after} in
  before)
    { date -u '+%Y-%m-%d %H:%M UTC'; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
      $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/env.txt"
    $PY -c "from common.cuda_ext import build_course_ops; build_course_ops('solutions')" > "$OUT/prebuild.log" 2>&1 &
    t0=$(date +%s)
    (cd "$OLD" && $PY -m common.course.grade --impl solutions --no-tests --stages "$STAGES" --timeout 500 \
       --json-out "$OUT/before.json" 2>&1 | grep -v '^\[' | tee "$OUT/before.txt")
    echo "before: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/env.txt"
    wait ;;
  after)
    t0=$(date +%s)
    $PY -m common.course.grade --impl solutions --stages "a01,$STAGES" --timeout 500 --json-out "$OUT/after.json" \
      --results-json "$OUT/after_results.json" 2>&1 | grep -v '^\[' | tee "$OUT/after.txt"
    echo "after: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/env.txt" ;;
  gpu)
    t0=$(date +%s)
    $PY -m pytest -q -p no:cacheprovider -rfEs --impl solutions tests/test_grader.py tests/test_a06_matmul.py tests/test_a07_flash_attention.py \
      -k "graph or fresh or a08_perf" > "$OUT/gpu_tests.log" 2>&1
    echo "gpu tests: rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/gpu_tests.log")" | tee -a "$OUT/env.txt"
    t0=$(date +%s)
    COURSE_MUTANT_WORKERS=${WORKERS:-4} $PY -m pytest tests/test_mutants.py --impl solutions --mutants -q -p no:cacheprovider \
      -rfEs -k "${K:-captured or addresses or capturable or TF32}" > "$OUT/gpu_mutants.log" 2>&1
    echo "gpu mutants: rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/gpu_mutants.log")" | tee -a "$OUT/env.txt" ;;
  compare)
    $PY lectures/_tools/compare_grades.py "$OUT/before.json" "$OUT/after.json" \
      --labels "before (one input set, replayed)" "after (fresh inputs per call)" | tee "$OUT/compare.md" ;;
esac
