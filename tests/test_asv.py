"""The asv suite: `asv check`; `asv continuous` building two commits of a scratch clone into their own
environments (asv_plugins/fp8bench_env.py) and failing on a planted slowdown; `make publish`'s script
writing a gh-pages branch that Chromium renders offline; the committed H200 history's asv site; the
direction-aware `fp8bench asv-compare`."""

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ASV = shutil.which("asv", path=str(Path(sys.executable).parent)) or shutil.which("asv")


@pytest.fixture(scope="module")
def asv_env(tmp_path_factory):
    """The environment every asv command here runs in: a HOME of its own, so that asv's machine file
    (~/.asv-machine.json) holds one machine, ci-cpu, whatever the user's own file holds (asv picks the only
    entry there when no --machine is given, and refuses when there are several)."""
    if ASV is None:
        pytest.skip("asv is not installed (pip install asv)")
    home = tmp_path_factory.mktemp("asv-home")
    env = dict(os.environ, PYTHONUNBUFFERED="1", HOME=str(home))
    assert subprocess.run([ASV, "machine", "--yes", "--machine", "ci-cpu"], cwd=ROOT, env=env,
                          capture_output=True).returncode == 0
    return env


@pytest.fixture
def conf(tmp_path_factory, asv_env):
    """A results and html folder per test: the quick CPU run's results must not join the H200 history's."""
    if ASV is None:
        if os.environ.get("CI"):
            raise RuntimeError("CI must have asv (the dev extra installs it)")
        pytest.skip("asv is not installed (pip install asv)")
    tmp = tmp_path_factory.mktemp("asv")
    cfg = json.loads((ROOT / "asv.conf.json").read_text())
    assert cfg["environment_type"] == "derived" and cfg["launch_method"] == "forkserver"
    assert cfg["results_dir"] == "results/asv" and cfg["html_dir"] == "results/site/asv"
    cfg.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks"), results_dir=str(tmp / "results"),
               html_dir=str(tmp / "html"))
    path = tmp / "asv.conf.json"
    path.write_text(json.dumps(cfg))
    shutil.copytree(ROOT / "asv_plugins", tmp / "asv_plugins")  # asv imports plugins beside its config
    return path


def _asv(env, *args, timeout=900):
    return subprocess.run([ASV, *args], capture_output=True, text=True, cwd=ROOT, env=env, timeout=timeout)


@pytest.mark.slow
def test_asv_check(conf, asv_env):
    res = _asv(asv_env, "check", "--python=same", "--config", str(conf))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "No problems found" in res.stdout


def _git(repo, *args):
    return subprocess.run(["git", "-c", "user.name=fp8bench-test", "-c", "user.email=test@fp8bench", *args],
                          cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def gated_clone(tmp_path_factory, asv_env):
    """A clone of this repository's HEAD plus one commit that sets the test-only slowdown knob (torch's every
    timed iteration 50% longer) in the CPU suite's preset, and `asv continuous HEAD~1 HEAD` run in it as
    the Makefile's asv-gate runs it (its ASV_GATE series; --quick: each case is measured once anyway)."""
    clone = tmp_path_factory.mktemp("gate") / "repo"
    subprocess.run(["git", "clone", "--quiet", str(ROOT), str(clone)], check=True)
    preset = clone / "conf" / "sweep" / "asv-cpu.yaml"
    preset.write_text(preset.read_text() + 'slowdown: "torch:0.5"\n')
    _git(clone, "commit", "--quiet", "-am", "plant a 50% slowdown of the torch backend in the CPU suite")
    gate = re.search(r"^ASV_GATE := (.+)$", (ROOT / "Makefile").read_text(), re.M).group(1)
    env = asv_env
    start = time.monotonic()
    res = subprocess.run([ASV, "continuous", "--machine", "ci-cpu", "--bench", gate, "--factor", "1.1", "--quick",
                          "--show-stderr", "HEAD~1", "HEAD"], cwd=clone, env=env, capture_output=True, text=True,
                         timeout=1200)
    print(f"asv continuous HEAD~1 HEAD: {time.monotonic() - start:.0f} s, exit {res.returncode}")
    return clone, res


def _recorded(clone, commit):
    """{benchmark: {case: value}} asv recorded for `commit` on machine ci-cpu."""
    [path] = [p for p in (clone / "results" / "asv" / "ci-cpu").glob(f"{commit[:8]}-*.json")]
    out = {}
    for name, entry in json.loads(path.read_text())["results"].items():
        out[name.split(".")[-1]] = dict(zip((p.strip("'") for p in entry[1][0]), entry[0], strict=True))
    return out


@pytest.mark.slow
def test_asv_continuous_builds_both_commits_offline_and_fails_on_a_planted_slowdown(gated_clone):
    clone, res = gated_clone
    assert res.returncode != 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "PERFORMANCE DECREASED" in res.stdout
    assert "Installing" in res.stdout  # each commit installed into the derived environment, not the tree
    base, head = _git(clone, "rev-parse", "HEAD~1"), _git(clone, "rev-parse", "HEAD")
    before, after = _recorded(clone, base), _recorded(clone, head)
    assert set(before) == set(after) == {"track_time_ms", "track_time_vs_bf16", "track_noise_power",
                                         "track_peak_mem_bytes"}
    case = "gemm.tiny.fprop_gate_up.e4m3.current.torch"
    # Both commits recorded every CPU case, and the planted commit's are slower than asv's 10% factor for most
    # of them. Single CPU cases on a shared two-core machine are noisy: one read only +19% in a CI run at
    # 50a2709, and a stricter form of this check (every case slower, median above +20%) failed once unexplained.
    ratios = [after["track_time_ms"][c] / t for c, t in before["track_time_ms"].items() if t is not None and t > 0]
    assert len(ratios) >= 10 and statistics.median(ratios) > 1.1, ratios
    gpu = before["track_time_ms"]["gemm.llama2-7b.fprop_qkv.e4m3.blockwise.torch"]
    assert gpu is None or gpu != gpu  # a GPU case: skipped here (asv records null/NaN)
    # noise power 10^(-SQNR/10) of an E4M3 GEMM: SQNR between 25 and 33 dB, unchanged by the slowdown
    noise = before["track_noise_power"][case]
    assert 10 ** -3.3 < noise < 10 ** -2.5 and after["track_noise_power"][case] == pytest.approx(noise)


@pytest.mark.slow
def test_publish_writes_a_gh_pages_branch_that_renders_offline(gated_clone, asv_env, tmp_path):
    from fp8bench.report.browser import check_asv_site, check_site, chromium_path

    if chromium_path() is None:
        pytest.skip("chromium is not installed")
    clone, _ = gated_clone
    status = _git(clone, "status", "--porcelain")  # asv continuous refreshed results/asv/benchmarks.json
    res = subprocess.run([sys.executable, "scripts/publish.py"], cwd=clone, capture_output=True, text=True,
                         env=asv_env, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert _git(clone, "log", "-1", "--format=%s", "gh-pages") == f"fp8bench site at {_git(clone, 'rev-parse', '--short', 'HEAD')}"
    assert _git(clone, "status", "--porcelain") == status  # publishing leaves the working tree and index alone
    site = tmp_path / "gh-pages"
    site.mkdir()
    archive = subprocess.run(["git", "archive", "gh-pages"], cwd=clone, capture_output=True, check=True).stdout
    subprocess.run(["tar", "x", "-C", str(site)], input=archive, check=True)
    assert (site / ".nojekyll").is_file() and (site / "asv" / "index.html").is_file()
    checks = check_site(site)
    assert {c.page for c in checks} >= {"index.html", "history.html", "runs.html"}
    for c in checks:
        assert c.errors == [] and c.external_requests == [] and c.broken_links == [], c
    assert 'href="asv/index.html"' in (site / "index.html").read_text()  # asv's site is in the navigation
    asv = check_asv_site(site / "asv", "suite.FP8Cases.track_time_ms",
                         "case_id=%27gemm.tiny.fprop_gate_up.e4m3.current.torch%27")
    assert asv.errors == [] and asv.external_requests == [] and asv.graph_drawn


@pytest.mark.slow
def test_committed_h200_history_publishes_and_renders_offline(conf, asv_env):
    """results/asv/h200 holds the suite's H200 history: `asv continuous` and `asv run` through the derived
    environment, one result file per commit. `asv publish` plus scripts/asv_offline.py must give a site whose
    graphs hold three or more H200 commits of the suite as it is now, rendered by Chromium from file:// with no
    console error and nothing fetched. (Results of an older measurement version stay committed; asv shows a
    result only under the benchmark version it was recorded with, so they are not drawn.)"""
    from fp8bench.report.browser import check_asv_site, chromium_path

    if chromium_path() is None:
        pytest.skip("chromium is not installed")
    h200 = ROOT / "results" / "asv" / "h200"
    results = conf.parent / "results"
    shutil.copytree(h200, results / "h200", dirs_exist_ok=True)
    assert _asv(asv_env, "run", "--python=same", "--bench", "just-discover", "--config", str(conf)).returncode == 0
    version = json.loads((results / "benchmarks.json").read_text())["suite.FP8Cases.track_time_ms"]["version"]
    current = set()
    for p in h200.glob("*.json"):
        data = json.loads(p.read_text())
        if "results" in data:
            column = data["result_columns"].index("version")
            if {row[column] for row in data["results"].values()} == {version}:
                current.add(data["commit_hash"])
    assert len(current) >= 3, f"{len(current)} H200 commits of {version}"
    res = _asv(asv_env, "publish", "--config", str(conf))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    html = conf.parent / "html"
    off = subprocess.run([sys.executable, str(ROOT / "scripts" / "asv_offline.py"), str(html)], capture_output=True,
                         text=True)
    assert off.returncode == 0, off.stdout + off.stderr
    index = json.loads((html / "index.json").read_text())
    graph = json.loads((html / "graphs" / "branch-main" / "machine-h200" / "python-3.12" /
                        "suite.FP8Cases.track_time_ms.json").read_text())
    drawn = {index["revision_to_hash"][str(rev)] for rev, values in graph if any(v == v for v in values if v)}
    assert drawn == current, (sorted(drawn), sorted(current))
    case = "case_id=%27layer.llama2-7b.b2s4096.e4m3.delayed.te%27"
    check = check_asv_site(html, "suite.FP8Cases.track_time_ms", case)
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


@pytest.mark.slow
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
