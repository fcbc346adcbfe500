#!/usr/bin/env python3
"""Checkpoint stall, asynchronous against synchronous, on the CPU backend with 4 ranks (benchmark, not a
test): for each model, `gantry-engine run --nproc 4` trains the same config twice in this one call, once with
train.checkpoint_async = true and once with false, checkpointing every 2 steps, and prints one JSON line per
(model, mode) with the median over the periodic checkpoints of rank 0's stall (the time the train loop was
held), write time (the writer's time to the commit) and checkpoint size, then a table side by side.

  python3 tests/bench/checkpoint_stall.py --engine build/app/gantry-engine [--models tiny,10m] [--steps 8]
                                          [--zero 0]

Models: tiny (assets/configs/tiny.toml's shape: 2 layers, d 64, vocab 256; 0.12M parameters) and 10m (5
layers, d 384, vocab 4096, T 32; 10.4M parameters). The last checkpoint of a run is written to the end in
both modes (the run must not end before its commit), so it is left out. Under ZeRO 0 rank 0 writes the whole
state (the other ranks' shards hold headers only), so its stall is the gang's. Each line names the machine
(nproc, load average at the start) and the UTC time.
"""
import argparse, json, os, platform, statistics, subprocess, sys, tempfile, time

MODELS = {
    "tiny": dict(n_layer=2, n_head=4, n_embd=64, vocab=256, seq=64),
    "10m": dict(n_layer=5, n_head=6, n_embd=384, vocab=4096, seq=32),
}


def params(m):
    d, L = m["n_embd"], m["n_layer"]
    return m["vocab"] * d + m["seq"] * d + L * (12 * d * d + 13 * d) + 2 * d


def config_text(m, steps, async_on):
    return f"""
[model]
n_layer = {m['n_layer']}
n_head = {m['n_head']}
n_embd = {m['n_embd']}
vocab_size = {m['vocab']}
seq_len = {m['seq']}
[train]
global_batch = 4
micro_batch = 1
threads = 1
max_steps = {steps}
val_every = 0
checkpoint_every = 2
keep_checkpoints = 2
checkpoint_async = {'true' if async_on else 'false'}
[data]
kind = "synthetic"
synthetic_train_tokens = 262144
synthetic_val_tokens = 16384
"""


def run(engine, model, steps, zero, async_on, scratch):
    m = MODELS[model]
    out = os.path.join(scratch, f"{model}_{'async' if async_on else 'sync'}")
    os.makedirs(out, exist_ok=True)
    cfg = os.path.join(out, "bench.toml")
    with open(cfg, "w") as f:
        f.write(config_text(m, steps, async_on))
    p = subprocess.run([engine, "run", "--nproc", "4", "--zero", str(zero), "--config", cfg, "--out",
                        os.path.join(out, "run"), "--json"], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"{model} async={async_on}: gantry-engine run failed ({p.returncode}):\n{p.stderr[-3000:]}")
    ckpts, steps_s = [], []
    for line in p.stdout.splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if j.get("event") == "checkpoint":
            ckpts.append(j)
        elif "step" in j and "loss" in j and "event" not in j:
            steps_s.append(j["step_s"])
    periodic = [c for c in ckpts if c["step"] < steps]
    return {
        "bench": "checkpoint_stall", "model": model, "params": params(m), "mode": "async" if async_on else "sync",
        "ranks": 4, "zero": zero, "checkpoints": len(periodic),
        "stall_s_median": statistics.median(c["stall_s"] for c in periodic),
        "stall_s_max": max(c["stall_s"] for c in periodic),
        "write_s_median": statistics.median(c["write_s"] for c in periodic),
        "waited_s_max": max(c["waited_s"] for c in periodic),
        "mb": periodic[0]["bytes"] / 1e6,
        "step_s_median": statistics.median(steps_s),
        "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "machine": f"{platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--models", default="tiny,10m")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--zero", type=int, default=0)
    a = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"checkpoint_stall_{os.getpid()}_") as scratch:
        for model in a.models.split(","):
            for async_on in (True, False):
                r = run(a.engine, model, a.steps, a.zero, async_on, scratch)
                print(json.dumps(r), flush=True)
                rows.append(r)
    print("\n| model | params | state MB | mode | stall median (max) | write median | step median |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['model']} | {r['params'] / 1e6:.2f}M | {r['mb']:.1f} | {r['mode']} | "
              f"{r['stall_s_median'] * 1e3:.1f} ms ({r['stall_s_max'] * 1e3:.1f}) | "
              f"{r['write_s_median'] * 1e3:.1f} ms | {r['step_s_median'] * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
