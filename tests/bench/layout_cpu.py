#!/usr/bin/env python3
"""The host CPU a step costs, planned against measured (issue 17): each layout of layout_plan.py's model run
with `gantry-engine run --nproc N --tp T --pp P` twice, for S1 and S2 steps, and the CPU seconds of all its
processes (user + system, getrusage of the children) differenced: (CPU(S2) - CPU(S1)) / (S2 - S1) is one
step's CPU without the start-up. Beside it the planner's `time.cpu.host_cpu_s` (every rank's loops and its
collectives' kernel and Gloo work) and `collectives_cpu_s`, with --measure-cpu right before. CPU time is
what a step costs the host whatever else runs, so this checks the model's work on a busy machine, where the
step time cannot be checked. Prints one JSON line per layout and a table.

  python3 tests/bench/layout_cpu.py --engine build/app/gantry-engine [--steps 4 12]
"""
import argparse, json, os, resource, subprocess, sys, tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from layout_plan import CONFIG, LAYOUTS  # noqa: E402


def run_cpu(engine, cfg, nproc, tp, pp, out):
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run([engine, "run", "--nproc", str(nproc), "--tp", str(tp), "--pp", str(pp), "--config", cfg,
                        "--out", out], capture_output=True, text=True)
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"run exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
    return r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="build/app/gantry-engine")
    ap.add_argument("--steps", type=int, nargs=2, default=[4, 12])
    a = ap.parse_args()
    print(f"# cores {os.cpu_count()}, load average before: {os.getloadavg()}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix=f"layout_cpu_{os.getpid()}_") as work:
        for nproc, tp, pp, micro in LAYOUTS:
            got = []
            for steps in a.steps:
                cfg = os.path.join(work, f"n{nproc}_tp{tp}_pp{pp}_{steps}.toml")
                with open(cfg, "w") as f:
                    f.write(CONFIG.format(micro=micro, steps=steps))
                got.append(run_cpu(a.engine, cfg, nproc, tp, pp, os.path.join(work, f"o{nproc}{tp}{pp}_{steps}")))
            n = a.steps[1] - a.steps[0]
            user, system = (got[1][0] - got[0][0]) / n, (got[1][1] - got[0][1]) / n
            p = subprocess.run([a.engine, "plan", "--engine", "gantry-cpu", "--config", cfg, "--gpus", str(nproc),
                                "--tp", str(tp), "--pp", str(pp), "--dp", str(nproc // (tp * pp)), "--json",
                                "--measure-cpu"], capture_output=True, text=True)
            c = json.loads(p.stdout)["time"]["cpu"]
            row = {"nproc": nproc, "dp": nproc // (tp * pp), "tp": tp, "pp": pp, "micro_batch": micro,
                   "load1": round(os.getloadavg()[0], 2), "measured_user_s": user, "measured_system_s": system,
                   "planned_host_cpu_s": c["host_cpu_s"], "planned_collectives_cpu_s": c["collectives_cpu_s"],
                   "collectives": c["collectives"]}
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(f"# load average after: {os.getloadavg()}")
    print(f"{'layout':<22}{'CPU/step meas':>14}{'(system)':>10}{'planned':>9}{'err':>8}{'of it, collectives':>20}")
    for r in rows:
        meas = r["measured_user_s"] + r["measured_system_s"]
        name = f"dp{r['dp']} tp{r['tp']} pp{r['pp']} mb{r['micro_batch']}"
        err = 100 * (r["planned_host_cpu_s"] - meas) / meas
        print(f"{name:<22}{meas:>13.3f}s{r['measured_system_s']:>9.3f}s{r['planned_host_cpu_s']:>8.3f}s"
              f"{err:>+7.1f}%{r['planned_collectives_cpu_s']:>19.3f}s")


if __name__ == "__main__":
    main()
