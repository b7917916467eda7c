"""Statistical comparison of two runs (`fp8bench compare`): every timing and speedup the runs share, judged at
once against the variance between runs (fp8bench.core.judging), numerics by value.

A series is one case x metric: its change is log(head / base), judged beyond the shift its whole class made
(its class: the same metric, bound label, workload, model, backend and precision, or the nearest coarser class
with enough series), against its own run-to-run variance from
history (earlier runs of the same GPU model and measurement version, never a run started after the head),
or where it has none against its class's spread in this comparison; the class's shift is judged against
its history. All are judged together by Benjamini-Hochberg, so thousands of series do not make every A/A
pair a regression, and each row states the smallest change it could have caught.

Bound labels come from each run's stored block times (fp8bench.core.bound): host-bound series form classes
of their own, judged on their own (wider) variance and reported as host-bound changes; series from before the
rule are `unknown` and form theirs. Only `unsettled` series, series across measurement versions (with
--across-versions), timings made once (the emulator) and series without any variance are not comparable,
each counted with its reason. Numerics are deterministic for a fixed seed and are compared by value. No
duckdb import: queries go through the store connection.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from fp8bench.analysis.history import StepChange, change_points, history_steps  # noqa: F401  (re-exported)
from fp8bench.core import markdown
from fp8bench.core.bound import Bound, combine, label_of_record
from fp8bench.core.judging import FDR, IMPROVEMENT, REGRESSION, UNCHANGED, judge_comparison
from fp8bench.core.records import METRICS, StoreError

SPEEDUPS = ("speedup_vs_bf16", "speedup_vs_bf16_kernel")
NUMERICS = ("sqnr_db", "reference_sqnr_db")
SQNR_TOLERANCE_DB = 0.5
"""Numerics change by more than this many dB is a verdict (they are deterministic for a fixed seed)."""
ENV_KEYS = ("torch", "cuda", "driver", "transformer_engine", "torchao", "triton", "python")
NOT_COMPARABLE = "not comparable"


@dataclass(frozen=True)
class Change:
    case_id: str
    metric: str
    base: float
    head: float
    rel_change: float
    """(head - base) / base."""
    p_value: float | None
    detectable: float | None
    """The smallest relative change this series could be caught at with 80% power (NaN/None: not judged)."""
    verdict: str
    """regression | improvement | unchanged | not comparable"""
    bound: str = ""
    """The series' bound label over both runs ('device-bound', 'host-bound', 'unknown', 'unsettled'; '' on a
    CPU or for numerics)."""
    reason: str = ""
    """Why a series is not comparable; for a judged one, where its variance came from."""
    beyond_class: float | None = None
    """The relative change beyond its class's shared shift (what the verdict is on)."""
    versions: str = ""
    """'v2 → v4' when the two runs were timed by different measurement versions (compare --across-versions)."""


@dataclass(frozen=True)
class ClassChange:
    """A shift shared by a whole class of series (another box, another day, or a change to all of them)."""

    name: str
    members: int
    rel_change: float
    p_value: float | None
    verdict: str
    """regression | improvement | unchanged, or '' where the class has no history of shifts to judge by."""
    detectable: float | None


@dataclass
class Comparison:
    base_run: str
    head_run: str
    device: str
    base_version: int | None = None
    head_version: int | None = None
    env_changes: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)
    class_changes: list[ClassChange] = field(default_factory=list)
    """Shifts shared by whole classes of series (judged where the class has a history of shifts)."""

    @property
    def regressions(self) -> list:
        """Series and class shifts called regressions (exit code 1)."""
        return [c for c in self.changes + self.class_changes if c.verdict == REGRESSION]

    def judged(self) -> list[Change]:
        return [c for c in self.changes if c.verdict in (REGRESSION, IMPROVEMENT, UNCHANGED)]

    def not_comparable(self) -> Counter:
        """Series not judged, by reason."""
        return Counter(c.reason for c in self.changes if c.verdict == NOT_COMPARABLE)

    def summary(self) -> str:
        """e.g. '2 regression (1 host-bound), 0 improvement, 78 unchanged; 3 not comparable: unsettled 3'."""
        parts = []
        for v in (REGRESSION, IMPROVEMENT, UNCHANGED):
            hits = [c for c in self.changes if c.verdict == v]
            host = sum(c.bound == Bound.HOST.value for c in hits)
            parts.append(f"{len(hits)} {v}" + (f" ({host} host-bound)" if host and v != UNCHANGED else ""))
        cases = len({c.case_id for c in self.judged()})
        nc = self.not_comparable()
        tail = f"; {sum(nc.values())} not comparable" + (": " + ", ".join(f"{r} {n}" for r, n in sorted(nc.items()))
                                                         if nc else "")
        return ", ".join(parts) + f" ({len(self.judged())} series of {cases} cases judged, BH at {FDR:.0%})" + tail


def resolve_run(con, spec: str) -> str:
    """A run id, a git commit (prefix; its latest run), or 'latest'."""
    if not con.execute("SELECT count(*) FROM runs").fetchone()[0]:
        where = con.execute("SELECT path FROM duckdb_databases() WHERE NOT internal AND path IS NOT NULL").fetchone()
        raise StoreError(f"no runs in {where[0] if where else 'the database'}; record one (fp8bench run) or load "
                         "some (fp8bench ingest results)")
    if spec == "latest":
        row = con.execute("SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 1").fetchone()
    else:
        row = con.execute("SELECT run_id FROM runs WHERE run_id = ?", [spec]).fetchone() or con.execute(
            "SELECT run_id FROM runs WHERE git_commit LIKE ? || '%' ORDER BY started_at DESC LIMIT 1",
            [spec]).fetchone()
    if row is None:
        recent = [r[0] for r in con.execute("SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 8").fetchall()]
        raise StoreError(f"run {spec!r} is neither a run id, a git commit of a run, nor 'latest'; recent runs: {recent}")
    return row[0]


class VersionMismatch(StoreError):
    """Two runs timed by different measurement versions: a change between them may be the method's."""


def run_version(con, run_id: str) -> int | None:
    row = con.execute("SELECT measurement_version FROM runs WHERE run_id = ?", [run_id]).fetchone()
    return row[0] if row else None


def check_versions(base: str, vb: int | None, head: str, vh: int | None, across: bool) -> str:
    """'' when both runs share a measurement version; else VersionMismatch, or with `across` the label."""
    if vb == vh:
        return ""
    if not across:
        raise VersionMismatch(
            f"refusing to compare runs of different measurement versions: {base} was timed by version {vb}, "
            f"{head} by version {vh} (records.MEASUREMENT_VERSION says what changed); a change between them can "
            "be the method's, not the code's. Re-run the base, or pass --across-versions to see the changes "
            "(listed, not judged)")
    return f"v{vb} → v{vh}"


def _env(con, run_id: str) -> dict:
    cols = ", ".join(f"e.{k}" for k in ENV_KEYS)
    row = con.execute(f"SELECT r.device_name, e.device_kind, r.started_at, {cols} FROM runs r "
                      "LEFT JOIN environments e USING (env_id) WHERE r.run_id = ?", [run_id]).fetchone()
    return dict(zip(("device_name", "device_kind", "started_at", *ENV_KEYS), row, strict=True))


@dataclass(frozen=True)
class _RunData:
    """What one run holds for a comparison: ok cases' (workload, model, method) and label, and the values of
    the series compared."""

    cases: dict[str, tuple[str, str, str, str, str]]
    """case -> (workload, model, backend, format, how it was timed)."""
    labels: dict[str, Bound | None]
    speedup_labels: dict[str, Bound | None]
    values: dict[tuple[str, str], float]


def _timed_metrics(con, base: str, head: str) -> list[str]:
    """Metrics with per-iteration samples in both runs: the timings (loss curves and block times are not)."""
    rows = con.execute("SELECT metric FROM samples WHERE run_id = ? INTERSECT SELECT metric FROM samples "
                       "WHERE run_id = ?", [base, head]).fetchall()
    return sorted(m for (m,) in rows if m in METRICS and METRICS[m][0] == "ms")


def _run_data(con, run_id: str, metrics: list[str], is_cuda: bool) -> _RunData:
    cases, measurement = {}, {}
    for case_id, workload, model, backend, fmt, m in con.execute(
            "SELECT case_id, workload, model, backend, format, measurement FROM cases WHERE run_id = ? AND "
            "status = 'ok'", [run_id]).fetchall():
        measurement[case_id] = json.loads(m or "{}")
        cases[case_id] = (workload, model, backend, fmt, measurement[case_id].get("method", ""))
    blocks: dict[str, dict[str, list[float]]] = {}
    for case_id, name, value in con.execute(
            "SELECT case_id, metric, value FROM samples WHERE run_id = ? AND metric LIKE '%block_%_ms' "
            "ORDER BY case_id, metric, i", [run_id]).fetchall():
        blocks.setdefault(case_id, {}).setdefault(name, []).append(value)
    labels = {c: label_of_record(blocks.get(c, {}), measurement[c], is_cuda=is_cuda) for c in cases}
    speedup_labels = {}
    for c in cases:
        twin = measurement[c].get("twin")
        if blocks.get(c, {}).get("twin_block_wall_ms"):
            other = label_of_record(blocks[c], measurement[c], is_cuda=is_cuda, prefix="twin_")
        else:  # the twin's own record, where the run recorded it
            other = labels.get(twin, Bound.UNKNOWN if is_cuda else None)
        speedup_labels[c] = None if labels[c] is None and other is None else combine(
            *(x for x in (labels[c], other) if x is not None))
    values = {(c, m): v for c, m, v in con.execute(
        "SELECT case_id, metric, value FROM measurements WHERE run_id = ? AND list_contains(?, metric)",
        [run_id, metrics + list(SPEEDUPS) + list(NUMERICS)]).fetchall() if c in cases and v is not None}
    return _RunData(cases, labels, speedup_labels, values)


def _history(con, base: str, head: str, keys: list[tuple[str, str]]) -> np.ndarray:
    """Values of each series (rows, in `keys` order) in the earlier runs (columns, in start order): same GPU
    model and measurement version as the base, started before the head, neither base nor head, no injected
    slowdown (the test-only knob). NaN where a run lacks the series."""
    rows = con.execute("""
        SELECT r.run_id, m.case_id, m.metric, m.value FROM measurements m JOIN runs r USING (run_id)
        JOIN cases c USING (run_id, case_id), (SELECT * FROM runs WHERE run_id = ?) b
        WHERE c.status = 'ok' AND r.run_id NOT IN (?, ?)
          AND r.started_at < (SELECT started_at FROM runs WHERE run_id = ?)
          AND r.device_name = b.device_name
          AND r.measurement_version IS NOT DISTINCT FROM b.measurement_version
          AND coalesce(json_extract_string(r.config, '$.base.slowdown'), '') = ''
          AND list_contains(?, m.metric)
        ORDER BY r.started_at""", [base, base, head, head, sorted({m for _, m in keys})]).fetchall()
    runs = list(dict.fromkeys(r for r, _, _, _ in rows))
    col, row = {r: j for j, r in enumerate(runs)}, {k: i for i, k in enumerate(keys)}
    out = np.full((len(keys), len(runs)), np.nan)
    for run_id, case_id, metric, value in rows:
        i = row.get((case_id, metric))
        if i is not None and value is not None:
            out[i, col[run_id]] = value
    return out


def _not_comparable(case: str, metric: str, b: _RunData, h: _RunData, versions: str) -> tuple[str, str]:
    """(bound label, reason it is not comparable or '')."""
    labels = [x.speedup_labels[case] if metric in SPEEDUPS else x.labels[case] for x in (b, h)]
    bound = "" if None in labels else combine(*labels).value
    if versions:
        return bound, f"measurement versions {versions}"
    if Bound.UNSETTLED.value == bound:
        return bound, "unsettled"
    if metric in SPEEDUPS and b.cases[case][4] != h.cases[case][4]:
        return bound, f"speedup formed another way ({b.cases[case][4] or 'unstated'} → {h.cases[case][4] or 'unstated'})"
    if metric not in SPEEDUPS and "once" in (b.cases[case][4], h.cases[case][4]):
        return bound, "timed once (the emulator runs for its numerics)"
    return bound, ""


def _judge_series(con, base: str, head: str, b: _RunData, h: _RunData, versions: str,
                  cmp: Comparison) -> None:
    """Every timing and speedup both runs hold, judged at once; the rows go to cmp.changes, class shifts to
    cmp.class_changes."""
    keys = sorted(k for k in set(b.values) & set(h.values) if k[1] not in NUMERICS and b.values[k] > 0
                  and h.values[k] > 0)
    info = {k: _not_comparable(*k, b, h, versions) for k in keys}
    judged = [k for k in keys if not info[k][1]]
    d = [math.log(h.values[k] / b.values[k]) for k in judged]
    # like series, most alike first: the same backend and precision, then backend, model, workload
    classes = [(m, info[(c, m)][0], *b.cases[c][:3], "bf16" if b.cases[c][3] == "bf16" else "fp8") for c, m in judged]
    levels = [classes] + [[x[:n] for x in classes] for n in (5, 4, 3, 2)]
    result = judge_comparison(d, _history(con, base, head, judged), levels,
                              [METRICS[m][1] == "higher" for _, m in judged])
    where = {k: i for i, k in enumerate(judged)}
    for k in keys:
        bv, hv = b.values[k], h.values[k]
        i = where.get(k)
        if i is None or not result.verdict[i]:
            reason = info[k][1] or "no variance (no history, and under 8 like series)"
            cmp.changes.append(Change(*k, bv, hv, hv / bv - 1, None, None, NOT_COMPARABLE, info[k][0], reason,
                                      None, versions))
            continue
        cmp.changes.append(Change(*k, bv, hv, hv / bv - 1, float(result.p[i]), float(result.detectable[i]),
                                  str(result.verdict[i]), info[k][0], str(result.source[i]),
                                  math.expm1(result.change[i]), versions))
    for c in result.classes:
        name = " · ".join(str(x) for x in c.key if x)
        cmp.class_changes.append(ClassChange(name, c.members, math.expm1(c.shift),
                                             None if math.isnan(c.p) else c.p, c.verdict,
                                             None if math.isnan(c.detectable) else c.detectable))


def _judge_numerics(b: _RunData, h: _RunData, versions: str, cmp: Comparison) -> None:
    for case_id, metric in sorted(k for k in set(b.values) & set(h.values) if k[1] in NUMERICS):
        bv, hv = b.values[(case_id, metric)], h.values[(case_id, metric)]
        delta = hv - bv
        verdict = (UNCHANGED if abs(delta) <= SQNR_TOLERANCE_DB or delta != delta
                   else IMPROVEMENT if delta > 0 else REGRESSION)
        cmp.changes.append(Change(case_id, metric, bv, hv, delta / abs(bv) if bv else 0.0, None, None, verdict,
                                  reason=f"by value (±{SQNR_TOLERANCE_DB} dB)", versions=versions))


def compare_runs(con, base_spec: str, head_spec: str, across_versions: bool = False) -> Comparison:
    base, head = resolve_run(con, base_spec), resolve_run(con, head_spec)
    if base == head:
        raise StoreError(f"BASE {base_spec!r} and HEAD {head_spec!r} are the same run ({base}); compare two runs")
    eb, eh = _env(con, base), _env(con, head)
    if eb["device_name"] != eh["device_name"]:
        raise StoreError(f"refusing to compare runs on different devices: {base} ran on {eb['device_name']!r}, "
                         f"{head} on {eh['device_name']!r}; compare runs of one GPU model")
    vb, vh = run_version(con, base), run_version(con, head)
    versions = check_versions(base, vb, head, vh, across_versions)
    cmp = Comparison(base, head, eb["device_name"] or "unknown device", vb, vh)
    cmp.env_changes = [f"{k} {eb[k]} → {eh[k]}" for k in ENV_KEYS if eb[k] != eh[k]]
    is_cuda = (eb["device_kind"] or "cuda") != "cpu"
    metrics = _timed_metrics(con, base, head)
    b, h = _run_data(con, base, metrics, is_cuda), _run_data(con, head, metrics, is_cuda)
    _judge_series(con, base, head, b, h, versions, cmp)
    _judge_numerics(b, h, versions, cmp)
    return cmp


def to_markdown(cmp: Comparison) -> str:
    lines = [f"### fp8bench compare: {cmp.base_run} → {cmp.head_run} ({cmp.device})", ""]
    if cmp.base_version != cmp.head_version:
        lines += [f"**Across measurement versions {cmp.base_version} → {cmp.head_version}**: changes are listed, "
                  "not judged.", ""]
    if cmp.env_changes:
        lines += ["Environment changed (a likely cause of any change below): " + "; ".join(cmp.env_changes), ""]
    lines.append(cmp.summary())
    shown = [c for c in cmp.changes if c.verdict in (REGRESSION, IMPROVEMENT)]
    if shown:
        rows = [[f"`{c.case_id}`", c.metric, c.bound, f"{c.base:.4g}", f"{c.head:.4g}", f"{c.rel_change:+.2%}",
                 "" if c.beyond_class is None else f"{c.beyond_class:+.2%}",
                 "" if c.p_value is None else f"{c.p_value:.2g}",
                 "" if c.detectable is None else f"{c.detectable:.1%}", f"**{c.verdict}**"] for c in shown]
        lines += ["", markdown.table(["case", "metric", "bound", "base", "head", "change", "beyond class", "p",
                                      "detectable", "verdict"], rows).rstrip("\n")]
    moved = [c for c in cmp.class_changes if c.verdict in (REGRESSION, IMPROVEMENT)]
    if moved:
        rows = [[c.name, str(c.members), f"{c.rel_change:+.2%}", f"**{c.verdict}**"] for c in moved]
        lines += ["", markdown.table(["class", "series", "shift", "verdict"], rows).rstrip("\n")]
    return "\n".join(lines) + "\n"
