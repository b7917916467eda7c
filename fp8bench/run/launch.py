"""What a sweep job does in a launcher's worker process before it measures anything.

Hydra leaves device placement to the user: a joblib worker on an 8-GPU box would otherwise run on GPU 0 with
every other worker. `pin_worker_gpu` claims one GPU per worker process (an exclusive lock file per GPU, held
for the process's life) and sets CUDA_VISIBLE_DEVICES before CUDA is initialised in that process.
"""

from __future__ import annotations

import fcntl
import os
import statistics
import tempfile
from pathlib import Path

from fp8bench.core.hardware import visible_gpus
from fp8bench.core.records import read_shard
from fp8bench.run.scheduler import use_allocated_cpus

_claimed: dict[str, object] = {}


def pin_worker_gpu() -> str | None:
    """Claim a free GPU for this process and make it the only visible one; None on a machine with fewer than
    two GPUs (nothing to choose). Idempotent: a worker keeps its GPU for every job it runs."""
    if "gpu" in _claimed:
        return _claimed["gpu"]  # type: ignore[return-value]
    gpus = visible_gpus()
    if len(gpus) < 2:
        return None
    lock_dir = Path(tempfile.gettempdir()) / f"fp8bench-gpu-locks-{os.getuid()}"
    lock_dir.mkdir(exist_ok=True)
    for gpu in gpus:
        fd = open(lock_dir / f"gpu{gpu}.lock", "w")  # noqa: SIM115 - held open: the lock lives with the process
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fd.close()
            continue
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
        _claimed.update(gpu=gpu, fd=fd)
        return gpu
    raise RuntimeError(f"all {len(gpus)} GPUs {gpus} are claimed by other fp8bench workers; run at most that many "
                       "jobs at once (hydra.launcher.n_jobs)")


def keep_worker_alive() -> None:
    """loky (joblib's default backend) measures a worker's memory after its first task and restarts the worker
    once it has grown by 300 MB, taking it for a leak. A CUDA context and the caching allocator grow a worker
    by more than that on its first GPU job, and a restart costs the sweep a new CUDA context and imports
    (docs/launchers.md), so in our workers growth is expected: raise the threshold (loky reads this module
    global at every check)."""
    try:
        from joblib.externals.loky import process_executor
    except ImportError:
        return
    process_executor._MAX_MEMORY_LEAK_SIZE = 1 << 62


def prepare_worker(parent_pid: int) -> str | None:
    """What a sweep job does first when it runs in a launcher's worker process (not in `parent_pid`, the
    `fp8bench run` process itself): stay alive across jobs, size torch's threads to the CPUs the worker was
    given (a Slurm job's allocation), and claim a GPU. Returns the GPU id, or None."""
    if os.getpid() == parent_pid:
        return None
    keep_worker_alive()
    use_allocated_cpus()
    return pin_worker_gpu()


JOB_KEY = ("workload", "model", "format", "scaling", "backend")
"""What identifies a point's cases in the records (the axes a sweep varies)."""


def job_seconds_from_history(jobs: list) -> list[float | None]:
    """Per job config (one twin group of a run's plan: `job_group`): the seconds its points' cases took the last
    time each ran, summed, from the shards under its results_dir; None for a job none of whose cases ran
    before. The launcher (hydra_plugins/fp8bench_launchers/local_gpus.py) orders jobs by it."""
    from fp8bench.run.runner import group_points, run_dir_for

    keys = [{(p.workload.name, p.model.name, p.format.name, p.scaling.name, p.backend_name)
             for p in group_points(run_dir_for(job, str(job.run_id)), int(job.job_group))} for job in jobs]
    latest: dict[tuple, dict[str, tuple[float, float]]] = {}  # key -> case_id -> (started_at, duration_s)
    for results_dir in {Path(str(job.results_dir)) for job in jobs}:
        for shard in results_dir.glob("runs/*/shard-*.jsonl"):
            records, _ = read_shard(shard)  # skips a torn last line of a crashed job
            for rec in records:
                key = tuple(getattr(rec, f) for f in JOB_KEY)
                seen = latest.setdefault(key, {}).get(rec.case_id, (-1.0, 0.0))
                if rec.started_at >= seen[0]:
                    latest[key][rec.case_id] = (rec.started_at, rec.duration_s)
    out = []
    for job_keys in keys:
        known = [s for k in job_keys for _, s in latest.get(k, {}).values()]
        out.append(sum(known) if known else None)
    return out


def longest_first(seconds: list[float | None]) -> list[int]:
    """Job positions, longest first (LPT); a job without history counts as the mean of those with one, and
    ties keep declaration order (so with no history at all the order is Hydra's)."""
    known = [s for s in seconds if s is not None]
    default = statistics.fmean(known) if known else 0.0
    return sorted(range(len(seconds)), key=lambda i: -(default if seconds[i] is None else seconds[i]))
