#!/bin/bash
# One device call on a machine with several GPUs (issue 18), budget-aware: builds the engine-only tree
# (Release, -Werror, -j on every core), runs every GPU test (label gpu, the several-GPU ones included), then
# the measurements, most valuable first, each beside its reference in the same call:
#   1. data-parallel scaling, GPT-2 124M B32/GPU: Gantry ZeRO 0 at 1 and 4 GPUs (dp_scaling.py), PyTorch +
#      compile at 1 GPU and DDP at 4 (torch_gpt2.py --ddp 1 under torchrun)
#   2. all-reduce at 4 GPUs: allreduce_bench (our communicator) and torch_allreduce.py at the same sizes
#   3. checkpoint stall and throughput cost at 4 GPUs, async against sync against none (checkpoint_stall.py)
#   4. ZeRO 1 and 3 at 4 GPUs; 5. ZeRO 0 and DDP at 2 GPUs; 6. ZeRO 1 and 3 at 2 GPUs
#   7. tensor parallel over the first 2 or 4 GPUs, GPT-2 124M and 350M, and 350M pipelines over them (1F1B,
#      interleaved vp 2, ZB-H1; 8 micro-batches), each beside one GPU (dp_scaling.py --tp, --pp); at 4 GPUs
#      or more, 350M at tp 2 x pp 2, and pp 2 x dp 2 at ZeRO 1-3
# A step that would not fit in what is left of BUDGET (seconds, default 560) is skipped and named; so is one
# whose name STEPS (an extended regex, default every step) does not match. Ends with one compact summary;
# every log is in $OUT/gpu_multi_logs.tgz. Not a test.
#
#   BUDGET=560 [STEPS='ctest|tp_'] [CT_REGEX=<the GPU tests to run>] bash tests/bench/gpu_multi.sh SRC_DIR REF_DIR
# SRC_DIR: the checkout; REF_DIR: copies of ../shared/bench/*.py (torch_gpt2.py, torch_allreduce.py).
set -u -o pipefail
[ $# -eq 2 ] || { echo "usage: BUDGET=560 bash tests/bench/gpu_multi.sh SRC_DIR REF_DIR"; exit 2; }
SRC=$(cd "$1" && pwd) || exit 2
P=$(cd "$2" && pwd) || exit 2
for f in torch_gpt2.py torch_allreduce.py; do
  [ -f "$P/$f" ] || { echo "gpu_multi: $P/$f missing: copy ../shared/bench/*.py into REF_DIR"; exit 2; }
done
BUDGET=${BUDGET:-560}; RESERVE=20; OUTD=/tmp/gpu_multi_logs; B=/tmp/gm_build; BENCH="$SRC/tests/bench"
rm -rf "$OUTD"; mkdir -p "$OUTD"
trap 'mkdir -p "${OUT:-/tmp}"; tar -czf "${OUT:-/tmp}/gpu_multi_logs.tgz" -C /tmp gpu_multi_logs 2>/dev/null' EXIT
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
T0=$(date +%s)
el() { echo "[$(($(date +%s) - T0)) s] $*"; }
left() { echo $((BUDGET - ($(date +%s) - T0))); }
NGPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)
: > "$OUTD/steps.tsv"  # name, rc (or SKIPPED), seconds

# step NAME EST_S CMD...: runs CMD (stdout+stderr to NAME.log) when EST_S fits in what is left, under a
# timeout of what is left; records the outcome for the summary.
step() {
  local name=$1 est=$2; shift 2
  if ! [[ $name =~ ${STEPS:-.} ]]; then
    printf '%s\tSKIPPED\t0\n' "$name" >> "$OUTD/steps.tsv"
    return 0
  fi
  local l; l=$(left)
  if [ $((l - RESERVE)) -lt "$est" ]; then
    echo "SKIPPED $name: needs ~${est} s, $((l - RESERVE)) s left"
    printf '%s\tSKIPPED\t0\n' "$name" >> "$OUTD/steps.tsv"
    return 0
  fi
  local s0; s0=$(date +%s)
  # Through bash: CMD may be one of the functions below (exported).
  timeout -k 5 $((l - RESERVE)) bash -c '"$@"' _ "$@" > "$OUTD/$name.log" 2>&1
  local rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" $(($(date +%s) - s0)) >> "$OUTD/steps.tsv"
  el "$name rc=$rc ($(($(date +%s) - s0)) s)"
  [ $rc -eq 0 ] || tail -5 "$OUTD/$name.log"
  return 0
}

{
  nvidia-smi --query-gpu=index,name,memory.total,clocks.max.sm,power.limit,temperature.gpu,driver_version --format=csv
  # The tree's commit: its own repository's HEAD only when SRC is that repository's top (a `git archive`
  # copy inside another checkout would name the outer one's), else SRC/COMMIT, which whoever copies a tree
  # with `git archive` writes (`git rev-parse --short HEAD > SRC/COMMIT`).
  src_commit=unknown
  if [ "$(git -C "$SRC" rev-parse --show-toplevel 2>/dev/null)" = "$(cd "$SRC" && pwd -P)" ]; then
    src_commit=$(git -C "$SRC" rev-parse --short HEAD)
  elif [ -f "$SRC/COMMIT" ]; then
    src_commit=$(cat "$SRC/COMMIT")
  fi
  echo "$(date -u '+%F %T') UTC, cores $(nproc), $NGPU GPUs, budget $BUDGET s, src $src_commit"
  python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())" 2>&1 | tail -1
} | tee "$OUTD/gpus.txt"
nvidia-smi topo -m > "$OUTD/topo.txt" 2>&1

# ---- build ------------------------------------------------------------------------------------------------
# GM_BUILD=DIR reuses a tree configured before (a second call on a warm machine): no configure; the build
# only brings it up to date.
if [ -n "${GM_BUILD:-}" ]; then B=$GM_BUILD; fi
[ -n "${GM_BUILD:-}" ] || cmake -S "$SRC" -B $B -G Ninja -DGANTRY_ENGINE_ONLY=ON -DGANTRY_WERROR=ON -DCMAKE_BUILD_TYPE=Release \
  > "$OUTD/build.log" 2>&1 && timeout -k 5 $((BUDGET - 120)) cmake --build $B -j"$(nproc)" >> "$OUTD/build.log" 2>&1
BUILD_RC=$?
printf 'build\t%s\t%s\n' $BUILD_RC $(($(date +%s) - T0)) >> "$OUTD/steps.tsv"
el "build rc=$BUILD_RC"
if [ $BUILD_RC -ne 0 ]; then
  grep -E "error|Error" "$OUTD/build.log" | head -30
  tail -20 "$OUTD/build.log"
  echo "==== gpu_multi summary ====: build failed (rc $BUILD_RC; 124: past $((BUDGET - 120)) s); nothing measured"
  exit 1
fi
ENGINE=$B/app/gantry-engine
[ -x $B/tests/bench/allreduce_bench ] || echo "note: allreduce_bench not built (no NCCL found at configure)"

# ---- every GPU test ----------------------------------------------------------------------------------------
# Capped at CT_CAP seconds (default 200) and so that the measurements keep at least 200 s; each test at
# most 150 s.
CT=$(($(left) - 200)); [ $CT -gt ${CT_CAP:-200} ] && CT=${CT_CAP:-200}; [ $CT -lt 60 ] && CT=60
step ctest_gpu 30 timeout $CT ctest --test-dir $B -L gpu -R "${CT_REGEX:-.}" --timeout 150 --output-on-failure
grep -E "tests passed|\(Failed\)|Timeout|Not Run|\*\*\*" "$OUTD/ctest_gpu.log" | tail -12

# ---- measurements -------------------------------------------------------------------------------------------
dp() {  # dp ZERO GPUS...
  local z=$1; shift
  python3 "$BENCH/dp_scaling.py" --engine $ENGINE --model 124m --zero "$z" --gpus "$@"
}
torch1() { python3 "$P/torch_gpt2.py" --batch 32 --seq 1024; }
tp() {  # tp MODEL GPUS: one tensor-parallel group over GPUS, beside one GPU
  python3 "$BENCH/dp_scaling.py" --engine $ENGINE --model "$1" --zero 0 --tp "$2" --gpus 1 "$2"
}
pp() {  # pp MODEL GPUS: a pipeline of GPUS stages (1F1B, 8 micro-batches a step), beside one GPU accumulating 8
  python3 "$BENCH/dp_scaling.py" --engine $ENGINE --model "$1" --zero 0 --pp "$2" --pp-micro 8 --gpus 1 "$2"
}
tppp() {  # tppp MODEL GPUS: tp 2 x pp GPUS/2 (1F1B, 8 micro-batches a step), beside one GPU accumulating 8
  python3 "$BENCH/dp_scaling.py" --engine $ENGINE --model "$1" --zero 0 --tp 2 --pp $(($2 / 2)) --pp-micro 8 \
    --gpus 1 "$2"
}
ppvp() {  # ppvp MODEL GPUS: interleaved 1F1B over GPUS stages, vp 2, 8 micro-batches a step, beside one GPU
  python3 "$BENCH/dp_scaling.py" --engine $ENGINE --model "$1" --zero 0 --pp "$2" --pp-micro 8 \
    --schedule interleaved --vp 2 --gpus 1 "$2"
}
ppzb() {  # ppzb MODEL GPUS: ZB-H1 over GPUS stages, 8 micro-batches a step, beside one GPU
  python3 "$BENCH/dp_scaling.py" --engine $ENGINE --model "$1" --zero 0 --pp "$2" --pp-micro 8 \
    --schedule zbh1 --gpus 1 "$2"
}
ppz() {  # ppz MODEL ZERO [SCHEDULE]: pp 2 x dp 2 (1F1B or SCHEDULE, 8 micro-batches a step) at ZeRO ZERO on 4
  # GPUs, beside one GPU
  python3 "$BENCH/dp_scaling.py" --engine $ENGINE --model "$1" --zero "$2" --pp 2 --pp-micro 8 \
    --schedule "${3:-1f1b}" --gpus 1 4
}
ddp() { torchrun --standalone --nproc_per_node "$1" "$P/torch_gpt2.py" --ddp 1 --batch 32 --seq 1024; }
export -f dp torch1 ddp tp pp tppp ppvp ppzb ppz
export ENGINE BENCH P
FIRST=(1)

# W: the several-GPU point the issue asks first (4), or every GPU of a smaller machine.
W=$((NGPU >= 4 ? 4 : NGPU))
if [ "$W" -ge 2 ]; then FIRST=(1 "$W"); fi
step dp_z0_1_$W 60 dp 0 "${FIRST[@]}"
step torch_1 70 torch1
if [ "$W" -ge 2 ]; then
  step ddp_$W 80 ddp $W
  if [ -x $B/tests/bench/allreduce_bench ]; then
    step allreduce_ours_$W 40 $B/tests/bench/allreduce_bench --nproc $W --step
  fi
  step allreduce_torch_$W 40 torchrun --standalone --nproc_per_node $W "$BENCH/torch_allreduce_sizes.py" \
    --ref "$P/torch_allreduce.py"
  step ckpt_stall_$W 100 python3 "$BENCH/checkpoint_stall.py" --engine $ENGINE --backend cuda --nproc $W \
    --models 124m --steps 90 --every 20 --warmup 10
  step dp_z1_$W 30 dp 1 $W
  step dp_z3_$W 30 dp 3 $W
fi
if [ "$W" -gt 2 ]; then
  step dp_z0_2 25 dp 0 2
  step ddp_2 60 ddp 2
  step dp_z1_2 25 dp 1 2
  step dp_z3_2 25 dp 3 2
fi
if [ "$NGPU" -ge 8 ]; then  # the issue's 8-GPU point, where the machine has it
  step dp_z0_8 30 dp 0 8
  step ddp_8 70 ddp 8
  step dp_z1_8 30 dp 1 8
  step dp_z3_8 30 dp 3 8
fi
if [ "$W" -ge 2 ]; then
  step tp_124m_$W 45 tp 124m $W
  step tp_350m_$W 60 tp 350m $W
  step pp_350m_$W 90 pp 350m $W
  step ppvp_350m_$W 90 ppvp 350m $W
  step ppzb_350m_$W 90 ppzb 350m $W
fi
if [ "$W" -ge 4 ]; then
  step tppp_350m_$W 90 tppp 350m $W
  step ppz1_350m_4 80 ppz 350m 1
  step ppz3_350m_4 80 ppz 350m 3
  step ppzbz1_350m_4 80 ppz 350m 1 zbh1
  step ppzbz2_350m_4 80 ppz 350m 2 zbh1
fi
el "measurements done"

# ---- summary -----------------------------------------------------------------------------------------------
python3 - "$OUTD" <<'EOF'
import glob, json, os, sys
d = sys.argv[1]
def lines(name):
    out = []
    try:
        for l in open(os.path.join(d, name + ".log")):
            if l.startswith("{"):
                try: out.append(json.loads(l))
                except ValueError: pass
    except OSError: pass
    return out
print("\n==== gpu_multi summary ====")
print(open(os.path.join(d, "gpus.txt")).read().strip())
print("topology (nvidia-smi topo -m):\n" + "".join(l for l in open(os.path.join(d, "topo.txt")) if l.startswith("GPU") or l.startswith("\t")).rstrip())
print("steps: " + ", ".join(f"{n} {'skipped' if rc == 'SKIPPED' else ('ok' if rc == '0' else 'rc=' + rc)} {s}s"
      for n, rc, s in (l.rstrip("\n").split("\t") for l in open(os.path.join(d, "steps.tsv")))))
ct = os.path.join(d, "ctest_gpu.log")
if os.path.exists(ct):
    txt = open(ct).read().splitlines()
    summ = next((l.strip() for l in txt if "tests passed" in l), None)
    print("gpu tests: " + (summ or "no ctest summary (timed out?); its last lines:"))
    if summ is None: print("\n".join("   " + l.strip() for l in txt[-4:]))
    for l in txt:
        if "(Failed)" in l or "(Timeout)" in l or "Not Run" in l or "(SEGFAULT)" in l: print("   " + l.strip())
# Data-parallel scaling: Gantry (per ZeRO) and DDP, tokens/s and efficiency vs the same system's 1 GPU.
g = {}
def names(prefix):
    return sorted(os.path.basename(f)[:-4] for f in glob.glob(os.path.join(d, prefix + "*.log")))
for name in names("dp_z"):
    for r in lines(name):
        if "tokens_per_s" in r: g[(r["zero"], r["nproc"])] = r
        elif "error" in r: g[(r["zero"], r["nproc"])] = r
t = {}
for name in ["torch_1"] + names("ddp_"):
    for r in lines(name):
        if "tokens_per_s" in r: t[r["gpus"]] = r
gpu = next((r["gpu"] for r in t.values()), "?")
print(f"\nDP scaling, GPT-2 124M B32/GPU T1024 ({gpu}); tok/s, step ms, efficiency vs 1 GPU of the same system")
counts = sorted({n for _, n in g} | set(t) | {1})
print("| system | " + " | ".join(f"{n} GPU" + ("s" if n > 1 else "") for n in counts) + " | efficiency at " + " / ".join(str(n) for n in counts[1:]) + " |")
print("| --- " * (len(counts) + 2) + "|")
def cell(r):
    if r is None: return "not run"
    if "error" in r: return "failed: " + r["error"]
    return f"{r['tokens_per_s']:,} / {r['step_ms']} ms" + (f" / {r['rank0_gb_allocated']} GB" if "rank0_gb_allocated" in r else "")
def eff(r, base, n):
    return f"{100 * r['tokens_per_s'] / (n * base['tokens_per_s']):.1f} %" if r and base and "tokens_per_s" in r and "tokens_per_s" in base else "—"
b0 = g.get((0, 1))
for z in (0, 1, 3):
    if z and not any(k[0] == z for k in g): continue
    cells = [cell(g.get((z, n))) if (z == 0 or n > 1) else "(ZeRO 0's)" for n in counts]
    print(f"| Gantry ZeRO {z} | " + " | ".join(cells) + " | " + " / ".join(eff(g.get((z, n)), b0, n) for n in counts[1:]) + " |")
tc = lambda r: "not run" if r is None else f"{r['tokens_per_s']:,} / {r['median_step_ms']} ms / {r.get('peak_mem_gib', '?')} GiB"
print("| PyTorch+compile (DDP) | " + " | ".join(tc(t.get(n)) for n in counts) + " | " + " / ".join(eff(t.get(n), t.get(1), n) for n in counts[1:]) + " |")
for n in counts:
    a, r = g.get((0, n)), t.get(n)
    if a and r and "tokens_per_s" in a: print(f"ratio Gantry ZeRO 0 / DDP at {n}: {a['tokens_per_s'] / r['tokens_per_s']:.3f}x")
# Tensor parallel: each model's one-GPU run and its tp group, from the same dp_scaling.py call.
tp_rows = [r for n in names("tp_") + names("pp_") + names("tppp_") + names("ppvp_") + names("ppz") for r in lines(n)]
if tp_rows:
    print(f"\nTensor and pipeline parallel, GPT-2 at its dp_scaling.py micro-batch, T1024 ({gpu}); efficiency = tok/s / (GPUs x one GPU's)")
    print("| model | layout | tok/s | step ms | rank 0 GB | efficiency | bubble measured / formula |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in tp_rows:
        lay = ("1 GPU" if r.get("nproc") == 1 else f"tp {r.get('tp')} x pp {r.get('pp', 1)} over {r.get('nproc')} GPUs")
        sched = [t.split("=")[1].strip().strip('"') for t in r.get("train", []) if t.startswith(("pp_schedule", "vp"))]
        if r.get("nproc", 1) > 1 and (r.get("zero") or sched):
            lay += f" (zero {r.get('zero', 0)}" + "".join(", " + x for x in sched) + ")"
        lay += f", {r['accum']} micro-batches a step" if r.get("accum", 1) > 1 else ""
        if "error" in r:
            print(f"| {r.get('model', '?')} | {lay} | failed: {r['error']} | | | | |")
            continue
        e = f"{100 * r['scaling_efficiency']:.1f} %" if "scaling_efficiency" in r and r["nproc"] > 1 else "—"
        b = f"{r['bubble_pct']} % / {r['bubble_formula_pct']} %" if "bubble_pct" in r else "—"
        print(f"| {r['model']} | {lay} | {r['tokens_per_s']:,} | {r['step_ms']} | {r.get('rank0_gb_allocated', '?')} | {e} | {b} |")
# All-reduce: ours against torch's at the same sizes.
ours_lines = [r for n in names("allreduce_ours_") for r in lines(n)]
ours = {r["bytes"]: r for r in ours_lines if r.get("what") == "size"}
step_line = next((r for r in ours_lines if r.get("what") == "step_buckets"), None)
ref = {r["bytes"]: r for n in names("allreduce_torch_") for r in lines(n)}
ngpu_ar = next((r["gpus"] for r in list(ours.values()) + list(ref.values())), "?")
if ours or ref:
    print(f"\nAll-reduce fp32 at {ngpu_ar} GPUs: busbw GB/s (time us); ours = all_reduce_enqueue, wall / GPU events / via sync()")
    print("| bytes | ours busbw (us) | ours gpu-event / sync() us | wrong | torch busbw (us) | ours / torch |")
    print("| --- | --- | --- | --- | --- | --- |")
    for b in sorted(set(ours) | set(ref)):
        o, r = ours.get(b), ref.get(b)
        os_ = f"{o['busbw_GBps']} ({o['time_us']})" if o else "not run"
        ox = f"{o['gpu_time_us']} / {o['comm_sync_time_us']}" if o else "—"
        rs = f"{r['busbw_GBps']} ({r['time_us']})" if r else "not run"
        ratio = f"{100 * o['busbw_GBps'] / r['busbw_GBps']:.1f} %" if o and r and r["busbw_GBps"] else "—"
        print(f"| {b / 2**20:g} MiB | {os_} | {ox} | {o['wrong'] if o else '—'} | {rs} | {ratio} |")
    if step_line:
        s = step_line
        print(f"124M step's {s['buckets']} ZeRO-0 buckets back to back ({s['bytes'] / 1e6:.0f} MB): {s['time_us']} us, "
              f"busbw {s['busbw_GBps']} GB/s (gpu {s['gpu_time_us']} us, sync() {s['comm_sync_time_us']} us)")
# Checkpoint stall: checkpoint_stall.py prints its own table; reprint it.
for ck in glob.glob(os.path.join(d, "ckpt_stall_*.log")):
    tbl = [l.rstrip() for l in open(ck) if l.startswith("|")]
    if tbl:
        print(f"\nCheckpoints at {ck[:-4].rsplit('_', 1)[1]} GPUs, GPT-2 124M B32/GPU, every 20 steps of 90 (timed from step 10):")
        print("\n".join(tbl))
EOF
