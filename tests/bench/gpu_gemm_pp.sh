#!/bin/bash
# One device call (issue 19, second session): build the engine-only tree SRC (gemm_bench, gpt_bench and the
# GPU tests only), run gemm_bench (the ping-pong product against cuBLASLt and the cooperative experiment,
# checked), the kernels' GPU tests with GANTRY_CUDA_SM90_GEMM at 0-4 and the backend's at 0, 2, 4, then
# gpt_bench alternately under each value of GPP_SWITCHES (default "0 1 2"; labels sw0_1, sw1_1, ...). Not a test. Logs under $OUT.
#
#   bash tests/bench/gpu_gemm_pp.sh SRC_DIR [ROUNDS]
set -u -o pipefail
SRC=$(cd "$1" && pwd); ROUNDS=${2:-1}; OUTD=${OUT:-/tmp}; B=/tmp/gpp
export NCCL_NVLS_ENABLE=0
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
{ cmake -S "$SRC" -B $B -G Ninja -DGANTRY_ENGINE_ONLY=ON -DCMAKE_BUILD_TYPE=Release &&
  cmake --build $B -j16 --target gemm_bench gpt_bench kernels_cuda_test backend_cuda_test; } \
  > "$OUTD/build.log" 2>&1 || { grep -B2 -A12 -m3 "error" "$OUTD/build.log"; tail -20 "$OUTD/build.log"; exit 1; }
el "build"
echo "HGMMA in gemm_bench: $(cuobjdump --dump-sass $B/tests/bench/gemm_bench 2>/dev/null | grep -c HGMMA)," \
     "LDL/STL: $(cuobjdump --dump-sass $B/tests/bench/gemm_bench 2>/dev/null | grep -cE 'LDL|STL')"
timeout 150 $B/tests/bench/gemm_bench 2>&1 | tee "$OUTD/gemm_bench.jsonl" | python3 -c "import sys,json
for l in sys.stdin:
  if l.startswith('{'): d=json.loads(l); print('%-8s %-26s %8.4f ms %6.1f TF  err %.1e %.1e wrong %d' % (d['shape'], d['variant'], d['ms'], d['tflops'], d['err_vs_cublas'], d['err_vs_cpu'], d['wrong']))
  else: print(l.strip())"
el "gemm_bench"
for sw in 0 1 2 3 4; do
  GANTRY_CUDA_SM90_GEMM=$sw timeout 120 $B/tests/engine/core/cuda/kernels_cuda_test > "$OUTD/kt_$sw.log" 2>&1
  echo "kernels_cuda_test under GANTRY_CUDA_SM90_GEMM=$sw: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUTD/kt_$sw.log" | tr '\n' ' ')"
  grep -E "Failure|Expected|Which is|rel_error" "$OUTD/kt_$sw.log" | head -6
done
for sw in 0 2 4; do
  GANTRY_CUDA_SM90_GEMM=$sw timeout 150 $B/tests/engine/core/cuda/backend_cuda_test > "$OUTD/bt_$sw.log" 2>&1
  echo "backend_cuda_test under GANTRY_CUDA_SM90_GEMM=$sw: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUTD/bt_$sw.log" | tr '\n' ' ')"
done
el "tests"
for r in $(seq 1 "$ROUNDS"); do
  for sw in ${GPP_SWITCHES:-0 1 2}; do
    GANTRY_CUDA_SM90_GEMM=$sw timeout 100 $B/tests/bench/gpt_bench --label sw${sw}_$r
  done
done 2>&1 | tee "$OUTD/gpt_bench.jsonl" | grep -E '^\{|rror|abort' | python3 -c "import sys,json
for l in sys.stdin:
  try: d=json.loads(l); print({k: d[k] for k in d if k in ('label','model','step_ms_median','tokens_per_s','mfu','sm_mhz','power_w')})
  except Exception: print(l.strip())"
el "gpt_bench"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
