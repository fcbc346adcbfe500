#!/bin/bash
# One device call (issue 19): GPT-2 124M and 350M, Gantry with the classifier's gradient products in turn and
# overlapped (GANTRY_CUDA_CLASSIFIER_OVERLAP 0 / 1) before and after both peers (PyTorch + compile:
# torch_gpt2.py; llm.c + cuDNN), one build. Reuses /tmp/gl and /tmp/llmc_work from gpu_large.sh on a warm
# machine, builds them otherwise. Not a test; logs in $OUT/gpu_sbs_logs.tgz.
#
#   bash tests/bench/gpu_classifier_sbs.sh SRC_DIR PEERS_DIR
set -u -o pipefail
SRC=$(cd "$1" && pwd); P=$(cd "$2" && pwd); OUTD=/tmp/sbs_logs
mkdir -p $OUTD; trap 'tar -czf "${OUT:-/tmp}/gpu_sbs_logs.tgz" -C /tmp sbs_logs 2>/dev/null' EXIT
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,power.limit,temperature.gpu --format=csv,noheader
CUDNN=$(python3 -c "import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])")
LW=/tmp/llmc_work
if [ ! -x $LW/train_gpt2cu ]; then
  lib=$(mktemp -d) && ln -s "$CUDNN/lib/libcudnn.so.9" "$lib/libcudnn.so"
  rm -rf $LW && cp -r "$P/llmc" $LW && ln -sfn "$P/fe" $LW/cudnn-frontend
  sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' $LW/llmc/cuda_utils.cuh
  ( cd $LW && CPATH=$CUDNN/include LIBRARY_PATH=$lib make train_gpt2cu USE_CUDNN=1 NVCC_LDLIBS="-lnvrtc -lcuda" \
      NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY=90 -j4 > "$OUTD/llmc_build.log" 2>&1 ) & LPID=$!
else LPID=""; fi
LD=/tmp/llmc_data; [ -f $LD/val_000000.bin ] || { mkdir -p $LD && python3 "$P/make_llmc_data.py" $LD; }
cmake -S "$SRC" -B /tmp/gl -G Ninja -DGANTRY_ENGINE_ONLY=ON -DGANTRY_WERROR=ON -DCMAKE_BUILD_TYPE=Release \
  > "$OUTD/build.log" 2>&1 && cmake --build /tmp/gl -j12 >> "$OUTD/build.log" 2>&1 || { tail -30 "$OUTD/build.log"; exit 1; }
el "engine built"
gb() { env GANTRY_CUDA_CLASSIFIER_OVERLAP=$2 timeout 100 /tmp/gl/tests/bench/gpt_bench --label "$1" 2>&1 | grep '^{' | \
         tee -a "$OUTD/gpt_bench.jsonl"; }
gb ov0_before 0; gb ov1_before 1
el "gantry before the peers done"
for cfg in "12 768 12 32" "24 1024 16 16"; do set -- $cfg
  timeout 150 python3 "$P/torch_gpt2.py" --layers $1 --dim $2 --heads $3 --batch $4 --seq 1024 2>&1 | grep '^{' | tee -a "$OUTD/torch.jsonl"
done
el "torch done"
[ -n "$LPID" ] && wait $LPID
for cfg in "d12 32" "d24 16"; do set -- $cfg
  ( cd $LW && LD_LIBRARY_PATH=$CUDNN/lib:${LD_LIBRARY_PATH:-} timeout 90 ./train_gpt2cu -i "$LD/train_*.bin" -j "$LD/val_*.bin" \
      -e $1 -b $2 -t 1024 -d $(( $2 * 1024 )) -x 50 -v 100000 -s 100000 -m 1 -r 0 -f 1 -w 1 > "$OUTD/llmc_$1.log" 2>&1 )
  grep -m1 -i "device memory" "$OUTD/llmc_$1.log"
  python3 "$P/llmc_summary.py" "$OUTD/llmc_$1.log" $1 $2 1024 0 "llm.c+cudnn" | tee -a "$OUTD/llmc.jsonl"
done
el "llm.c done"
gb ov1_after 1; gb ov0_after 0
el "gantry after the peers done"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
