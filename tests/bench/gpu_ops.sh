#!/bin/bash
# One device call (issue 19): the per-op table (kernels_bench at 124M and 350M: the classifier's products in the
# engine's chunks and in one pass, and every cuBLASLt candidate for the dwte product), attention_bench, and
# PyTorch's SDPA (cuDNN, FlashAttention-2) at the same shapes. Not a test.
#
#   bash tests/bench/gpu_ops.sh SRC_DIR PEERS_DIR
set -u -o pipefail
SRC=$(cd "$1" && pwd); P=$(cd "$2" && pwd)
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,power.limit,temperature.gpu --format=csv,noheader
cmake -S "$SRC" -B /tmp/go -G Ninja -DGANTRY_ENGINE_ONLY=ON -DGANTRY_WERROR=ON -DCMAKE_BUILD_TYPE=Release > /tmp/go.log 2>&1 &&
  cmake --build /tmp/go -j16 --target kernels_bench attention_bench gpt_bench >> /tmp/go.log 2>&1 || { tail -30 /tmp/go.log; exit 1; }
el "built"
for m in 124m 350m; do timeout 120 /tmp/go/tests/bench/kernels_bench --model $m; done
el "kernels_bench done"
timeout 120 /tmp/go/tests/bench/attention_bench 2>&1 | grep -v '^{'
el "attention_bench done"
timeout 150 python3 "$P/torch_attention.py" 2>&1 | tail -12
el "torch attention done"
nvidia-smi --query-gpu=clocks.sm,power.draw,temperature.gpu --format=csv,noheader
