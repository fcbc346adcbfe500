#!/bin/bash
# One device call (issue 19): GPT-2 1.5B beside PyTorch + compile (Gantry before and after it), the GPU tests,
# then rounds of the classifier's gradient products in turn and overlapped (GANTRY_CUDA_CLASSIFIER_OVERLAP 0 / 1,
# alternating) at 124M and 350M. Not a test; logs in $OUT/gpu_ab_logs.tgz.
#
#   bash tests/bench/gpu_classifier_ab.sh SRC_DIR PEERS_DIR B_1.5B ROUNDS
set -u -o pipefail
SRC=$(cd "$1" && pwd); P=$(cd "$2" && pwd); B15=$3; ROUNDS=$4; OUTD=/tmp/ab_logs
mkdir -p $OUTD; trap 'tar -czf "${OUT:-/tmp}/gpu_ab_logs.tgz" -C /tmp ab_logs 2>/dev/null' EXIT
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,power.limit,temperature.gpu --format=csv,noheader
# PyTorch 1.5B compiles (CPU) while the engine builds.
timeout 330 python3 "$P/torch_gpt2.py" --layers 48 --dim 1600 --heads 25 --batch $B15 --seq 1024 --steps 10 --warmup 4 \
  > "$OUTD/torch_48.log" 2>&1 & TPID=$!
cmake -S "$SRC" -B /tmp/gl -G Ninja -DGANTRY_ENGINE_ONLY=ON -DGANTRY_WERROR=ON -DCMAKE_BUILD_TYPE=Release \
  > "$OUTD/build.log" 2>&1 && cmake --build /tmp/gl -j12 >> "$OUTD/build.log" 2>&1 || { tail -30 "$OUTD/build.log"; exit 1; }
el "engine built"
gb() { env ${6:-X=1} timeout 150 /tmp/gl/tests/bench/gpt_bench --models $2 --batch $3 --steps $4 --warmup $5 \
         --label "$1" 2>&1 | grep '^{' | tee -a "$OUTD/gpt_bench.jsonl"; }
wait $TPID; grep '^{' "$OUTD/torch_48.log" || tail -3 "$OUTD/torch_48.log"
el "torch 1.5B done"
gb after 1.5b $B15 10 4
timeout 150 ctest --test-dir /tmp/gl -L gpu --output-on-failure > "$OUTD/ctest.log" 2>&1
echo "gpu tests rc=$?"; grep -E "tests passed|\*\*\*Failed|Timeout|Not Run" "$OUTD/ctest.log" | tail -8
el "tests done"
for r in $(seq 1 $ROUNDS); do
  for m in 0 1; do gb "ov${m}_r$r" 124m,350m 0 20 8 GANTRY_CUDA_CLASSIFIER_OVERLAP=$m; done
done
el "A/B done"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
