#!/bin/bash
# Stage 7c on an H100, in ONE command (under 600 s; logs and results in $OUT):
#   bash solutions/a07_flash_attention/run_hopper.sh
# 1. build.log    GPU, versions, ptxas register/spill report (nvcc -Xptxas -v, sm_90a), the op's
#                 build through common.cuda_ext.load_op (timed), and a smoke run of each
#                 (d, causal, S) against float64 and SDPA, one case at a time, each named before
#                 it runs (a hang traps after 10 s: the mbarrier watchdog). If a case fails, it
#                 runs again in the debug build (COURSE_CUDA_DEFINES=A07C_DEBUG_HANG, built in the background from
#                 the start), whose watchdog prints the stuck barrier (block, thread, smem
#                 address, parity) before it traps; the benchmark is then skipped.
# 2. pytest.log   tests/test_a07c_flash_hopper.py --impl solutions (float64 reference, SDPA's
#                 own error, S in {1, 17, 128, 1000, 4096}, d 64/128, causal/not, bad inputs)
# 3. memcheck.log compute-sanitizer --tool memcheck on small ragged cases (d 64/128, causal/not)
# 4. bench.log + a07c_flash_hopper.csv/.md: TFLOP/s vs SDPA, bf16, d = 128, S = 2048..16384; then
#    the same for each build in $VARIANTS (without the intra-warpgroup overlap, without the
#    ping-pong schedule; each its own build), and the default once more, into bench.log
# 5. stubs.log    the graded tests on assignments/ (the untouched stub): every one must fail
# 6. mutants.log  tests/mutants/flash.py's 7c mutants, each caught by the graded tests
# 7. ncu_s4096_d128.txt  Nsight Compute, this kernel and SDPA's at S = 4096, d = 128, non-causal
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/a07c_out}; mkdir -p "$OUT"; export OUT
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/ext}
PY=${PY:-python3}
SRC=solutions/a07_flash_attention/flash_fwd_hopper.cu
NVCC=$(command -v nvcc || echo "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc")
SANITIZER=$(command -v compute-sanitizer || echo "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer")
t0=$(date +%s)
step() { echo "=== [$(( $(date +%s) - t0 )) s] $*"; }

# The debug variant (printf in the watchdog; its wgmma's are serialised), built while the rest runs,
# so that a failing smoke case can be rerun with it at once. Its own process: both register one op.
rm -f "$OUT/smoke_case"
( COURSE_CUDA_DEFINES=A07C_DEBUG_HANG timeout 300 $PY -c "from solutions.a07_flash_attention import flash_hopper as m; m._op()" \
    > /tmp/a07c_debug_build.log 2>&1 ) &
DBG_PID=$!
# The variants the bench compares (each its own build and process), built meanwhile too.
VARIANTS="A07C_NO_OVERLAP A07C_NO_PINGPONG"
for V in $VARIANTS; do
  ( env COURSE_CUDA_DEFINES=$V timeout 300 $PY -c "from solutions.a07_flash_attention import flash_hopper as m; m._op()" \
      > /tmp/a07c_build_$V.log 2>&1 ) &
done

{
  step "GPU"
  nvidia-smi --query-gpu=name,compute_cap,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv
  $PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  $NVCC --version | tail -2
  step "ptxas report (sm_90a, -DA07C_SM90A)"
  $NVCC -arch=sm_90a -std=c++17 --expt-relaxed-constexpr -DA07C_SM90A -Icommon -Xptxas -v -c $SRC -o /dev/null 2>&1 \
    | grep -E "error|warning|Performance|entry function|spill|Used"
  step "build + smoke"
  timeout 200 $PY - <<'PYEOF' 2>&1
import os, time, torch, torch.nn.functional as F
from common.testing import rel_error
from common import reference as ref
from solutions.a07_flash_attention import flash_hopper as m
t = time.time(); m._op(); print(f"build/load: {time.time() - t:.0f} s", flush=True)
torch.manual_seed(0)
for d in (128, 64):
    for causal in (False, True):
        for s in (1, 200, 1000):
            q, k, v = (torch.randn(2, 3, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            print(f"smoke d={d} causal={causal} S={s} ...", end=" ", flush=True)
            with open(os.environ["OUT"] + "/smoke_case", "w") as f:      # removed when all pass
                f.write(f"{d} {int(causal)} {s}\n")
            o, lse = m.flash_attention_hopper(q, k, v, causal=causal)
            torch.cuda.synchronize()
            ro, rl = ref.attention(q, k, v, is_causal=causal)
            so = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            print(f"O err {rel_error(o, ro):.2e} (SDPA {rel_error(so, ro):.2e}), L err {rel_error(lse, rl):.2e}, "
                  f"nonfinite {int((~torch.isfinite(o)).sum())}", flush=True)
os.remove(os.environ["OUT"] + "/smoke_case")
PYEOF
  echo "smoke exit: $?"
  if [ -f "$OUT/smoke_case" ]; then
    read -r SD SC SS < "$OUT/smoke_case"
    step "smoke failed at d=$SD causal=$SC S=$SS: again with the debug build (COURSE_CUDA_DEFINES=A07C_DEBUG_HANG)"
    wait $DBG_PID; echo "debug build exit: $?"; tail -3 /tmp/a07c_debug_build.log
    COURSE_CUDA_DEFINES=A07C_DEBUG_HANG timeout 90 $PY - "$SD" "$SC" "$SS" <<'PYEOF' 2>&1
import sys, torch
from solutions.a07_flash_attention import flash_hopper as m
d, causal, s = int(sys.argv[1]), bool(int(sys.argv[2])), int(sys.argv[3])
torch.manual_seed(0)
q, k, v = (torch.randn(2, 3, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
o, lse = m.flash_attention_hopper(q, k, v, causal=causal)
torch.cuda.synchronize()
print("debug run finished without a trap; finite:", bool(torch.isfinite(o).all()), flush=True)
PYEOF
    echo "debug run exit: $?"
  fi
} > "$OUT/build.log" 2>&1
tail -24 "$OUT/build.log"

step "pytest" | tee "$OUT/pytest.log"
timeout 170 $PY -m pytest tests/test_a07c_flash_hopper.py --impl solutions -q -rs -p no:cacheprovider 2>&1 \
  | tee -a "$OUT/pytest.log" | tail -25
step "pytest, the COURSE_CUDA_DEFINES=A07C_NO_OVERLAP build" | tee -a "$OUT/pytest.log"
COURSE_CUDA_DEFINES=A07C_NO_OVERLAP timeout 170 $PY -m pytest tests/test_a07c_flash_hopper.py --impl solutions -q -p no:cacheprovider 2>&1 \
  | tee -a "$OUT/pytest.log" | tail -4

step "memcheck" | tee "$OUT/memcheck.log"
cat > /tmp/a07c_memcheck.py <<'PYEOF'
import torch
from solutions.a07_flash_attention import flash_hopper as m
for d in (64, 128):
    for causal in (False, True):
        q, k, v = (torch.randn(1, 2, 300, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        o, lse = m.flash_attention_hopper(q, k, v, causal=causal)
        torch.cuda.synchronize()
        print(f"memcheck case d={d} causal={causal}: finite {bool(torch.isfinite(o).all())}", flush=True)
PYEOF
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout 100 "$SANITIZER" --tool memcheck --print-limit 20 \
  $PY /tmp/a07c_memcheck.py 2>&1 | tee -a "$OUT/memcheck.log" | tail -12
step "memcheck, the COURSE_CUDA_DEFINES=A07C_NO_OVERLAP build" | tee -a "$OUT/memcheck.log"
COURSE_CUDA_DEFINES=A07C_NO_OVERLAP PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout 100 "$SANITIZER" --tool memcheck --print-limit 20 \
  $PY /tmp/a07c_memcheck.py 2>&1 | tee -a "$OUT/memcheck.log" | tail -6

wait $DBG_PID 2>/dev/null   # the background build is done before anything is timed
if [ -f "$OUT/smoke_case" ]; then
  step "bench skipped: the smoke run failed (build.log)" | tee "$OUT/bench.log"
else
  step "bench" | tee "$OUT/bench.log"
  timeout 100 $PY -m solutions.a07_flash_attention.bench_hopper --out "$OUT" 2>&1 | tee -a "$OUT/bench.log" | tail -14
  for V in $VARIANTS; do   # A07C_NO_OVERLAP: the softmax not under the same warpgroup's P V; A07C_NO_PINGPONG: no schedule
    step "bench, the COURSE_CUDA_DEFINES=$V build" | tee -a "$OUT/bench.log"
    env COURSE_CUDA_DEFINES=$V timeout 150 $PY -m solutions.a07_flash_attention.bench_hopper --out /tmp/a07c_$V 2>&1 \
      | tee -a "$OUT/bench.log" | tail -14
  done
  step "bench again, the default build (second round: clocks)" | tee -a "$OUT/bench.log"
  timeout 100 $PY -m solutions.a07_flash_attention.bench_hopper --out /tmp/a07c_again 2>&1 | tee -a "$OUT/bench.log" | tail -14
fi
step "graded tests on the untouched stub (every one must fail)" | tee "$OUT/stubs.log"
timeout 120 $PY -m pytest tests/test_a07c_flash_hopper.py --impl assignments -m graded -q -p no:cacheprovider --tb=no \
  2>&1 | tail -6 | tee -a "$OUT/stubs.log"
step "mutants (tests/mutants/flash.py, 7c): each must be caught" | tee "$OUT/mutants.log"
PYTHONPATH=$PWD/tests${PYTHONPATH:+:$PYTHONPATH} timeout 200 $PY -m pytest tests/test_mutants.py --impl solutions --mutants -k 7c -q \
  -p no:cacheprovider 2>&1 | tail -8 | tee -a "$OUT/mutants.log"
step "Nsight Compute: one call of each at S = 4096, d = 128, non-causal (clocks not locked)" | tee "$OUT/ncu_s4096_d128.txt"
NCU=$(command -v ncu || echo "${CUDA_HOME:-/usr/local/cuda}/bin/ncu")
cat > /tmp/a07c_ncu.py <<'PYEOF'
import torch, torch.nn.functional as F
from solutions.a07_flash_attention import flash_hopper as m
q, k, v = (torch.randn(4, 16, 4096, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
m.flash_attention_hopper(q, k, v, causal=False); F.scaled_dot_product_attention(q, k, v)   # warm (builds, autotune)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStart()
m.flash_attention_hopper(q, k, v, causal=False); F.scaled_dot_product_attention(q, k, v)
torch.cuda.synchronize()
torch.cuda.cudart().cudaProfilerStop()
PYEOF
PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} timeout 240 "$NCU" --profile-from-start off --clock-control none \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section LaunchStats --section Occupancy \
  $PY /tmp/a07c_ncu.py 2>&1 | tee -a "$OUT/ncu_s4096_d128.txt" | grep -E "attention_fwd_hopper|sdpa|Duration|Compute \(SM\)|highest-utilized|Grid Size" | cut -c1-160
step "done"
