#!/usr/bin/env bash
# The host cost on the H100, in one call (about 8 minutes): the host cost of every course op, BEFORE and AFTER the
# wrappers' cuts, on the same machine; the registration experiment; the GPU tests of the stages touched.
#
# Prepare the "before" tree once, here (an ignored folder: the solutions as they were before the cuts; 98146cf
# for the first round of cuts, 6249f65 for the second):
#   rm -rf .hostcost_before && mkdir .hostcost_before && git archive 6249f65 solutions | tar -x -C .hostcost_before
# then on the GPU machine (carry .hostcost_before), from the repository root:
#   OUT=$OUT bash lectures/_tools/gpu/hostcost_run.sh
# Writes under $OUT: before1/, after1/, before2/, after2/ (hostcost.md/.csv), compare1.txt, compare2.txt,
# registration.txt, test logs. Commit after2/hostcost.md and .csv as lectures/results/hostcost.*, then:
# python lectures/_tools/results_table.py --write
set -u
OUT=${OUT:-/tmp/hostcost_out}; mkdir -p "$OUT"
BEFORE=${BEFORE:-.hostcost_before/solutions}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext} PYTHONUNBUFFERED=1
PY=${PY:-python3}
DEADLINE=$(( $(date +%s) + ${BUDGET_S:-460} ))
left() { local s=$(( DEADLINE - $(date +%s) )); [ "$s" -gt "${1:-30}" ] && echo "$s" || echo "${1:-30}"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"; } | tee "$OUT/env.txt"
[ -d "$BEFORE" ] || { echo "no $BEFORE: prepare it (see the top of this script)"; exit 1; }

# 1. Stage 4's CUDA op for both trees (each impl registers its own namespace, so two builds), side by side.
t0=$(date +%s)
for tree in solutions "$BEFORE"; do
  $PY -c "import common; from common.impl import load; load('a04_cuda_gelu.fused_gelu', '$tree').build()" \
    > "$OUT/build_$(basename "$(dirname "$tree")").log" 2>&1 &
done; wait
echo "[hostcost] a04 builds: $(( $(date +%s) - t0 )) s"

# 2. The bench: before, after, before, after (a host's speed drifts within minutes: two rounds alternating; the
#    kernels' sources are the same, so the later runs compile nothing new). Commit after2 (decided beforehand).
for round in 1 2; do for side in before after; do
  tree=$([ "$side" = before ] && echo "$BEFORE" || echo solutions)
  t0=$(date +%s)
  timeout 150 $PY -m common.course.hostcost --impl "$tree" --out "$OUT/$side$round" > "$OUT/$side$round.log" 2>&1
  echo "[hostcost] $side$round rc=$? in $(( $(date +%s) - t0 )) s"
done; done
for round in 1 2; do
  $PY -m common.course.hostcost --compare "$OUT/before$round/hostcost.csv" "$OUT/after$round/hostcost.csv" > "$OUT/compare$round.txt" 2>&1
  echo "[hostcost] compare$round rc=$? (1: a GPU time got worse)"; cat "$OUT/compare$round.txt"
done
timeout 90 $PY lectures/_tools/hostcost_registration.py > "$OUT/registration.txt" 2>&1
echo "[hostcost] registration rc=$?"; cat "$OUT/registration.txt"

# 3. The GPU tests of the stages whose wrappers changed (a06's CUDA versions and 7c did not change); TESTS=0
#    skips them (run them in a call of their own when the bench and the tests do not fit one call together).
if [ "${TESTS:-1}" = 0 ]; then echo "=== after2"; sed -n '/^| stage/,$p' "$OUT/after2/hostcost.md"; exit 0; fi
t0=$(date +%s)
timeout "$(left 60)" $PY -m pytest tests/test_a03_fused_linear.py tests/test_a05_triton_gelu.py tests/test_a07_flash_attention.py \
  tests/test_a08_gpt2_inference.py --impl solutions -q -rfE > "$OUT/pytest_solutions.log" 2>&1
echo "[hostcost] tests a03 a05 a07 a08 rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/pytest_solutions.log")"
t0=$(date +%s)
timeout "$(left 30)" $PY -m pytest tests/test_a06_matmul.py --impl solutions -q -rfE -k "not cuda" > "$OUT/pytest_a06.log" 2>&1
echo "[hostcost] tests a06 (Triton) rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/pytest_a06.log")"
grep -hE "^(FAILED|ERROR)" "$OUT"/pytest_*.log | head -20
echo "=== after2"; sed -n '/^| stage/,$p' "$OUT/after2/hostcost.md"
