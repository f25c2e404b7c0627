#!/bin/bash
# Stage 9 on a GPU (H100): one device call per mode, logs under $OUT.
#   bash solutions/a09_llama_inference/run.sh tests     # stage-9 tests (the GPU-marked sizes included)
#   bash solutions/a09_llama_inference/run.sh stubs     # stage-9 graded tests on the untouched stubs (none may pass)
#   bash solutions/a09_llama_inference/run.sh grade     # the grader on stage 9 (its trials and the timed decode step)
#   bash solutions/a09_llama_inference/run.sh bench     # the bench: Llama-3.2-1B and Qwen3-0.6B decode, batch 1/16, prompts 128/2048
#   bash solutions/a09_llama_inference/run.sh gqa       # the GQA decode attention's bandwidth (bench_attention.py)
#   MODELS=llama-3.2-1b BATCHES="1" PROMPTS="128" bash solutions/a09_llama_inference/run.sh bench    # a subset
set -u
OUT=${OUT:-/tmp/a09_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/ext
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
for mode in "$@"; do
  echo "== $mode $(date +%T)"
  case "$mode" in
    tests) timeout ${TEST_TIMEOUT:-400} python3 -m pytest tests/test_a09_llama_inference.py --impl solutions -q -rs \
             --durations=10 2>&1 | tee "$OUT/pytest_a09.log" | tail -22 ;;
    stubs) timeout ${TEST_TIMEOUT:-300} python3 -m pytest tests/test_a09_llama_inference.py --impl assignments -q \
             --tb=no -m graded 2>&1 | tail -4 ;;
    grade) timeout ${TEST_TIMEOUT:-500} python3 -m common.course.grade --impl solutions --stages a09 2>&1 \
             | tee "$OUT/grade_a09.log" | tail -30 ;;
    bench) timeout ${BENCH_TIMEOUT:-570} python3 -m solutions.a09_llama_inference.bench ${MODELS:+--models $MODELS} \
             --batches ${BATCHES:-1 16} --prompts ${PROMPTS:-128 2048} ${BENCH_ARGS:-} --out "$OUT/a09_decode" 2>&1 \
             | tee "$OUT/bench.log" | grep -v "^\[transformers\]" | tail -30 ;;
    gqa) timeout ${BENCH_TIMEOUT:-300} python3 -m solutions.a09_llama_inference.bench_attention --write 2>&1 | tail -14
         cp lectures/results/a09_gqa_attention.md "$OUT/" ;;
  esac
done
echo "== done $(date +%T)"
