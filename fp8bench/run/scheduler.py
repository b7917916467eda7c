"""The batch scheduler a process runs under, read from its environment, and the CPU threads its allocation gives.

Slurm tells a job what it is and what it got through environment variables (`sbatch`'s "OUTPUT ENVIRONMENT
VARIABLES"). `slurm_context` turns them into a plain dict that can travel with a record; `allocated_cpus`
and `use_allocated_cpus` size torch's thread pool to the job's allocation. Without them a job granted one
core of a shared node runs as many threads as the node has cores (Slurm's task/none plugin leaves the
process affinity at the whole node), and its threads wait at every barrier for siblings descheduled by the
neighbouring jobs.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

SLURM_VARIABLES = {
    "job_id": "SLURM_JOB_ID",
    "array_job_id": "SLURM_ARRAY_JOB_ID",
    "array_task_id": "SLURM_ARRAY_TASK_ID",
    "job_name": "SLURM_JOB_NAME",
    "node": "SLURMD_NODENAME",
    "nodes": "SLURM_JOB_NODELIST",
    "partition": "SLURM_JOB_PARTITION",
    "account": "SLURM_JOB_ACCOUNT",
    "cluster": "SLURM_CLUSTER_NAME",
    "cpus_per_task": "SLURM_CPUS_PER_TASK",
    "cpus_on_node": "SLURM_CPUS_ON_NODE",
    "ntasks": "SLURM_NTASKS",
    "procid": "SLURM_PROCID",
    "restart_count": "SLURM_RESTART_COUNT",
    "gpus": "SLURM_GPUS_ON_NODE",
}
"""Field of the context → the Slurm variable it comes from."""

INTEGER_FIELDS = frozenset({"cpus_per_task", "cpus_on_node", "ntasks", "procid", "restart_count", "gpus"})


def slurm_context(environ: Mapping[str, str] | None = None) -> dict:
    """The Slurm job this process runs in, as a plain dict; {} outside Slurm.

    `job_id` is the id `squeue`, `sacct` and `scancel` use: `<array job>_<task>` for a task of a job array
    (SLURM_JOB_ID, its own number, is kept as `slurm_job_id`). Fields Slurm did not set are left out;
    counts are integers. `restart_count` is 0 for a job's first run and n after n requeues.
    """
    env = os.environ if environ is None else environ
    if "SLURM_JOB_ID" not in env:
        return {}
    ctx: dict = {"scheduler": "slurm"}
    for name, var in SLURM_VARIABLES.items():
        value = env.get(var)
        if value is None or value == "":
            continue
        ctx[name] = int(value) if name in INTEGER_FIELDS and value.isdigit() else value
    ctx.setdefault("restart_count", 0)
    if "array_job_id" in ctx and "array_task_id" in ctx:
        ctx["slurm_job_id"] = ctx["job_id"]
        ctx["job_id"] = f"{ctx['array_job_id']}_{ctx['array_task_id']}"
    return ctx


def _tasks_on_node(env: Mapping[str, str]) -> int:
    """Tasks of this job on this node: SLURM_NTASKS_PER_NODE, or the first count of SLURM_TASKS_PER_NODE
    ('2(x3),1' means two tasks on each of three nodes, then one)."""
    for var in ("SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        m = re.match(r"(\d+)", env.get(var, ""))
        if m and int(m.group(1)) > 0:
            return int(m.group(1))
    return 1


def allocated_cpus(environ: Mapping[str, str] | None = None) -> int:
    """CPUs this process may use: in a Slurm job, its task's share of the allocation (SLURM_CPUS_PER_TASK,
    else the CPUs allocated on the node over the tasks on it), never more than the process affinity allows;
    elsewhere the process affinity (what `taskset`, a cpuset or another scheduler granted)."""
    env = os.environ if environ is None else environ
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if "SLURM_JOB_ID" not in env:
        return max(1, affinity)
    per_task = env.get("SLURM_CPUS_PER_TASK", "")
    if per_task.isdigit() and int(per_task) > 0:
        share = int(per_task)
    elif env.get("SLURM_CPUS_ON_NODE", "").isdigit():
        share = max(1, int(env["SLURM_CPUS_ON_NODE"]) // _tasks_on_node(env))
    else:
        share = affinity
    return max(1, min(share, affinity))


def use_allocated_cpus(environ: Mapping[str, str] | None = None) -> int:
    """Size torch's intra-op thread pool to this process's CPUs and return the thread count.

    In a Slurm job the allocation decides, whatever OMP_NUM_THREADS the submitting shell passed along (that
    was the submitting machine's setting). Elsewhere an OMP_NUM_THREADS that is set is kept (torch read it at
    start); otherwise the process affinity decides.
    """
    import torch

    env = os.environ if environ is None else environ
    if "SLURM_JOB_ID" not in env and env.get("OMP_NUM_THREADS", "").isdigit():
        return torch.get_num_threads()
    threads = allocated_cpus(env)
    if torch.get_num_threads() != threads:
        torch.set_num_threads(threads)
    return threads
