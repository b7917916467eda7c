"""Runs are crash-safe: records are fsync'ed per case, failures are isolated, SIGKILL + resume loses nothing."""

import json
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from fp8bench.config.compose import expand
from fp8bench.core.hardware import detect_device
from fp8bench.core.records import read_run
from fp8bench.run.plan import plan
from fp8bench.run.runner import execute

ROOT = Path(__file__).resolve().parents[1]

SWEEP = ["sweep=quick", "model=tiny", "workload=gemm", "backend=emulated"]


@pytest.mark.slow
def test_failure_is_recorded_and_the_sweep_goes_on(tmp_path):
    points, _ = expand(["workload=gemm", "backend=torch", "workload.linears=[qkv,o]", "fail_on=fprop_o",
                        "measure.iters=3", f"results_dir={tmp_path}"])
    records = execute(plan(points), tmp_path / "r", "r", detect_device(), progress=False)
    by_status = {r.case_id: r for r in records}
    failed = [r for r in records if r.status == "failed"]
    # the fault is the shape's: the recipe's case and the BF16 twin it is timed beside both fail
    assert sorted(r.case_id for r in failed) == ["gemm.tiny.fprop_o.bf16.none.torch",
                                                 "gemm.tiny.fprop_o.e4m3.current.torch"]
    assert all("injected failure" in r.reason for r in failed)
    assert by_status["gemm.tiny.wgrad_o.e4m3.current.torch"].status == "ok"
    assert by_status["gemm.tiny.wgrad_o.bf16.none.torch"].status == "ok"
    assert len(records) == 12  # 6 E4M3 GEMMs and their 6 twins


@pytest.mark.slow
def test_every_ok_case_has_time_samples_and_numerics(tmp_path):
    points, _ = expand(["sweep=quick", "model=tiny", "workload=gemm", "backend=torch", "workload.linears=[o]",
                        f"results_dir={tmp_path}"])
    records = execute(plan(points), tmp_path / "r", "r", detect_device(), progress=False)
    ok = [r for r in records if r.status == "ok"]
    assert len(ok) == 5 * 3  # bf16 + e4m3/hybrid × current/rowwise, 3 GEMMs each (blockwise needs sm_90)
    for r in ok:
        assert r.metric("time_ms") > 0 and len(r.samples["time_ms"]) >= 3
        assert r.metric("sqnr_db") is not None and r.metric("rel_err") is not None
        if r.format != "bf16":
            assert r.metric("sqnr_vs_emulated_db") >= 35.0
    bf16 = [r.metric("sqnr_db") for r in ok if r.format == "bf16"]
    e4m3 = [r.metric("sqnr_db") for r in ok if (r.format, r.scaling) == ("e4m3", "current")]
    assert min(bf16) > 40.0 and all(25.0 < s < 33.0 for s in e4m3)


def _shard_lines(run_dir: Path) -> list[str]:
    return [line for p in run_dir.glob("shard-*.jsonl") for line in p.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_sigkill_midway_then_resume_records_every_case_once(tmp_path, cli, cli_process):
    run_dir = tmp_path / "runs" / "killed"
    proc = cli_process("run", *SWEEP, "run_id=killed", f"results_dir={tmp_path}", "store.ingest=false")
    deadline = time.time() + 120
    while time.time() < deadline and (not run_dir.exists() or len(_shard_lines(run_dir)) < 25):
        time.sleep(0.05)
    proc.kill()  # SIGKILL
    proc.join()
    before = len(_shard_lines(run_dir))
    points, _ = expand(SWEEP)
    total = len(plan(points))
    assert 25 <= before < total, f"kill landed at {before} of {total}"

    res = cli("run", *SWEEP, "resume=killed", f"results_dir={tmp_path}")
    assert res.returncode == 0, res.stderr
    assert f"{before} cases already recorded" in res.stderr or f"{before - 1} cases already recorded" in res.stderr

    ids = [json.loads(line)["case_id"] for line in _shard_lines(run_dir) if line.endswith("}")]
    assert len(ids) == len(set(ids)) == total  # every case exactly once across both shards
    con = duckdb.connect(str(tmp_path / "fp8bench.duckdb"), read_only=True)
    rows = con.execute("SELECT count(*), count(DISTINCT case_id) FROM cases WHERE run_id = 'killed'").fetchone()
    assert rows == (total, total)
    _, records, _ = read_run(run_dir)
    assert len(records) == total


@pytest.mark.slow
def test_hydra_multirun_jobs_share_one_run_and_ingest_together(tmp_path, cli):
    res = cli("run", "-m", "workload=gemm", "model=tiny", "format=bf16,e4m3", "scaling=none,current",
              "backend=emulated,torch", "workload.linears=[o]", "measure.iters=3", f"results_dir={tmp_path}")
    assert res.returncode == 0, res.stderr[-2000:]
    [run_dir] = (tmp_path / "runs").iterdir()
    shards = sorted(p.name for p in run_dir.glob("shard-*.jsonl"))
    # 8 points, 4 impossible pairs dropped; one job per twin group (a backend's recipes and their twins)
    assert len(shards) == 2 and all("-job" in s for s in shards)
    con = duckdb.connect(str(tmp_path / "fp8bench.duckdb"), read_only=True)
    assert con.execute("SELECT count(DISTINCT run_id), count(*) FROM cases").fetchone() == (1, 12)


def test_the_git_commit_can_be_given_where_the_checkout_cannot_say(monkeypatch, tmp_path):
    from fp8bench.core.hardware import git_state

    commit, _ = git_state()
    assert commit and len(commit) == 40  # this checkout's own HEAD
    monkeypatch.setenv("FP8BENCH_GIT_COMMIT", "0123abcd" * 5)
    assert git_state() == ("0123abcd" * 5, False)
    monkeypatch.setenv("FP8BENCH_GIT_DIRTY", "1")
    assert git_state(str(tmp_path)) == ("0123abcd" * 5, True)


@pytest.mark.slow
def test_without_a_terminal_progress_is_plain_lines_and_the_run_prints_its_wall_time(tmp_path):
    """A batch job's log (CI, a GPU box): the live bar draws nothing there, so progress comes as lines with
    done/total, statuses, elapsed time and an ETA, at a steady pace, and the last one when the run ends."""
    code = ("import sys, fp8bench.run.runner as r; r.PLAIN_PROGRESS_EVERY_S = 0.0; "  # every case: a short run shows it
            "from fp8bench.cli import main; sys.exit(main(sys.argv[1:]))")
    res = subprocess.run([sys.executable, "-c", code, "run", *SWEEP, "workload.linears=[o]", f"results_dir={tmp_path}",
                          "store.ingest=false"], cwd=ROOT, capture_output=True, text=True, timeout=300)  # no terminal
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [line for line in res.stderr.splitlines() if line.startswith("run ") and " cases (" in line]
    total = len(plan(expand([*SWEEP, "workload.linears=[o]"])[0]))
    assert len(lines) == total and f" {total}/{total} cases (ok " in lines[-1]
    assert "elapsed" in lines[-1] and any("ETA" in line for line in lines)
    assert f"{total} cases (ok {total})" in res.stdout and "wall time" in res.stdout
