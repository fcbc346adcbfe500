#!/usr/bin/env python3
"""Data-parallel scaling of gantry-engine on one GPU machine: GPT-2 124M (or 350M) trained with
`gantry-engine run --nproc N` for N in --gpus, micro-batch 32 per GPU (weak scaling: global batch 32 x N),
on the built-in synthetic corpus. Prints one JSON line per N with the median tokens/s over the timed steps
and the scaling efficiency against N = 1 (tokens/s at N / (N x tokens/s at 1)).

  python3 tests/bench/dp_scaling.py --engine build/app/gantry-engine --gpus 1 2 [--zero 0] [--steps 30] [--bucket-mb 25]
      [--tp T] [--set cuda_graphs=false ...]   (extra [train] lines; each line also names the NCCL_/GANTRY_ variables set)

With --tp T (> 1) every N > 1 runs tensor parallel over groups of T GPUs, data parallel over N / T groups
(global batch micro x N / T); N = 1 stays the one-GPU baseline, so the efficiency is the layout's tokens/s
against N single GPUs'. With --pp P (> 1) every N > 1 runs a P-stage pipeline (train.pp_schedule --schedule, --vp,
--pp-micro M micro-batches a step per pipeline: global batch micro x M x N / (T x P)); the baseline then
accumulates M micro-batches a step too, so both take the same optimizer steps.

Each line also carries rank 0's device memory allocated up front (GB) and its training state by category.

Run it in the same device call as `torchrun --nproc_per_node N ../shared/bench/torch_gpt2.py --ddp 1` so
the two efficiencies come from the same card and minutes.
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile

MODELS = {
    "124m": dict(n_layer=12, n_head=12, n_embd=768, micro=32),
    "350m": dict(n_layer=24, n_head=16, n_embd=1024, micro=16),
}


def config_text(model, nproc, steps, micro, bucket_mb, train_extra=(), tp=1, pp=1, accum=1, vocab=50304):
    m = MODELS[model]
    return f"""
[model]
n_layer = {m['n_layer']}
n_head = {m['n_head']}
n_embd = {m['n_embd']}
vocab_size = {vocab}
seq_len = 1024

[optim]
lr = 6e-4
min_lr = 6e-5
warmup_steps = 10

[train]
global_batch = {micro * accum * nproc // (tp * pp)}
micro_batch = {micro}
max_steps = {steps}
checkpoint_every = 0
val_every = 0
backend = "cuda"
dp_bucket_mb = {bucket_mb}
{chr(10).join(train_extra)}

[data]
kind = "synthetic"
synthetic_branching = 4
synthetic_train_tokens = 4194304
synthetic_val_tokens = 65536
"""


def run(engine, model, nproc, zero, steps, warmup, micro, bucket_mb, work, train_extra=(), tp=1, pp=1, accum=1,
        vocab=50304):
    cfg = os.path.join(work, f"{model}_n{nproc}_z{zero}_tp{tp}_pp{pp}.toml")
    with open(cfg, "w") as f:
        f.write(config_text(model, nproc, steps, micro, bucket_mb, train_extra, tp, pp, accum, vocab))
    out = os.path.join(work, f"run_{model}_n{nproc}_z{zero}_tp{tp}_pp{pp}")
    cmd = [engine, "run", "--nproc", str(nproc), "--tp", str(tp), "--pp", str(pp), "--zero", str(zero), "--config",
           cfg, "--out", out, "--json", "--json-ranks"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        return {"nproc": nproc, "tp": tp, "pp": pp, "zero": zero, "error": f"exit {p.returncode}"}
    lines = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
    steps_seen = [j for j in lines if "step" in j and "loss" in j and "event" not in j]
    rank_steps = [j["rank_step"] for j in lines if "rank_step" in j and j["rank_step"]["step"] > warmup]
    timed = [s for s in steps_seen if s["step"] > warmup]
    tps = statistics.median(s["tokens_per_s"] for s in timed)
    ms = statistics.median(s["step_s"] * 1e3 for s in timed)
    r = {"nproc": nproc, "tp": tp, "pp": pp, "accum": accum, "zero": zero, "model": model, "vocab": vocab,
         "bucket_mb": bucket_mb, "train": list(train_extra),
         "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "GANTRY_"))},
         "tokens_per_s": round(tps),
         "step_ms": round(ms, 2), "timed_steps": len(timed)}
    # Where each rank's step goes (the backend's CUDA-event phases), the median over the timed steps, in ms:
    # per phase, rank 0's and the largest rank's.
    if rank_steps:
        ph = {}
        for key in ("forward_s", "backward_s", "optimizer_s", "comm_exposed_s", "data_wait_s", "total_s"):
            per_rank = {}
            for rs in rank_steps:
                per_rank.setdefault(rs["rank"], []).append(rs[key])
            med = {k: statistics.median(v) * 1e3 for k, v in per_rank.items()}
            ph[key[:-2] + "_ms"] = {"rank0": round(med.get(0, float("nan")), 3), "max": round(max(med.values()), 3)}
        r["phases"] = ph
    # A pipeline's measured bubble (each rank prints it every step): the median over the timed steps of the
    # most idle stage, beside the schedule's formula.
    bub = {}
    formula = None
    for m in re.finditer(r"rank (\d+) step (\d+): pipeline bubble ([0-9.]+) % measured, formula ([0-9.]+) %", p.stderr):
        if int(m.group(2)) > warmup:
            bub.setdefault(int(m.group(1)), []).append(float(m.group(3)))
            formula = float(m.group(4))
    if bub:
        r["bubble_pct"] = round(max(statistics.median(v) for v in bub.values()), 1)
        r["bubble_formula_pct"] = formula
    # What the timed steps' messages were placed by (the CUDA stage switches from units to the measured costs
    # after a few steps, where that holds no more activations): each answer seen, with how many lines said it.
    placed = {}
    for m in re.finditer(r"rank \d+ step (\d+): pipeline bubble .*messages placed by (units|measured costs)", p.stderr):
        if int(m.group(1)) > warmup:
            placed[m.group(2)] = placed.get(m.group(2), 0) + 1
    if placed:
        r["messages_placed_by"] = placed
    # ZB-H1: each rank's weight passes against its whole backward (the median over the timed steps).
    split = {}
    for m in re.finditer(r"rank (\d+) step (\d+): pipeline bubble .*; weight passes ([0-9.]+) ms of the backward's "
                         r"([0-9.]+) ms", p.stderr):
        if int(m.group(2)) > warmup:
            split.setdefault(int(m.group(1)), []).append(float(m.group(3)) / float(m.group(4)))
    if split:
        r["weight_pass_fraction"] = {k: round(statistics.median(v), 3) for k, v in sorted(split.items())}
    # Rank 0's start-up summary: the device memory its backend allocated up front (everything it holds for
    # the run, activations included) and, data parallel, its training state by category.
    m = re.search(r"([0-9.]+) GB allocated up front", p.stderr)
    if m:
        r["rank0_gb_allocated"] = float(m.group(1))
    m = re.search(r"params ([0-9.]+) MB, grads ([0-9.]+) MB, AdamW ([0-9.]+) MB", p.stderr)
    if m:
        r["rank0_state_mb"] = {"params": float(m.group(1)), "grads": float(m.group(2)), "adamw": float(m.group(3))}
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="build/app/gantry-engine")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--zero", type=int, default=0)
    ap.add_argument("--model", default="124m", choices=sorted(MODELS))
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--bucket-mb", type=float, default=25)
    ap.add_argument("--tp", type=int, default=1, help="tensor-parallel degree of every N > 1 (divides N)")
    ap.add_argument("--pp", type=int, default=1, help="pipeline stages of every N > 1 (tp x pp divides N)")
    ap.add_argument("--pp-micro", type=int, default=8, help="with --pp: micro-batches a step per pipeline")
    ap.add_argument("--schedule", default="1f1b", help="with --pp: train.pp_schedule")
    ap.add_argument("--vp", type=int, default=1, help="with --pp and --schedule interleaved: model chunks per rank")
    ap.add_argument("--micro", type=int, default=0, help="sequences per micro-batch (default: the model's, 32 or 16)")
    ap.add_argument("--vocab", type=int, default=50304, help="vocabulary size (GPT-2's padded 50,304)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra [train] line, e.g. --set cuda_graphs=false (repeatable)")
    a = ap.parse_args()
    micro = a.micro or MODELS[a.model]["micro"]
    with tempfile.TemporaryDirectory() as work:
        base = None
        for n in a.gpus:
            extra = [kv.replace("=", " = ", 1) for kv in a.set]
            tp = a.tp if n > 1 else 1
            pp = a.pp if n > 1 else 1
            accum = a.pp_micro if a.pp > 1 else 1
            if pp > 1:  # the one-GPU baseline accumulates the same micro-batches with no pipeline
                extra.append(f'pp_schedule = "{a.schedule}"')
                if a.vp > 1:
                    extra.append(f"vp = {a.vp}")
            r = run(a.engine, a.model, n, a.zero, a.steps, a.warmup, micro, a.bucket_mb, work, extra, tp, pp, accum, a.vocab)
            if "tokens_per_s" in r:
                if n == 1:
                    base = r["tokens_per_s"]
                if base:
                    r["scaling_efficiency"] = round(r["tokens_per_s"] / (n * base), 4)
            print(json.dumps(r), flush=True)


if __name__ == "__main__":
    main()
