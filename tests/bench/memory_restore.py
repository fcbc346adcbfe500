#!/usr/bin/env python3
"""Restore time from the agents' in-memory copies against the disk checkpoint (issue 16; benchmark, not a
test): `gantry-engine up --nodes 2 --slots 2`, a dp-4 tiny run (4 ranks, CPU/Gloo, 1 thread each), then per
round one worker killed with -9 past step 12 and the time from the kill until the recovered generation's
first step (the API polled every 20 ms), split at the placement (`restarts` went up). Two sources, in the same
call and alternating:

  memory  train.memory_copy_every = 2, no disk checkpoint: the new gang's agents assemble the newest complete
          set from the agents holding it, the workers load it;
  disk    train.checkpoint_every = 2 (synchronous writes, fsynced), no memory copies: the workers load the
          newest committed checkpoint from the run's folder.

The `restore` event's source is checked against the one asked for. One JSON line per round (machine: nproc,
load average at the start, UTC time), then a summary.

  python3 tests/bench/memory_restore.py --engine build/app/gantry-engine [--rounds 3]
"""
import argparse, json, os, platform, random, re, signal, subprocess, tempfile, time, urllib.request

import recovery_time
from recovery_time import TINY, children, rank_of


class Api(recovery_time.Api):
    def events(self, run):
        # The event stream, read until it has nothing more for a moment.
        req = urllib.request.Request(f"{self.url}/v1/runs/{run}/events",
                                     headers={"Authorization": "Bearer " + self.token})
        out = []
        try:
            with urllib.request.urlopen(req, timeout=1.0) as r:
                for line in r:
                    line = line.decode().strip()
                    if line.startswith("data:"):
                        out.append(json.loads(line[5:]))
        except Exception:
            pass
        return out


def has_rank(pid):
    return rank_of(pid) is not None


def wait(pred, limit):
    t0 = time.time()
    while time.time() - t0 < limit:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise SystemExit("memory_restore: timed out")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    base = open(TINY).read()
    base = re.sub(r"max_steps = \d+", "max_steps = 1000000", base)
    base = re.sub(r"val_every = \d+", "val_every = 0", base)
    configs = {
        "memory": re.sub(r"checkpoint_every = \d+", "checkpoint_every = 0", base).replace(
            "[train]", "[train]\nthreads = 1\nmemory_copy_every = 2"),
        "disk": re.sub(r"checkpoint_every = \d+", "checkpoint_every = 2", base).replace(
            "[train]", "[train]\nthreads = 1\ncheckpoint_async = false"),
    }
    results = []
    for rnd in range(a.rounds):
        for source in ("memory", "disk"):
            d = tempfile.mkdtemp(prefix="gantry_memory_restore_bench_")
            up = subprocess.run([a.engine, "up", "--nodes", "2", "--slots", "2", "--dir", d],
                                capture_output=True, text=True)
            if up.returncode != 0:
                raise SystemExit("memory_restore: up: " + up.stderr)
            try:
                api = Api(up.stdout.splitlines()[0].strip(), open(os.path.join(d, "token")).read().strip())
                run = api.call("POST", "/v1/runs", {"config": configs[source], "layout": {"dp": 4},
                                                    "max_restarts": 10})
                path = f"/v1/runs/{run['id']}"
                wait(lambda: api.call("GET", path)["last_step"] >= 12, 120)
                load = os.getloadavg()[0]
                agents = [int(open(os.path.join(d, f"agent-{n}.pid")).read()) for n in ("node-0", "node-1")]
                workers = [w for p in agents for w in children(p) if has_rank(w)]
                victim = random.choice(workers)
                t0 = time.time()
                os.kill(victim, signal.SIGKILL)
                placed = wait(lambda: api.call("GET", path).get("restarts", 0) >= 1 and time.time(), 120)
                frm = api.call("GET", path)["last_step"]
                first = wait(lambda: api.call("GET", path)["last_step"] > frm and time.time(), 120)
                restore = [e for e in api.events(run["id"]) if e.get("kind") == "restore"]
                got = json.loads(restore[-1]["payload"])["source"] if restore else None
                r = {"bench": "memory_restore", "source": source, "restore_event_source": got, "round": rnd,
                     "from_step": frm, "to_placed_s": round(placed - t0, 3),
                     "placed_to_first_step_s": round(first - placed, 3),
                     "failure_to_first_step_s": round(first - t0, 3), "nproc": os.cpu_count(),
                     "load1": round(load, 2), "host": platform.node(),
                     "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                print(json.dumps(r), flush=True)
                results.append(r)
            finally:
                subprocess.run([a.engine, "down", "--dir", d], capture_output=True)
    for source in ("memory", "disk"):
        xs = sorted(r["placed_to_first_step_s"] for r in results if r["source"] == source)
        ys = sorted(r["failure_to_first_step_s"] for r in results if r["source"] == source)
        if xs:
            print(f"{source}: placed -> first step median {xs[len(xs) // 2]:.3f} s ({xs[0]:.3f}-{xs[-1]:.3f}); "
                  f"failure -> first step median {ys[len(ys) // 2]:.3f} s over {len(xs)} rounds", flush=True)


if __name__ == "__main__":
    main()
