#!/usr/bin/env python3
"""Pipeline bubble on the CPU backend: each schedule (GPipe, 1F1B, interleaved 1F1B with --vp chunks per rank,
ZB-H1) run with `gantry-engine run --nproc P --pp P` on a small GPT (vp layers per stage, or --layers), and each
rank's measured bubble (the part of its schedule spent waiting for its neighbours, from the workers' "pipeline
bubble" stderr lines) printed beside its schedule's formula: (p - 1) / (m + p - 1) for GPipe and 1F1B,
(p - 1) / (v·m + p - 1) interleaved, (p - 1) / (3m + p - 1) for ZB-H1. Medians over the steps after --warmup.
One JSON line per schedule and a table.

  python3 tests/bench/pipeline_bubble.py --engine build/app/gantry-engine --pp 8 --micro 8 16 \
      --schedules gpipe 1f1b interleaved zbh1 --vp 2 [--steps 12]

The ranks share the machine's cores (train.threads = 1 each): on a machine with fewer cores than ranks the
stages also wait for a core, which the measured bubble includes; the script prints the load average before
and after so the figures can be read against it.
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile

LINE = re.compile(r"rank (\d+) step (\d+): pipeline bubble ([0-9.]+) % measured, (?:formula|\(p-1\)/\(m\+p-1\) =) ([0-9.]+) %")


def config_text(layers, global_batch, micro, steps, schedule, vp):
    return f"""
[model]
n_layer = {layers}
n_head = 4
n_embd = 128
vocab_size = 256
seq_len = 64

[optim]
lr = 1e-3

[train]
global_batch = {global_batch}
micro_batch = {micro}
max_steps = {steps}
checkpoint_every = 0
val_every = 0
threads = 1
sdc_check_every = 0
pp_schedule = "{schedule}"
vp = {vp}

[data]
kind = "synthetic"
synthetic_branching = 4
synthetic_train_tokens = 262144
synthetic_val_tokens = 16384
"""


def run(engine, pp, layers, m, schedule, steps, warmup, work, vp):
    micro = 2
    vp = vp if schedule == "interleaved" else 1
    cfg = os.path.join(work, f"{schedule}_pp{pp}_m{m}.toml")
    with open(cfg, "w") as f:
        f.write(config_text(layers, micro * m, micro, steps, schedule, vp))
    out = os.path.join(work, f"run_{schedule}_pp{pp}_m{m}")
    cmd = [engine, "run", "--nproc", str(pp), "--pp", str(pp), "--config", cfg, "--out", out, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.stderr.write(p.stderr[-4000:])
        return {"schedule": schedule, "pp": pp, "vp": vp, "m": m, "error": f"exit {p.returncode}"}
    per_rank, formula = {}, None
    for mt in LINE.finditer(p.stderr):
        rank, step, measured, ideal = int(mt.group(1)), int(mt.group(2)), float(mt.group(3)), float(mt.group(4))
        formula = ideal
        if step > warmup:
            per_rank.setdefault(rank, []).append(measured)
    steps_seen = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{") and '"step"' in l and "event" not in l]
    step_ms = statistics.median(s["step_s"] * 1e3 for s in steps_seen if s["step"] > warmup)
    medians = {r: round(statistics.median(v), 1) for r, v in sorted(per_rank.items())}
    return {"schedule": schedule, "pp": pp, "vp": vp, "m": m, "formula_pct": formula, "measured_pct_by_rank": medians,
            "measured_pct_mean": round(statistics.mean(medians.values()), 1) if medians else None,
            "step_ms": round(step_ms, 1), "timed_steps": steps - warmup}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="build/app/gantry-engine")
    ap.add_argument("--pp", type=int, default=4)
    ap.add_argument("--layers", type=int, default=0, help="model layers (default: vp per stage)")
    ap.add_argument("--vp", type=int, default=2, help="model chunks per rank under the interleaved schedule")
    ap.add_argument("--micro", type=int, nargs="+", default=[4, 8], help="micro-batches per step (m)")
    ap.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b", "interleaved", "zbh1"])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    a = ap.parse_args()
    layers = a.layers or a.pp * a.vp
    print(f"# cores {os.cpu_count()}, load average before {os.getloadavg()}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"pipeline_bubble_{os.getpid()}_") as work:
        for m in a.micro:
            for s in a.schedules:
                r = run(a.engine, a.pp, layers, m, s, a.steps, a.warmup, work, a.vp)
                print(json.dumps(r), flush=True)
                rows.append(r)
    print(f"# load average after {os.getloadavg()}")
    print(f"{'schedule':11} {'pp':>3} {'vp':>3} {'m':>3} {'formula %':>10} {'measured % (mean of ranks)':>27} {'step ms':>8}  by rank")
    for r in rows:
        if "error" in r:
            print(f"{r['schedule']:11} {r['pp']:>3} {r['vp']:>3} {r['m']:>3}  {r['error']}")
            continue
        print(f"{r['schedule']:11} {r['pp']:>3} {r['vp']:>3} {r['m']:>3} {r['formula_pct']:>10.1f} {r['measured_pct_mean']:>27.1f} "
              f"{r['step_ms']:>8.1f}  {r['measured_pct_by_rank']}")


if __name__ == "__main__":
    main()
