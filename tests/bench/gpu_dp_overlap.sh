#!/usr/bin/env bash
# Issue 18's data-parallel experiments, one device call on a machine with 4+ GPUs (benchmark, not a test):
# GPT-2 124M, micro-batch 32 per GPU, every variant in the same call so they compare (docs/PERF.md, G1-G5).
# PHASES picks what runs, in order:
#   dp        1 GPU with and without CUDA graphs; 4 GPUs as they are, with NCCL_MAX_CTAS=8, with 100 MB buckets
#   short     1 GPU and 4 GPUs as they are
#   ab        the host's poll cap, 1 ms (the old one) against the default, interleaved twice
#   final     the side-by-side table: ZeRO 0 at 1 and 4 GPUs, ZeRO 1 and 3 at 4, PyTorch + compile at 1 and
#             DDP at 4 (REF: a folder holding ../shared/bench/torch_gpt2.py), one GPU's checkpoint stall
#   ckpt      checkpoint_stall.py at 4 GPUs: async, deferred, none
#   memory    1 GPU, 124M: in-memory copies every step (async, sync) and every 10 (async) against none
#   stall350  1 GPU, 350M: checkpoint stall every 10, async, deferred and sync against none
#   snapshot  ctest -R StateSnapshot (the checkpoint and in-memory copy slots)
#   dd        dd's write rate to /tmp (the checkpoints' disk) and /dev/shm (the copies' tmpfs)
#   probe     what the machine has of the cluster's libraries (SQLite, libcurl, cpp-httplib) and glibc
#   tests     ctest -L gpu (at most CT seconds)
#   watchdog  the NCCL watchdog's test alone
# Each dp_scaling.py line is JSON with each phase's median (rank 0 and the slowest rank); everything also
# goes to $OUT/gpu_dp_overlap.txt as it comes.
#
#   PHASES="final" REF=.gpu/peers bash tests/bench/gpu_dp_overlap.sh .   (GM_BUILD=DIR: reuse a build tree)
set -uo pipefail
SRC=$(cd "${1:-.}" && pwd)
OUT=${OUT:-/tmp/gpu_dp_overlap}
mkdir -p "$OUT"
LOG="$OUT/gpu_dp_overlap.txt"
B=${GM_BUILD:-/tmp/gdo_build}
say() { echo "$*" | tee -a "$LOG"; }
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
say "# gpu_dp_overlap $(date -u +%FT%TZ), $(nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c | xargs), src $(git -C "$SRC" rev-parse --short HEAD 2>/dev/null)"
t0=$SECONDS
if [ ! -f "$B/build.ninja" ]; then
  cmake -S "$SRC" -B "$B" -G Ninja -DGANTRY_ENGINE_ONLY=ON -DGANTRY_WERROR=ON -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.txt" 2>&1
fi
ninja -C "$B" ${TARGETS:-} >"$OUT/build.txt" 2>&1
rc=$?
say "build rc=$rc in $((SECONDS - t0)) s"
if [ $rc -ne 0 ]; then grep -E "error" "$OUT/build.txt" | head -20 | tee -a "$LOG"; exit 1; fi
E=$B/app/gantry-engine
D="python3 $SRC/tests/bench/dp_scaling.py --engine $E --steps 30 --warmup 10"
for phase in ${PHASES:-dp}; do
case "$phase" in
  tests)
    timeout ${CT:-240} ctest --test-dir "$B" -L gpu --timeout 150 --output-on-failure >"$OUT/ctest_gpu.txt" 2>&1
    say "ctest -L gpu rc=$? in $((SECONDS - t0)) s"
    grep -E "tests passed|Failed|\*\*\*|Not Run|Skipped" "$OUT/ctest_gpu.txt" | tail -30 | tee -a "$LOG"
    ;;
  dp)
    say "## 1 GPU, graphs on / off";   $D --gpus 1 2>&1 | tee -a "$LOG"; $D --gpus 1 --set cuda_graphs=false 2>&1 | tee -a "$LOG"
    say "## 4 GPUs, as is";            $D --gpus 4 2>&1 | tee -a "$LOG"
    say "## 4 GPUs, NCCL_MAX_CTAS=8";  NCCL_MAX_CTAS=8 $D --gpus 4 2>&1 | tee -a "$LOG"
    say "## 4 GPUs, 100 MB buckets";   $D --gpus 4 --bucket-mb 100 2>&1 | tee -a "$LOG"
    say "## 4 GPUs, as is, again";     $D --gpus 4 2>&1 | tee -a "$LOG"
    ;;
  ckpt)
    python3 "$SRC/tests/bench/checkpoint_stall.py" --engine "$E" --backend cuda --nproc 4 --models 124m \
      --steps 60 --every 10 --warmup 10 --modes async,deferred,none 2>&1 | tee -a "$LOG"
    ;;
  ab)
    # The host's poll cap (GANTRY_NCCL_POLL_MAX_US; 1000 was the old fixed cap), interleaved twice so drift
    # shows.
    say "## 1 GPU";                    $D --gpus 1 2>&1 | tee -a "$LOG"
    for round in 1 2; do
      say "## 4 GPUs, poll cap 1000 us (old)"; GANTRY_NCCL_POLL_MAX_US=1000 $D --gpus 4 2>&1 | tee -a "$LOG"
      say "## 4 GPUs, poll cap 50 us";         $D --gpus 4 2>&1 | tee -a "$LOG"
    done
    ;;
  final)
    # The side-by-side table: Gantry ZeRO 0 at 1 and 4 GPUs, ZeRO 1 and 3 at 4; PyTorch + compile at 1 and
    # DDP at 4 (REF: a folder holding ../shared/bench/torch_gpt2.py); then one GPU's checkpoint stall,
    # async against deferred against none (GPT-2 124M every 10 steps).
    say "## Gantry ZeRO 0, 1 and 4 GPUs"; $D --gpus 1 4 2>&1 | tee -a "$LOG"
    say "## Gantry ZeRO 1, 4 GPUs";      $D --gpus 4 --zero 1 2>&1 | tee -a "$LOG"
    say "## Gantry ZeRO 3, 4 GPUs";      $D --gpus 4 --zero 3 2>&1 | tee -a "$LOG"
    say "## PyTorch + compile, 1 GPU"
    python3 "$REF/torch_gpt2.py" --batch 32 --seq 1024 2>&1 | grep -E "^\{" | tee -a "$LOG"
    say "## PyTorch + compile, DDP, 4 GPUs"
    torchrun --standalone --nproc_per_node 4 "$REF/torch_gpt2.py" --ddp 1 --batch 32 --seq 1024 2>&1 | grep -E "^\{" | tee -a "$LOG"
    say "## checkpoint stall, 1 GPU, 124m every 10"
    CUDA_VISIBLE_DEVICES=0 python3 "$SRC/tests/bench/checkpoint_stall.py" --engine "$E" --backend cuda --nproc 1 \
      --models 124m --steps 60 --every 10 --warmup 10 --modes async,deferred,none 2>&1 | tee -a "$LOG"
    ;;
  memory)
    M="python3 $SRC/tests/bench/checkpoint_stall.py --engine $E --backend cuda --nproc 1 --models 124m --via-run --steps 60 --warmup 10"
    say "## in-memory copies, 1 GPU, 124m every step"
    CUDA_VISIBLE_DEVICES=0 $M --every 1 --modes none,memory-async,memory 2>&1 | tee -a "$LOG"
    say "## in-memory copies, 1 GPU, 124m every 10"
    CUDA_VISIBLE_DEVICES=0 $M --every 10 --modes memory-async,none 2>&1 | tee -a "$LOG"
    ;;
  stall350)
    say "## checkpoint stall, 1 GPU, 350m every 10"
    CUDA_VISIBLE_DEVICES=0 python3 "$SRC/tests/bench/checkpoint_stall.py" --engine "$E" --backend cuda --nproc 1 \
      --models 350m --steps 50 --every 10 --warmup 10 --modes async,deferred,sync,none 2>&1 | tee -a "$LOG"
    ;;
  snapshot)
    ctest --test-dir "$B" -R StateSnapshot --timeout 120 --output-on-failure >"$OUT/ctest_snapshot.txt" 2>&1
    say "ctest -R StateSnapshot rc=$?"; grep -E "Passed|Failed|tests passed" "$OUT/ctest_snapshot.txt" | tee -a "$LOG"
    ;;
  dd)
    # The disk and tmpfs the checkpoints and copies are written to, 4 GB with one writer, as dd sees them.
    say "## dd, 4 GB to /tmp (fdatasync): $(dd if=/dev/zero of=/tmp/gdo_dd bs=64M count=64 conv=fdatasync 2>&1 | tail -1)"; rm -f /tmp/gdo_dd
    say "## dd, 4 GB to /dev/shm: $(dd if=/dev/zero of=/dev/shm/gdo_dd bs=64M count=64 2>&1 | tail -1)"; rm -f /dev/shm/gdo_dd
    ;;
  probe)
    say "## libraries: $(ldd --version | head -1)"
    ls /usr/lib/x86_64-linux-gnu/ /usr/include 2>/dev/null | grep -E "sqlite|curl|httplib|ssl\.so|brotli|nghttp|glfw" | sort -u | tr '\n' ' ' | tee -a "$LOG"; echo | tee -a "$LOG"
    ;;
  watchdog)
    ctest --test-dir "$B" -R Watchdog --timeout 120 --output-on-failure >"$OUT/ctest_watchdog.txt" 2>&1
    say "ctest -R Watchdog rc=$?"; grep -E "Passed|Failed|tests passed" "$OUT/ctest_watchdog.txt" | tee -a "$LOG"
    ;;
  short)
    say "## 1 GPU";                    $D --gpus 1 2>&1 | tee -a "$LOG"
    say "## 4 GPUs, as is";            $D --gpus 4 2>&1 | tee -a "$LOG"
    ;;
esac
done
say "done in $((SECONDS - t0)) s"
