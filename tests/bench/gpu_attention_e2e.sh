#!/bin/bash
# One device call (issue 19): the whole engine-only tree with -Werror, the GPU tests, attention_bench, then
# gpt_bench with the wgmma attention forward (default) and without it
# (GANTRY_CUDA_ATTENTION_WGMMA=0) before and after both peers (PyTorch + compile, llm.c + cuDNN) at 124M and
# 350M, and at 1.5B if time is left. Not a test; logs in $OUT/gpu_e2e_logs.tgz.
#
#   bash tests/bench/gpu_attention_e2e.sh SRC_DIR PEERS_DIR
set -u -o pipefail
SRC=$(cd "$1" && pwd); P=$(cd "$2" && pwd); OUTD=/tmp/e2e_logs; BUDGET=${BUDGET:-560}
mkdir -p $OUTD; trap 'tar -czf "${OUT:-/tmp}/gpu_e2e_logs.tgz" -C /tmp e2e_logs 2>/dev/null' EXIT
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,power.limit,temperature.gpu --format=csv,noheader
CUDNN=$(python3 -c "import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])")
lib=$(mktemp -d) && ln -s "$CUDNN/lib/libcudnn.so.9" "$lib/libcudnn.so"
LW=/tmp/llmc_work; rm -rf $LW && cp -r "$P/llmc" $LW && ln -sfn "$P/fe" $LW/cudnn-frontend
sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' $LW/llmc/cuda_utils.cuh
( cd $LW && CPATH=$CUDNN/include LIBRARY_PATH=$lib make train_gpt2cu USE_CUDNN=1 NVCC_LDLIBS="-lnvrtc -lcuda" \
    NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY=90 -j4 > "$OUTD/llmc_build.log" 2>&1 ) & LPID=$!
LD=/tmp/llmc_data; mkdir -p $LD && python3 "$P/make_llmc_data.py" $LD &
cmake -S "$SRC" -B /tmp/ge -G Ninja -DGANTRY_ENGINE_ONLY=ON -DGANTRY_WERROR=ON -DCMAKE_BUILD_TYPE=Release \
  > "$OUTD/build.log" 2>&1 && cmake --build /tmp/ge -j12 >> "$OUTD/build.log" 2>&1 ||
  { grep -E "error" "$OUTD/build.log" | head -30; tail -20 "$OUTD/build.log"; exit 1; }
el "engine built"
timeout 150 ctest --test-dir /tmp/ge -L gpu --output-on-failure > "$OUTD/ctest.log" 2>&1
echo "gpu tests rc=$?"; grep -E "tests passed|\*\*\*Failed|Timeout" "$OUTD/ctest.log" | tail -8
el "tests done"
timeout 60 /tmp/ge/tests/bench/attention_bench wgmma | grep -v '^{'
GANTRY_CUDA_ATTENTION_WGMMA=0 timeout 60 /tmp/ge/tests/bench/attention_bench mma | grep -v '^{' | tail -7
el "attention benches done"
gb() { env GANTRY_CUDA_ATTENTION_WGMMA=$2 timeout 150 /tmp/ge/tests/bench/gpt_bench --label "$1" ${3:-} 2>&1 | \
         grep '^{' | tee -a "$OUTD/gpt_bench.jsonl"; }
gb wgmma_before 1; gb mma_before 0
el "gantry before the peers done"
for cfg in "12 768 12 32" "24 1024 16 16"; do set -- $cfg
  timeout 150 python3 "$P/torch_gpt2.py" --layers $1 --dim $2 --heads $3 --batch $4 --seq 1024 2>&1 | grep '^{' | tee -a "$OUTD/torch.jsonl"
done
el "torch done"
wait $LPID; wait
for cfg in "d12 32" "d24 16"; do set -- $cfg
  ( cd $LW && LD_LIBRARY_PATH=$CUDNN/lib:${LD_LIBRARY_PATH:-} timeout 90 ./train_gpt2cu -i "$LD/train_*.bin" -j "$LD/val_*.bin" \
      -e $1 -b $2 -t 1024 -d $(( $2 * 1024 )) -x 50 -v 100000 -s 100000 -m 1 -r 0 -f 1 -w 1 > "$OUTD/llmc_$1.log" 2>&1 )
  python3 "$P/llmc_summary.py" "$OUTD/llmc_$1.log" $1 $2 1024 0 "llm.c+cudnn" | tee -a "$OUTD/llmc.jsonl"
done
el "llm.c done"
gb mma_after 0; gb wgmma_after 1
el "gantry after the peers done"
if [ "$(left)" -gt 100 ]; then
  gb wgmma_15b 1 "--models 1.5b --batch 16 --steps 10 --warmup 4"; gb mma_15b 0 "--models 1.5b --batch 16 --steps 10 --warmup 4"
fi
el "end"
