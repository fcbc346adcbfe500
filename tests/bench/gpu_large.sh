#!/bin/bash
# One device call (issue 19): GPT-2 774M (36 layers, d 1280, 20 heads) and 1.5B (48 layers, d 1600, 25 heads)
# on one GPU, Gantry before and after both peers (PyTorch + compile: torch_gpt2.py; llm.c + cuDNN), at the
# largest power-of-two micro-batch that all three fit (64 / 32 on a card of > 100 GB, else 32 / 16), then
# Gantry alone at a larger micro-batch (the first of a few candidates, largest first, that fits); the GPU
# tests last. (As run in call L1 of docs/PERF.md it also timed the classifier experiment of commit b44a6fc at
# 124M and 350M.) Not a test; logs in $OUT/gpu_large_logs.tgz; a stage is skipped once the call's time budget
# (BUDGET s) is near.
#
#   [OWN_MAX=0] [TESTS=0] bash tests/bench/gpu_large.sh SRC_DIR PEERS_DIR     (=0 skips those stages)
# PEERS_DIR holds the shared bench scripts (torch_gpt2.py, make_llmc_data.py, llmc_summary.py) and copies of
# llm.c (llmc/) and cudnn-frontend (fe/include): ../shared/bench/README.md says how to fetch them.
set -u -o pipefail
SRC=$(cd "$1" && pwd); P=$(cd "$2" && pwd); OUTD=/tmp/gl_logs; BUDGET=${BUDGET:-570}
mkdir -p $OUTD; trap 'tar -czf "${OUT:-/tmp}/gpu_large_logs.tgz" -C /tmp gl_logs 2>/dev/null' EXIT
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,power.limit,temperature.gpu --format=csv,noheader
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
if [ "$MEM" -gt 100000 ]; then B774=64; B15=32; MAX774="88 80 72"; MAX15="44 40 36";
else B774=32; B15=16; MAX774="40 36"; MAX15="20 18"; fi
CUDNN=$(python3 -c "import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])")
lib=$(mktemp -d) && ln -s "$CUDNN/lib/libcudnn.so.9" "$lib/libcudnn.so"
LW=/tmp/llmc_work; rm -rf $LW && cp -r "$P/llmc" $LW && ln -sfn "$P/fe" $LW/cudnn-frontend
sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' $LW/llmc/cuda_utils.cuh
( cd $LW && CPATH=$CUDNN/include LIBRARY_PATH=$lib make train_gpt2cu USE_CUDNN=1 NVCC_LDLIBS="-lnvrtc -lcuda" \
    NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY=90 -j4 > "$OUTD/llmc_build.log" 2>&1;
  echo "llmc build rc=$?" >> "$OUTD/llmc_build.log" ) & LPID=$!
LD=/tmp/llmc_data; mkdir -p $LD && python3 "$P/make_llmc_data.py" $LD &
tg() {  # torch_gpt2 at layers dim heads batch; at half the batch if the first run printed nothing (memory)
  local b=$4
  for try in 1 2; do
    timeout 300 python3 "$P/torch_gpt2.py" --layers $1 --dim $2 --heads $3 --batch $b --seq 1024 --steps 10 \
      --warmup 4 > "$OUTD/torch_$1_$b.log" 2>&1
    if grep '^{' "$OUTD/torch_$1_$b.log" | tee -a "$OUTD/torch.jsonl"; then return; fi
    grep -m1 -i "out of memory" "$OUTD/torch_$1_$b.log"; b=$(( b / 2 ))
  done
}
# PyTorch 774M compiles (CPU) while the engine builds; its timed steps end before any Gantry run starts.
tg 36 1280 20 $B774 > "$OUTD/torch774.out" 2>&1 & TPID=$!
cmake -S "$SRC" -B /tmp/gl -G Ninja -DGANTRY_ENGINE_ONLY=ON -DGANTRY_WERROR=ON -DCMAKE_BUILD_TYPE=Release \
  > "$OUTD/build.log" 2>&1 && cmake --build /tmp/gl -j10 >> "$OUTD/build.log" 2>&1 || { tail -30 "$OUTD/build.log"; exit 1; }
el "engine built"
wait $TPID; cat "$OUTD/torch774.out"; el "torch 774M done"
gb() {  # label model batch steps warmup [env]
  env ${6:-X=1} timeout 150 /tmp/gl/tests/bench/gpt_bench --models $2 --batch $3 --steps $4 --warmup $5 --label "$1" \
    2>&1 | grep '^{' | tee -a "$OUTD/gpt_bench.jsonl"
}
gb before 774m $B774 10 4; gb before 1.5b $B15 10 4
el "gantry before the peers done"
[ "$(left)" -gt 300 ] && tg 48 1600 25 $B15
el "torch 1.5B done"
wait $LPID; tail -1 "$OUTD/llmc_build.log"; wait
for cfg in "d36 $B774" "d48 $B15"; do set -- $cfg
  [ "$(left)" -gt 200 ] || break
  ( cd $LW && LD_LIBRARY_PATH=$CUDNN/lib:${LD_LIBRARY_PATH:-} timeout 120 ./train_gpt2cu -i "$LD/train_*.bin" -j "$LD/val_*.bin" \
      -e $1 -b $2 -t 1024 -d $(( $2 * 1024 )) -x 20 -v 100000 -s 100000 -m 1 -r 0 -f 1 -w 1 > "$OUTD/llmc_$1.log" 2>&1 )
  grep -m2 -iE "device memory|out of memory" "$OUTD/llmc_$1.log"
  python3 "$P/llmc_summary.py" "$OUTD/llmc_$1.log" $1 $2 1024 0 "llm.c+cudnn" | tee -a "$OUTD/llmc.jsonl"
done
el "llm.c done"
[ "$(left)" -gt 120 ] && { gb after 774m $B774 10 4; gb after 1.5b $B15 10 4; }
el "gantry after the peers done"
if [ "${OWN_MAX:-1}" = 1 ]; then
  for b in $MAX774; do [ "$(left)" -gt 90 ] || break; gb own_max 774m $b 8 3 && break; done
  for b in $MAX15; do [ "$(left)" -gt 70 ] || break; gb own_max 1.5b $b 8 3 && break; done
  el "gantry at its own largest micro-batch done"
fi
[ "${TESTS:-1}" = 1 ] && [ "$(left)" -gt 40 ] && { timeout $(( $(left) - 10 )) ctest --test-dir /tmp/gl -L gpu --output-on-failure \
  > "$OUTD/ctest.log" 2>&1; echo "GPU tests rc=$?"; grep -E "tests passed|\*\*\*Failed|Timeout" "$OUTD/ctest.log" | tail -5; }
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
el "end"
