"""Launchers: sweep jobs in separate processes (submitit's local executor) ingest as one run; each parallel
worker claims its own GPU; the SLURM launcher config composes."""

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from fp8bench.config.compose import conf_dir, register_schema
from fp8bench.core.records import read_shard

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_local_processes_launcher_runs_each_job_in_its_own_process_one_after_another_and_ingests_every_job(cli, tmp_path):
    # two twin groups (a workload's E4M3 cases and their BF16 twins): two jobs
    r = cli("run", "-m", "workload=gemm,linear", "model=tiny", "backend=torch", "format=e4m3", "scaling=current",
            "workload.linears=[o]", "workload.roles=[fprop,dgrad]", "hydra/launcher=local-processes",
            f"results_dir={tmp_path}", "run_id=proc", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    shards = sorted((tmp_path / "runs" / "proc").glob("shard-*.jsonl"))
    pids = {s.name.split("-")[2] for s in shards}
    assert len(shards) == 2 and len(pids) == 2 and str(os.getpid()) not in pids  # two processes, neither this one
    # one after another: a job's cases all end before the next job's first case starts (submitit's local
    # executor, given the sweep as one array, started every job at once)
    spans = sorted((min(r.started_at for r in recs), max(r.started_at + r.duration_s for r in recs))
                   for recs in (read_shard(s)[0] for s in shards))
    assert all(end <= next_start for (_, end), (next_start, _) in itertools.pairwise(spans)), spans
    con = duckdb.connect(str(tmp_path / "fp8bench.duckdb"), read_only=True)
    rows = con.execute("SELECT count(*), count(DISTINCT case_id), count(*) FILTER (WHERE status = 'ok') "
                       "FROM cases WHERE run_id = 'proc'").fetchone()
    assert rows == (6, 6, 6)  # (2 GEMMs + 1 linear) x (E4M3, its twin), nothing lost or duplicated


@pytest.mark.slow
@pytest.mark.parametrize("devices", ["3,5", None])
def test_a_local_processes_job_sees_the_launching_process_gpus_and_can_import_the_launcher(tmp_path, monkeypatch,
                                                                                          devices):
    """submitit's controller sets a job's CUDA_VISIBLE_DEVICES from gpus_per_node (the preset's 0: "", no GPU);
    the launcher's setup lines give the job the launching process's, or unset it as it was, and put the plugin
    folder on the job's PYTHONPATH (the job unpickles the launcher by its hydra_plugins name)."""
    import submitit

    register_schema()  # puts fp8bench's hydra_plugins folder on sys.path, as `fp8bench run` does
    from hydra_plugins.fp8bench_launchers.local_processes import job_setup

    if devices is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", devices)

    def seen():
        import importlib.util

        return os.environ.get("CUDA_VISIBLE_DEVICES"), importlib.util.find_spec("hydra_plugins.fp8bench_launchers.local_processes") is not None

    executor = submitit.AutoExecutor(cluster="local", folder=tmp_path / "jobs")
    executor.update_parameters(gpus_per_node=0, timeout_min=1, local_setup=job_setup(dict(os.environ)))
    assert executor.submit(seen).result() == (devices, True)


_PIN = """
import sys, time
from pathlib import Path
from fp8bench.run.launch import pin_worker_gpu
try:
    print(pin_worker_gpu(), flush=True)
except RuntimeError as exc:
    print("error:", exc, flush=True)
    sys.exit(0)
while not Path(sys.argv[1]).exists():
    time.sleep(0.05)
"""


@pytest.mark.slow
def test_each_worker_process_claims_its_own_gpu(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="3,5", TMPDIR=str(tmp_path))
    stop = tmp_path / "stop"
    procs = []
    try:
        lines = []
        for _ in range(3):
            p = subprocess.Popen([sys.executable, "-c", _PIN, str(stop)], env=env, stdout=subprocess.PIPE, text=True)
            procs.append(p)
            lines.append(p.stdout.readline().strip())
        assert sorted(lines[:2]) == ["3", "5"]  # two workers, two GPUs, each its own
        assert lines[2].startswith("error: all 2 GPUs")  # a third cannot share one
    finally:
        stop.touch()
        for p in procs:
            p.wait(timeout=30)
    # a worker that exits releases its GPU for the next one
    again = subprocess.run([sys.executable, "-c", _PIN, str(stop)], env=env, capture_output=True, text=True)
    assert again.stdout.strip() in ("3", "5")


def test_one_gpu_or_none_needs_no_pinning(monkeypatch):
    from fp8bench.core.hardware import gpu_count
    from fp8bench.run.launch import pin_worker_gpu

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert pin_worker_gpu() is None and gpu_count() == 1


SLURM_LAUNCHER = "hydra_plugins.fp8bench_launchers.slurm.SlurmSweepLauncher"


def test_slurm_launcher_config_composes_with_one_gpu_per_task():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"],
                      return_hydra_config=True)
    GlobalHydra.instance().clear()
    launcher = cfg.hydra.launcher
    assert launcher._target_ == SLURM_LAUNCHER
    assert (launcher.gpus_per_node, launcher.tasks_per_node, launcher.partition) == (1, 1, "gpu")


def test_slurm_cpu_launcher_config_asks_for_one_core_and_no_gpu():
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register_schema()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hydra/launcher=slurm-cpu", "results_dir=/shared/x"],
                      return_hydra_config=True)
    GlobalHydra.instance().clear()
    launcher = cfg.hydra.launcher
    assert launcher._target_ == SLURM_LAUNCHER and launcher.name == "fp8bench"
    assert (launcher.gpus_per_node, launcher.cpus_per_task, launcher.mem_gb, launcher.partition) == (None, 1, 2, None)
    assert launcher.submitit_folder == "/shared/x/hydra/.submitit/%j"  # the jobs' logs sit beside the results


def test_longest_first_orders_by_history_and_keeps_declaration_order_without_it():
    from fp8bench.run.launch import longest_first

    assert longest_first([None, None, None]) == [0, 1, 2]
    assert longest_first([2.0, None, 9.0, 1.0]) == [2, 1, 0, 3]  # the unknown job counts as the mean, 4.0


def _history_record(case_id, workload, fmt, scaling, seconds, started):
    from fp8bench.core.records import CaseRecord

    return CaseRecord(run_id="before", case_id=case_id, workload=workload, model="tiny", format=fmt, scaling=scaling,
                      backend="torch", shape_name="fprop_o", shape={}, status="ok", started_at=started,
                      duration_s=seconds).to_json()


@pytest.mark.slow
def test_local_gpus_launcher_hands_out_the_longest_job_first(cli, tmp_path):
    """A previous run says the linear workload's twin group took longest (the later of a case's two records
    counts): this sweep runs it first, where Hydra's declaration order would have run it second."""
    old = tmp_path / "runs" / "before"
    old.mkdir(parents=True)
    (old / "shard-1-1-job0.jsonl").write_text("\n".join([
        _history_record("gemm.tiny.fprop_o.bf16.none.torch", "gemm", "bf16", "none", 5.0, 1.0),
        _history_record("linear.tiny.o.e4m3.current.torch", "linear", "e4m3", "current", 0.5, 1.0),
        _history_record("linear.tiny.o.e4m3.current.torch", "linear", "e4m3", "current", 30.0, 2.0),
        '{"torn": '])  # a crashed job's last line is skipped
    )
    r = cli("run", "-m", "workload=gemm,linear", "model=tiny", "backend=torch", "format=e4m3", "scaling=current",
            "workload.linears=[o]", "workload.roles=[fprop]", "hydra/launcher=local-gpus", f"results_dir={tmp_path}",
            "run_id=lpt", "store.ingest=false", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    jobs, started = {}, {}  # a shard is named by its twin group (declaration order); when it ran, by its records
    for shard in (tmp_path / "runs" / "lpt").glob("shard-*.jsonl"):
        for line in shard.read_text().splitlines():
            rec = json.loads(line)
            jobs.setdefault(rec["workload"], set()).add(shard.stem.rsplit("-", 1)[1])
            started[rec["workload"]] = min(started.get(rec["workload"], rec["started_at"]), rec["started_at"])
    assert jobs == {"gemm": {"job0"}, "linear": {"job1"}}
    assert started["linear"] < started["gemm"]


def test_job_seconds_come_from_each_cases_latest_run_and_skip_a_torn_line(tmp_path):
    import dataclasses
    import json

    from omegaconf import OmegaConf

    from fp8bench.config.compose import expand
    from fp8bench.core.records import CaseRecord, ShardWriter
    from fp8bench.run.launch import job_seconds_from_history

    groups = [[dataclasses.asdict(p) for p in expand(["workload=gemm", "model=tiny", f"format={fmt}",
                                                      f"scaling={sc}", "backend=torch"])[0]]
              for fmt, sc in (("e4m3", "current"), ("bf16", "none"), ("hybrid", "current"))]
    (tmp_path / "runs" / "cur").mkdir(parents=True)
    (tmp_path / "runs" / "cur" / "plan.json").write_text(json.dumps({"groups": groups}))

    def job(index):  # a job's config names its run and its twin group (fp8bench run -m)
        return OmegaConf.create({"results_dir": str(tmp_path), "run_id": "cur", "job_group": index})

    def record(run, case, started, seconds, fmt="e4m3", sc="current"):
        return CaseRecord(run_id=run, case_id=case, workload="gemm", model="tiny", format=fmt, scaling=sc,
                          backend="torch", shape_name="s", shape={}, status="ok", started_at=started,
                          duration_s=seconds)
    old = ShardWriter(tmp_path / "runs" / "old")
    for rec in (record("old", "a", 1.0, 5.0), record("old", "b", 1.0, 2.0),
                record("old", "c", 1.0, 1.0, "bf16", "none")):
        old.write(rec)
    new = ShardWriter(tmp_path / "runs" / "new")
    new.write(record("new", "a", 2.0, 3.0))  # a's latest run replaces its older time; b keeps its own
    with open(new.path, "a") as f:
        f.write('{"run_id": "new", "case_id": "b", "dur')  # a crashed job's torn last line
    seconds = job_seconds_from_history([job(0), job(1), job(2)])
    assert seconds == [3.0 + 2.0, 1.0, None]


WITHOUT_HYDRA_LAUNCHER_PLUGINS = """
import sys
# as on a GPU box given only what a run needs: neither Hydra's joblib nor its submitit launcher is installed
sys.modules["hydra_plugins.hydra_joblib_launcher"] = None
sys.modules["hydra_plugins.hydra_submitit_launcher"] = None
from fp8bench.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_sweep_runs_without_the_launcher_plugins_and_choosing_one_is_a_clear_error(tmp_path):
    """A box without hydra-joblib-launcher or hydra-submitit-launcher runs `-m` sweeps with Hydra's basic
    launcher; choosing a launcher built on a missing plugin exits 2 naming the package and the launchers that
    do run there, with no traceback."""
    sweep = ["run", "-m", "workload=gemm", "model=tiny", "backend=torch", "format=e4m3", "scaling=current",
             "workload.roles=[fprop]", "workload.linears=[o]", f"results_dir={tmp_path}", "store.ingest=false"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}

    def run(*extra):
        return subprocess.run([sys.executable, "-c", WITHOUT_HYDRA_LAUNCHER_PLUGINS, *sweep, *extra], cwd=ROOT,
                              env=env, capture_output=True, text=True, timeout=600)

    ok = run("run_id=basic")
    assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
    assert len(list((tmp_path / "runs" / "basic").glob("shard-*.jsonl"))) == 1
    assert "Error importing" not in ok.stderr  # Hydra's plugin scan says nothing a run needs
    bad = run("run_id=gpus", "hydra/launcher=local-gpus")
    said = bad.stdout + bad.stderr
    assert bad.returncode == 2 and "Traceback" not in said, said[-2000:]
    assert "hydra/launcher=local-gpus needs hydra-joblib-launcher" in said
    assert "launchers that run here: ['basic']" in " ".join(said.split())
    assert not (tmp_path / "runs" / "gpus").exists() or not list((tmp_path / "runs" / "gpus").glob("shard-*"))


def test_only_choosing_a_launcher_whose_plugin_is_missing_is_an_error(monkeypatch):
    from fp8bench.config import compose
    from fp8bench.config.schema import ConfigError

    monkeypatch.setattr(compose, "_MISSING_PLUGINS", {"hydra_plugins.fp8bench_launchers.local_gpus":
                                                      "hydra_plugins.hydra_joblib_launcher"})
    for fine in (["~hydra/launcher"], ["hydra.launcher.n_jobs=2"], ["hydra/launcher=local-processes"], [],
                 ["sweep=hopper", "model=tiny,gpt-125m"]):
        compose.chosen_launcher_missing(fine)
    for chosen in (["hydra/launcher=local-gpus"], ["+hydra/launcher=local-gpus"],
                   ["hydra/launcher=slurm", "hydra/launcher=local-gpus"]):
        with pytest.raises(ConfigError, match=r"hydra/launcher=local-gpus needs hydra-joblib-launcher, .*pip install "
                                              r"hydra-joblib-launcher\); launchers that run here: \['local-processes', "
                                              r"'slurm-cpu', 'slurm', 'basic'\]"):
            compose.chosen_launcher_missing(chosen)
