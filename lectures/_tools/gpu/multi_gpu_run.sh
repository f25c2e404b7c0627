#!/usr/bin/env bash
# Batch grading across the GPUs of one machine: four submissions, one grading
# process per GPU at a time (common.course.grade --submissions). Run from the repository root:
#   OUT=/some/dir bash lectures/_tools/gpu/multi_gpu_run.sh
#   STAGES=a02,a05 (default: two quick stages, no CUDA build), TESTS=1 (also the pytest part)
set -u
OUT=${OUT:-/tmp/batch}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext}
SUBS=$(mktemp -d)
cp -r solutions "$SUBS/alice"; cp -r solutions "$SUBS/bob"; cp -r assignments "$SUBS/carol"; cp -r solutions "$SUBS/dave"
{ date -u '+%Y-%m-%d %H:%M UTC'; nvidia-smi -L
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, '| GPUs visible:', torch.cuda.device_count())"; } | tee "$OUT/env.txt"
t0=$(date +%s)
python3 -m common.course.grade --submissions "$SUBS" --out "$OUT/graded" --stages "${STAGES:-a02,a05}" --timeout 300 \
  $([ "${TESTS:-0}" = 1 ] || echo --no-tests) | tee "$OUT/batch.txt"
echo "batch wall time: $(( $(date +%s) - t0 )) s" | tee -a "$OUT/batch.txt"
python3 - "$OUT/graded" <<'PY' | tee -a "$OUT/batch.txt"
import json, sys
from pathlib import Path
for rep in sorted(Path(sys.argv[1]).glob("*/report.json")):
    r = json.loads(rep.read_text())
    res = json.loads((rep.parent / "results.json").read_text())
    print(f"{rep.parent.name:6s} impl={Path(r['impl']).name:12s} gpu={r['gpu']} score={r['total']}/{r['max']} "
          f"in {r['seconds']:.0f} s; results.json score {res.get('score')}, {len(res.get('tests', []))} tests")
PY
