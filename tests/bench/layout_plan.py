#!/usr/bin/env python3
"""Planner beside measurement (issue 17): each layout of a small GPT run with `gantry-engine run --nproc N --tp T
--pp P --zero Z --json-ranks` on the CPU backend (ZeRO 0-3; train.pp_schedule 1f1b, or zbh1 where named), and
per layout the measured memory per rank (the step records' mem_allocated_bytes: the backend's own allocation,
the largest rank's) and step time (the median over the steps after --warmup of the slowest rank's total_s),
beside what `gantry-engine plan --engine gantry-cpu` predicts for the same layout: with the default (developer
VM) rates, and with --measure-cpu also with rates measured right before that run (the loops by CPU time,
Gloo's latency and bandwidth by the wall clock, so under whatever load the machine has then). Where the
planner has no figure (a layout it refuses) it is printed as "unknown" with the planner's reason, never 0.

--repeats R runs every layout R times, round-robin (so a burst of load hits different layouts), and reports
the median of the R medians with their range. One JSON line per run and a table. Each JSON line also
has where the step went: measured, the slowest rank's forward + backward (compute_s), exposed
communication (comm_s: its collectives' waits, the pipeline's bubble) and optimizer, medians over the steps;
planned, the planner's compute_s, exposed_comm_s + bubble_s and optimizer_s.

  python3 tests/bench/layout_plan.py --engine build/app/gantry-engine [--steps 8] [--warmup 3] \
      [--repeats 3] [--measure-cpu]

The ranks share the machine's cores (train.threads = 1 each); the planner is told the host's cores (its
default, std::thread::hardware_concurrency). The load average is printed with each run.
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
pp_schedule = "{schedule}"
backend = "cpu"

[data]
kind = "synthetic"
synthetic_branching = 4
synthetic_train_tokens = 262144
synthetic_val_tokens = 16384
"""

# (nproc, tp, pp, micro_batch, zero, pp_schedule): what the CPU backend trains with this 2-layer model.
LAYOUTS = [(1, 1, 1, 8, 0, "1f1b"), (2, 1, 1, 8, 0, "1f1b"), (4, 1, 1, 4, 0, "1f1b"), (2, 2, 1, 8, 0, "1f1b"),
           (4, 2, 1, 8, 0, "1f1b"), (4, 4, 1, 8, 0, "1f1b"), (2, 1, 2, 4, 0, "1f1b"), (4, 1, 2, 4, 0, "1f1b"),
           (4, 2, 2, 4, 0, "1f1b"), (2, 1, 1, 8, 1, "1f1b"), (2, 1, 1, 8, 3, "1f1b"), (2, 1, 2, 4, 0, "zbh1"),
           (4, 1, 2, 4, 2, "zbh1")]


def tag(nproc, tp, pp, micro, zero, schedule):
    return f"n{nproc}_tp{tp}_pp{pp}_mb{micro}_z{zero}_{schedule}"


def write_config(work, nproc, tp, pp, micro, zero, schedule, steps):
    cfg = os.path.join(work, tag(nproc, tp, pp, micro, zero, schedule) + ".toml")
    with open(cfg, "w") as f:
        f.write(CONFIG.format(micro=micro, steps=steps, schedule=schedule))
    return cfg


def measure(engine, nproc, tp, pp, micro, zero, schedule, steps, warmup, work):
    cfg = write_config(work, nproc, tp, pp, micro, zero, schedule, steps)
    cmd = [engine, "run", "--nproc", str(nproc), "--tp", str(tp), "--pp", str(pp), "--zero", str(zero),
           "--config", cfg, "--out", os.path.join(work, "run_" + tag(nproc, tp, pp, micro, zero, schedule)),
           "--json-ranks"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return cfg, {"error": f"run exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}"}
    mem, total, parts = {}, {}, {}
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
            # Where the slowest rank's step went (the rank whose total_s is the step's).
            if total[r["step"]] == r["total_s"]:
                parts[r["step"]] = (r["forward_s"] + r["backward_s"], r["comm_exposed_s"], r["optimizer_s"])
    if not total:
        return cfg, {"error": "no step past the warm-up"}
    med = lambda k: statistics.median(v[k] for v in parts.values())
    return cfg, {"mem_bytes": max(mem.values()), "step_s": statistics.median(total.values()),
                 "compute_s": med(0), "comm_s": med(1), "optimizer_s": med(2)}


def predict(engine, cfg, nproc, tp, pp, zero, measure):
    dp = nproc // (tp * pp)
    cmd = [engine, "plan", "--engine", "gantry-cpu", "--config", cfg, "--gpus", str(nproc), "--tp", str(tp),
           "--pp", str(pp), "--dp", str(dp), "--zero", str(zero), "--json"] + (["--measure-cpu"] if measure else [])
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        return {"why_unknown": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    j = json.loads(p.stdout)
    t = j["time"]
    out = {"mem_bytes": j["memory"]["total"], "step_s": t["step_s"], "compute_s": t["compute_s"],
           "comm_s": t["exposed_comm_s"] + t["bubble_s"], "optimizer_s": t["optimizer_s"]}
    if measure:
        out["comm_latency_s"] = j["cpu_rates"]["comm_latency_s"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="build/app/gantry-engine")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--measure-cpu", action="store_true", help="also predict with rates measured right before")
    a = ap.parse_args()
    print(f"# cores {os.cpu_count()}, load average before: {os.getloadavg()}", flush=True)
    runs = {l: [] for l in LAYOUTS}
    with tempfile.TemporaryDirectory(prefix=f"layout_plan_{os.getpid()}_") as work:
        for rep in range(a.repeats):
            for layout in LAYOUTS:
                nproc, tp, pp, micro, zero, schedule = layout
                # The rates under the load of the moment, right before the run they predict.
                cfg = write_config(work, nproc, tp, pp, micro, zero, schedule, a.steps)
                measured_now = predict(a.engine, cfg, nproc, tp, pp, zero, True) if a.measure_cpu else None
                load = os.getloadavg()[0]
                cfg, m = measure(a.engine, nproc, tp, pp, micro, zero, schedule, a.steps, a.warmup, work)
                pr = predict(a.engine, cfg, nproc, tp, pp, zero, False) if "error" not in m else {}
                row = {"repeat": rep, "nproc": nproc, "dp": nproc // (tp * pp), "tp": tp, "pp": pp,
                       "micro_batch": micro, "zero": zero, "schedule": schedule, "load1": round(load, 2),
                       "measured": m, "planned": pr}
                if measured_now is not None:
                    row["planned_measured_rates"] = measured_now
                print(json.dumps(row), flush=True)
                runs[layout].append(row)
    print(f"# load average after: {os.getloadavg()}")

    def cell(v, fmt):
        return "unknown" if v is None else fmt.format(v)

    def err(p, m):
        return None if p is None else 100 * (p - m) / m

    hdr = f"{'layout':<32}{'mem meas MB':>12}{'mem plan MB':>12}{'err':>7}{'step meas s (range)':>26}{'plan s':>9}{'err':>8}"
    if a.measure_cpu:
        hdr += f"{'plan* s':>9}{'err*':>8}"
    print(hdr)
    for l, rows in runs.items():
        ok = [r for r in rows if "error" not in r["measured"]]
        name = f"dp{l[0] // (l[1] * l[2])} tp{l[1]} pp{l[2]} mb{l[3]}" + (f" zero{l[4]}" if l[4] else "") + \
            (f" {l[5]}" if l[2] > 1 else "")
        if not ok:
            print(f"{name:<32} {rows[0]['measured'].get('error')}")
            continue
        steps = [r["measured"]["step_s"] for r in ok]
        ms = statistics.median(steps)
        mm = max(r["measured"]["mem_bytes"] for r in ok) / 1e6
        pr = ok[0]["planned"]
        pm = pr.get("mem_bytes")
        pm = None if pm is None else pm / 1e6
        ps = pr.get("step_s")
        line = (f"{name:<32}{mm:>12.3f}{cell(pm, '{:.3f}'):>12}{cell(err(pm, mm), '{:+.1f}%'):>7}"
                f"{ms:>10.4f} ({min(steps):.3f}-{max(steps):.3f}){cell(ps, '{:.4f}'):>9}{cell(err(ps, ms), '{:+.1f}%'):>8}")
        if a.measure_cpu:
            star = [r["planned_measured_rates"]["step_s"] for r in ok
                    if r.get("planned_measured_rates", {}).get("step_s") is not None]
            pstar = statistics.median(star) if star else None
            line += f"{cell(pstar, '{:.4f}'):>9}{cell(err(pstar, ms), '{:+.1f}%'):>8}"
        print(line)
        if pm is None and "why_unknown" in pr:
            print(f"{'':<32}memory: {pr['why_unknown']}")


if __name__ == "__main__":
    main()
