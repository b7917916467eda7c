"""One value per case: three runs of the same cases in one database, and every page and command shows each
case once, from its latest run (the earlier runs stay in History), checked in headless Chromium."""

import json

import pytest

from fp8bench.core.records import CaseRecord, Metric, ShardWriter, write_manifest
from fp8bench.data import store
from fp8bench.report import build_site
from fp8bench.report.browser import chromium_path

DEVICE = "Planted GPU"
RUNS = [("r1", 1.8e9, 1.0), ("r2", 1.8e9 + 10, 2.0), ("r3", 1.8e9 + 20, 3.0)]
"""(run id, start, factor): every time in run k is k times the first run's; r3 is the one to show."""

pytestmark = pytest.mark.skipif(chromium_path() is None, reason="chromium is not installed (apt-get install chromium)")


def _case(run_id, workload, shape_name, fmt, metrics, shape):
    scaling = "none" if fmt == "bf16" else "current"
    return CaseRecord(run_id=run_id, case_id=f"{workload}.m.{shape_name}.{fmt}.{scaling}.torch", workload=workload,
                      model="m", format=fmt, scaling=scaling, backend="torch", shape_name=shape_name, shape=shape,
                      params={"tokens": 8192}, status="ok", metrics=[Metric.of(k, v) for k, v in metrics.items()],
                      samples={"time_ms": [metrics["time_ms"]] * 3})


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("selection")
    for run_id, started, f in RUNS:
        run_dir = tmp / "runs" / run_id
        write_manifest(run_dir, {"run_id": run_id, "started_at": started, "git_commit": run_id, "git_dirty": False,
                                 "device_name": DEVICE, "config": {}, "measurement": {"version": 4},
                                 "env": {"env_id": "planted", "device_name": DEVICE}})
        gemm = {"m": 8192, "n": 8192, "k": 8192, "role": "fprop"}
        kernels = {"gpu_gemm_ms": 6.0 * f, "gpu_quantize_ms": 0.5 * f, "gpu_attention_ms": 0.0, "gpu_other_ms": 1.0 * f}
        with ShardWriter(run_dir) as w:
            w.write(_case(run_id, "linear", "o", "bf16", {"time_ms": 10.0 * f, "tflops": 100 / f, "gpu_busy_ms": 9.0 * f,
                                                           "peak_mem_bytes": 2**30 * f, **kernels}, {}))
            w.write(_case(run_id, "linear", "o", "e4m3", {"time_ms": 5.0 * f, "tflops": 200 / f, "gpu_busy_ms": 4.5 * f,
                                                           "peak_mem_bytes": 2**29 * f, "speedup_vs_bf16": 2.0,
                                                           **{k: v / 2 for k, v in kernels.items()}}, {}))
            w.write(_case(run_id, "gemm", "fprop_o", "bf16", {"time_ms": 2.0 * f, "tflops": 500 / f}, gemm))
            w.write(_case(run_id, "gemm", "fprop_o", "e4m3", {"time_ms": 1.5 * f, "time_ms_kernel": 1.0 * f,
                                                               "tflops": 700 / f, "tflops_kernel": 1000 / f}, gemm))
    cal = tmp / "calibration"
    cal.mkdir()
    (cal / "planted.json").write_text(json.dumps({
        "device_name": DEVICE, "device_kind": "cuda", "measured_at": 1.8e9, "bf16_tflops": 800.0, "fp8_tflops": 1400.0,
        "copy_gbps": 4000.0}))
    con = store.connect(tmp / "db.duckdb")
    store.ingest(con, [tmp / "runs", cal])
    out = tmp / "site"
    build_site(con, out)
    con.close()
    return out


BARS = "Array.from(document.querySelectorAll('.plot')).map(d => ({type: d._fullData.map(t => t.type), " \
       "traces: d._fullData.map(t => ({name: t.name, y: Array.from(t.y || [])}))}))"


@pytest.mark.slow
def test_bars_show_each_cases_selected_value_not_the_sum_of_its_runs(site, page_text):
    plots = page_text(site, "modules.html", BARS)
    time_bars = [p for p in plots if "bar" in p["type"] and all(" · " in t["name"] for t in p["traces"])]
    assert time_bars, plots
    values = {t["name"]: t["y"] for t in time_bars[0]["traces"]}
    assert values == {"bf16/none · torch": [30.0], "e4m3/current · torch": [15.0]}, values


@pytest.mark.slow
def test_tables_list_each_case_once_with_its_run(site, page_text):
    gemm = page_text(site, "gemm.html")
    table = gemm.split("TFLOPS and speedups")[1]
    assert table.count("m fprop_o") == 1 and "r3" in table and "r1" not in table
    modules = page_text(site, "modules.html")
    waterfall = modules.split("Why not 2x")[1].split("fwd+bwd time")[0]
    assert [line.split("\t")[0] for line in waterfall.splitlines() if "\t" in line].count(
        "linear.m.o.e4m3.current.torch") == 1  # one table row


@pytest.mark.slow
def test_roofline_and_waterfall_commands_list_each_case_once(site, cli):
    db = str(site.parent / "db.duckdb")
    roof = cli("roofline", "--db", db)
    assert roof.returncode == 0 and roof.stdout.count("gemm.m.fprop_o.e4m3.current.torch") == 1 and "r3" in roof.stdout
    fall = cli("waterfall", "--db", db)
    assert fall.returncode == 0 and fall.stdout.count("linear.m.o.e4m3.current.torch") == 1 and "r3" in fall.stdout
