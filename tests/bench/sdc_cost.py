#!/usr/bin/env python3
"""Throughput cost of the silent-data-corruption check (train.sdc_check_every, engine/core/sdc_check.h) on
the CPU: `gantry-engine run --nproc 4` (Gloo) on assets/configs/tiny.toml with the check off, every 10 steps
and every step, side by side. The three settings run in interleaved rounds (off, 10, 1, off, 10, 1, ...) so
that a machine whose load drifts (other builds on shared cores) hits each alike.

Throughput is the global batch's tokens over the mean step time of the timed steps (after --warmup), where a
step's time includes its check (the check runs inside the step, before its record is taken); a check every
10 steps shows in the mean, not in a median. Prints one JSON line per setting and round, then one summary
line per setting: the median over rounds of tokens/s, its cost against off (1 - tokens/s / off's), and the
check's own wall time (rank 0's, from its goodbye line) as a share of off's mean step time.

  python3 tests/bench/sdc_cost.py --engine build/app/gantry-engine [--zero 0] [--rounds 5] [--steps 60]
"""
import argparse, json, os, re, statistics, subprocess, sys, tempfile

SETTINGS = [0, 10, 1]  # train.sdc_check_every


def config_text(source_dir, steps, every):
    text = open(os.path.join(source_dir, "assets/configs/tiny.toml")).read()
    text = text.replace("max_steps = 150", f"max_steps = {steps}")
    text = text.replace("checkpoint_every = 50", "checkpoint_every = 0")
    text = text.replace("val_every = 25", "val_every = 0")
    return text.replace("backend = \"cpu\"", f"backend = \"cpu\"\nsdc_check_every = {every}")


def run(engine, source_dir, work, zero, steps, warmup, every, rnd):
    cfg = os.path.join(work, f"sdc_{every}_z{zero}_r{rnd}.toml")
    with open(cfg, "w") as f:
        f.write(config_text(source_dir, steps, every))
    out = os.path.join(work, f"run_{every}_z{zero}_r{rnd}")
    cmd = [engine, "run", "--nproc", "4", "--zero", str(zero), "--config", cfg, "--out", out, "--json"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    steps_seen = []
    for line in p.stdout.splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if isinstance(j, dict) and "loss" in j and "event" not in j:
            steps_seen.append(j)
    timed = [s for s in steps_seen if s["step"] > warmup]
    if not timed:
        sys.exit(f"no timed steps in {out}")
    # step_s from tokens_per_s (the record's global tokens / step time): tokens = global batch x seq_len.
    tokens = 16 * 64
    mean_s = statistics.fmean(tokens / s["tokens_per_s"] for s in timed)
    # Rank 0's goodbye: "..., 40 sdc checks (0.412 ms each, hashing 0.101 ms)": the check's own wall time
    # (hash and all-reduce; the all-reduce also waits for the slowest rank) and, of it, the hash.
    m = re.search(r"(\d+) sdc checks \(([\d.]+) ms each, hashing ([\d.]+) ms\)", p.stderr)
    return {"every": every, "zero": zero, "round": rnd, "steps": len(timed), "mean_step_ms": mean_s * 1e3,
            "checks": int(m.group(1)) if m else 0, "check_ms": float(m.group(2)) if m else None,
            "hash_ms": float(m.group(3)) if m else None,
            "tokens_per_s": tokens / mean_s,
            "check": next((l for l in p.stderr.splitlines() if l.startswith("sdc check:")), "?")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="build/app/gantry-engine")
    ap.add_argument("--source", default=os.path.join(os.path.dirname(__file__), "..", ".."))
    ap.add_argument("--zero", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    a = ap.parse_args()
    results = {e: [] for e in SETTINGS}
    check_ms = {e: [] for e in SETTINGS}
    hash_ms = {e: [] for e in SETTINGS}
    step_ms_off = []
    with tempfile.TemporaryDirectory(prefix=f"gantry_sdc_cost_{os.getpid()}_") as work:
        for rnd in range(a.rounds):
            for every in SETTINGS:
                r = run(a.engine, a.source, work, a.zero, a.steps, a.warmup, every, rnd)
                print(json.dumps(r), flush=True)
                results[every].append(r["tokens_per_s"])
                if r["check_ms"] is not None:
                    check_ms[every].append(r["check_ms"])
                    hash_ms[every].append(r["hash_ms"])
                if every == 0:
                    step_ms_off.append(r["mean_step_ms"])
    off = statistics.median(results[0])
    for every in SETTINGS:
        med = statistics.median(results[every])
        # Per round against that round's off run, so load drift between rounds cancels.
        paired = [1 - t / o for t, o in zip(results[every], results[0])]
        print(json.dumps({"summary": True, "every": every, "zero": a.zero, "rounds": a.rounds,
                          "median_tokens_per_s": round(med, 1),
                          "cost_vs_off": round(1 - med / off, 4),
                          "paired_cost_median": round(statistics.median(paired), 4),
                          "paired_cost_min": round(min(paired), 4), "paired_cost_max": round(max(paired), 4),
                          # The check's own time over the steps it covers, against off's mean step time:
                          # the cost the throughput difference above cannot resolve through the noise.
                          "check_ms_median": round(statistics.median(check_ms[every]), 4) if check_ms[every]
                          else None,
                          "check_share_of_step": round(statistics.median(check_ms[every]) / every /
                                                       statistics.median(step_ms_off), 5)
                          if check_ms[every] else None,
                          "hash_ms_median": round(statistics.median(hash_ms[every]), 4) if hash_ms[every]
                          else None,
                          "hash_share_of_step": round(statistics.median(hash_ms[every]) / every /
                                                      statistics.median(step_ms_off), 6)
                          if hash_ms[every] else None}),
              flush=True)


if __name__ == "__main__":
    main()
