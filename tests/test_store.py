"""DuckDB store: idempotent ingest, corrupt shards reported and skipped, Parquet round trip, storage version."""

import json

import duckdb
import pytest

from fp8bench.core.records import CaseRecord, Metric, ShardWriter, write_manifest
from fp8bench.data import store


def _record(run_id, case_id, fmt="e4m3", t=1.0, backend="torch", status="ok"):
    twin = case_id if fmt == "bf16" else case_id.replace(f".{fmt}.current.", ".bf16.none.")
    return CaseRecord(run_id=run_id, case_id=case_id, twin_id=twin, workload="gemm", model="tiny", format=fmt,
                      scaling="none" if fmt == "bf16" else "current", backend=backend, shape_name=case_id.split(".")[2],
                      shape={"m": 1}, params={"tokens": 16}, status=status,
                      metrics=[Metric.of("time_ms", t), Metric.of("sqnr_db", 30.0)],
                      samples={"time_ms": [t, t * 1.1, t * 0.9]})


def _make_run(tmp_path, run_id="r1"):
    run_dir = tmp_path / "runs" / run_id
    write_manifest(run_dir, {"run_id": run_id, "started_at": 1.7e9, "git_commit": "abc", "git_dirty": False,
                             "device_name": "cpu", "env": {"env_id": "e1", "device_name": "cpu"}, "config": {}})
    with ShardWriter(run_dir) as w:
        w.write(_record(run_id, "gemm.tiny.fprop_o.bf16.none.torch", "bf16", 2.0))
        w.write(_record(run_id, "gemm.tiny.fprop_o.e4m3.current.torch", "e4m3", 1.0))
        w.write(_record(run_id, "gemm.tiny.fprop_o.e4m3.current.emulated", "e4m3", 5.0, backend="emulated"))
    return run_dir


def _counts(con):
    return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in store.TABLES}


def test_ingest_is_idempotent_and_derives_speedup(tmp_path):
    run_dir = _make_run(tmp_path)
    con = store.connect(tmp_path / "db.duckdb")
    store.ingest(con, [tmp_path])
    first = _counts(con)
    store.ingest(con, [run_dir])
    assert _counts(con) == first
    assert first["cases"] == 3 and first["samples"] == 9 and first["runs"] == 1
    speedups = con.execute("SELECT case_id, value FROM measurements WHERE metric='speedup_vs_bf16'").fetchall()
    assert speedups == [("gemm.tiny.fprop_o.e4m3.current.torch", 2.0)]  # the emulator gets none


def test_fp8_all_gather_speedup_is_against_bf16_fsdp2_on_as_many_gpus():
    from fp8bench.core.records import derive_speedups

    def train(fmt, shape_name, t):
        scaling = "none" if fmt == "bf16" else "current"
        twin = f"train.gpt.{shape_name.removesuffix('fp8ag')}.bf16.none.torchao"
        return CaseRecord(run_id="r", case_id=f"train.gpt.{shape_name}.{fmt}.{scaling}.torchao", twin_id=twin,
                          workload="train",
                          model="gpt", format=fmt, scaling=scaling, backend="torchao", shape_name=shape_name,
                          shape={}, status="ok", metrics=[Metric.of("time_ms", t)])

    records = [train("bf16", "b8.seed0", 1.0), train("bf16", "b8.seed0.fsdp2x2", 4.0),
               train("hybrid", "b8.seed0.fsdp2x2", 5.0), train("hybrid", "b8.seed0.fsdp2x2fp8ag", 8.0)]
    got = {r.shape_name: m[0].value for r, m, _ in derive_speedups(records)}
    assert got == {"b8.seed0.fsdp2x2": 0.8, "b8.seed0.fsdp2x2fp8ag": 0.5}


def test_corrupt_and_truncated_shards_are_reported_and_skipped(tmp_path):
    run_dir = _make_run(tmp_path)
    (run_dir / "shard-garbage.jsonl").write_bytes(b"\x00\xff not json\n")
    good = _record("r1", "gemm.tiny.fprop_qkv.e4m3.current.torch").to_json()
    (run_dir / "shard-truncated.jsonl").write_text(good + "\n" + good[: len(good) // 2])
    con = store.connect(tmp_path / "db.duckdb")
    rep = store.ingest(con, [tmp_path])
    assert len(rep.problems) == 2
    assert {p.path.split("/")[-1] for p in rep.problems} == {"shard-garbage.jsonl", "shard-truncated.jsonl"}
    assert _counts(con)["cases"] == 4


def test_missing_path_is_a_store_error(tmp_path):
    con = store.connect(tmp_path / "db.duckdb")
    with pytest.raises(store.StoreError, match="does not exist"):
        store.ingest(con, [tmp_path / "nope"])


def test_parquet_export_round_trip(tmp_path):
    _make_run(tmp_path)
    con = store.connect(tmp_path / "a.duckdb")
    store.ingest(con, [tmp_path / "runs"])
    files = store.export(con, ["r1"], tmp_path / "export")
    assert {f.name for f in files} == {f"{t}.parquet" for t in store.TABLES}
    con2 = store.connect(tmp_path / "b.duckdb")
    store.ingest(con2, [tmp_path / "export"])
    rep = store.ingest(con2, [tmp_path / "export"])
    assert _counts(con2) == _counts(con)
    assert (rep.runs, rep.cases) == (["r1"], 3)  # an export's case records are counted as a run folder's are
    config = con2.execute("SELECT config FROM runs").fetchone()[0]
    assert json.loads(config) == {}


def test_storage_version_is_pinned_for_duckdb_1_4(tmp_path):
    con = store.connect(tmp_path / "db.duckdb")
    assert store.storage_version(con) == "v1.4.0+"
    con.close()
    raw = duckdb.connect(str(tmp_path / "db.duckdb"), read_only=True)
    tags = raw.execute("SELECT tags FROM duckdb_databases() WHERE NOT internal AND path IS NOT NULL").fetchone()[0]
    assert tags["storage_version"].startswith("v1.4.0")


def test_a_later_skip_never_overwrites_a_measured_case(tmp_path):
    """Two sweep points mapping to one case id (jobs of a multirun): the measurement stays, the clash is
    reported; a later *measured* record still replaces an earlier one (a failed case re-run)."""
    from fp8bench.core.records import read_run

    C1, C2 = "gemm.tiny.a.e4m3.current.torch", "gemm.tiny.b.e4m3.current.torch"

    run_dir = tmp_path / "runs" / "r1"
    write_manifest(run_dir, {"run_id": "r1", "env": {}, "config": {}})
    with ShardWriter(run_dir, "a") as w:
        w.write(_record("r1", C1))
        w.write(_record("r1", C2, status="failed"))
    with ShardWriter(run_dir, "b") as w:
        w.write(_record("r1", C1, status="skipped"))
        w.write(_record("r1", C2, t=2.0))
    _, records, problems = read_run(run_dir)
    by_id = {r.case_id: r for r in records}
    assert by_id[C1].status == "ok" and by_id[C2].status == "ok" and by_id[C2].metric("time_ms") == 2.0
    assert any(f"{C1} recorded twice" in p.error for p in problems)


def test_every_run_has_its_measurement_version_older_exports_included(tmp_path):
    """Runs recorded before the version travelled with the data get the one their manifest implies
    (records.LEGACY_VERSION_SQL); a run folder's manifest and each record carry it from version 4 on."""
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "results"
    con = store.connect(tmp_path / "db.duckdb")
    store.ingest(con, [results / "h200-layer", results / "h200-layer-settled", results / "h200-hopper"])
    versions = dict(con.execute("SELECT run_id, measurement_version FROM runs").fetchall())
    assert versions["layer-te"] == 2 and versions["s5-layer"] == 3 and versions["hopper-a"] == 4
    measured = con.execute("SELECT count(*) FROM cases WHERE run_id = 'hopper-a' AND status = 'ok' AND "
                           "json_extract(measurement, '$.version')::INT = 4").fetchone()[0]
    assert measured > 1000


def test_a_database_written_before_the_version_columns_gains_them(tmp_path):
    import duckdb

    path = tmp_path / "old.duckdb"
    old = duckdb.connect(str(path))
    old.execute("CREATE TABLE runs (run_id VARCHAR PRIMARY KEY, started_at TIMESTAMP, git_commit VARCHAR, "
                "git_dirty BOOLEAN, device_name VARCHAR, env_id VARCHAR, config JSON, source VARCHAR)")
    old.execute("INSERT INTO runs VALUES ('r', TIMESTAMP '2026-11-30 09:00:00', NULL, NULL, 'cpu', NULL, "
                "'{\"base\": {\"measure\": {\"settle_ms\": 200}}}', NULL)")
    old.close()
    con = store.connect(path, read_only=True)  # compare, report and history open read-only: upgraded first
    assert con.execute("SELECT measurement_version FROM runs").fetchone()[0] == 3


@pytest.mark.slow
def test_a_spread_loaded_after_the_runs_gives_them_their_across_box_intervals(tmp_path):
    from pathlib import Path

    results = Path(__file__).resolve().parents[1] / "results"
    con = store.connect(tmp_path / "db.duckdb")
    store.ingest(con, [results / "h200-hopper"])
    query = "SELECT count(*) FROM measurements WHERE run_id = 'hopper-b' AND metric = 'speedup_vs_bf16_box_lo'"
    before = con.execute(query).fetchone()[0]
    store.ingest(con, [results / "spread"])
    assert before > 0 and con.execute(query).fetchone()[0] == before  # derived again, not twice
    con.execute("DELETE FROM measurements WHERE metric LIKE '%_box_%'")
    store.ingest(con, [results / "spread"])
    assert con.execute(query).fetchone()[0] == before


def test_an_export_without_the_training_host_bound_label_gains_it_at_ingest(tmp_path):
    """Exports written before training steps were judged host-bound carry their speedups only: ingest derives
    the label from the export's own step and kernel times (once, however often it is loaded)."""
    run_dir = tmp_path / "runs" / "t"
    write_manifest(run_dir, {"run_id": "t", "started_at": 1.7e9, "device_name": "NVIDIA H200",
                             "env": {"env_id": "e1", "device_name": "NVIDIA H200"}, "config": {}})
    with ShardWriter(run_dir) as w:
        for fmt, step_ms, busy_ms in (("bf16", 34.9, 12.6), ("e4m3", 118.0, 15.0)):
            scaling = "none" if fmt == "bf16" else "blockwise"
            w.write(CaseRecord(run_id="t", case_id=f"train.gpt.b8.seed0.{fmt}.{scaling}.triton",
                               twin_id="train.gpt.b8.seed0.bf16.none.triton", workload="train",
                               model="gpt", format=fmt, scaling=scaling, backend="triton", shape_name="b8.seed0",
                               shape={}, params={"tokens": 4096}, status="ok",
                               metrics=[Metric.of("time_ms", step_ms), Metric.of("gpu_busy_ms", busy_ms)]))
    con = store.connect(tmp_path / "a.duckdb")
    store.ingest(con, [tmp_path / "runs"])
    label = "SELECT case_id, value FROM measurements WHERE metric = 'host_bound'"
    assert con.execute(label).fetchall() == [("train.gpt.b8.seed0.e4m3.blockwise.triton", 1.0)]
    con.execute("DELETE FROM measurements WHERE metric = 'host_bound'")  # as an older export has it
    store.export(con, ["t"], tmp_path / "export")
    con2 = store.connect(tmp_path / "b.duckdb")
    for _ in range(2):
        store.ingest(con2, [tmp_path / "export"])
        assert con2.execute(label).fetchall() == [("train.gpt.b8.seed0.e4m3.blockwise.triton", 1.0)]
