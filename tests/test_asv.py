"""The asv suite: `asv check` and a quick CPU `asv run` on a throwaway results folder (both must pass)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ASV = shutil.which("asv", path=str(Path(sys.executable).parent)) or shutil.which("asv")


@pytest.fixture
def conf(tmp_path_factory):
    """A results and html folder per test: the quick CPU run's results must not join the H200 history's."""
    if ASV is None:
        if os.environ.get("CI"):
            raise RuntimeError("CI must have asv (the dev extra installs it)")
        pytest.skip("asv is not installed (pip install asv)")
    tmp = tmp_path_factory.mktemp("asv")
    cfg = json.loads((ROOT / "asv.conf.json").read_text())
    assert cfg["environment_type"] == "existing" and cfg["launch_method"] == "spawn"
    assert cfg["results_dir"] == "results/asv" and cfg["html_dir"] == "results/site/asv"
    cfg.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks"), results_dir=str(tmp / "results"),
               html_dir=str(tmp / "html"))
    path = tmp / "asv.conf.json"
    path.write_text(json.dumps(cfg))
    return path


def _asv(*args, timeout=900):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([ASV, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)


@pytest.mark.slow
def test_asv_check(conf):
    res = _asv("check", "--python=same", "--config", str(conf))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "No problems found" in res.stdout


@pytest.mark.slow
def test_quick_cpu_asv_run_records_cpu_cases_and_skips_gpu_ones(conf):
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    assert _asv("machine", "--yes", "--machine", "ci-cpu", "--config", str(conf)).returncode == 0
    res = _asv("run", "--python=same", "--quick", "--machine", "ci-cpu", "--set-commit-hash", commit,
               "--config", str(conf))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    [result_file] = [p for p in (conf.parent / "results" / "ci-cpu").glob("*.json") if p.name != "machine.json"]
    results = json.loads(result_file.read_text())["results"]
    values, params = results["suite.FP8Cases.track_time_ms"][0], results["suite.FP8Cases.track_time_ms"][1][0]
    by_case = dict(zip((p.strip("'") for p in params), values, strict=True))
    assert by_case["gemm.tiny.fprop_gate_up.e4m3.current.torch"] > 0
    gpu = by_case["gemm.llama2-7b.fprop_qkv.e4m3.blockwise.torch"]
    assert gpu is None or gpu != gpu  # a GPU case: skipped here (asv records null/NaN)
    sqnr = dict(zip((p.strip("'") for p in params), results["suite.FP8Cases.track_sqnr_db"][0], strict=True))
    assert 25 < sqnr["gemm.tiny.fprop_gate_up.e4m3.current.torch"] < 33


@pytest.mark.slow
def test_committed_h200_history_publishes_and_renders_offline(conf):
    """results/asv/h200 holds real H200 runs of several commits; `asv publish` plus scripts/asv_offline.py
    must give a site that Chromium renders from file:// with no console error and nothing fetched."""
    from fp8bench.report.browser import check_asv_site, chromium_path

    if chromium_path() is None:
        pytest.skip("chromium is not installed")
    h200 = ROOT / "results" / "asv" / "h200"
    commits = {json.loads(p.read_text())["commit_hash"] for p in h200.glob("*.json") if p.name != "machine.json"}
    assert len(commits) >= 3
    results = conf.parent / "results"
    shutil.copytree(h200, results / "h200", dirs_exist_ok=True)
    assert _asv("run", "--python=same", "--bench", "just-discover", "--config", str(conf)).returncode == 0
    # asv publishes a result only under the benchmark version it was recorded with; the committed H200 runs
    # predate measurement version 4, so describe the suite as it was when they were recorded
    recorded = {}
    for p in h200.glob("*.json"):
        data = json.loads(p.read_text())
        if "results" in data:
            column = data["result_columns"].index("version")
            recorded.update({name: row[column] for name, row in data["results"].items()})
    described = json.loads((results / "benchmarks.json").read_text())
    for name, version in recorded.items():
        described[name]["version"] = version
    (results / "benchmarks.json").write_text(json.dumps(described))
    res = _asv("publish", "--config", str(conf))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    html = conf.parent / "html"
    off = subprocess.run([sys.executable, str(ROOT / "scripts" / "asv_offline.py"), str(html)], capture_output=True,
                         text=True)
    assert off.returncode == 0, off.stdout + off.stderr
    index = json.loads((html / "index.json").read_text())
    assert len(index["revision_to_hash"]) >= 3
    check = check_asv_site(html, "suite.FP8Cases.track_time_ms",
                           "case_id=%27layer.llama2-7b.b2s4096.e4m3.delayed.te%27")
    assert check.errors == [] and check.external_requests == []
    assert check.benchmarks >= 2 and check.graph_drawn


def _edited_copy(tmp_path, commit_prefix, case, factors):
    """results/asv/h200 copied, with `case`'s values in the result of `commit_prefix` scaled per benchmark."""
    dst = tmp_path / "asv" / "h200"
    shutil.copytree(ROOT / "results" / "asv" / "h200", dst)
    [path] = [p for p in dst.glob(f"{commit_prefix}*.json")]
    data = json.loads(path.read_text())
    for bench, factor in factors.items():
        entry = data["results"][f"suite.FP8Cases.{bench}"]
        i = [p.strip("'") for p in entry[1][0]].index(case)
        entry[0][i] *= factor
    path.write_text(json.dumps(data))
    return tmp_path / "asv"


def test_asv_compare_is_direction_aware_and_gates_with_its_exit_code(cli, tmp_path):
    case = "layer.llama2-7b.b2s4096.e4m3.delayed.te"
    same = cli("asv-compare", "a0f323a", "a0f323a", "--results", str(ROOT / "results" / "asv"))
    assert same.returncode == 0 and "0 regression" in same.stdout
    # head 20% slower and its speedup 20% lower: both are regressions (asv compare would call the second better)
    worse = _edited_copy(tmp_path / "w", "a0f323a", case, {"track_time_ms": 1.2, "track_speedup_vs_bf16": 0.8})
    r = cli("asv-compare", "228c534", "a0f323a", "--results", str(worse), "--threshold", "0.1")
    assert r.returncode == 1, r.stdout
    rows = [line for line in r.stdout.splitlines() if "regression" in line and "layer.llama2-7b.b2s4096" in line]
    assert len(rows) == 2, r.stdout
    better = _edited_copy(tmp_path / "b", "a0f323a", case, {"track_time_ms": 0.8, "track_speedup_vs_bf16": 1.25})
    r = cli("asv-compare", "228c534", "a0f323a", "--results", str(better), "--threshold", "0.1", "--all")
    lines = [line for line in r.stdout.splitlines() if "layer.llama2-7b.b2s4096" in line and "improvement" in line]
    assert len(lines) >= 2, r.stdout
    bad = cli("asv-compare", "228c534", "nope", "--results", str(ROOT / "results" / "asv"))
    assert bad.returncode == 2 and "recorded commits" in bad.stderr and "Traceback" not in bad.stderr
