#!/bin/bash
# One device call: build the engine-only tree SRC, run gemm_bench (the sm90 product experiment, checked),
# the GPU tests, then gpt_bench alternately without and with an environment switch (labels off1, on1, ...).
# Not a test. Logs go under $OUT.
#
#   bash tests/bench/gpu_switch_ab.sh SRC_DIR SWITCH=VALUE [ROUNDS]
set -u -o pipefail
SRC=$(cd "$1" && pwd); SW=$2; ROUNDS=${3:-2}; OUTD=${OUT:-/tmp}; B=/tmp/gsw
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv,noheader
t0=$(date +%s)
{ cmake -S "$SRC" -B $B -G Ninja -DGANTRY_ENGINE_ONLY=ON -DCMAKE_BUILD_TYPE=Release && cmake --build $B -j16; } \
  > "$OUTD/build.log" 2>&1 || { grep -B2 -A12 -m3 "error" "$OUTD/build.log"; tail -20 "$OUTD/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 )) s"
echo "HGMMA in gemm_bench: $(cuobjdump --dump-sass $B/tests/bench/gemm_bench 2>/dev/null | grep -c HGMMA)"
timeout 180 $B/tests/bench/gemm_bench 2>&1 | tee "$OUTD/gemm_bench.jsonl"; gemm_rc=$?
echo "gemm_bench rc=$gemm_rc"
t0=$(date +%s)
timeout 300 ctest --test-dir $B -L gpu --output-on-failure > "$OUTD/ctest_gpu.log" 2>&1
echo "gpu tests rc=$? in $(( $(date +%s) - t0 )) s"; grep -E "tests passed|Failed|\*\*\*Failed|Exception|Timeout" "$OUTD/ctest_gpu.log" | tail -8
timeout 120 ctest --test-dir $B -R "plan_engine_profile" --output-on-failure > "$OUTD/ctest_plan.log" 2>&1
echo "plan profile tests rc=$?"; grep -E "tests passed|Failed|\*\*\*" "$OUTD/ctest_plan.log" | tail -4
if [ "$gemm_rc" != 0 ]; then echo "gemm_bench failed: the switch runs are skipped"; ROUNDS_ON=0; else ROUNDS_ON=1; fi
for r in $(seq 1 "$ROUNDS"); do
  timeout 120 $B/tests/bench/gpt_bench --label off$r
  [ $ROUNDS_ON = 1 ] && env "$SW" timeout 120 $B/tests/bench/gpt_bench --label on$r
done 2>&1 | tee "$OUTD/gpt_bench.jsonl" | grep -E '^\{|rror|abort'
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
