#!/usr/bin/env bash
# The mutation checks on the GPU machine, GPU-only mutants included, in one call:
#   OUT=/some/dir bash lectures/_tools/gpu/mutants_run.sh        (from the repository root)
#   K='a06' ...        only the mutants whose test id matches pytest's -k expression
#   WORKERS=8 ...      grading processes (COURSE_MUTANT_WORKERS; default 8, for 16 cores)
#   AFTER='tests/test_a04_cuda_gelu.py' ...  then run these tests on solutions/ (a changed test must pass)
# Writes $OUT/env.txt, $OUT/pytest_mutants.log, $OUT/mutants.json (id -> caught, first failing
# test) and $OUT/pytest_after.log; prints the per-mutant table and the summary last.
set -u
OUT=${OUT:-/tmp/mutants_out}; mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext} PYTHONUNBUFFERED=1
export COURSE_MUTANT_WORKERS=${WORKERS:-8}
PY=${PY:-python3}
BT=/tmp/mutants_basetemp
{ date -u '+%Y-%m-%d %H:%M UTC'
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  $PY -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  echo "cores: $(nproc)  workers: $COURSE_MUTANT_WORKERS  -k: ${K:-all}"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

t0=$(date +%s)
timeout -k 10 ${LIMIT:-540} $PY -m pytest tests/test_mutants.py --impl solutions --mutants -q -rfEs -s --basetemp=$BT \
  ${K:+-k "$K"} > "$OUT/pytest_mutants.log" 2>&1
echo "pytest rc=$? in $(( $(date +%s) - t0 )) s" | tee -a "$OUT/env.txt"

if [ -n "${AFTER:-}" ]; then
  t1=$(date +%s)
  timeout 120 $PY -m pytest $AFTER --impl solutions -q -rfEs > "$OUT/pytest_after.log" 2>&1
  echo "after: rc=$? in $(( $(date +%s) - t1 )) s: $(tail -1 "$OUT/pytest_after.log")" | tee -a "$OUT/env.txt"
fi

$PY - "$BT" "$OUT/mutants.json" <<'EOF'
import glob, json, sys
res = {}
for f in sorted(glob.glob(f"{sys.argv[1]}/*/w*.json")):
    res.update(json.load(open(f)))
json.dump(res, open(sys.argv[2], "w"), indent=1)
for mid, r in res.items():
    first = (r.get("first_failure") or [""])[0] if "error" not in r else "ERROR " + r["error"]
    print(f"{mid:60s} {'caught' if r['caught'] else 'NOT CAUGHT':10s} {first}")
print(f"graded: {len(res)}, caught: {sum(r['caught'] for r in res.values())}")
EOF
grep -E "^(FAILED|ERROR)|mutation checks:|passed|failed" "$OUT/pytest_mutants.log" | tail -20
