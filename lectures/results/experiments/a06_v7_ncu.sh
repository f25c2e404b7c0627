#!/usr/bin/env bash
# Stage 6, CUDA v7 vs cuBLAS under Nsight Compute (issue #12): where v7's time goes at a short-K GPT-2
# GEMM (small QKV, T = 8192: [8192, 768] x [768, 2304]), a mid one (small MLP-down, T = 2048) and
# 4096^3. One call of each kernel after a warm-up, clocks not locked (--clock-control none: the
# GPU's own clocks, as the bench sees them). Prints one line per kernel: time, tensor-pipe (wgmma)
# activity, SM throughput, L2 and DRAM throughput, grid, registers.
#   OUT=/some/dir bash lectures/results/experiments/a06_v7_ncu.sh   -> $OUT/a06_v7_ncu.csv
set -u
OUT=${OUT:-/tmp/a06_v7_ncu}; mkdir -p "$OUT"
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext} PYTHONPATH=$PWD
METRICS=gpu__time_duration.sum,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,\
sm__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum.per_second,dram__bytes.sum.per_second,\
launch__grid_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active
cat > "$OUT/target.py" <<'PY'
import torch
from common.impl import load
cu = load("a06_matmul.matmul_cuda", "solutions")
shapes = [(8192, 768, 2304), (2048, 3072, 768), (4096, 4096, 4096)]
ops = []
for m, k, n in shapes:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16); b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    ops += [lambda a=a, b=b, c=c: cu.matmul(a, b, 7, out=c), lambda a=a, b=b, c=c: torch.matmul(a, b, out=c)]
for op in ops: op()                        # build, warm-up
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
for op in ops: op()
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
PY
ncu --profile-from-start off --clock-control none --metrics "$METRICS" --csv --page raw \
    python3 "$OUT/target.py" > "$OUT/a06_v7_ncu.csv" 2> "$OUT/a06_v7_ncu.err"
echo "ncu rc=$?"
python3 - "$OUT/a06_v7_ncu.csv" <<'PY'
import csv, sys
rows = list(csv.DictReader(l for l in open(sys.argv[1]) if l.startswith('"')))
units, rows = rows[0], rows[1:]          # ncu's raw page: the first row holds the units
cols = {"gpu__time_duration.sum": "time", "sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active": "gmma",
        "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm", "lts__t_bytes.sum.per_second": "L2",
        "dram__bytes.sum.per_second": "dram", "sm__warps_active.avg.pct_of_peak_sustained_active": "warps",
        "launch__grid_size": "grid", "launch__registers_per_thread": "regs"}
for r in rows:
    print(f"{r['Kernel Name'][:40]:40s} " + "  ".join(f"{short} {r.get(k, '?')} {units.get(k, '')}".rstrip() for k, short in cols.items()))
PY
