#!/bin/bash
# One device call, side by side (issue 19): builds the engine-only trees BASE and NEW and llm.c + cuDNN,
# runs NEW's gemm_bench (the sm90 product experiment), then gpt_bench of NEW and BASE before and after the
# peers (PyTorch + compile: torch_gpt2.py; llm.c + cuDNN), then NEW's GPU tests. Not a test; logs under $OUT.
#
#   bash tests/bench/gpu_side_by_side.sh BASE_DIR NEW_DIR PEERS_DIR [VAR=VALUE ...]
# Each VAR=VALUE adds a run of NEW under that environment setting before and after the peers (label on<k>_<i>),
# and a run of NEW's backend GPU tests under it.
# PEERS_DIR holds the shared bench scripts (torch_gpt2.py, make_llmc_data.py, llmc_summary.py) and copies of
# llm.c (llmc/) and cudnn-frontend (fe/include): ../shared/bench/README.md says how to fetch them.
set -u -o pipefail
BASE=$(cd "$1" && pwd); NEW=$(cd "$2" && pwd); P=$(cd "$3" && pwd); OUTD=${OUT:-/tmp}; shift 3; SWITCHES=("$@")
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,power.limit,temperature.gpu --format=csv,noheader
# llm.c + cuDNN, built while the engine builds (as ../shared/bench/llmc_cudnn.sh does, split in two phases).
CUDNN=$(python3 -c "import nvidia.cudnn; print(list(nvidia.cudnn.__path__)[0])")
lib=$(mktemp -d) && ln -s "$CUDNN/lib/libcudnn.so.9" "$lib/libcudnn.so"
LW=/tmp/llmc_work; rm -rf $LW && cp -r "$P/llmc" $LW && ln -sfn "$P/fe" $LW/cudnn-frontend
sed -i 's/cudaMemAdviseSetPreferredLocation, cudaCpuDeviceId)/cudaMemAdviseSetPreferredLocation, cudaMemLocation{cudaMemLocationTypeHost, 0})/' $LW/llmc/cuda_utils.cuh
( cd $LW && CPATH=$CUDNN/include LIBRARY_PATH=$lib make train_gpt2cu USE_CUDNN=1 NVCC_LDLIBS="-lnvrtc -lcuda" \
    NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY=90 -j6 > "$OUTD/llmc_build.log" 2>&1;
  echo "llmc build rc=$?" >> "$OUTD/llmc_build.log" ) & LPID=$!
LD=/tmp/llmc_data; mkdir -p $LD && python3 "$P/make_llmc_data.py" $LD &
build() { cmake -S "$1" -B "$2" -G Ninja -DGANTRY_ENGINE_ONLY=ON -DCMAKE_BUILD_TYPE=Release > "$3" 2>&1 &&
          cmake --build "$2" -j10 >> "$3" 2>&1; }
build "$BASE" /tmp/sbs_base "$OUTD/build_base.log" & BPID=$!
build "$NEW" /tmp/sbs_new "$OUTD/build_new.log" || { tail -30 "$OUTD/build_new.log"; exit 1; }
wait $BPID || echo "base build failed"
el "engine builds done"
timeout 100 /tmp/sbs_new/tests/bench/gemm_bench 2>&1 | tee "$OUTD/gemm_bench.jsonl" | grep -E "wrong|sm90|cublaslt" | \
  python3 -c "import sys,json
for l in sys.stdin:
  if l.startswith('{'): d=json.loads(l); print(d['shape'], d['variant'], d['ms'], d['tflops'], 'err', d['err_vs_cublas'], d['err_vs_cpu'], 'wrong', d['wrong'])
  else: print(l.strip())"
el "gemm_bench done"
gb() { timeout 100 "$1"/tests/bench/gpt_bench --label "$2" 2>&1 | grep '^{' | tee -a "$OUTD/gpt_bench.jsonl"; }
grep -q "^# wrong 0" "$OUTD/gemm_bench.jsonl" || { echo "gemm_bench not clean: no switch runs"; SWITCHES=(); }
sw() {
  local k=0
  for s in "${SWITCHES[@]}"; do
    k=$((k + 1))
    env "$s" timeout 100 /tmp/sbs_new/tests/bench/gpt_bench --label "on${k}_$1" 2>&1 | grep '^{' | tee -a "$OUTD/gpt_bench.jsonl"
  done
}
gb /tmp/sbs_new new1; sw 1; gb /tmp/sbs_base base1
el "gantry before the peers done"
for cfg in "12 768 12 32" "24 1024 16 16"; do set -- $cfg
  timeout 150 python3 "$P/torch_gpt2.py" --layers $1 --dim $2 --heads $3 --batch $4 --seq 1024 2>&1 | grep '^{' | tee -a "$OUTD/torch.jsonl"
done
el "torch done"
wait $LPID; tail -1 "$OUTD/llmc_build.log"; wait
for cfg in "d12 32" "d24 16"; do set -- $cfg
  ( cd $LW && LD_LIBRARY_PATH=$CUDNN/lib:${LD_LIBRARY_PATH:-} timeout 90 ./train_gpt2cu -i "$LD/train_*.bin" -j "$LD/val_*.bin" \
      -e $1 -b $2 -t 1024 -d $(( $2 * 1024 )) -x 50 -v 100000 -s 100000 -m 1 -r 0 -f 1 -w 1 > "$OUTD/llmc_$1.log" 2>&1 )
  python3 "$P/llmc_summary.py" "$OUTD/llmc_$1.log" $1 $2 1024 0 "llm.c+cudnn" | tee -a "$OUTD/llmc.jsonl"
done
el "llm.c done"
gb /tmp/sbs_base base2; sw 2; gb /tmp/sbs_new new2
el "gantry after the peers done"
timeout 70 ctest --test-dir /tmp/sbs_new -L gpu --output-on-failure > "$OUTD/ctest_gpu.log" 2>&1
echo "gpu tests rc=$?"; grep -E "tests passed|\*\*\*Failed|Timeout" "$OUTD/ctest_gpu.log" | tail -6
for s in "${SWITCHES[@]}"; do
  env "$s" timeout 60 ctest --test-dir /tmp/sbs_new -R "backend_cuda|kernels_cuda" --output-on-failure > "$OUTD/ctest_switch.log" 2>&1
  echo "backend/kernel GPU tests under $s: rc=$?"; grep -E "tests passed|\*\*\*Failed|Timeout" "$OUTD/ctest_switch.log" | tail -4
done
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
el "end"
