#!/bin/bash
# Stage 8 on a GPU (H100): one device call per mode, logs and tables under $OUT.
#   bash solutions/a08_gpt2_inference/run.sh tests     # stage-8 tests, then the a06/a07 Triton tests (their launch code changed)
#   bash solutions/a08_gpt2_inference/run.sh bench     # the benchmark: GPT-2 small and medium, prompts 128/960, batch 1/8/64
#   MODELS=small BATCHES="1" bash solutions/a08_gpt2_inference/run.sh bench    # a subset
#   bash solutions/a08_gpt2_inference/run.sh stubs     # stage-8 graded tests on the untouched stubs (none may pass)
# Decode at the memory wall, each mode one device call of at most 10 minutes, the table last:
#   bash solutions/a08_gpt2_inference/run.sh gemv      # per-kernel decode-GEMM GB/s: gemv, a06, cuBLAS (+ XL config sweep)
#   bash solutions/a08_gpt2_inference/run.sh step      # decode-step ms and % of bandwidth: the floors' cases, 3 paths
#   bash solutions/a08_gpt2_inference/run.sh profile   # decode-step profile of GPT-2 small and XL: kernels, gaps, PDL
# The engine as users expect one: bad ids, head sizes 80/96, EOS, streaming, sampling (~5 min):
#   bash solutions/a08_gpt2_inference/run.sh engine     # its tests (a08 + the a07 forward's head dims), then bench --sampling
set -u
OUT=${OUT:-/tmp/a08_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=/tmp/ext
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__)" | tee -a "$OUT/gpu.txt"
for mode in "$@"; do
  echo "== $mode $(date +%T)"
  case "$mode" in
    tests) timeout ${TEST_TIMEOUT:-300} python3 -m pytest tests/test_a08_gpt2_inference.py --impl solutions -q -rs \
             --durations=8 2>&1 | tee "$OUT/pytest_a08.log" | tail -22 ;;
    others) timeout ${TEST_TIMEOUT:-300} python3 -m pytest tests/test_a06_matmul.py tests/test_a07_flash_attention.py \
             --impl solutions -q -k "triton" 2>&1 | tee "$OUT/pytest_a06_a07.log" | tail -6 ;;
    bench) timeout ${BENCH_TIMEOUT:-560} python3 -m solutions.a08_gpt2_inference.bench --models ${MODELS:-small medium} \
             --batches ${BATCHES:-1 8 64} --prompts ${PROMPTS:-128 960} ${BENCH_ARGS:-} --out "$OUT/a08_gpt2_inference" \
             2>&1 | tee "$OUT/bench.log" | grep -v "^\[transformers\]" | tail -30 ;;
    stubs) timeout ${TEST_TIMEOUT:-300} python3 -m pytest tests/test_a08_gpt2_inference.py --impl assignments -q \
             --tb=no -m graded 2>&1 | tail -4 ;;
    gemv) timeout ${BENCH_TIMEOUT:-570} python3 -m solutions.a08_gpt2_inference.bench --gemv --sweep ${SWEEP:-xl} \
             --out "$OUT/a08" 2>&1 | tee "$OUT/gemv.log" | tail -80 ;;
    step) timeout ${BENCH_TIMEOUT:-570} python3 -m solutions.a08_gpt2_inference.bench --step ${STEP_ARGS:-} \
             --out "$OUT/a08" 2>&1 | tee "$OUT/step.log" | tail -40 ;;
    engine) timeout ${TEST_TIMEOUT:-230} python3 -m pytest tests/test_a08_gpt2_inference.py \
             tests/test_a07_flash_attention.py --impl solutions -q -rs --durations=10 -k "bad_token or head_size or \
             not_a_power or eos or sampl or sample_kernel or decode_attention or write_kv or check_their_inputs or \
             gpt2_small_64 or switches" 2>&1 | tee "$OUT/pytest_engine.log" | tail -25
             timeout ${BENCH_TIMEOUT:-220} python3 -m solutions.a08_gpt2_inference.bench --sampling --models small \
             --batches ${BATCHES:-1 8} --prompts 128 --out "$OUT/a08" 2>&1 | tee "$OUT/sampling.log" | tail -20 ;;
    profile) timeout ${BENCH_TIMEOUT:-570} python3 -m solutions.a08_gpt2_inference.bench --profile \
             --models ${MODELS:-small xl} --out "$OUT/a08" 2>&1 | tee "$OUT/profile.log" | tail -60 ;;
  esac
done
echo "== done $(date +%T)"
