#!/usr/bin/env python3
"""Planner beside measurement (issue 17): each layout of a small GPT run with `gantry-engine run --nproc N
--tp T --pp P --json-ranks` on the CPU backend, and per layout the measured memory per rank (the step
records' mem_allocated_bytes: the backend's own allocation, the largest rank's) and step time (the median
over the steps after --warmup of the slowest rank's total_s), beside what `gantry-engine plan --engine
gantry-cpu` predicts for the same layout. Where the planner does not take the layout (its gantry-cpu profile
is one device today) the prediction is printed as "unknown" with the planner's reason, never 0. One JSON
line per layout and a table.

  python3 tests/bench/layout_plan.py --engine build/app/gantry-engine [--steps 8] [--warmup 3]

The ranks share the machine's cores (train.threads = 1 each); the load average is printed before and after.
"""
import argparse, json, os, statistics, subprocess, sys, tempfile

CONFIG = """
[model]
n_layer = 2
n_head = 4
n_embd = 64
vocab_size = 256
seq_len = 64

[optim]
lr = 1e-2

[train]
seed = 1234
global_batch = 16
micro_batch = {micro}
max_steps = {steps}
checkpoint_every = 0
val_every = 0
threads = 1
sdc_check_every = 0
pp_schedule = "1f1b"
backend = "cpu"

[data]
kind = "synthetic"
synthetic_branching = 4
synthetic_train_tokens = 262144
synthetic_val_tokens = 16384
"""

# (nproc, tp, pp, micro_batch): what the CPU backend on main trains (tp x pp does not compose yet).
LAYOUTS = [(1, 1, 1, 8), (2, 1, 1, 8), (4, 1, 1, 4), (2, 2, 1, 8), (4, 2, 1, 8), (4, 4, 1, 8),
           (2, 1, 2, 4), (4, 1, 2, 4)]


def measure(engine, nproc, tp, pp, micro, steps, warmup, work):
    cfg = os.path.join(work, f"n{nproc}_tp{tp}_pp{pp}.toml")
    with open(cfg, "w") as f:
        f.write(CONFIG.format(micro=micro, steps=steps))
    cmd = [engine, "run", "--nproc", str(nproc), "--tp", str(tp), "--pp", str(pp), "--config", cfg, "--out",
           os.path.join(work, f"run_n{nproc}_tp{tp}_pp{pp}"), "--json-ranks"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return cfg, {"error": f"run exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}"}
    mem, total = {}, {}
    for line in p.stdout.splitlines():
        try:
            r = json.loads(line).get("rank_step")
        except (json.JSONDecodeError, AttributeError):
            continue
        if not r:
            continue
        mem[r["rank"]] = max(mem.get(r["rank"], 0), r["mem_allocated_bytes"])
        if r["step"] > warmup:
            total[r["step"]] = max(total.get(r["step"], 0.0), r["total_s"])
    if not total:
        return cfg, {"error": "no step past the warm-up"}
    return cfg, {"mem_bytes": max(mem.values()), "step_s": statistics.median(total.values())}


def predict(engine, cfg, nproc, tp, pp):
    dp = nproc // (tp * pp)
    cmd = [engine, "plan", "--engine", "gantry-cpu", "--config", cfg, "--gpus", str(nproc), "--tp", str(tp),
           "--pp", str(pp), "--dp", str(dp), "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"why_unknown": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    j = json.loads(p.stdout)
    return {"mem_bytes": j["memory"]["total"], "step_s": j["time"]["step_s"] if "step_s" in j["time"] else None}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="build/app/gantry-engine")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    print(f"# load average before: {os.getloadavg()}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"layout_plan_{os.getpid()}_") as work:
        for nproc, tp, pp, micro in LAYOUTS:
            cfg, m = measure(a.engine, nproc, tp, pp, micro, a.steps, a.warmup, work)
            pr = predict(a.engine, cfg, nproc, tp, pp) if "error" not in m else {}
            row = {"nproc": nproc, "dp": nproc // (tp * pp), "tp": tp, "pp": pp, "micro_batch": micro,
                   "measured": m, "planned": pr}
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(f"# load average after: {os.getloadavg()}")

    def cell(v, fmt):
        return "unknown" if v is None else fmt.format(v)

    print(f"{'layout':<22}{'mem meas MB':>12}{'mem plan MB':>12}{'err':>8}{'step meas s':>13}{'step plan s':>13}{'err':>8}")
    for r in rows:
        m, pr = r["measured"], r["planned"]
        name = f"dp{r['dp']} tp{r['tp']} pp{r['pp']} mb{r['micro_batch']}"
        if "error" in m:
            print(f"{name:<22} {m['error']}")
            continue
        mm, pm = m["mem_bytes"] / 1e6, (pr.get("mem_bytes") or 0) / 1e6 or None
        ms, ps = m["step_s"], pr.get("step_s")
        me = None if pm is None else 100 * (pm - mm) / mm
        se = None if ps is None else 100 * (ps - ms) / ms
        print(f"{name:<22}{mm:>12.3f}{cell(pm, '{:.3f}'):>12}{cell(me, '{:+.1f}%'):>8}{ms:>13.4f}"
              f"{cell(ps, '{:.4f}'):>13}{cell(se, '{:+.1f}%'):>8}")
        if "why_unknown" in pr:
            print(f"{'':<22}planner: {pr['why_unknown']}")


if __name__ == "__main__":
    main()
