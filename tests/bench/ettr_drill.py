#!/usr/bin/env python3
"""ETTR under injected failures (issue "Fault tolerance"; a benchmark, not a test): a dp-4 tiny run on
`gantry-engine up --nodes 2 --slots 2 --spares 1` for --minutes of training, with a failure injected at
exponentially distributed intervals of mean --mean-interval seconds (seeded: --seed), each one of

  kill   a worker of a random rank, kill -9;
  hang   a worker of a random rank, SIGSTOP (found after the run's hang timeout, default 10 s);
  node   a node holding ranks: its agent and its workers, kill -9 (found by the coordinator's node
         timeout); the node comes back as a repaired machine would, --repair seconds later (its agent is
         started again with its old command line), so that a spare exists for the next node failure.

No failure is injected while the run is still recovering from the previous one (the next waits for the
new generation's first step). At the end it prints the run's goodput ledger (GET /v1/runs/{id}/goodput)
while the run is live: the wall is [submission, now], ETTR = productive / wall. One JSON line per failure,
then the ledger, each naming the machine (nproc, load average) and the UTC time.

  python3 tests/bench/ettr_drill.py --engine build/app/gantry-engine [--minutes 30] [--mean-interval 300]
      [--kinds kill,hang,node] [--seed 1] [--checkpoint-policy young_daly|fixed] [--checkpoint-every 20]
"""
import argparse, json, os, platform, random, re, signal, subprocess, tempfile, time

from recovery_time import Api, TINY, children, rank_of


def utc():
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", required=True)
    ap.add_argument("--minutes", type=float, default=30)
    ap.add_argument("--mean-interval", type=float, default=300)
    ap.add_argument("--kinds", default="kill,hang,node")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repair", type=float, default=30, help="seconds until a killed node's agent returns")
    ap.add_argument("--hang-timeout", type=int, default=10)
    ap.add_argument("--checkpoint-policy", default="young_daly", choices=["young_daly", "fixed"])
    ap.add_argument("--checkpoint-every", type=int, default=20, help="steps; the start for young_daly")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    kinds = a.kinds.split(",")

    cfg = open(TINY).read()
    cfg = re.sub(r"max_steps = \d+", "max_steps = 100000000", cfg)
    cfg = re.sub(r"checkpoint_every = \d+", "checkpoint_every = 0", cfg)
    cfg = re.sub(r"val_every = \d+", "val_every = 0", cfg)
    cfg = cfg.replace("[train]", "[train]\nthreads = 1")

    d = tempfile.mkdtemp(prefix="gantry_ettr_drill_")
    up = subprocess.run([a.engine, "up", "--nodes", "2", "--slots", "2", "--spares", "1", "--dir", d],
                        capture_output=True, text=True)
    if up.returncode != 0:
        raise SystemExit("ettr_drill: up: " + up.stderr)
    repairs = []  # (time due, node, argv, pid file)
    try:
        api = Api(up.stdout.splitlines()[0].strip(), open(os.path.join(d, "token")).read().strip())
        run = api.call("POST", "/v1/runs", {"config": cfg, "layout": {"dp": 4}, "max_restarts": 1000,
                                            "checkpoint_every_steps": a.checkpoint_every,
                                            "checkpoint_policy": a.checkpoint_policy,
                                            "hang_timeout_s": a.hang_timeout, "keep_last": 3})
        path = f"/v1/runs/{run['id']}"
        while api.call("GET", path).get("last_step", -1) < 1:
            time.sleep(0.2)
        start = time.time()
        end = start + a.minutes * 60
        next_at = start + rng.expovariate(1.0 / a.mean_interval)
        injected = 0
        while time.time() < end:
            now = time.time()
            for r in [r for r in repairs if r[0] <= now]:
                repairs.remove(r)
                _, node, argv, pid_file = r
                log = open(os.path.join(d, f"agent-{node}.log"), "ab")
                p = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                                     start_new_session=True)
                open(pid_file, "w").write(f"{p.pid}\n")
                print(json.dumps({"bench": "ettr_drill", "repaired": node, "t_s": round(now - start, 1),
                                  "utc": utc()}), flush=True)
            if now < next_at:
                time.sleep(min(0.5, next_at - now))
                continue
            st = api.call("GET", path)
            kind = rng.choice(kinds)
            nodes = sorted({s["node"] for s in st["placement"]})
            pid_files = {n: os.path.join(d, f"agent-{n}.pid") for n in nodes}
            agents = {n: int(open(f).read()) for n, f in pid_files.items() if os.path.exists(f)}
            if kind in ("kill", "hang"):
                workers = [w for p in agents.values() for w in children(p) if rank_of(w) is not None]
                if not workers:
                    next_at = now + 1
                    continue
                victim = rng.choice(workers)
                what = f"rank {rank_of(victim)}"
                os.kill(victim, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
            else:
                node = rng.choice(sorted(agents))
                argv = open(f"/proc/{agents[node]}/cmdline", "rb").read().decode().split("\0")[:-1]
                ws = children(agents[node])
                os.kill(agents[node], signal.SIGKILL)
                for w in ws:
                    try:
                        os.kill(w, signal.SIGKILL)
                    except OSError:
                        pass
                repairs.append((time.time() + a.repair, node, argv, pid_files[node]))
                what = node
            injected += 1
            t_fail = time.time()
            restarts = st.get("restarts", 0)
            # The next failure waits for this one's recovery: the new generation's first step.
            while time.time() < end:
                s2 = api.call("GET", path)
                if s2.get("restarts", 0) > restarts:
                    break
                time.sleep(0.1)
            frm = api.call("GET", path)["last_step"]
            while time.time() < end and api.call("GET", path)["last_step"] <= frm:
                time.sleep(0.1)
            print(json.dumps({"bench": "ettr_drill", "failure": injected, "kind": kind, "what": what,
                              "t_s": round(t_fail - start, 1),
                              "to_first_step_s": round(time.time() - t_fail, 2),
                              "load1": round(os.getloadavg()[0], 2), "utc": utc()}), flush=True)
            next_at = time.time() + rng.expovariate(1.0 / a.mean_interval)
        g = api.call("GET", path + "/goodput")
        st = api.call("GET", path)
        print(json.dumps({"bench": "ettr_drill", "minutes": a.minutes, "mean_interval_s": a.mean_interval,
                          "failures_injected": injected, "ettr": g["ettr"], "wall_s": g["wall_s"],
                          "seconds": g["seconds"], "failures_in_ledger": len(g["failures"]),
                          "young_daly": g["young_daly"], "last_step": st["last_step"],
                          "generation": st.get("generation"), "nproc": os.cpu_count(),
                          "load1": round(os.getloadavg()[0], 2), "host": platform.node(), "utc": utc()}),
              flush=True)
        for f in g["failures"]:
            print(json.dumps({"failure": f["kind"], "node": f["node"], "fault": f["fault"],
                              "detection_s": f["detection_s"], "restore_s": f["restore_s"],
                              "recomputed_s": f["recomputed_s"], "cost_s": f["cost_s"]}), flush=True)
    finally:
        subprocess.run([a.engine, "down", "--dir", d], capture_output=True)


if __name__ == "__main__":
    main()
