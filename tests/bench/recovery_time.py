#!/usr/bin/env python3
"""Failure to the first step of the recovered generation (issue "Fault tolerance"; benchmark, not a test):
`gantry-engine up --nodes 2 --slots 2 --spares 1`, a dp-4 tiny run checkpointing every 5 steps, then for
each round one failure and the time from it until the run's newest step is past the checkpoint it went on
from (the recovered generation's first step, seen by polling the API every 20 ms):

  kill   a worker of a random rank, kill -9 (the agent's waitpid sees it at once);
  node   a whole node: its agent and its workers, kill -9 (found by the coordinator's node timeout, 5 s; the
         spare takes its ranks at the same dp);
  hang   a worker of a random rank, SIGSTOP (found by its node's launcher when its heartbeats have been
         silent for the run's hang_timeout_s, --hang-timeout, default 10 s; the goal is that plus <= 5 s).

Also split: until the coordinator placed the new generation (`restarts` went up) and from there to its first
step (the workers' start, rendezvous and checkpoint load). One JSON line per round, then a summary. Each line
names the machine (nproc, load average at the start) and the UTC time.

  python3 tests/bench/recovery_time.py --engine build/app/gantry-engine [--rounds 3] [--kinds kill,node,hang]
      [--hang-timeout 10]
"""
import argparse, json, os, platform, random, re, signal, subprocess, sys, tempfile, time, urllib.request

TINY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "assets", "configs", "tiny.toml")


class Api:
    def __init__(self, url, token):
        self.url, self.token = url, token

    def call(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": "Bearer " + self.token,
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read())


def children(pid):
    out = []
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            with open(f"/proc/{p}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if ppid == pid:
            out.append(int(p))
    return out


def rank_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            m = re.search(rb"(?:^|\x00)RANK=(\d+)\x00", f.read())
            return int(m.group(1)) if m else None
    except OSError:
        return None


def wait(pred, limit):
    t0 = time.time()
    while time.time() - t0 < limit:
        v = pred()
        if v:
            return v
        time.sleep(0.02)
    raise SystemExit("recovery_time: timed out")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--kinds", default="kill,node,hang")
    ap.add_argument("--hang-timeout", type=int, default=10, help="the run's hang_timeout_s (1..3600)")
    a = ap.parse_args()
    cfg = open(TINY).read()
    cfg = re.sub(r"max_steps = \d+", "max_steps = 1000000", cfg)
    cfg = re.sub(r"checkpoint_every = \d+", "checkpoint_every = 0", cfg)
    cfg = re.sub(r"val_every = \d+", "val_every = 0", cfg)
    cfg = cfg.replace("[train]", "[train]\nthreads = 1")
    results = []
    for kind in a.kinds.split(","):
        for rnd in range(a.rounds):
            d = tempfile.mkdtemp(prefix="gantry_recovery_bench_")
            up = subprocess.run([a.engine, "up", "--nodes", "2", "--slots", "2", "--spares", "1", "--dir", d],
                                capture_output=True, text=True)
            if up.returncode != 0:
                raise SystemExit("recovery_time: up: " + up.stderr)
            try:
                api = Api(up.stdout.splitlines()[0].strip(), open(os.path.join(d, "token")).read().strip())
                run = api.call("POST", "/v1/runs", {"config": cfg, "layout": {"dp": 4}, "checkpoint_every_steps": 5,
                                                    "max_restarts": 10, "hang_timeout_s": a.hang_timeout})
                path = f"/v1/runs/{run['id']}"
                wait(lambda: api.call("GET", path)["last_step"] >= 12, 120)
                load = os.getloadavg()[0]
                agents = {n: int(open(os.path.join(d, f"agent-{n}.pid")).read()) for n in ("node-0", "node-1")}
                if kind in ("kill", "hang"):
                    workers = [w for p in agents.values() for w in children(p) if rank_of(w) is not None]
                    victim = random.choice(workers)
                    what = f"rank {rank_of(victim)}"  # before the kill: a killed process has no environ
                    t0 = time.time()
                    os.kill(victim, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
                else:
                    node = random.choice(list(agents))
                    ws = children(agents[node])
                    t0 = time.time()
                    os.kill(agents[node], signal.SIGKILL)
                    for w in ws:
                        try:
                            os.kill(w, signal.SIGKILL)
                        except OSError:
                            pass
                    what = node
                placed = wait(lambda: api.call("GET", path).get("restarts", 0) >= 1 and time.time(), 120)
                st = api.call("GET", path)
                frm = st["last_step"]
                first = wait(lambda: api.call("GET", path)["last_step"] > frm and time.time(), 120)
                st = api.call("GET", path)
                r = {"bench": "recovery_time", "kind": kind, "round": rnd, "failed": what,
                     "to_placed_s": round(placed - t0, 3), "placed_to_first_step_s": round(first - placed, 3),
                     "failure_to_first_step_s": round(first - t0, 3), "from_step": frm, "dp": st["layout"]["dp"],
                     "nodes": sorted({s["node"] for s in st["placement"]}), "nproc": os.cpu_count(),
                     "load1": round(load, 2), "host": platform.node(),
                     "hang_timeout_s": a.hang_timeout if kind == "hang" else None,
                     "utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
                print(json.dumps(r), flush=True)
                results.append(r)
            finally:
                subprocess.run([a.engine, "down", "--dir", d], capture_output=True)
    for kind in a.kinds.split(","):
        xs = sorted(r["failure_to_first_step_s"] for r in results if r["kind"] == kind)
        if xs:
            print(f"{kind}: failure -> first step {xs[0]:.2f}-{xs[-1]:.2f} s over {len(xs)} rounds", flush=True)


if __name__ == "__main__":
    main()
