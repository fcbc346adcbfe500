#!/bin/bash
# One device call (issue 19, the wgmma attention backward): build the attention targets (FULL=1: the whole
# engine-only tree) with -Werror, the GPU tests (attention first, then the other one-GPU tests; FULL=1: ctest -L
# gpu), attention_bench with the wgmma backward (default) and
# without it (GANTRY_CUDA_ATTENTION_WGMMA_BWD=0), then gpt_bench 124M/350M both ways, alternating, while the
# time budget lasts. Not a test; logs in $OUT/attn_bwd_logs.tgz.
#
#   BUDGET=seconds bash tests/bench/gpu_attention_bwd.sh SRC_DIR
set -u -o pipefail
SRC=$(cd "$1" && pwd); OUTD=/tmp/attn_bwd_logs; BUDGET=${BUDGET:-420}
mkdir -p $OUTD; trap 'tar -czf "${OUT:-/tmp}/attn_bwd_logs.tgz" -C /tmp attn_bwd_logs 2>/dev/null' EXIT
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,power.limit,temperature.gpu --format=csv,noheader
date -u
cmake -S "$SRC" -B /tmp/ge -G Ninja -DGANTRY_ENGINE_ONLY=ON -DGANTRY_WERROR=ON -DCMAKE_BUILD_TYPE=Release \
  > "$OUTD/build.log" 2>&1 && cmake --build /tmp/ge -j16 $([ "${FULL:-0}" = 1 ] || echo --target attention_test \
  attention_bench gpt_bench kernels_cuda_test backend_cuda_test) >> "$OUTD/build.log" 2>&1 ||
  { grep -E "error" "$OUTD/build.log" | head -30; tail -20 "$OUTD/build.log"; exit 1; }
el "built"
timeout 120 /tmp/ge/tests/engine/core/cuda/attention_test > "$OUTD/attention_test.log" 2>&1
echo "attention_test rc=$?"; grep -E "rel err|difference|FAILED|PASSED|Failure|Expected|Which is|actual" \
  "$OUTD/attention_test.log" | head -60
el "attention tests done"
timeout 60 /tmp/ge/tests/bench/attention_bench wgmma_bwd | tee "$OUTD/bench_new.log" | grep -v '^{'
GANTRY_CUDA_ATTENTION_WGMMA_BWD=0 timeout 60 /tmp/ge/tests/bench/attention_bench mma_bwd | tee "$OUTD/bench_old.log" | grep -v '^{' | tail -7
grep -o '"label":"[a-z_]*"\|"B":[0-9]*\|"NH":[0-9]*\|"bwd_repeat_identical":[a-z]*\|"fast_vs_det":[^}]*\|"nonfinite":[0-9]*' \
  "$OUTD/bench_new.log" | paste -sd' ' | sed 's/"label"/\n"label"/g'
for v in ${VARIANTS:-}; do  # NAME=VALUE[,NAME=VALUE] settings of the engine's bench knobs, one run each
  env ${v//,/ } timeout 60 /tmp/ge/tests/bench/attention_bench "$v" > "$OUTD/bench_$v.log" 2>&1
  grep -v '^{' "$OUTD/bench_$v.log" | grep -E "^GANTRY" | sed 's/GANTRY_ATTN_WGMMA_BWD_//'
  grep -o '"fast_vs_det":[^}]*' "$OUTD/bench_$v.log" | paste -sd' '
  env ${v//,/ } timeout 60 /tmp/ge/tests/engine/core/cuda/attention_test > "$OUTD/test_$v.log" 2>&1
  echo "attention_test with $v: rc=$?"; grep -E "PASSED|FAILED" "$OUTD/test_$v.log" | head -5
done
el "attention benches done"
if [ "${NCU:-0}" = 1 ]; then  # each backward kernel's own time and memory traffic at 32 x 12 (first launches)
  timeout 120 ncu --clock-control none --cache-control none -k 'regex:^(dq|dkdv)_kernel' -c 4 \
    --section SpeedOfLight --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active \
    /tmp/ge/tests/bench/attention_bench ncu > "$OUTD/ncu.log" 2>&1
  echo "ncu rc=$?"
  if [ "${NCU_STALLS:-0}" = 1 ]; then  # where the warps of one dq and one dK/dV kernel wait, and the pipes' use
    timeout 120 ncu --clock-control none --cache-control none -k 'regex:^(dq|dkdv)_kernel' -c 2 \
      --section WarpStateStats --section ComputeWorkloadAnalysis --section SchedulerStats \
      /tmp/ge/tests/bench/attention_bench ncu > "$OUTD/ncu_stalls.log" 2>&1
    grep -vE "^==PROF|^ *-+ *-+|^$|Section:|^ *Metric Name" "$OUTD/ncu_stalls.log" | grep -vE "^    OPT|^          " | head -70
  fi
  grep -E "dq_kernel|dkdv_kernel|Duration|dram__bytes|hit_rate|warps_active|Compute \(SM\)|Memory Throughput|==ERR|==WARN" "$OUTD/ncu.log" | head -40
  el "ncu done"
fi
if [ "${FULL:-0}" = 1 ]; then  # FULL=1: the whole engine-only tree was built; every GPU-labelled test
  timeout 200 ctest --test-dir /tmp/ge -L gpu --output-on-failure > "$OUTD/ctest_gpu.log" 2>&1
  echo "ctest -L gpu rc=$?"; grep -E "tests passed|\*\*\*Failed|Timeout|Not Run" "$OUTD/ctest_gpu.log" | tail -8
  el "ctest -L gpu done"
elif [ "${TESTS:-1}" = 1 ]; then
  for t in kernels_cuda_test backend_cuda_test; do
    timeout 150 /tmp/ge/tests/engine/core/cuda/$t > "$OUTD/$t.log" 2>&1; echo "$t rc=$?"
    grep -E "PASSED|FAILED|tests ran" "$OUTD/$t.log" | tail -4
  done
  el "other gpu tests done"
fi
# OLD_ENV: the setting gpt_bench's "old" runs take (default: the mma.sync backward).
gb() { env $2 timeout 150 /tmp/ge/tests/bench/gpt_bench --label "$1" ${3:-} 2>&1 | \
         grep '^{' | tee -a "$OUTD/gpt_bench.jsonl" | grep -o '"label":"[^"]*"\|"model":"[^"]*"\|"tokens_per_s":[0-9.]*\|"step_ms_median":[0-9.]*\|"bwd_ms":[0-9.]*\|"loss":[0-9.]*' | paste -sd' '; }
for round in 1 2; do
  [ "$(left)" -gt 90 ] || break
  gb "new_$round" GANTRY_NONE=1; el "gpt_bench new $round"
  [ "$(left)" -gt 60 ] || break
  gb "old_$round" "${OLD_ENV:-GANTRY_CUDA_ATTENTION_WGMMA_BWD=0}"; el "gpt_bench old $round"
done
el "end"
