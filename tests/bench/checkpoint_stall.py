#!/usr/bin/env python3
"""Checkpoint stall and throughput cost, asynchronous against synchronous (benchmark, not a test): for each
model, `gantry-engine run --nproc N` trains the same config three times in this one call: with
train.checkpoint_async = true, with it and train.checkpoint_defer_when_busy ("deferred": a checkpoint due
while the previous write is in flight waits for the first step boundary after it), with checkpoint_async =
false (checkpointing every --every steps), and with no periodic checkpoint (the baseline). One JSON line per (model, mode), then a table side by side.
Two more modes take in-memory copies (train.memory_copy_every = --every, no periodic disk checkpoint) into a
tmpfs folder given as an agent would (GANTRY_MEMORY_DIR, /dev/shm when there is one): "memory" writes each
copy before the next step, "memory-async" with train.memory_copy_async (a copy due while the one before is
still being written is skipped; the written/skipped counts are reported). They always run through `run`,
whose workers read that folder: compare them with a baseline taken with --via-run.

- stall: the median (and max) over the periodic checkpoints of rank 0's stall (the time the train loop was
  held), write time (the writer's time to the commit), time spent waiting for the checkpoint before, size.
- throughput cost, two ways:
  - steps: the median tokens/s of the steps that ran while a checkpoint was being taken or written (the
    first step after each checkpoint, and the following ones up to its write time: an async write runs
    beside them) against the median of the other timed steps. A step's own time excludes the stall (the
    loop stalls between steps), so this shows what the background write costs the steps.
  - run: tokens/s over the wall clock from the end of step --warmup to the end of the last step (the run's
    last checkpoint, always written to the end, is outside), stalls included, timed by when each step's JSON
    line reaches this script; against the baseline run's same window: cost = 1 - run / baseline.

  python3 tests/bench/checkpoint_stall.py --engine build/app/gantry-engine [--models tiny,10m] [--steps 8]
  python3 tests/bench/checkpoint_stall.py --engine build/app/gantry-engine --backend cuda --nproc 4 \\
      --models 124m [--steps 90] [--every 20] [--warmup 10] [--zero 0]
  ... --dry-run   (prints the configs and commands; runs nothing)

With --nproc 1 the engine runs as `gantry-engine train` (one process) and each async checkpoint's line also
carries copy_s, the copy into host memory by itself (CUDA: the copy stream's device time), reported as the
copy's bandwidth (state bytes / copy_s) beside the link's.

Models: tiny (assets/configs/tiny.toml's shape: 2 layers, d 64, vocab 256; 0.12M parameters) and 10m (5
layers, d 384, vocab 4096, T 32; 10.4M parameters), CPU backend, micro-batch 1, 4 sequences a step; 124m
(GPT-2 124M, vocab 50304, T 1024; 124.5M parameters), CUDA backend, micro-batch 32 per GPU (global batch
32 x N), synthetic corpus, as dp_scaling.py; 350m (GPT-2 350M: 24 layers, d 1024), CUDA, micro-batch 16.
The last checkpoint of a run is written to the end in both modes (the run must not end before its commit),
so it is left out. Under ZeRO 0 rank 0 writes the whole state (the other ranks' shards hold headers only),
so its stall is the gang's. Each line names the machine
(nproc, load average at the start; the GPU under cuda) and the UTC time.
"""
import argparse, json, math, os, platform, re, shutil, statistics, subprocess, sys, tempfile, time

MODELS = {
    "tiny": dict(n_layer=2, n_head=4, n_embd=64, vocab=256, seq=64, backend="cpu", micro=1),
    "10m": dict(n_layer=5, n_head=6, n_embd=384, vocab=4096, seq=32, backend="cpu", micro=1),
    "124m": dict(n_layer=12, n_head=12, n_embd=768, vocab=50304, seq=1024, backend="cuda", micro=32),
    "350m": dict(n_layer=24, n_head=16, n_embd=1024, vocab=50304, seq=1024, backend="cuda", micro=16),
}
DEFAULTS = {  # per backend: steps, every, warmup
    "cpu": dict(steps=8, every=2, warmup=1),
    "cuda": dict(steps=90, every=20, warmup=10),  # checkpoints ~1.3 s apart at 124M: room for an async write
}
MODES = ("async", "deferred", "sync", "none", "memory", "memory-async")


def params(m):
    d, L = m["n_embd"], m["n_layer"]
    return m["vocab"] * d + m["seq"] * d + L * (12 * d * d + 13 * d) + 2 * d


def config_text(m, nproc, steps, every, mode):
    if m["backend"] == "cpu":
        batch = "global_batch = 4\nmicro_batch = 1\nthreads = 1"
        data = "synthetic_train_tokens = 262144\nsynthetic_val_tokens = 16384"
        extra = ""
    else:
        batch = f"global_batch = {m['micro'] * nproc}\nmicro_batch = {m['micro']}"
        data = "synthetic_branching = 4\nsynthetic_train_tokens = 4194304\nsynthetic_val_tokens = 65536"
        extra = 'backend = "cuda"\n'
    return f"""
[model]
n_layer = {m['n_layer']}
n_head = {m['n_head']}
n_embd = {m['n_embd']}
vocab_size = {m['vocab']}
seq_len = {m['seq']}
[train]
{batch}
max_steps = {steps}
val_every = 0
checkpoint_every = {0 if mode == 'none' or mode.startswith('memory') else every}
keep_checkpoints = 2
checkpoint_async = {'false' if mode == 'sync' else 'true'}
checkpoint_defer_when_busy = {'true' if mode == 'deferred' else 'false'}
memory_copy_every = {every if mode.startswith('memory') else 0}
memory_copy_async = {'true' if mode == 'memory-async' else 'false'}
{extra}[data]
kind = "synthetic"
{data}
"""


def gpu_name():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20).stdout.splitlines()
        return f"{len(out)}x {out[0].strip()}" if out else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def run_engine(cmd, env=None):
    """Runs the engine, stamping each stdout line with when it arrived. Returns (rc, [(t, json)], stderr)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1, env=env)
    err_chunks = []
    import threading
    t = threading.Thread(target=lambda: err_chunks.append(p.stderr.read()), daemon=True)
    t.start()
    lines = []
    for line in p.stdout:
        now = time.monotonic()
        try:
            lines.append((now, json.loads(line)))
        except ValueError:
            continue
    rc = p.wait()
    t.join()
    return rc, lines, "".join(err_chunks)


def summarise(model, m, mode, nproc, zero, steps, every, warmup, lines):
    ckpts = [j for _, j in lines if j.get("event") == "checkpoint"]
    step_lines = [(t, j) for t, j in lines if "step" in j and "loss" in j and "event" not in j]
    periodic = [c for c in ckpts if c["step"] < steps]
    timed = [(t, j) for t, j in step_lines if j["step"] > warmup]
    r = {"bench": "checkpoint_stall", "model": model, "params": params(m), "backend": m["backend"], "mode": mode,
         "ranks": nproc, "zero": zero, "steps": steps, "every": every if mode != "none" else 0, "warmup": warmup,
         "checkpoints": len(periodic)}
    if not timed:
        r["error"] = f"no step after --warmup {warmup} was reported"
        return r
    step_s_median = statistics.median(j["step_s"] for _, j in timed)
    r["step_s_median"] = step_s_median
    if periodic:
        r.update({
            "stall_s_median": statistics.median(c["stall_s"] for c in periodic),
            "stall_s_max": max(c["stall_s"] for c in periodic),
            "write_s_median": statistics.median(c["write_s"] for c in periodic),
            "waited_s_max": max(c["waited_s"] for c in periodic),
            "mb": periodic[0]["bytes"] / 1e6,
        })
        copies = [c["copy_s"] for c in periodic if c.get("copy_s")]
        if copies:  # async, one rank: the copy into host memory by itself, and its bandwidth
            r["copy_s_median"] = statistics.median(copies)
            r["copy_gb_per_s"] = round(periodic[0]["bytes"] / 1e9 / statistics.median(copies), 2)
        # The steps a checkpoint touched: the first after it, and as many more as its write lasted.
        touched = set()
        for c in periodic:
            span = max(1, math.ceil(c["write_s"] / step_s_median)) if c.get("async") else 1
            touched.update(range(c["step"] + 1, c["step"] + 1 + span))
        with_ck = [j["tokens_per_s"] for _, j in timed if j["step"] in touched]
        without = [j["tokens_per_s"] for _, j in timed if j["step"] not in touched]
        r["tokens_per_s_steps_with_checkpoint"] = round(statistics.median(with_ck)) if with_ck else None
        r["tokens_per_s_steps_without"] = round(statistics.median(without)) if without else None
        r["steps_with_checkpoint"] = len(with_ck)
    else:
        r["tokens_per_s_steps_without"] = round(statistics.median(j["tokens_per_s"] for _, j in timed))
    # Wall clock over the timed window: from step `warmup`'s line to the last step's.
    by_step = {j["step"]: t for t, j in step_lines}
    last = max(by_step)
    if warmup in by_step and last > warmup:
        tokens_per_step = timed[0][1]["tokens_per_s"] * timed[0][1]["step_s"]
        r["run_tokens_per_s_wall"] = round((last - warmup) * tokens_per_step / (by_step[last] - by_step[warmup]))
        r["run_window_steps"] = [warmup, last]
    else:
        r["run_tokens_per_s_wall"] = None  # unknown: warmup 0 has no line to start the clock at
    return r


def run(engine, model, nproc, steps, every, warmup, zero, mode, scratch, dry, via_run):
    m = MODELS[model]
    out = os.path.join(scratch, f"{model}_{mode}")
    os.makedirs(out, exist_ok=True)
    cfg = os.path.join(out, "bench.toml")
    with open(cfg, "w") as f:
        f.write(config_text(m, nproc, steps, every, mode))
    # One rank trains in this process (`train`): its checkpoint lines carry the copy's own time (copy_s),
    # which the launcher's records do not.
    memory = mode.startswith("memory")
    cmd = ([engine, "train", "--config", cfg, "--out", os.path.join(out, "run"), "--json"]
           if nproc == 1 and not memory and not via_run else
           [engine, "run", "--nproc", str(nproc), "--zero", str(zero), "--config", cfg, "--out",
            os.path.join(out, "run"), "--json"])
    if dry:
        print(f"# {model} {mode}: {' '.join(cmd)}\n{open(cfg).read()}")
        return None
    env = None
    if memory:  # the agent's memory folder, a tmpfs as the agent's default
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else scratch
        env = dict(os.environ, GANTRY_MEMORY_DIR=tempfile.mkdtemp(prefix=f"checkpoint_stall_{os.getpid()}_", dir=shm))
    try:
        rc, lines, stderr = run_engine(cmd, env)
    finally:
        if env is not None:
            shutil.rmtree(env["GANTRY_MEMORY_DIR"], ignore_errors=True)
    if rc != 0:
        return {"bench": "checkpoint_stall", "model": model, "mode": mode, "ranks": nproc,
                "error": f"gantry-engine run exited {rc}: {stderr[-1500:]}"}
    r = summarise(model, m, mode, nproc, zero, steps, every, warmup, lines)
    if memory:  # rank 0's count of the copies written and skipped
        found = re.search(r"rank 0: in-memory copies: (\d+) written, (\d+) skipped", stderr)
        r["copies_written"], r["copies_skipped"] = (int(found[1]), int(found[2])) if found else (None, None)
    r["launcher"] = cmd[1]
    r["utc"] = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())
    r["machine"] = f"{platform.node()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    if m["backend"] == "cuda":
        r["gpu"] = gpu_name()
    return r


def ms(v):
    return "unknown" if v is None else f"{v * 1e3:.1f} ms"


def num(v):
    return "unknown" if v is None else f"{v:,}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", required=True)
    ap.add_argument("--backend", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--models", default=None, help="comma-separated; default tiny,10m (cpu) or 124m (cuda)")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--every", type=int, default=None, help="steps between checkpoints")
    ap.add_argument("--warmup", type=int, default=None, help="steps left out of the timing")
    ap.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3))
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    ap.add_argument("--dry-run", action="store_true", help="print the configs and commands; run nothing")
    ap.add_argument("--via-run", action="store_true",
                    help="one rank too through `run` (as the memory modes always are), for a like baseline")
    a = ap.parse_args()
    d = DEFAULTS[a.backend]
    steps, every, warmup = (a.steps or d["steps"], a.every or d["every"],
                            d["warmup"] if a.warmup is None else a.warmup)
    models = (a.models or ("124m" if a.backend == "cuda" else "tiny,10m")).split(",")
    modes = a.modes.split(",")
    for model in models:
        if model not in MODELS:
            ap.error(f"--models: unknown model {model!r}; known: {', '.join(MODELS)}")
        if MODELS[model]["backend"] != a.backend:
            ap.error(f"--models {model} runs on the {MODELS[model]['backend']} backend; pass --backend "
                     f"{MODELS[model]['backend']} (or pick {', '.join(k for k, v in MODELS.items() if v['backend'] == a.backend)})")
    for mode in modes:
        if mode not in MODES:
            ap.error(f"--modes: unknown mode {mode!r}; known: {', '.join(MODES)}")
    if a.nproc < 1 or steps < 2 or every < 1 or not 0 <= warmup < steps:
        ap.error("need --nproc >= 1, --steps >= 2, --every >= 1 and 0 <= --warmup < --steps")
    if every >= steps:
        ap.error(f"--every {every} >= --steps {steps}: no periodic checkpoint would be taken")
    if a.backend == "cuda" and warmup == 0:
        ap.error("--backend cuda needs --warmup >= 1 (the first steps compile and allocate)")
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"checkpoint_stall_{os.getpid()}_") as scratch:
        for model in models:
            for mode in modes:
                r = run(a.engine, model, a.nproc, steps, every, warmup, a.zero, mode, scratch, a.dry_run,
                        a.via_run)
                if r is None:
                    continue
                print(json.dumps(r), flush=True)
                rows.append(r)
                if "error" in r:
                    sys.stderr.write(f"checkpoint_stall: {model} {mode}: {r['error']}\n")
    if not rows:
        return
    base = {r["model"]: r.get("run_tokens_per_s_wall") for r in rows if r["mode"] == "none"}
    print(f"\n| model | ranks | mode | every | state MB | stall median (max) | copy GB/s | write median | waited max | "
          f"step median | tok/s steps with ckpt / without | run tok/s (wall) | run cost vs none |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['model']} | {r['ranks']} | {r['mode']} | failed: {r['error'][:80]} |")
            continue
        b, w = base.get(r["model"]), r.get("run_tokens_per_s_wall")
        cost = f"{100 * (1 - w / b):.1f} %" if b and w else "unknown"
        mb = f"{r['mb']:.1f}" if "mb" in r else "—"
        if r["mode"] == "none":  # no periodic checkpoint: nothing stalled, nothing written
            print(f"| {r['model']} | {r['ranks']} | none | — | — | — | — | — | — | {ms(r['step_s_median'])} | "
                  f"— / {num(r.get('tokens_per_s_steps_without'))} | {num(w)} | — |")
            continue
        gbs = r.get("copy_gb_per_s")
        if r["mode"].startswith("memory"):  # copies, not checkpoint events: the counts and the run's cost
            print(f"| {r['model']} | {r['ranks']} | {r['mode']} | {r['every']} | — | "
                  f"written {num(r.get('copies_written'))}, skipped {num(r.get('copies_skipped'))} | — | — | — | "
                  f"{ms(r['step_s_median'])} | — / {num(r.get('tokens_per_s_steps_without'))} | {num(w)} | {cost} |")
            continue
        print(f"| {r['model']} | {r['ranks']} | {r['mode']} | {r['every']} | {mb} | "
              f"{ms(r.get('stall_s_median'))} ({ms(r.get('stall_s_max'))}) | {'—' if gbs is None else gbs} | "
              f"{ms(r.get('write_s_median'))} | "
              f"{ms(r.get('waited_s_max'))} | {ms(r['step_s_median'])} | "
              f"{num(r.get('tokens_per_s_steps_with_checkpoint'))} / {num(r.get('tokens_per_s_steps_without'))} | "
              f"{num(w)} | {cost} |")
    if any("error" in r for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
