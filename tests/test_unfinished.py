"""The cases a batch job did not finish, recorded with the scheduler's state (fp8bench.run.unfinished), and the
Slurm queries the launching process makes (fp8bench.run.slurm_jobs), without a cluster: tests/test_slurm.py
runs them against a real one."""

from __future__ import annotations

from dataclasses import replace

import pytest

from fp8bench.config.compose import expand
from fp8bench.core.hardware import detect_device
from fp8bench.core.records import ShardWriter, done_case_ids, read_run
from fp8bench.core.types import Status
from fp8bench.run import slurm_jobs
from fp8bench.run.caserun import case_record
from fp8bench.run.plan import execution_order, job_groups, plan
from fp8bench.run.runner import write_plan
from fp8bench.run.unfinished import TimeLimitReached, job_cases, record_unfinished

SWEEP = ["workload=gemm", "model=tiny", "backend=emulated", "seed=0,1", "format=e4m3", "scaling=current"]


@pytest.fixture
def run(tmp_path):
    points, _ = expand(SWEEP, multirun=True)
    groups = job_groups(execution_order(plan(points, detect_device())))
    run_dir = tmp_path / "runs" / "r"
    write_plan(run_dir, groups)
    return run_dir, groups


def _write(run_dir, job: str, records) -> None:
    with ShardWriter(run_dir, job) as shard:
        for rec in records:
            shard.write(rec)


def test_a_jobs_unfinished_cases_are_recorded_failed_with_its_state(run):
    run_dir, groups = run
    assert len(groups) == 2
    cases = job_cases(run_dir, 0)
    assert [c.case_id for c in cases] == [c.case_id for c in groups[0]] and len(cases) >= 3
    job = {"scheduler": "slurm", "job_id": "7_0", "node": "n1"}
    ok = replace(case_record(cases[0], "r", Status.OK), scheduler=job)
    own_failure = replace(case_record(cases[1], "r", Status.FAILED, "RuntimeError: boom"), scheduler=job)
    _write(run_dir, "job0", [ok, own_failure])

    recorded = record_unfinished(run_dir, "r", 0, "7_0", "CANCELLED")

    assert recorded == [c.case_id for c in cases[2:]]  # not the job's own records, not the other group's cases
    _, records, _ = read_run(run_dir)
    by_id = {r.case_id: r for r in records}
    for case_id in recorded:
        rec = by_id[case_id]
        assert rec.status == "failed" and "CANCELLED" in rec.reason
        assert rec.scheduler == {"scheduler": "slurm", "job_id": "7_0", "state": "CANCELLED"}
    assert by_id[cases[1].case_id].reason == "RuntimeError: boom"
    assert record_unfinished(run_dir, "r", 0, "7_0", "CANCELLED") == []  # nothing left unrecorded for that job


def test_a_resume_supersedes_the_failed_records_and_leaves_their_shard_alone(run):
    run_dir, _ = run
    cases = job_cases(run_dir, 1)
    recorded = record_unfinished(run_dir, "r", 1, "8_1", "TIMEOUT")
    assert recorded == [c.case_id for c in cases]
    [failed_shard] = run_dir.glob("shard-*-job1-timeout.jsonl")
    before = failed_shard.read_bytes()
    assert done_case_ids(run_dir) == set()  # a resume runs them again
    later = run_dir / "shard-99999999T999999-1-job1.jsonl"  # a resume's shard sorts after it
    with open(later, "w") as f:
        for case in cases:
            f.write(replace(case_record(case, "r", Status.OK), scheduler={"job_id": "9_1"}).to_json() + "\n")
    _, records, _ = read_run(run_dir)
    assert sorted(r.case_id for r in records) == sorted(recorded)  # each case once
    assert {r.status for r in records} == {"ok"}
    assert failed_shard.read_bytes() == before


def test_a_time_limit_stop_is_not_an_exception_a_case_catches():
    with pytest.raises(TimeLimitReached):
        try:
            raise TimeLimitReached("timed-out too many times")
        except Exception:  # noqa: BLE001 - what run_case and run_cases catch
            pytest.fail("caught as a case's failure")


def test_accounting_states_read_cancelled_by_a_user_as_cancelled(monkeypatch):
    calls = []

    def fake(*args, timeout=60):
        calls.append(args)
        return "12_0|CANCELLED by 0\n12_1|TIMEOUT\n12_2|RUNNING\n13|COMPLETED\n"
    monkeypatch.setattr(slurm_jobs, "_slurm", fake)
    assert slurm_jobs.final_states(["12_0", "12_1", "12_2", "14_0"]) == {
        "12_0": "CANCELLED", "12_1": "TIMEOUT", "12_2": "RUNNING", "14_0": ""}
    assert calls[0][-4:] == ("-j", "12", "-j", "14")


def test_queued_and_wait_gone_follow_squeue(monkeypatch):
    listings = iter(["5_0\n5_1\n", "5_1\n6\n", ""])
    monkeypatch.setattr(slurm_jobs, "_slurm", lambda *a, timeout=60: next(listings))
    assert slurm_jobs.queued(["5_0", "5_1"]) == {"5_0", "5_1"}
    assert slurm_jobs.wait_gone(["5_0", "5_1"], timeout=5, every=0.01) == set()
