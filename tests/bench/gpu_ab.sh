#!/bin/bash
# One device call's A/B of the CUDA backend: builds two engine-only trees side by side (BASE, NEW), runs
# NEW's GPU tests, then gpt_bench alternately from each build (JSON lines labelled base1, new1, base2, ...).
# Not a test. Everything it prints also goes under $OUT.
#
#   bash tests/bench/gpu_ab.sh BASE_DIR NEW_DIR [ROUNDS]
set -u -o pipefail
BASE=$(cd "$1" && pwd); NEW=$(cd "$2" && pwd); ROUNDS=${3:-2}; OUTD=${OUT:-/tmp}
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu --format=csv
build() {  # src dir, build dir, log
  cmake -S "$1" -B "$2" -G Ninja -DGANTRY_ENGINE_ONLY=ON -DCMAKE_BUILD_TYPE=Release > "$3" 2>&1 &&
    cmake --build "$2" -j16 >> "$3" 2>&1
}
t0=$(date +%s)
build "$BASE" /tmp/gab_base "$OUTD/build_base.log" & pb=$!
build "$NEW" /tmp/gab_new "$OUTD/build_new.log" || { tail -40 "$OUTD/build_new.log"; exit 1; }
wait $pb || { tail -20 "$OUTD/build_base.log"; echo "base build failed"; }
echo "builds: $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
timeout 300 ctest --test-dir /tmp/gab_new -L gpu --output-on-failure > "$OUTD/ctest_gpu.log" 2>&1
echo "gpu tests rc=$? in $(( $(date +%s) - t0 )) s"; grep -E "tests passed|Failed|\*\*\*|Passed|Skipped" "$OUTD/ctest_gpu.log" | tail -25
timeout 120 ctest --test-dir /tmp/gab_new -R "plan_engine_profile|backend_cuda|train" --output-on-failure > "$OUTD/ctest_plan.log" 2>&1
echo "plan/train tests rc=$?"; grep -E "tests passed|Failed|\*\*\*" "$OUTD/ctest_plan.log" | tail -10
for r in $(seq 1 "$ROUNDS"); do
  [ -x /tmp/gab_base/tests/bench/gpt_bench ] && /tmp/gab_base/tests/bench/gpt_bench --label base$r
  /tmp/gab_new/tests/bench/gpt_bench --label new$r
done 2>&1 | tee "$OUTD/gpt_bench.jsonl" | grep '^{'
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv
