#!/usr/bin/env bash
# Issue 16's one-GPU checkpoint benchmarks in one device call (benchmarks, not tests):
#   1. the disk: dd's write bandwidth (O_DIRECT, fsync) on the disk the checkpoints go to;
#   2. the link: PyTorch's pinned device-to-host copy of 1.5 GB (the bandwidth a copy can have);
#   3. checkpoint_stall.py --nproc 1: GPT-2 124M (every 10 steps) and 350M (every 20), async against sync
#      against none, each async line with its copy's bandwidth.
# Everything goes to $OUT/gpu_checkpoint_one.txt as it comes, so a call cut short still returns what ran.
#
#   BUDGET=400 bash tests/bench/gpu_checkpoint_one.sh .
set -uo pipefail
SRC=$(cd "${1:-.}" && pwd)
OUT=${OUT:-/tmp/gpu_checkpoint_one}
mkdir -p "$OUT"
LOG="$OUT/gpu_checkpoint_one.txt"
BUILD=/tmp/gantry_ckpt_build
SCRATCH=${SCRATCH:-/tmp}
say() { echo "$*" | tee -a "$LOG"; }

say "# gpu_checkpoint_one $(date -u +%FT%TZ) on $(nvidia-smi --query-gpu=name,pcie.link.gen.max,pcie.link.width.max --format=csv,noheader 2>/dev/null | head -1)"
t0=$SECONDS
cmake -S "$SRC" -B "$BUILD" -G Ninja -DGANTRY_ENGINE_ONLY=ON -DCMAKE_BUILD_TYPE=Release >"$OUT/cmake.txt" 2>&1 &&
  ninja -C "$BUILD" gantry-engine >"$OUT/build.txt" 2>&1
rc=$?
say "build rc=$rc in $((SECONDS - t0)) s"
if [ $rc -ne 0 ]; then tail -30 "$OUT/build.txt" | tee -a "$LOG"; exit 1; fi
ENGINE=$BUILD/app/gantry-engine

say "## dd: 4 GiB, 1 MiB blocks, O_DIRECT, fsync, into $SCRATCH"
dd if=/dev/zero of="$SCRATCH/gantry_dd_test" bs=1M count=4096 oflag=direct conv=fsync 2>&1 | tail -1 | tee -a "$LOG"
rm -f "$SCRATCH/gantry_dd_test"

say "## link: torch pinned device-to-host copy, 1.5 GB, median of 5"
python3 - <<'EOF' 2>&1 | tee -a "$LOG"
import statistics, torch
n = 1_500_000_000 // 4
d = torch.empty(n, dtype=torch.float32, device="cuda")
h = torch.empty(n, dtype=torch.float32, pin_memory=True)
ts = []
for _ in range(6):
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record(); h.copy_(d, non_blocking=True); b.record(); b.synchronize()
    ts.append(a.elapsed_time(b) / 1e3)
t = statistics.median(ts[1:])
print(f"torch pinned D2H: {n * 4 / 1e9 / t:.2f} GB/s ({t * 1e3:.1f} ms for 1.5 GB)")
EOF

say "## checkpoint_stall 124m, every 10"
python3 "$SRC/tests/bench/checkpoint_stall.py" --engine "$ENGINE" --backend cuda --nproc 1 --models 124m \
  --steps 60 --every 10 --warmup 10 2>&1 | tee -a "$LOG"
say "## checkpoint_stall 350m, every 20"
python3 "$SRC/tests/bench/checkpoint_stall.py" --engine "$ENGINE" --backend cuda --nproc 1 --models 350m \
  --steps 50 --every 20 --warmup 10 2>&1 | tee -a "$LOG"
say "# done in $((SECONDS - t0)) s"
