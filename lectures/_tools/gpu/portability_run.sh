#!/bin/bash
# Portability on a GPU (the H100): what the CPU cross-compile cannot show. Logs under $OUT.
#   bash lectures/_tools/gpu/portability_run.sh                 # facts, tests, ab
#   STEPS="facts tests" bash lectures/_tools/gpu/portability_run.sh
# facts  what the kernels now ask of the device (common.gpu), and which CUDA versions it refuses
# tests  the tests that run the changed code on a GPU: the fallback of the attention tables (fp32 at d = 128,
#        which did not fit an H100 before, and no fallback for the 16-bit tables), the CUDA versions'
#        skips and refusals, stages 6-8 with the device-derived matmul pruning (~4 min cold)
# ab     the grader's timing of stages 6, 7, 8 (--no-tests: trials and timed cases) for this tree and for
#        BASE (default e9b6b3c, the last commit before the device-derived limits) checked out in a temporary git worktree,
#        one after the other on the same machine: the speedups should agree within the runs' spread (~3 min each)
set -u
OUT=${OUT:-/tmp/portability_out}; mkdir -p "$OUT"
BASE=${BASE:-e9b6b3c}
STEPS=${STEPS:-"facts tests ab"}
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
for step in $STEPS; do
  echo "== $step $(date +%T)"
  case $step in
    facts) python3 - <<'EOF' 2>&1 | tee "$OUT/facts.txt"
from common import gpu
print(gpu.describe(), "| shared memory a block:", gpu.shared_memory_per_block(), "B | SMs:", gpu.sm_count(),
      "| L2:", gpu.l2_bytes(), "B | limits:", gpu.limits())
for feature in gpu.NEEDS:
    print(f"  {feature}: {gpu.why_not(feature) or 'runs here'}")
from common.impl import load
mt = load("a06_matmul.matmul_triton", "solutions")
old = 220 * 1024   # the constant the device-derived pruning replaced
for size in (2, 4):
    for m, k, aligned in ((4096, 768, True), (4096, 4096, True), (16, 768, True), (4095, 4095, False), (16, 4095, False)):
        pairs = mt._config_set(m, k, size, aligned)
        same = mt.configs_for(m, k, size, aligned, gpu.limits()) == [p for p in pairs if p[0][4] * (p[0][0] + p[0][1]) * p[0][2] * size <= old]
        print(f"  matmul candidates M={m} K={k} {size}-byte {'aligned' if aligned else 'unaligned'}: "
              f"{'the same as the 220 KB rule' if same else 'DIFFERENT from the 220 KB rule'}")
EOF
      ;;
    tests) timeout ${TEST_TIMEOUT:-560} python3 -m pytest tests/test_portability.py tests/test_a06_matmul.py \
             tests/test_a07_flash_attention.py tests/test_a07c_flash_hopper.py tests/test_a08_gpt2_inference.py \
             --impl solutions -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/pytest.log" | tail -15 ;;
    ab) base=$(mktemp -d)/base
        if ! git worktree add --detach "$base" "$BASE" > "$OUT/worktree.log" 2>&1; then
          echo "ab: no git worktree of $BASE here (a copy without .git?): $(tail -1 "$OUT/worktree.log")"; continue
        fi
        for tree in new base; do
          dir=.; [ $tree = base ] && dir=$base
          (cd "$dir" && timeout ${GRADE_TIMEOUT:-400} python3 -m common.course.grade --impl solutions --stages a06,a07,a08 \
             --no-tests --json --quiet --timeout 380) > "$OUT/grade_$tree.json" 2> "$OUT/grade_$tree.err"
          echo "graded $tree: rc=$?"
        done
        git worktree remove --force "$base"
        python3 - "$OUT" <<'EOF' | tee "$OUT/ab.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
runs = {t: {s["stage"]: s for s in json.loads((out / f"grade_{t}.json").read_text())["stages"]} for t in ("new", "base")}
for key in runs["new"]:
    n, b = runs["new"][key], runs["base"].get(key, {})
    print(f"{key}: correctness {n.get('correctness')} (base {b.get('correctness')}), speedup {n.get('speedup')} "
          f"(base {b.get('speedup')})")
    for cn, cb in zip(n.get("cases") or [], b.get("cases") or []):
        print(f"   {cn.get('label', '')[:70]:70s} {cn.get('speedup')} (base {cb.get('speedup')})")
EOF
        ;;
  esac
done
echo "== done $(date +%T)"
