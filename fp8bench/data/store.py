"""The only importer of duckdb: schema, idempotent ingest of shards and Parquet exports, exports, queries.

Ingest replaces each run it sees as a whole (the run folder or export is the source of truth), so running
it twice changes nothing. The file is created with storage version v1.4.0 so DuckDB 1.4 and later open it.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from fp8bench.analysis.derive import (
    TRAINING_VERDICT_METRICS,
    derive_train_host_bound,
    derive_training_verdicts,
    derived_metrics,
    moderate_speedup_intervals,
)
from fp8bench.core.records import (
    LEGACY_VERSION_SQL,
    MANIFEST,
    SHARD_GLOB,
    CaseRecord,
    Metric,
    ShardProblem,
    StoreError,
    derive_box_intervals,
    read_run,
)
from fp8bench.data import legacy

STORAGE_VERSION = "v1.4.0"
TABLES = ("runs", "environments", "cases", "measurements", "samples")
EXPORT_MARKER = "cases.parquet"

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  run_id VARCHAR PRIMARY KEY, started_at TIMESTAMP, git_commit VARCHAR, git_dirty BOOLEAN,
  device_name VARCHAR, env_id VARCHAR, config JSON, source VARCHAR);
CREATE TABLE IF NOT EXISTS environments (
  env_id VARCHAR PRIMARY KEY, device_kind VARCHAR, device_name VARCHAR, capability VARCHAR, cuda VARCHAR,
  driver VARCHAR, python VARCHAR, torch VARCHAR, triton VARCHAR, transformer_engine VARCHAR, torchao VARCHAR,
  details JSON);
CREATE TABLE IF NOT EXISTS cases (
  run_id VARCHAR, case_id VARCHAR, workload VARCHAR, model VARCHAR, format VARCHAR, scaling VARCHAR,
  backend VARCHAR, shape_name VARCHAR, shape JSON, params JSON, status VARCHAR, reason VARCHAR,
  started_at DOUBLE, duration_s DOUBLE, PRIMARY KEY (run_id, case_id));
CREATE TABLE IF NOT EXISTS measurements (
  run_id VARCHAR, case_id VARCHAR, metric VARCHAR, value DOUBLE, unit VARCHAR, direction VARCHAR,
  derived BOOLEAN, PRIMARY KEY (run_id, case_id, metric));
CREATE TABLE IF NOT EXISTS ceilings (
  device_name VARCHAR PRIMARY KEY, device_kind VARCHAR, measured_at TIMESTAMP, bf16_tflops DOUBLE,
  fp8_tflops DOUBLE, copy_gbps DOUBLE, spec_bf16_tflops DOUBLE, spec_fp8_tflops DOUBLE, spec_gbps DOUBLE,
  spec_source VARCHAR, details JSON, source VARCHAR);
CREATE TABLE IF NOT EXISTS samples (
  run_id VARCHAR, case_id VARCHAR, metric VARCHAR, i INTEGER, value DOUBLE,
  PRIMARY KEY (run_id, case_id, metric, i));
CREATE TABLE IF NOT EXISTS speedup_spreads (
  device_name VARCHAR, series VARCHAR, half_width DOUBLE, quantile DOUBLE, cases INTEGER, source VARCHAR,
  PRIMARY KEY (device_name, series));
"""
MIGRATIONS = """
ALTER TABLE runs ADD COLUMN IF NOT EXISTS measurement_version INTEGER;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS measurement JSON;
ALTER TABLE cases ADD COLUMN IF NOT EXISTS measurement JSON;
ALTER TABLE cases ADD COLUMN IF NOT EXISTS label VARCHAR;
ALTER TABLE cases ADD COLUMN IF NOT EXISTS twin_id VARCHAR;
ALTER TABLE cases ADD COLUMN IF NOT EXISTS ran JSON;
ALTER TABLE cases ADD COLUMN IF NOT EXISTS legacy_case_id VARCHAR;
ALTER TABLE cases ADD COLUMN IF NOT EXISTS scheduler JSON;
"""
"""Columns added after the first schema (a database file written before them gains them on open). Runs
recorded before versions travelled with the data get theirs from records.LEGACY_VERSION_SQL."""


LOCK_WAIT_S = 300.0
"""How long `connect` waits for a DuckDB file that another process holds (DuckDB allows one writer process,
and no reader beside it): an ingest takes seconds, so two sweeps ending at once both get in."""
LOCK_POLL_S = 0.5


class DatabaseBusy(RuntimeError):
    """The DuckDB file stayed locked by another process for the whole wait. Not bad input: what was recorded
    is safe in its run folder, and `fp8bench ingest` loads it later."""

    def __init__(self, db: Path, holder: str, waited_s: float) -> None:
        super().__init__(f"{str(db)!r} is still held by {holder} after {waited_s:.0f} s")
        self.db, self.holder, self.waited_s = db, holder, waited_s


_LOCK_HOLDER = re.compile(r"Conflicting lock is held in (.+?) \(PID (\d+)\)")


def _lock_holder(exc: duckdb.Error) -> str | None:
    """'PID 123 (/usr/bin/python3)' when `exc` is DuckDB's refusal of a file another process holds, else None."""
    text = str(exc)
    if "Could not set lock on file" not in text:
        return None
    m = _LOCK_HOLDER.search(text)
    return f"PID {m.group(2)} ({m.group(1)})" if m else "another process"


def _open(db: Path, read_only: bool, wait_s: float, on_wait) -> duckdb.DuckDBPyConnection:
    """duckdb.connect, retried while another process holds the file, at most `wait_s` seconds;
    `on_wait(holder, wait_s)` is called once, when the wait begins."""
    deadline = time.monotonic() + wait_s
    started, told = time.monotonic(), False
    while True:
        try:
            return duckdb.connect(str(db), read_only=read_only,
                                  config={} if read_only else {"storage_compatibility_version": STORAGE_VERSION})
        except duckdb.Error as exc:
            holder = _lock_holder(exc)
            if holder is None:
                raise StoreError(f"--db {str(db)!r} cannot be opened: {str(exc).splitlines()[0]}") from None
            if time.monotonic() >= deadline:
                raise DatabaseBusy(db, holder, time.monotonic() - started) from None
            if not told and on_wait is not None:
                on_wait(holder, wait_s)
                told = True
            time.sleep(LOCK_POLL_S)


def connect(db: str | Path, read_only: bool = False, wait_s: float = LOCK_WAIT_S,
            on_wait=None) -> duckdb.DuckDBPyConnection:
    """Open (and create or migrate) the DuckDB file. While another process holds it, wait up to `wait_s`
    seconds (calling `on_wait(holder, wait_s)` once), then raise DatabaseBusy."""
    db = Path(db)
    if read_only and not db.is_file():
        raise StoreError(f"--db {str(db)!r} does not exist; run `fp8bench ingest` first")
    db.parent.mkdir(parents=True, exist_ok=True)
    con = _open(db, read_only, wait_s, on_wait)
    with contextlib.suppress(duckdb.Error):  # timestamps in UTC whatever the machine's zone (needs ICU)
        con.execute("SET TimeZone = 'UTC'")
    if not read_only:
        con.execute(SCHEMA)
        con.execute(MIGRATIONS)
        _fill_legacy_versions(con)
    elif _needs_migration(con):  # a file from before the version columns: upgrade it once, then read
        con.close()
        connect(db, wait_s=wait_s, on_wait=on_wait).close()
        return connect(db, read_only=True, wait_s=wait_s, on_wait=on_wait)
    return con


def in_memory_copy(db: str | Path) -> duckdb.DuckDBPyConnection:
    """A connection to an in-memory copy of the DuckDB file `db` (read, never written): what a caller may
    change freely without touching the file. A missing file is an error."""
    src = Path(db)
    if not src.is_file():
        raise StoreError(f"--db {str(src)!r} does not exist; give a DuckDB file that `fp8bench ingest` wrote")
    con = connect(":memory:")
    try:
        con.execute(f"ATTACH '{str(src).replace(chr(39), chr(39) * 2)}' AS src (READ_ONLY)")
    except duckdb.Error as exc:
        raise StoreError(f"--db {str(src)!r} cannot be opened: {str(exc).splitlines()[0]}") from None
    present = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables WHERE table_catalog = 'src'")
               .fetchall()}
    for table in ("runs", "environments", "cases", "measurements", "samples", "ceilings", "speedup_spreads"):
        if table in present:  # by name: a file written before a column existed leaves it NULL
            con.execute(f"INSERT INTO main.{table} BY NAME SELECT * FROM src.{table}")
    con.execute("DETACH src")
    _fill_legacy_versions(con)
    return con


def _needs_migration(con) -> bool:
    has_runs = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'runs'").fetchone()[0]
    has_version = con.execute("SELECT count(*) FROM information_schema.columns WHERE table_name = 'runs' "
                              "AND column_name = 'measurement_version'").fetchone()[0]
    return bool(has_runs) and not has_version


def _fill_legacy_versions(con) -> None:
    con.execute(f"UPDATE runs SET measurement_version = {LEGACY_VERSION_SQL} WHERE measurement_version IS NULL")


def storage_version(con: duckdb.DuckDBPyConnection) -> str:
    """The storage version tag of the main database file (e.g. 'v1.4.0+')."""
    row = con.execute("SELECT tags FROM duckdb_databases() WHERE NOT internal AND path IS NOT NULL").fetchone()
    return (row[0] or {}).get("storage_version", "") if row else ""


@dataclass
class IngestReport:
    runs: list[str] = field(default_factory=list)
    ceilings: list[str] = field(default_factory=list)
    """Devices whose calibration (fp8bench calibrate) was loaded."""
    spreads: list[str] = field(default_factory=list)
    """Devices whose between-box spread of speedups (results/spread/) was loaded."""
    cases: int = 0
    """Case records loaded: from run folders and from Parquet exports alike."""
    problems: list[ShardProblem] = field(default_factory=list)


LOCAL_RESULT_DIRS = ("runs", "hydra", "site")
"""Folders of results/ that are a checkout's own (its runs, Hydra's job folders, the built site): never a
committed result set. The Makefile's COMMITTED leaves the same three out."""


def committed_result_sets(results: Path) -> list[Path]:
    """The committed result sets under `results` (what `make results-page` and `make publish` ingest)."""
    return sorted(p for p in results.iterdir() if p.is_dir() and p.name not in LOCAL_RESULT_DIRS)


CALIBRATION_DIR = "calibration"
SPREAD_DIR = "spread"
"""results/spread/<device>.json: how far speedups move between boxes of one GPU model (fp8bench.analysis.spread)."""


def _is_calibration(p: Path) -> bool:
    """A `fp8bench calibrate` file: results/calibration/<device>.json."""
    return p.is_file() and p.parent.name == CALIBRATION_DIR and p.suffix == ".json"


def _is_spread(p: Path) -> bool:
    return p.is_file() and p.parent.name == SPREAD_DIR and p.suffix == ".json"


def _json_files(paths: list[Path], kind) -> list[Path]:
    """The JSON files of one kind (`kind(path)`: calibration, spread) given or found under `paths`."""
    files = []
    for p in paths:
        if kind(p):
            files.append(p)
        elif p.is_dir():
            files += [f for f in p.rglob("*.json") if kind(f)]
    return sorted(set(files))


def _ingest_spread(con, path: Path) -> str:
    """One device's between-box spread of speedups, by series (workload, or workload + '_kernel')."""
    try:
        s = json.loads(path.read_text())
        device, q = s["device_name"], float(s["quantile"])
        rows = [(device, name, float(v["half_width"]), q, int(v["cases"]), str(path)) for name, v in s["series"].items()]
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise StoreError(f"spread file {str(path)!r} is unreadable: {exc}") from None
    con.execute("DELETE FROM speedup_spreads WHERE device_name = ?", [device])
    con.executemany("INSERT INTO speedup_spreads VALUES (?, ?, ?, ?, ?, ?)", rows)
    return device


BOX_INPUTS = ("speedup_vs_bf16", "speedup_vs_bf16_lo", "speedup_vs_bf16_hi", "speedup_vs_bf16_kernel",
              "speedup_vs_bf16_kernel_lo", "speedup_vs_bf16_kernel_hi", "host_bound")


def _stored_records(con, where: str, params: list, metrics: tuple[str, ...]) -> list[CaseRecord]:
    """The stored cases matching `where` (over `cases c` joined with `runs r`) as CaseRecords holding only
    `metrics`: what a derivation over runs already in the database reads."""
    rows = con.execute(f"""
        SELECT c.run_id, c.case_id, c.label, c.twin_id, c.workload, c.model, c.format, c.scaling, c.backend,
               c.shape_name, c.params, c.measurement, c.status, m.metric, m.value
        FROM cases c JOIN runs r USING (run_id) JOIN measurements m USING (run_id, case_id)
        WHERE {where} AND m.metric IN (SELECT unnest(?::VARCHAR[]))""", [*params, list(metrics)]).fetchall()
    by_case: dict[tuple[str, str], CaseRecord] = {}
    for (run_id, case_id, label, twin_id, workload, model, fmt, scaling, backend, shape_name, case_params, measurement,
         status, metric, value) in rows:
        rec = by_case.setdefault((run_id, case_id), CaseRecord(
            run_id=run_id, case_id=case_id, label=label or "", twin_id=twin_id or "", workload=workload, model=model,
            format=fmt, scaling=scaling, backend=backend, shape_name=shape_name, shape={},
            params=json.loads(case_params or "{}"), measurement=json.loads(measurement or "{}"), status=status))
        rec.metrics.append(Metric.of(metric, value))
    return list(by_case.values())


def _insert_derived(con, derived: list[tuple[CaseRecord, list[Metric], bool]]) -> None:
    import pyarrow as pa

    rows = [(r.run_id, r.case_id, m.name, m.value, m.unit, m.direction) for r, ms, _ in derived for m in ms]
    if not rows:
        return
    con.register("derived_in", pa.table(list(zip(*rows, strict=True)),
                                        names=["run_id", "case_id", "metric", "value", "unit", "direction"]))
    try:
        con.execute("INSERT INTO measurements SELECT run_id, case_id, metric, CAST(value AS DOUBLE), unit, direction, "
                    "true FROM derived_in")
    finally:
        con.unregister("derived_in")


def _rederive_box_intervals(con, device: str) -> None:
    """A spread loaded after a device's runs: derive their across-box intervals now (records.derive_box_intervals),
    replacing any derived from an earlier spread."""
    records = _stored_records(con, "r.device_name = ?", [device], BOX_INPUTS)
    con.execute("DELETE FROM measurements WHERE derived AND metric LIKE 'speedup_vs_bf16%_box_%' AND run_id IN "
                "(SELECT run_id FROM runs WHERE device_name = ?)", [device])
    _insert_derived(con, derive_box_intervals(records, spread_for(con, device)))


def _derive_train_host_bound(con, run_ids: list[str]) -> None:
    """An export written before training steps were judged host-bound (analysis.derive.derive_train_host_bound)
    carries their speedups without the label: derive it from the export's own step and kernel times."""
    by_run: dict[str, list[CaseRecord]] = {}
    for r in _stored_records(con, "c.workload = 'train' AND c.run_id IN (SELECT unnest(?::VARCHAR[]))", [run_ids],
                             ("time_ms", "gpu_busy_ms", "host_bound")):
        by_run.setdefault(r.run_id, []).append(r)
    _insert_derived(con, [d for records in by_run.values() for d in derive_train_host_bound(records)])


TRAINING_SAMPLES = ("loss", "val_loss", "val_step", "diverged_at_step")


def training_records(con, run_ids: list[str]) -> list[CaseRecord]:
    """The stored training cases of `run_ids` that trained (ok or diverged), with their shape, measured
    (not derived) metrics and loss curves: what the parity verdicts and curve classes read."""
    rows = con.execute("""
        SELECT run_id, case_id, model, format, scaling, backend, shape_name, shape, status, reason, measurement
        FROM cases WHERE workload = 'train' AND status IN ('ok', 'diverged')
          AND run_id IN (SELECT unnest(?::VARCHAR[]))""", [run_ids]).fetchall()
    recs = {(r[0], r[1]): CaseRecord(run_id=r[0], case_id=r[1], workload="train", model=r[2], format=r[3],
                                     scaling=r[4], backend=r[5], shape_name=r[6], shape=json.loads(r[7] or "{}"),
                                     status=r[8], reason=r[9] or "", measurement=json.loads(r[10] or "{}"))
            for r in rows}
    for run_id, case_id, metric, value in con.execute("""
            SELECT run_id, case_id, metric, value FROM measurements
            WHERE NOT derived AND run_id IN (SELECT unnest(?::VARCHAR[]))""", [run_ids]).fetchall():
        if (run_id, case_id) in recs and value is not None:
            recs[(run_id, case_id)].metrics.append(Metric(metric, value, "", ""))
    for run_id, case_id, metric, values in con.execute("""
            SELECT run_id, case_id, metric, list(value ORDER BY i) FROM samples
            WHERE metric IN (SELECT unnest(?::VARCHAR[])) AND run_id IN (SELECT unnest(?::VARCHAR[]))
            GROUP BY ALL""", [list(TRAINING_SAMPLES), run_ids]).fetchall():
        if (run_id, case_id) in recs:
            recs[(run_id, case_id)].samples[metric] = values
    return list(recs.values())


def _rederive_training_verdicts(con, run_ids: list[str]) -> None:
    """Judge the training runs of an export again with today's rules (analysis.derive.derive_training_verdicts):
    an export keeps the verdicts of the rules it was written under, which a later rule replaces."""
    con.execute("DELETE FROM measurements WHERE derived AND metric IN (SELECT unnest(?::VARCHAR[])) "
                "AND run_id IN (SELECT unnest(?::VARCHAR[]))", [list(TRAINING_VERDICT_METRICS), run_ids])
    by_run: dict[str, list[CaseRecord]] = {}
    for r in training_records(con, run_ids):
        by_run.setdefault(r.run_id, []).append(r)
    _insert_derived(con, [d for records in by_run.values() for d in derive_training_verdicts(records)])


def spread_for(con, device_name: str | None) -> dict[str, float]:
    """{series: half-width} of a device's between-box spread ({} when none was measured)."""
    return dict(con.execute("SELECT series, half_width FROM speedup_spreads WHERE device_name = ?",
                            [device_name]).fetchall()) if device_name else {}


def find_sources(paths: list[Path]) -> tuple[list[Path], list[Path]]:
    """(run folders, Parquet export folders) under `paths`; a missing path is an error."""
    runs, exports = set(), set()
    for p in paths:
        if not p.exists():
            raise StoreError(f"path {str(p)!r} does not exist; give a run folder, a shard, or a folder of exports")
        if p.is_file():
            if _is_calibration(p) or _is_spread(p):
                continue  # ceilings and spreads, loaded by ingest itself
            if p.name == EXPORT_MARKER:
                exports.add(p.parent)
            elif p.suffix == ".jsonl" or p.name == MANIFEST:
                runs.add(p.parent)
            else:
                raise StoreError(f"path {str(p)!r} is neither a shard (*.jsonl), a manifest nor {EXPORT_MARKER}")
            continue
        if (p / EXPORT_MARKER).is_file():
            exports.add(p)
        if (p / MANIFEST).is_file() or any(p.glob(SHARD_GLOB)):
            runs.add(p)
        for sub in p.rglob(EXPORT_MARKER):
            exports.add(sub.parent)
        for sub in list(p.rglob(MANIFEST)) + list(p.rglob(SHARD_GLOB)):
            runs.add(sub.parent)
    return sorted(runs), sorted(exports)


def _ingest_ceilings(con: duckdb.DuckDBPyConnection, path: Path) -> str:
    """One device's ceilings (the newest measurement of a device wins)."""
    try:
        c = json.loads(path.read_text())
        row = [c["device_name"], c["device_kind"], c["measured_at"], c["bf16_tflops"], c["fp8_tflops"],
               c["copy_gbps"], c.get("spec_bf16_tflops"), c.get("spec_fp8_tflops"), c.get("spec_gbps"),
               c.get("spec_source", ""), json.dumps(c.get("details", {})), str(path)]
    except (OSError, json.JSONDecodeError, KeyError) as exc:
        raise StoreError(f"calibration file {str(path)!r} is unreadable: {exc}") from None
    old = con.execute("SELECT epoch(measured_at) FROM ceilings WHERE device_name = ?", [row[0]]).fetchone()
    if old is None or old[0] <= row[2]:
        con.execute("DELETE FROM ceilings WHERE device_name = ?", [row[0]])
        con.execute("INSERT INTO ceilings VALUES (?, ?, to_timestamp(?), ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
    return row[0]


def ingest(con: duckdb.DuckDBPyConnection, paths: list[Path]) -> IngestReport:
    report = IngestReport()
    for path in _json_files(paths, _is_calibration):
        report.ceilings.append(_ingest_ceilings(con, path))
    for path in _json_files(paths, _is_spread):
        report.spreads.append(_ingest_spread(con, path))
        _rederive_box_intervals(con, report.spreads[-1])
    run_dirs, exports = find_sources(paths)
    for export in exports:
        report.runs += _ingest_export(con, export)
        report.cases += con.execute("SELECT count(*) FROM read_parquet(?)",
                                    [str(export / "cases.parquet")]).fetchone()[0]
    for run_dir in run_dirs:
        manifest, records, problems = read_run(run_dir)
        report.problems += problems
        if not records and manifest is None:
            continue
        records, old_ids = _upgraded(records, manifest)
        run_id = manifest["run_id"] if manifest else records[0].run_id
        _replace_run(con, run_id, manifest, records, source=str(run_dir), old_ids=old_ids)
        report.runs.append(run_id)
        report.cases += len(records)
    return report


def _delete_run(con: duckdb.DuckDBPyConnection, run_id: str) -> None:
    for t in ("samples", "measurements", "cases", "runs"):
        con.execute(f"DELETE FROM {t} WHERE run_id = ?", [run_id])


def _upgraded(records: list[CaseRecord], manifest: dict | None) -> tuple[list[CaseRecord], dict[str, str]]:
    """Version-1 records re-keyed to today's ids (fp8bench.data.legacy), and new id → old id for each."""
    base = ((manifest or {}).get("config") or {}).get("base")
    out, old_ids = [], {}
    for r in records:
        new = legacy.upgrade(r, base) if legacy.is_legacy(r) else r
        if new is not r:
            old_ids[new.case_id] = r.case_id
        out.append(new)
    return out, old_ids


def _replace_run(con, run_id: str, manifest: dict | None, records: list[CaseRecord], source: str,
                 old_ids: dict[str, str] | None = None) -> None:
    import pyarrow as pa

    old_ids = old_ids or {}
    con.execute("BEGIN TRANSACTION")
    try:
        _delete_run(con, run_id)
        env = (manifest or {}).get("env") or {}
        if env.get("env_id"):
            con.execute("DELETE FROM environments WHERE env_id = ?", [env["env_id"]])
            con.execute("INSERT INTO environments VALUES (?,?,?,?,?,?,?,?,?,?,?,?)", [
                env["env_id"], env.get("device_kind"), env.get("device_name"), env.get("capability"),
                env.get("cuda"), env.get("driver"), env.get("python"), env.get("torch_version"),
                env.get("triton_version"), env.get("transformer_engine_version"), env.get("torchao_version"),
                json.dumps(env)])
        m = manifest or {}
        measurement = m.get("measurement")
        con.execute("INSERT INTO runs (run_id, started_at, git_commit, git_dirty, device_name, env_id, config, "
                    "source, measurement_version, measurement) VALUES (?, to_timestamp(?), ?, ?, ?, ?, ?, ?, ?, ?)", [
                        run_id, m.get("started_at") or min((r.started_at for r in records if r.started_at), default=0.0),
                        m.get("git_commit"), m.get("git_dirty"), m.get("device_name"), env.get("env_id"),
                        json.dumps(m.get("config")), source, (measurement or {}).get("version"),
                        json.dumps(measurement) if measurement else None])
        _fill_legacy_versions(con)
        records = moderate_speedup_intervals(records)  # the published intervals, before what derives from them
        derived = derived_metrics(records, spread_for(con, m.get("device_name")))
        def cell(r: CaseRecord, k: str):
            if k == "legacy_case_id":
                return old_ids.get(r.case_id)
            if k == "label":  # the id's readable prefix, where a record written by hand left it out
                return r.label or r.case_id.split("~", 1)[0]
            v = getattr(r, k)
            if k in ("measurement", "ran", "scheduler"):
                return json.dumps(v) if v else None
            return json.dumps(v) if k in ("shape", "params") else v

        cases = pa.table({k: [cell(r, k) for r in records]
                          for k in ("run_id", "case_id", "label", "twin_id", "workload", "model", "format", "scaling",
                                    "backend", "shape_name", "shape", "params", "ran", "status", "reason", "started_at",
                                    "duration_s", "measurement", "legacy_case_id", "scheduler")})
        con.register("cases_in", cases)
        con.execute("INSERT INTO cases BY NAME SELECT * FROM cases_in")
        rows = [(r.run_id, r.case_id, mt.name, mt.value, mt.unit, mt.direction, d)
                for r, metrics, d in [(r, r.metrics, False) for r in records] + derived for mt in metrics]
        meas = pa.table(list(zip(*rows, strict=False)) if rows else [[]] * 7,
                        names=["run_id", "case_id", "metric", "value", "unit", "direction", "derived"])
        con.register("meas_in", meas)
        con.execute("INSERT INTO measurements SELECT run_id, case_id, metric, CAST(value AS DOUBLE), unit, "
                    "direction, CAST(derived AS BOOLEAN) FROM meas_in")
        srows = [(r.run_id, r.case_id, name, i, v) for r in records for name, vals in r.samples.items()
                 for i, v in enumerate(vals)]
        samp = pa.table(list(zip(*srows, strict=False)) if srows else [[]] * 5, names=["run_id", "case_id", "metric", "i", "value"])
        con.register("samp_in", samp)
        con.execute("INSERT INTO samples SELECT run_id, case_id, metric, CAST(i AS INTEGER), CAST(value AS DOUBLE) "
                    "FROM samp_in")
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    finally:
        for name in ("cases_in", "meas_in", "samp_in"):
            try:
                con.unregister(name)
            except Exception:
                pass


def _ingest_export(con, folder: Path) -> list[str]:
    """Load a Parquet export (one file per table) written by `export`, replacing the runs it holds."""
    missing = [t for t in TABLES if not (folder / f"{t}.parquet").is_file()]
    if missing:
        raise StoreError(f"export {str(folder)!r} lacks {[m + '.parquet' for m in missing]}")
    run_ids = [r[0] for r in con.execute("SELECT DISTINCT run_id FROM read_parquet(?)",
                                         [str(folder / "runs.parquet")]).fetchall()]
    con.execute("BEGIN TRANSACTION")
    try:
        for rid in run_ids:
            _delete_run(con, rid)
        con.execute("DELETE FROM environments WHERE env_id IN (SELECT env_id FROM read_parquet(?))",
                    [str(folder / "environments.parquet")])
        for t in TABLES:  # by name: an export written before a column existed leaves it NULL
            con.execute(f"INSERT INTO {t} BY NAME SELECT * FROM read_parquet(?)", [str(folder / f"{t}.parquet")])
        _fill_legacy_versions(con)
        _rekey_legacy_rows(con, run_ids)
        _derive_train_host_bound(con, run_ids)
        _rederive_training_verdicts(con, run_ids)
        con.execute("COMMIT")
    except Exception:
        con.execute("ROLLBACK")
        raise
    return run_ids


CASE_COLUMNS = ("run_id", "case_id", "workload", "model", "format", "scaling", "backend", "shape_name", "shape",
                "params", "status", "reason", "started_at", "duration_s", "measurement")


def _rekey_legacy_rows(con, run_ids: list[str]) -> None:
    """Rows of `run_ids` loaded from an export written before case ids were derived from the whole identity
    (no `label`): re-keyed in every table to today's ids (fp8bench.data.legacy), the old id kept beside."""
    import pyarrow as pa

    cols = ", ".join(f"c.{k}" for k in CASE_COLUMNS)
    rows = con.execute(f"""SELECT {cols}, r.config FROM cases c JOIN runs r USING (run_id)
                           WHERE c.label IS NULL AND c.run_id IN (SELECT unnest(?::VARCHAR[]))""", [run_ids]).fetchall()
    if not rows:
        return
    mapped = []
    for row in rows:
        values = dict(zip(CASE_COLUMNS, row[:-1], strict=True))
        record = CaseRecord.from_dict({**values, **{k: json.loads(values[k] or "{}") for k in ("shape", "params",
                                                                                            "measurement")},
                                       "started_at": values["started_at"] or 0.0, "duration_s": values["duration_s"] or 0.0,
                                       "reason": values["reason"] or "", "record_version": 1})
        base = (json.loads(row[-1] or "{}") or {}).get("base")
        new = legacy.upgrade(record, base)
        mapped.append((record.run_id, record.case_id, new.case_id, new.label, new.twin_id, json.dumps(new.params),
                       json.dumps(new.ran) if new.ran else None, json.dumps(new.measurement) if new.measurement else None))
    names = ["run_id", "old_id", "new_id", "label", "twin_id", "params", "ran", "measurement"]
    con.register("rekey_in", pa.table(list(zip(*mapped, strict=True)), names=names))
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE rekey AS SELECT * FROM rekey_in")
        con.execute("""CREATE OR REPLACE TEMP TABLE cases_new AS
            SELECT c.* REPLACE (k.new_id AS case_id, k.label AS label, k.twin_id AS twin_id, k.params::JSON AS params,
                                k.ran::JSON AS ran, k.measurement::JSON AS measurement, k.old_id AS legacy_case_id)
            FROM cases c JOIN rekey k ON c.run_id = k.run_id AND c.case_id = k.old_id""")
        for table in ("measurements", "samples"):
            con.execute(f"""CREATE OR REPLACE TEMP TABLE {table}_new AS SELECT t.* REPLACE (k.new_id AS case_id)
                            FROM {table} t JOIN rekey k ON t.run_id = k.run_id AND t.case_id = k.old_id""")
        for table in ("cases", "measurements", "samples"):
            con.execute(f"DELETE FROM {table} t USING rekey k WHERE t.run_id = k.run_id AND t.case_id = k.old_id")
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {table}_new")
            con.execute(f"DROP TABLE {table}_new")
        con.execute("DROP TABLE rekey")
    finally:
        con.unregister("rekey_in")


def export(con, run_ids: list[str], out: Path) -> list[Path]:
    """Write the given runs as one Parquet file per table (zstd): small enough to commit."""
    known = {r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()}
    unknown = [r for r in run_ids if r not in known]
    if unknown:
        raise StoreError(f"run {unknown[0]!r} is not in the database; choose from {sorted(known)[-10:]}")
    out.mkdir(parents=True, exist_ok=True)
    ids = ", ".join("'" + r.replace("'", "''") + "'" for r in run_ids)
    files = []
    for t in TABLES:
        where = (f"env_id IN (SELECT env_id FROM runs WHERE run_id IN ({ids}))" if t == "environments"
                 else f"run_id IN ({ids})")
        path = out / f"{t}.parquet"
        con.execute(f"COPY (SELECT * FROM {t} WHERE {where}) TO '{path}' (FORMAT parquet, COMPRESSION zstd)")
        files.append(path)
    return files


def metric_table(con, run_id: str | None = None):
    """Cases with their measurements pivoted wide (one row per case), as a pandas DataFrame."""
    where = "WHERE c.run_id = ?" if run_id else ""
    return con.execute(f"""
        SELECT c.run_id, c.case_id, c.workload, c.model, c.format, c.scaling, c.backend, c.status, c.reason,
               m.metric, m.value
        FROM cases c LEFT JOIN measurements m USING (run_id, case_id) {where}
        ORDER BY c.case_id""", [run_id] if run_id else []).fetchdf()
