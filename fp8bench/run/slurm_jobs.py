"""Slurm jobs seen from the process that submitted them: which are still queued, how each ended (accounting),
and cancelling them. Job ids are as `squeue` and `sacct` print them (`<array job>_<task>` for a task of an
array)."""

from __future__ import annotations

import subprocess
import time

RUNNING_STATES = frozenset({"PENDING", "RUNNING", "REQUEUED", "COMPLETING", "CONFIGURING", "RESIZING",
                            "SUSPENDED", "REQUEUE_HOLD", "REQUEUE_FED", "SIGNALING", "STAGE_OUT", "STOPPED"})
"""States of a job that has not ended (its processes may still write)."""


JOBS_FILE = "slurm-jobs.txt"
"""In a run folder: the ids of the Slurm jobs each launch of the run submitted, one a line."""


def remember(run_dir, job_ids: list[str]) -> None:
    """Add a launch's job ids to the run folder's JOBS_FILE (what resume asks the queue about)."""
    from pathlib import Path

    path = Path(run_dir) / JOBS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write("".join(f"{j}\n" for j in job_ids))


def still_queued(run_dir) -> list[str]:
    """The jobs an earlier launch of the run submitted that Slurm still lists (a launcher killed without
    Ctrl-C leaves them running); [] where none was submitted or no `squeue` answers here."""
    from pathlib import Path

    path = Path(run_dir) / JOBS_FILE
    ids = [line.strip() for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []
    try:
        return sorted(queued(ids), key=lambda j: tuple(int(x) for x in j.split("_") if x.isdigit()))
    except (OSError, RuntimeError, subprocess.TimeoutExpired):
        return []


def _slurm(*args: str, timeout: float = 60) -> str:
    res = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {res.returncode}: {(res.stderr or res.stdout).strip()}")
    return res.stdout


def queued(job_ids: list[str]) -> set[str]:
    """The jobs of `job_ids` that `squeue` still lists (pending, running or completing)."""
    if not job_ids:
        return set()
    out = _slurm("squeue", "-h", "-r", "-o", "%i")
    return {line.strip() for line in out.splitlines()} & set(job_ids)


def wait_gone(job_ids: list[str], timeout: float, every: float = 1.0) -> set[str]:
    """Wait until no job of `job_ids` is queued, at most `timeout` seconds; those still queued."""
    deadline = time.monotonic() + timeout
    left = queued(job_ids)
    while left and time.monotonic() < deadline:
        time.sleep(every)
        left = queued(job_ids)
    return left


def final_states(job_ids: list[str]) -> dict[str, str]:
    """Each job's latest state in accounting ('CANCELLED by 0' read as CANCELLED); '' where sacct has none."""
    if not job_ids:
        return {}
    arrays = sorted({j.split("_")[0] for j in job_ids})
    out = _slurm("sacct", "-X", "-n", "-P", "-o", "JobID,State", *[a for array in arrays for a in ("-j", array)])
    states = dict.fromkeys(job_ids, "")
    for line in out.splitlines():
        job, _, state = line.partition("|")
        if job in states and state.strip():
            states[job] = state.split()[0]
    return states


def cancel(job_ids: list[str]) -> None:
    """`scancel` the jobs (pending ones leave the queue; running ones get SIGTERM, then SIGKILL)."""
    if job_ids:
        _slurm("scancel", *job_ids)
