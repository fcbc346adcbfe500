#!/bin/bash
# One device call (issue 19): build the engine-only tree SRC (gemm_bench and the kernels' GPU test only), run
# gemm_bench (the ping-pong product, tests/bench/gemm_sm90_pp.cuh, and the cooperative one against cuBLASLt,
# checked), then kernels_cuda_test. Not a test. Logs under $OUT. (Calls P1-P2 also ran the GPU tests and
# gpt_bench under GANTRY_CUDA_SM90_GEMM, the switch Matmul had while the product sat in the engine.)
#
#   bash tests/bench/gpu_gemm_pp.sh SRC_DIR
set -u -o pipefail
SRC=$(cd "$1" && pwd); OUTD=${OUT:-/tmp}; B=/tmp/gpp
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
{ cmake -S "$SRC" -B $B -G Ninja -DGANTRY_ENGINE_ONLY=ON -DCMAKE_BUILD_TYPE=Release &&
  cmake --build $B -j16 --target gemm_bench kernels_cuda_test; } \
  > "$OUTD/build.log" 2>&1 || { grep -B2 -A12 -m3 "error" "$OUTD/build.log"; tail -20 "$OUTD/build.log"; exit 1; }
el "build"
echo "HGMMA in gemm_bench: $(cuobjdump --dump-sass $B/tests/bench/gemm_bench 2>/dev/null | grep -c HGMMA)," \
     "LDL/STL: $(cuobjdump --dump-sass $B/tests/bench/gemm_bench 2>/dev/null | grep -cE 'LDL|STL')"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader -lms 100 > "$OUTD/smi.log" & SMI=$!
timeout 150 $B/tests/bench/gemm_bench ${GEMM_ARGS:-} 2>&1 | tee "$OUTD/gemm_bench.jsonl" | python3 -c "import sys,json,time
for l in sys.stdin:
  t=time.strftime('%H:%M:%S')
  if l.startswith('{'): d=json.loads(l); print('%s %-8s %-26s %8.4f ms %6.1f TF  err %.1e %.1e wrong %d' % (t, d['shape'], d['variant'], d['ms'], d['tflops'], d['err_vs_cublas'], d['err_vs_cpu'], d['wrong']))
  else: print(t, l.strip())"
kill $SMI
el "gemm_bench"
timeout 120 $B/tests/engine/core/cuda/kernels_cuda_test > "$OUTD/kt.log" 2>&1
echo "kernels_cuda_test: rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUTD/kt.log" | tr '\n' ' ')"
el "end"
