#!/bin/bash
# One device call (issue 19): the whole engine-only tree with -Werror, the wgmma + TMA attention forward
# experiment (attention_sm90_bench: checked against the engine's kernel, then timed), PyTorch's SDPA beside it,
# and the GPU tests. Not a test.
#
#   bash tests/bench/gpu_attention_sm90.sh SRC_DIR PEERS_DIR
set -u -o pipefail
SRC=$(cd "$1" && pwd); P=$(cd "$2" && pwd)
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,memory.total,clocks.sm,power.limit,temperature.gpu --format=csv,noheader
cmake -S "$SRC" -B /tmp/ga -G Ninja -DGANTRY_ENGINE_ONLY=ON -DGANTRY_WERROR=ON -DCMAKE_BUILD_TYPE=Release > /tmp/ga.log 2>&1 &&
  cmake --build /tmp/ga -j16 >> /tmp/ga.log 2>&1 || { grep -E "error|warning" /tmp/ga.log | head -30; tail -20 /tmp/ga.log; exit 1; }
el "built"
cuobjdump --dump-sass /tmp/ga/tests/bench/attention_sm90_bench 2>/dev/null | grep -oE "HGMMA[.A-Z0-9x]*|UTMALDG[.A-Z0-9]*" | sort | uniq -c
timeout 120 /tmp/ga/tests/bench/attention_sm90_bench; echo "attention_sm90_bench rc=$?"
el "sm90 attention done"
timeout 90 python3 "$P/torch_attention.py" 2>&1 | grep '"HS": 64'
el "torch attention done"
timeout 200 ctest --test-dir /tmp/ga -L gpu --output-on-failure > /tmp/ga_ctest.log 2>&1
echo "gpu tests rc=$?"; grep -E "tests passed|\*\*\*Failed|Timeout" /tmp/ga_ctest.log | tail -6
el "end"
