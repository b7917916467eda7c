"""The cases a batch job did not finish, recorded `failed` with the scheduler's word on how the job ended.

A sweep job that Slurm cancels, times out or loses with its node writes nothing for the case in flight and
the cases after it. The launching process knows each job's twin group and, from accounting, its final state:
`record_unfinished` writes one `failed` record per case of the group that has no record of that job and no
finished record of the run (ok, skipped, diverged), into a shard of its own. A resume runs them again (failed
cases are not done) and its records, in later shards, supersede these.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from fp8bench.core.records import ShardWriter, done_case_ids, read_run
from fp8bench.core.types import Status
from fp8bench.run.caserun import case_record
from fp8bench.run.plan import Case


class TimeLimitReached(BaseException):  # noqa: N818 - a stop, not an error: `except Exception` must not catch it
    """Raised in a job at its scheduler's time-limit warning: the case in flight stops unrecorded (no case's
    `except Exception` takes it for that case's failure) and the job runs no further case."""


def job_cases(run_dir: Path, group: int) -> list[Case]:
    """The cases of twin group `group` of a run's plan, as a job of it plans them on this machine."""
    from fp8bench.core.hardware import detect_device
    from fp8bench.run.plan import execution_order, plan
    from fp8bench.run.runner import group_points

    return execution_order(plan(group_points(run_dir, group), detect_device()))


def unfinished(run_dir: Path, group: int, job_id: str) -> list[Case]:
    """The cases of `group` that job `job_id` recorded nothing for and that no record of the run finished."""
    _, records, _ = read_run(run_dir)
    by_job = {r.case_id for r in records if (r.scheduler or {}).get("job_id") == job_id}
    done = done_case_ids(run_dir)
    return [c for c in job_cases(run_dir, group) if c.case_id not in done and c.case_id not in by_job]


def record_unfinished(run_dir: Path, run_id: str, group: int, job_id: str, state: str,
                      scheduler: str = "slurm") -> list[str]:
    """Record each unfinished case of job `job_id` (twin group `group`) `failed`, with `scheduler` =
    {scheduler, job_id, state} and the state in `reason`; the ids recorded."""
    cases = unfinished(run_dir, group, job_id)
    if not cases:
        return []
    context = {"scheduler": scheduler, "job_id": job_id, "state": state}
    reason = f"{scheduler.capitalize()} job {job_id} ended {state} before this case finished"
    with ShardWriter(run_dir, f"job{group}-{state.lower()}") as shard:
        for case in cases:
            shard.write(replace(case_record(case, run_id, Status.FAILED, reason), scheduler=context))
    return [c.case_id for c in cases]
