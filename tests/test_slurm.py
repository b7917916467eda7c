"""Sweeps through a real Slurm (`make slurm-up`; `.ci/run` starts it): `fp8bench run -m ... hydra/launcher=slurm-cpu`
submits one job per sweep point, and after each fault a cluster deals out (a job cancelled, a node drained
while jobs wait, a job past its time limit, a job requeued) `resume=<run_id>` with the same launcher completes
the sweep: every case once, the shards already written untouched, no duplicate rows in DuckDB.

Each scenario runs once per module (a fixture) and several tests read what it left: the cases a failed job
did not finish are recorded with the job's id and Slurm's state, an interrupted sweep cancels its queued
jobs, a time limit fails no case in flight, and the site shows the job and its state.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import duckdb
import pytest
from slurm_cluster import (
    ROOT,
    Sweep,
    all_records,
    cancel,
    drained,
    expire,
    job_states,
    node_cpus,
    queued,
    requeue,
    running_job_with_records,
    snapshot,
    submitted_jobs,
    wait_gone,
    wait_until,
)

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parent
GEMMS = ["workload=gemm", "model=tiny", "backend=emulated", "seed=0,1"]
BASE = [*GEMMS, "format=e4m3,hybrid", "scaling=current,rowwise", "hydra/launcher=slurm-cpu"]
"""The issue's sweep over two seeds: two jobs (one per twin group: a seed's points share a BF16 twin point) of
four points, twelve GEMM cases each."""
FAULT = [*GEMMS, "format=e4m3,hybrid", "scaling=current", "workload.tokens=32768", "hydra/launcher=slurm-cpu"]
"""Two jobs of two points, twelve cases each, about 1.5 s a case on one core: long enough to be hit in the
middle."""
LONG = [*GEMMS, "format=e4m3,hybrid", "scaling=current", "workload.tokens=98304", "hydra/launcher=slurm-cpu",
        "hydra.launcher.timeout_min=10"]
"""Two jobs of about 50 s of cases each: still running when Slurm's time-limit check (every 30 s) comes. Jobs
of at most 10 minutes: submitit takes Slurm's signal to such a job for its time limit (to a longer job whose
limit an operator lowered, for a preemption, which it requeues)."""

def expected_cases(overrides: list[str]) -> set[str]:
    """The case ids the sweep plans here."""
    from fp8bench.config.compose import expand
    from fp8bench.core.hardware import detect_device
    from fp8bench.run.plan import plan

    points, _ = expand(overrides, multirun=True)
    return {c.case_id for c in plan(points, detect_device())}


def db_cases(results_dir: Path, run_id: str) -> list[tuple[str, str]]:
    con = duckdb.connect(str(results_dir / "fp8bench.duckdb"), read_only=True)
    try:
        return con.execute("SELECT case_id, status FROM cases WHERE run_id = ? ORDER BY case_id", [run_id]).fetchall()
    finally:
        con.close()


def unfinished(records: list[dict], expected: set[str]) -> set[str]:
    return expected - {r["case_id"] for r in records if r["status"] == "ok"}


@dataclass
class Fault:
    """What one fault left, and what resuming the run after it did."""

    results_dir: Path
    run_id: str
    expected: set[str]
    victim: str
    victim_states: list[str] = field(default_factory=list)
    first_rc: int | None = None
    before_resume: dict = field(default_factory=dict)
    records_before_resume: list[dict] = field(default_factory=list)
    queued_after_interrupt: dict = field(default_factory=dict)
    resume_rc: int | None = None
    resume_output: str = ""

    @property
    def run_dir(self) -> Path:
        return self.results_dir / "runs" / self.run_id

    @property
    def kept_before_resume(self) -> Path:
        """A copy of the run folder as the fault left it (the resume's records supersede its failed ones)."""
        return self.results_dir / "before-resume"


def finish(fault: Fault, axes: list[str]) -> Fault:
    """After the fault: wait until no job of the sweep is left in the queue, keep what the run folder holds,
    read the victim's states from accounting, then resume the run with the same overrides."""
    wait_gone(submitted_jobs(fault.results_dir))
    fault.victim_states = job_states([fault.victim], history=True)[fault.victim]
    fault.before_resume = snapshot(fault.run_dir)
    fault.records_before_resume = all_records(fault.run_dir)
    shutil.copytree(fault.run_dir, fault.kept_before_resume / fault.run_id)
    resumed = Sweep(fault.results_dir, *axes, f"resume={fault.run_id}", log_name="resume")
    try:
        fault.resume_rc = resumed.wait(600)
    finally:
        resumed.stop()
    fault.resume_output = resumed.output
    return fault


def start(tmp_path_factory, name: str, axes: list[str], *extra: str) -> tuple[Fault, Sweep]:
    results_dir = tmp_path_factory.mktemp(name)
    fault = Fault(results_dir, name, expected_cases([*axes, *extra]), victim="")
    return fault, Sweep(results_dir, *axes, *extra, f"run_id={name}")


# --- the scenarios ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base(slurm_cluster, tmp_path_factory):
    fault, sweep = start(tmp_path_factory, "base", BASE)
    try:
        fault.first_rc = sweep.wait(600)
    finally:
        sweep.stop()
    fault.resume_output = sweep.output
    return fault


@pytest.fixture(scope="module")
def cancelled(slurm_cluster, tmp_path_factory):
    """`scancel` of a job that has recorded some of its cases."""
    fault, sweep = start(tmp_path_factory, "cancelled", FAULT)
    try:
        fault.victim = running_job_with_records(fault.results_dir, fault.run_dir, at_least=2)
        cancel(fault.victim)
        fault.first_rc = sweep.wait(600)
    finally:
        sweep.stop()
    return finish(fault, FAULT)


@pytest.fixture(scope="module")
def drained_node(slurm_cluster, tmp_path_factory):
    """The node drained while the sweep's second job waits (one job at a time); the user gives up waiting
    (Ctrl-C), cancels what is still queued, and resumes once the node is back."""
    fault, sweep = start(tmp_path_factory, "drained", FAULT, "hydra.launcher.array_parallelism=1")
    axes = [*FAULT, "hydra.launcher.array_parallelism=1"]
    try:
        first = running_job_with_records(fault.results_dir, fault.run_dir, at_least=1)
        jobs = submitted_jobs(fault.results_dir)
        with drained(slurm_cluster.node):
            def held_by_the_drain():
                q = queued(jobs)
                waiting = {j: r for j, (state, r) in q.items() if state == "PENDING"}
                return waiting if q and first not in q and waiting.keys() == q.keys() and all(
                    "DRAIN" in r.upper() or "ReqNodeNotAvail" in r for r in waiting.values()) else None

            waiting = wait_until(held_by_the_drain, 300, f"{first} to finish and the rest to wait for the drained node")
            assert sweep.running(), "the launcher stopped waiting for the queued jobs"
            fault.first_rc = sweep.interrupt()
            fault.queued_after_interrupt = queued(jobs)
            fault.victim = sorted(waiting)[0]
            for job in fault.queued_after_interrupt:
                cancel(job)
            wait_gone(jobs)
    finally:
        sweep.stop()
    return finish(fault, axes)


@pytest.fixture(scope="module")
def expired(slurm_cluster, tmp_path_factory):
    """A job that has recorded a case gets a time limit of zero: Slurm ends it as TIMEOUT."""
    fault, sweep = start(tmp_path_factory, "expired", LONG)
    try:
        fault.victim = running_job_with_records(fault.results_dir, fault.run_dir, at_least=1)
        expire(fault.victim)
        fault.first_rc = sweep.wait(600)
    finally:
        sweep.stop()
    return finish(fault, LONG)


@pytest.fixture(scope="module")
def requeued(slurm_cluster, tmp_path_factory):
    """`scontrol requeue` of a job that has recorded some of its cases: Slurm kills it and runs it again."""
    fault, sweep = start(tmp_path_factory, "requeued", FAULT)
    try:
        fault.victim = running_job_with_records(fault.results_dir, fault.run_dir, at_least=2)
        requeue(fault.victim)
        fault.first_rc = sweep.wait(600)
    finally:
        sweep.stop()
    return finish(fault, FAULT)


FAULTS = {"cancelled": "CANCELLED", "drained_node": "CANCELLED", "expired": "TIMEOUT", "requeued": "REQUEUED"}
"""Each scenario and the state accounting must show for its victim."""


# --- a sweep through Slurm -------------------------------------------------------------------------------


def test_a_multirun_through_slurm_runs_one_job_per_twin_group_and_ingests_every_case_once(base, slurm_cluster):
    assert base.first_rc == 0, base.resume_output[-3000:]
    jobs = submitted_jobs(base.results_dir)
    assert len(jobs) == 2, jobs  # one job per twin group: one per seed
    assert job_states(jobs) == {j: ["COMPLETED"] for j in jobs}
    shards = sorted(base.run_dir.glob("shard-*.jsonl"))
    assert len(shards) == len(jobs) and {s.stem.rsplit("-", 1)[1] for s in shards} == {f"job{i}" for i in range(2)}
    rows = db_cases(base.results_dir, base.run_id)
    assert len(base.expected) >= 6
    assert [c for c, _ in rows] == sorted(base.expected)  # each case once, none missing, none extra
    assert {s for _, s in rows} == {"ok"}


def test_every_case_row_names_the_slurm_job_node_and_partition_that_ran_it(base, slurm_cluster):
    con = duckdb.connect(str(base.results_dir / "fp8bench.duckdb"), read_only=True)
    rows = con.execute("SELECT json_extract_string(scheduler, '$.job_id'), json_extract_string(scheduler, '$.node'), "
                       "json_extract_string(scheduler, '$.partition') FROM cases WHERE run_id = ?",
                       [base.run_id]).fetchall()
    assert len(rows) == len(base.expected)
    assert {job for job, _, _ in rows} == set(submitted_jobs(base.results_dir))
    assert {(node, part) for _, node, part in rows} == {(slurm_cluster.node, slurm_cluster.partition)}


def _job_threads():
    """What a sweep job does first (fp8bench.run.launch.prepare_worker), then its torch threads and context."""
    import torch

    from fp8bench.run.launch import prepare_worker
    from fp8bench.run.scheduler import slurm_context

    prepare_worker(parent_pid=-1)
    return torch.get_num_threads(), slurm_context()


def test_a_slurm_job_runs_as_many_torch_threads_as_its_allocation_has_cpus(slurm_cluster, tmp_path, monkeypatch):
    """The node has 2 CPUs and Slurm's task/none leaves every job's affinity at both: the allocation decides,
    whatever OMP_NUM_THREADS the submitting shell passed along."""
    import submitit

    cpus = node_cpus(slurm_cluster.node)
    if cpus < 2:
        pytest.skip(f"node {slurm_cluster.node} has {cpus} CPU: nothing to share out")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(TESTS), os.environ.get("PYTHONPATH")) if p))
    executor = submitit.AutoExecutor(folder=tmp_path / "jobs", cluster="slurm")
    jobs = []
    for cpus_per_task, inherited in ((1, str(cpus)), (2, "1")):
        monkeypatch.setenv("OMP_NUM_THREADS", inherited)
        executor.update_parameters(timeout_min=5, cpus_per_task=cpus_per_task, mem_gb=1,
                                   slurm_partition=slurm_cluster.partition)
        jobs.append(executor.submit(_job_threads))
    (one, ctx_one), (two, ctx_two) = (j.result() for j in jobs)
    assert (one, two) == (1, 2)
    assert ctx_one["job_id"] == jobs[0].job_id and ctx_two["job_id"] == jobs[1].job_id
    assert (ctx_one["cpus_per_task"], ctx_two["cpus_per_task"]) == (1, 2)
    assert ctx_one["node"] == slurm_cluster.node and ctx_one["partition"] == slurm_cluster.partition


# --- faults, then resume ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FAULTS)
def test_the_fault_happened_as_staged(name, request):
    """The scenario is what it says: accounting shows the victim's state, and (but for the drained node,
    whose victim never started) the victim had recorded cases and left some unfinished."""
    fault = request.getfixturevalue(name)
    assert FAULTS[name] in fault.victim_states, (fault.victim, fault.victim_states)
    if name == "requeued":
        assert fault.victim_states[-1] == "COMPLETED"  # its second run
        assert fault.first_rc == 0  # the launcher waited through the requeue
        return
    assert fault.first_rc != 0  # the launcher saw a job of its sweep fail
    left = unfinished(fault.records_before_resume, fault.expected)
    assert left and left != fault.expected, left


@pytest.mark.parametrize("name", FAULTS)
def test_resume_after_the_fault_completes_the_sweep_with_every_case_once(name, request):
    fault = request.getfixturevalue(name)
    assert fault.resume_rc == 0, fault.resume_output[-3000:]
    rows = db_cases(fault.results_dir, fault.run_id)
    assert [c for c, _ in rows] == sorted(fault.expected)
    assert {s for _, s in rows} == {"ok"}
    from fp8bench.core.records import read_run

    _, records, _ = read_run(fault.run_dir)
    assert sorted(r.case_id for r in records) == sorted(fault.expected)


@pytest.mark.parametrize("name", FAULTS)
def test_resume_leaves_every_shard_written_before_it_untouched(name, request):
    fault = request.getfixturevalue(name)
    assert fault.before_resume, "the fault left nothing recorded"
    after = snapshot(fault.run_dir)
    assert {shard: after.get(shard) for shard in fault.before_resume} == fault.before_resume  # bytes and mtime


@pytest.mark.parametrize("name", [
    "cancelled", "drained_node", "expired",
    "requeued",
])
def test_no_case_is_measured_twice(name, request):
    fault = request.getfixturevalue(name)
    measured = Counter(r["case_id"] for r in all_records(fault.run_dir) if r["status"] == "ok")
    assert set(measured) == fault.expected
    assert {c: n for c, n in measured.items() if n > 1} == {}


@pytest.mark.parametrize("name", ["cancelled", "drained_node", "expired"])
def test_the_cases_a_failed_job_did_not_finish_are_recorded_with_slurms_state(name, request):
    fault = request.getfixturevalue(name)
    state = FAULTS[name]
    left = unfinished(fault.records_before_resume, fault.expected)
    failed = {r["case_id"]: r for r in fault.records_before_resume
              if r["status"] == "failed" and (r.get("scheduler") or {}).get("job_id") == fault.victim}
    assert set(failed) == left
    assert all(r["scheduler"].get("state") == state and state in r["reason"] for r in failed.values())


def test_a_time_limit_is_not_recorded_as_a_failure_of_the_case_in_flight(expired):
    reasons = [r["reason"] for r in expired.records_before_resume if r["status"] == "failed"]
    assert not [r for r in reasons if "UncompletedJobError" in r], reasons


def test_the_site_shows_the_slurm_job_and_state_of_the_cases_it_did_not_finish(cancelled, tmp_path, page_text):
    """The run as the cancelled job left it, ingested and built into the site: headless Chromium finds the job
    id and the state the launcher recorded from accounting in one row of the runs page's batch-job table."""
    from fp8bench.data import store
    from fp8bench.report import build_site
    from fp8bench.report.browser import chromium_path

    if chromium_path() is None:
        if os.environ.get("CI"):
            raise RuntimeError("CI must install Debian's chromium (.ci/run does) for the report tests")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    stated = {(r["scheduler"]["job_id"], r["scheduler"]["state"]) for r in cancelled.records_before_resume
              if (r.get("scheduler") or {}).get("state")}
    assert stated
    con = store.connect(tmp_path / "db.duckdb")
    try:
        store.ingest(con, [cancelled.kept_before_resume])
        build_site(con, tmp_path / "site")
    finally:
        con.close()
    rows = page_text(tmp_path / "site", "runs.html",
                     "Array.from(document.querySelectorAll('tr')).map(r => Array.from(r.cells).map(c => c.innerText))")
    for job, state in stated:
        assert any(job in row and state in row and cancelled.run_id in row for row in rows), (job, state, rows)


def test_the_cases_a_requeued_job_measured_say_it_was_its_second_run(requeued):
    runs = Counter((r.get("scheduler") or {}).get("restart_count") for r in all_records(requeued.run_dir)
                   if (r.get("scheduler") or {}).get("job_id") == requeued.victim)
    assert runs[0] >= 2 and runs[1] >= 1, runs


def test_interrupting_a_slurm_sweep_cancels_its_queued_jobs(drained_node):
    assert drained_node.first_rc == 130
    assert drained_node.queued_after_interrupt == {}


def test_a_run_cut_by_its_time_limit_resumes_with_a_longer_one(expired, cli):
    longer = [o for o in LONG if not o.startswith("hydra.launcher.timeout_min=")] + ["hydra.launcher.timeout_min=20"]
    r = cli("run", "-m", *longer, f"results_dir={expired.results_dir}",
            f"resume={expired.run_id}", timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert [c for c, _ in db_cases(expired.results_dir, expired.run_id)] == sorted(expired.expected)


DISTRIBUTED = ["workload=train", "model=tiny", "backend=torch", "format=bf16", "scaling=none",
               "workload.train.nproc=2", "workload.train.strategy=ddp", "workload.train.steps=6",
               "workload.train.eval_every=3", "workload.batch=2", "workload.seq=32", "workload.train.bf16_seeds=1"]
"""A two-process training case (torchrun's two gloo ranks on CPUs), small enough for seconds."""


def test_a_two_process_training_case_through_slurm_matches_the_same_case_without_it(slurm_cluster, tmp_path):
    """The multi-process path a GPU cluster would take, minus NCCL: the job Slurm runs launches the case's two
    ranks (torchrun inside the job's two-CPU allocation); gloo on a CPU is deterministic for a fixed world size,
    so the curve is the one the same case trains without Slurm, bit for bit."""
    sweep = Sweep(tmp_path / "slurm", *DISTRIBUTED, "seed=0,1", "hydra/launcher=slurm-cpu",
                  "hydra.launcher.cpus_per_task=2", "run_id=dist")
    try:
        assert sweep.wait(600) == 0, sweep.output[-3000:]
    finally:
        sweep.stop()
    here = subprocess.run([sys.executable, "-m", "fp8bench", "run", *DISTRIBUTED, "seed=0", "run_id=dist",
                           f"results_dir={tmp_path / 'here'}", "store.ingest=false"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert here.returncode == 0, here.stdout[-2000:] + here.stderr[-2000:]
    slurm_recs = {r["case_id"]: r for r in all_records(tmp_path / "slurm" / "runs" / "dist")}
    [local] = all_records(tmp_path / "here" / "runs" / "dist")
    through = slurm_recs[local["case_id"]]
    assert through["status"] == local["status"] == "ok", (through["reason"], local["reason"])
    assert through["scheduler"]["job_id"] and not local["scheduler"]
    assert through["samples"]["loss"] == local["samples"]["loss"]
    assert through["samples"]["val_loss"] == local["samples"]["val_loss"]


def test_a_resume_refuses_while_jobs_of_a_killed_launcher_still_run(slurm_cluster, tmp_path):
    """A launcher killed outside Ctrl-C (SIGKILL, a lost login session) leaves its jobs queued and running:
    resume names them and exits 2 before submitting anything; once they are cancelled and gone, resume
    completes the sweep with every case once."""
    axes = [*FAULT, "hydra.launcher.array_parallelism=1"]
    expected = expected_cases(axes)
    run_dir = tmp_path / "runs" / "killed"
    sweep = Sweep(tmp_path, *axes, "run_id=killed")
    try:
        running_job_with_records(tmp_path, run_dir, at_least=1)
    finally:
        sweep.stop()  # SIGKILL: the launcher cancels nothing
    jobs = submitted_jobs(tmp_path)
    assert queued(jobs), "the killed launcher's jobs should still be in the queue"
    refused = Sweep(tmp_path, *axes, "resume=killed", log_name="refused")
    try:
        assert refused.wait(120) == 2, refused.output[-3000:]
    finally:
        refused.stop()
    left = sorted(queued(jobs))
    assert "still queued or running" in refused.output and any(j in refused.output for j in left), refused.output
    assert submitted_jobs(tmp_path) == jobs  # nothing submitted
    for job in left:
        cancel(job)
    wait_gone(jobs)
    resumed = Sweep(tmp_path, *axes, "resume=killed", log_name="resume")
    try:
        assert resumed.wait(600) == 0, resumed.output[-3000:]
    finally:
        resumed.stop()
    assert [c for c, _ in db_cases(tmp_path, "killed")] == sorted(expected)
    measured = Counter(r["case_id"] for r in all_records(run_dir) if r["status"] == "ok")
    assert set(measured) == expected and max(measured.values()) == 1
