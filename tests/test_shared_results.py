"""One results folder shared by runs that end at once (two sweeps, the jobs of a cluster sweep): DuckDB lets one
process hold the file, so an ingest that finds it held waits for it (saying so), and one that waits in vain
leaves the run in its folder and says how to load it; exit 2 stays for bad input."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[1]
POINT = ["workload=gemm", "model=tiny", "backend=emulated", "workload.linears=[o]"]


def _start(results_dir: Path, run_id: str, log: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", COLUMNS="200")
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "fp8bench", "run", *POINT, f"results_dir={results_dir}",
                                 f"run_id={run_id}"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)


def _wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.2)


@pytest.mark.slow
def test_two_runs_ending_at_once_into_one_results_folder_both_exit_0_and_both_are_ingested(tmp_path):
    """The DuckDB file is held (by this test, as by a third run's ingest) while both runs end: both wait for
    it, say so, and load their run once it is free."""
    db = tmp_path / "fp8bench.duckdb"
    holder = duckdb.connect(str(db))
    logs = [tmp_path / "a.log", tmp_path / "b.log"]
    procs = [_start(tmp_path, run_id, log) for run_id, log in zip(("a", "b"), logs, strict=True)]
    try:
        _wait_for(lambda: all("is held by" in log.read_text() for log in logs) or any(p.poll() is not None for p in procs),
                  240, "both runs waiting for the DuckDB file")
        assert all(p.poll() is None for p in procs), [log.read_text()[-2000:] for log in logs]
        for log in logs:
            assert f"{db} is held by PID {os.getpid()}" in log.read_text()
    finally:
        holder.close()
    codes = [p.wait(240) for p in procs]
    assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT run_id, count(*), count(DISTINCT case_id) FROM cases GROUP BY run_id ORDER BY run_id").fetchall()
    assert [r[0] for r in rows] == ["a", "b"] and rows[0][1:] == rows[1][1:] and rows[0][1] == rows[0][2] >= 3


@pytest.mark.slow
def test_an_ingest_that_waits_in_vain_exits_1_and_says_how_to_load_the_run(cli, tmp_path):
    r = cli("run", *POINT, f"results_dir={tmp_path}", "run_id=kept", "store.ingest=false")
    assert r.returncode == 0, r.stderr[-2000:]
    db = tmp_path / "other.duckdb"
    run_dir = tmp_path / "runs" / "kept"
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "print('held', flush=True); time.sleep(120)", str(db)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        r = cli("ingest", str(run_dir), "--db", str(db), "--wait", "2")
        waited = time.monotonic() - started
    finally:
        holder.kill()
        holder.wait()
    assert r.returncode == 1, r.stderr
    assert f"is held by PID {holder.pid}" in r.stderr and waited >= 2
    assert f"fp8bench ingest {run_dir} --db {db}" in r.stderr
    r = cli("ingest", str(run_dir), "--db", str(db))  # the file is free: the run was kept and loads
    assert r.returncode == 0 and "ingested 1 run(s), 3 case record(s)" in r.stderr, r.stderr


def test_a_negative_wait_is_bad_input(cli, tmp_path):
    r = cli("ingest", str(tmp_path), "--wait", "-1")
    assert r.returncode == 2 and "--wait=-1.0 must be a number of seconds >= 0" in r.stderr
