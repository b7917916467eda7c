"""A CPU training case alone, and beside one busy process: what a job's threads following its allocation buys.

Three runs of one `workload=train model=tiny` case (BF16, the emulator, one seed), each in a new process:

- alone: every CPU of this machine, torch's threads from them;
- beside a busy process (`python3 -c 'while 1: pass'`), still with every CPU's worth of threads: what a job
  does that ignores its allocation on a shared node (its threads wait at every barrier for a sibling the busy
  process has descheduled);
- beside the busy process, as a job allocated the CPUs the busy one leaves (the process affinity set to all
  CPUs but one, as Slurm's task/affinity or a cpuset would, and torch's threads from it through
  fp8bench.run.scheduler.use_allocated_cpus, which is what every sweep job calls first).

Prints the three wall times of the case (not counting the interpreter's start) and each one's ratio to
alone; the aim is the third at most 2x alone. Needs 2 CPUs or more.

    python scripts/contention_bench.py [--steps 100] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CASE = ["workload=train", "model=tiny", "backend=emulated", "format=bf16", "scaling=none", "workload.batch=8",
        "workload.seq=128", "workload.train.bf16_seeds=1", "workload.train.eval_every=25", "device=cpu"]


def child(cpus: int, steps: int) -> dict:
    """Run the case in this process on `cpus` CPUs (0: all of them); what it took."""
    if cpus:
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cpus])
    from fp8bench.config.compose import expand
    from fp8bench.core.hardware import detect_device
    from fp8bench.run.caserun import run_case
    from fp8bench.run.plan import plan
    from fp8bench.run.scheduler import use_allocated_cpus

    threads = use_allocated_cpus()
    device = detect_device()
    points, _ = expand([*CASE, f"workload.train.steps={steps}"])
    cases = plan(points, device)
    started = time.perf_counter()
    rec = run_case(cases[0], "contention-bench", device)
    return {"case_id": rec.case_id, "status": rec.status, "reason": rec.reason, "threads": threads,
            "cpus": len(os.sched_getaffinity(0)), "wall_s": time.perf_counter() - started,
            "step_ms": rec.metric("time_ms")}


def measure(cpus: int, steps: int) -> dict:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)  # torch's threads come from the CPUs the process may use
    out = subprocess.run([sys.executable, __file__, "--child", str(cpus), "--steps", str(steps)], env=env,
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"the case's process failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["status"] != "ok":
        raise SystemExit(f"{result['case_id']} did not run: {result['status']} {result['reason']}")
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100, help="training steps of the case (default 100)")
    p.add_argument("--json", type=Path, default=None, help="also write the figures here")
    p.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    ns = p.parse_args()
    if ns.child is not None:
        print(json.dumps(child(ns.child, ns.steps)))
        return 0
    if ns.steps < 1:
        p.error(f"--steps={ns.steps} must be at least 1")
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        p.error(f"this process may use {cpus} CPU: a busy process beside the case would leave it nothing")
    runs = {"alone": measure(0, ns.steps)}
    busy = subprocess.Popen([sys.executable, "-c", "while 1: pass"])
    try:
        runs["beside, threads of every CPU"] = measure(0, ns.steps)
        runs[f"beside, allocated {cpus - 1} of {cpus} CPUs"] = measure(cpus - 1, ns.steps)
    finally:
        busy.kill()
        busy.wait()
    alone = runs["alone"]["wall_s"]
    print(f"{runs['alone']['case_id']}, {ns.steps} steps, on {cpus} CPUs")
    for name, r in runs.items():
        print(f"  {name:<32} {r['wall_s']:8.1f} s  {r['wall_s'] / alone:5.2f}x alone  "
              f"({r['threads']} torch threads on {r['cpus']} CPUs, step {r['step_ms']:.1f} ms)")
    if ns.json:
        ns.json.write_text(json.dumps({"steps": ns.steps, "cpus": cpus, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
