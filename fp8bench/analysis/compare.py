"""Statistical A/B comparison of two runs and change-point detection over a run history.

Direction-aware (a higher `time_ms` is worse, a higher `sqnr_db` better). Timed metrics are compared on their
per-iteration samples with a Mann-Whitney U test and an effect-size floor: how far the case's median moves
between processes by itself. That spread comes from the case's history on the same GPU (runs that started
before the head, never after: a later run must not decide an earlier verdict) or, without enough history,
from repeated runs of the base or head commit. With neither, a change the samples show is answered
"insufficient data", not "regression": the spread within one process is far smaller than between processes
(docs/regression.md says by how much). Where the base commit has several
runs on the same GPU, the change must also hold against that commit's usual level ("usual").

Runs timed by different measurement versions (records.MEASUREMENT_VERSION) are not compared unless asked to,
and then every row says which versions it joins. Numerics are deterministic for a fixed seed and are compared
by value. No duckdb import: queries go through the store connection.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy
from scipy.stats import mannwhitneyu

from fp8bench.core import markdown
from fp8bench.core.records import METRICS, StoreError

ALPHA = 0.01
"""Two-sided significance level of the Mann-Whitney U test."""
MIN_FLOOR = 0.015
"""No timed change under 1.5% is called: just above the largest move of a stable case between two
processes of the same commit on the same GPU, where its samples within one run agree far more closely (the
A/A trials of docs/regression.md)."""
NOISE_MULTIPLE = 2.0
"""The within-run part of the floor: NOISE_MULTIPLE x the case's robust relative spread (1.4826·MAD/median, the
larger of both runs'). It alone never calls a change (see the module docstring)."""
REPEAT_MULTIPLE = 3.0
"""Without a history but with repeated runs of the base or head commit: floor = REPEAT_MULTIPLE x the largest
relative range of one commit's run medians (max - min over their median)."""
MIN_SAMPLES = 3
BETWEEN_MULTIPLE = 3.0
"""With a history: floor = BETWEEN_MULTIPLE x the case's run-to-run spread. Within-run and run-to-run noise
differ in both directions on a power-capped GPU: a short window of samples can agree closely while the median
moves between processes with the clock steps, and a long settled window can spread over several clock levels
while the medians agree. Only the run-to-run spread says how far a median moves by itself."""
JUMP_QUANTILE = 0.9
JUMP_MARGIN = 1.2
"""With a history the floor also covers the case's rare levels: JUMP_MARGIN x the JUMP_QUANTILE quantile of
its consecutive run-to-run moves. A case can sit on a level it reaches in a few runs of many; the robust spread
(a median of moves) does not see a level that rare, and a multiple of it lets one such run be called a
regression. The 90th percentile ignores the one large move a real step in the history makes, and so also a
level seen only once in a long history: that case is what the usual level (`usual_level`) catches. The trials
behind these numbers: docs/regression.md."""
MIN_HISTORY = 5
"""Runs of the case (same device and environment, no injected slowdown) needed to estimate run-to-run noise."""
MIN_LEVEL_RUNS = 3
"""Runs of the base commit on the same GPU needed before its usual level is judged against too (below)."""
SQNR_TOLERANCE_DB = 0.5
"""Numerics change by more than this many dB is a verdict (they are deterministic for a fixed seed)."""
ENV_KEYS = ("torch", "cuda", "driver", "transformer_engine", "torchao", "triton", "python")


@dataclass(frozen=True)
class Change:
    case_id: str
    metric: str
    base: float
    head: float
    rel_change: float
    """(head - base) / base."""
    p_value: float | None
    floor: float | None
    verdict: str
    """regression | improvement | unchanged | insufficient data"""
    level: float | None = None
    """The base commit's usual value on this GPU (median over its runs), when it has MIN_LEVEL_RUNS runs."""
    versions: str = ""
    """'v2 → v4' when the two runs were timed by different measurement versions (compare --across-versions)."""


@dataclass
class Comparison:
    base_run: str
    head_run: str
    device: str
    base_version: int | None = None
    head_version: int | None = None
    env_changes: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.verdict == "regression"]

    def summary(self) -> str:
        """e.g. '2 regression, 0 improvement, 78 unchanged, 0 insufficient data'."""
        verdicts = ("regression", "improvement", "unchanged", "insufficient data") + (
            ("host-bound",) if any(c.verdict == "host-bound" for c in self.changes) else ())
        return ", ".join(f"{sum(c.verdict == v for c in self.changes)} {v}" for v in verdicts)


def resolve_run(con, spec: str) -> str:
    """A run id, a git commit (prefix; its latest run), or 'latest'."""
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
            "be the method's, not the code's. Re-run the base, or pass --across-versions to compare anyway "
            "(every row is labelled)")
    return f"v{vb} → v{vh}"


def _env(con, run_id: str) -> dict:
    cols = ", ".join(f"e.{k}" for k in ENV_KEYS)
    row = con.execute(f"SELECT r.device_name, {cols} FROM runs r LEFT JOIN environments e USING (env_id) "
                      "WHERE r.run_id = ?", [run_id]).fetchone()
    return dict(zip(("device_name", *ENV_KEYS), row, strict=True))


def _samples(con, run_id: str) -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = {}
    for case_id, metric, value in con.execute(
            "SELECT s.case_id, s.metric, s.value FROM samples s JOIN cases c USING (run_id, case_id) "
            "WHERE s.run_id = ? AND c.status = 'ok' ORDER BY s.case_id, s.metric, s.i", [run_id]).fetchall():
        out.setdefault((case_id, metric), []).append(value)
    return out


def _values(con, run_id: str, metrics: list[str]) -> dict[str, dict[str, float | None]]:
    """{case: {metric: value, None where the case lacks it}} of the run's ok cases that have any of `metrics`."""
    out: dict[str, dict[str, float | None]] = {}
    for case_id, metric, value in con.execute(
            "SELECT m.case_id, m.metric, m.value FROM measurements m JOIN cases c USING (run_id, case_id) "
            "WHERE m.run_id = ? AND list_contains(?, m.metric) AND c.status = 'ok'", [run_id, metrics]).fetchall():
        out.setdefault(case_id, dict.fromkeys(metrics))[metric] = value
    return out


def _history(con, base: str, head: str) -> dict[tuple[str, str], list[tuple[str | None, float]]]:
    """Per (case, metric): (git commit, median) of the runs on the base run's device and environment (which
    holds the physical GPU) and measurement version, in start order, that started before the head run (so a
    later run never changes a verdict), leaving out the head and runs with an injected slowdown (the
    test-only knob)."""
    rows = con.execute("""
        SELECT m.case_id, m.metric, r.git_commit, m.value FROM measurements m JOIN runs r USING (run_id)
        JOIN cases c USING (run_id, case_id)
        WHERE c.status = 'ok' AND NOT m.derived AND r.run_id != ?
          AND r.started_at < (SELECT started_at FROM runs WHERE run_id = ?)
          AND r.device_name = (SELECT device_name FROM runs WHERE run_id = ?)
          AND r.env_id IS NOT DISTINCT FROM (SELECT env_id FROM runs WHERE run_id = ?)
          AND r.measurement_version IS NOT DISTINCT FROM (SELECT measurement_version FROM runs WHERE run_id = ?)
          AND coalesce(json_extract_string(r.config, '$.base.slowdown'), '') = ''
        ORDER BY r.started_at""", [head, head, base, base, base]).fetchall()
    out: dict[tuple[str, str], list[tuple[str | None, float]]] = {}
    for case_id, metric, commit, value in rows:
        out.setdefault((case_id, metric), []).append((commit, value))
    return out


def _repeats(con, run_id: str, head: str) -> dict[tuple[str, str], list[float]]:
    """Per (case, metric): the medians of every run of `run_id`'s commit on its device, environment and
    measurement version that started no later than the head run: the commit's repeats, which show how far a
    median moves between processes without a history."""
    rows = con.execute("""
        SELECT m.case_id, m.metric, m.value FROM measurements m JOIN runs r USING (run_id)
        JOIN cases c USING (run_id, case_id), (SELECT * FROM runs WHERE run_id = ?) x
        WHERE c.status = 'ok' AND NOT m.derived
          AND r.git_commit = x.git_commit AND r.device_name = x.device_name
          AND r.env_id IS NOT DISTINCT FROM x.env_id
          AND r.measurement_version IS NOT DISTINCT FROM x.measurement_version
          AND r.started_at <= (SELECT started_at FROM runs WHERE run_id = ?)
          AND coalesce(json_extract_string(r.config, '$.base.slowdown'), '') = ''""", [run_id, head]).fetchall()
    out: dict[tuple[str, str], list[float]] = {}
    for case_id, metric, value in rows:
        out.setdefault((case_id, metric), []).append(value)
    return out


def repeat_noise(*sides: list[float]) -> float | None:
    """REPEAT_MULTIPLE x the largest relative range of one side's run medians; None when no side has two."""
    ranges = [(max(xs) - min(xs)) / statistics.median(xs) for xs in sides if len(xs) >= 2 and statistics.median(xs)]
    return REPEAT_MULTIPLE * max(ranges) if ranges else None


def usual_level(history: list[tuple[str | None, float]], commit: str | None) -> float | None:
    """The median of `commit`'s runs in a case's history, None with fewer than MIN_LEVEL_RUNS of them."""
    values = [v for c, v in history if commit is not None and c == commit]
    return statistics.median(values) if len(values) >= MIN_LEVEL_RUNS else None


def robust_rel_spread(xs: list[float]) -> float:
    med = statistics.median(xs)
    mad = statistics.median(abs(x - med) for x in xs)
    return 1.4826 * mad / med if med else float("inf")


def run_to_run_noise(medians: list[float]) -> float | None:
    """How far the case's median moves between consecutive runs of one commit by itself, from its history:
    the larger of BETWEEN_MULTIPLE x the robust spread of the moves (1.4826 x median |Δ| / level) and
    JUMP_MARGIN x their JUMP_QUANTILE quantile (rare levels). None with fewer than MIN_HISTORY runs."""
    if len(medians) < MIN_HISTORY:
        return None
    diffs = [abs(b - a) / a for a, b in zip(medians, medians[1:], strict=False) if a]
    if not diffs:
        return None
    robust = 1.4826 * statistics.median(diffs)
    return max(BETWEEN_MULTIPLE * robust, JUMP_MARGIN * float(numpy.quantile(diffs, JUMP_QUANTILE)))


def judge_samples(base: list[float], head: list[float], direction: str, between: float | None = None,
                  level: float | None = None) -> tuple[float, float | None, float | None, str]:
    """(relative change of medians, p-value, floor, verdict) for one timed metric. `between`: how far the
    case's median moves between runs by itself (run_to_run_noise from its history, or repeat_noise from
    repeated runs); without it a change the samples show is "insufficient data". `level`: the base commit's
    usual value on this GPU (usual_level), when known: a change is then called only if it also clears the
    floor against that level, in the same direction."""
    mb, mh = statistics.median(base), statistics.median(head)
    rel = (mh - mb) / mb if mb else float("inf")
    if len(base) < MIN_SAMPLES or len(head) < MIN_SAMPLES:
        return rel, None, None, "insufficient data"
    # With a history, the case's own run-to-run spread is its noise: on a power-capped GPU a long window of
    # samples spans several clock levels while the medians of repeated runs agree more closely, so the
    # within-run spread would hide real changes. Without one, it is all we have.
    noise = between if between else NOISE_MULTIPLE * max(robust_rel_spread(base), robust_rel_spread(head))
    floor = max(MIN_FLOOR, noise)
    p = float(mannwhitneyu(base, head, alternative="two-sided").pvalue)
    if p >= ALPHA or abs(rel) < floor:
        return rel, p, floor, "unchanged"
    if not between:  # only the spread within one process is known: it cannot tell a change from a new process
        return rel, p, floor, "insufficient data"
    # A base run that landed on one of its commit's rare levels makes the next, usual run look changed. The
    # head must also differ from where that commit usually runs.
    if level and ((mh - level) / level * (1 if rel > 0 else -1)) < floor:
        return rel, p, floor, "unchanged"
    worse = rel > 0 if direction == "lower" else rel < 0
    return rel, p, floor, "regression" if worse else "improvement"


def compare_runs(con, base_spec: str, head_spec: str, across_versions: bool = False) -> Comparison:
    base, head = resolve_run(con, base_spec), resolve_run(con, head_spec)
    if base == head:
        raise StoreError(f"BASE {base_spec!r} and HEAD {head_spec!r} are the same run ({base}); compare two runs")
    eb, eh = _env(con, base), _env(con, head)
    if eb["device_name"] != eh["device_name"]:
        raise StoreError(f"refusing to compare runs on different devices: {base} ran on {eb['device_name']!r}, "
                         f"{head} on {eh['device_name']!r}; compare runs of one GPU model")
    vb, vh = run_version(con, base), run_version(con, head)
    label = check_versions(base, vb, head, vh, across_versions)
    cmp = Comparison(base, head, eb["device_name"] or "unknown device", vb, vh)
    cmp.env_changes = [f"{k} {eb[k]} → {eh[k]}" for k in ENV_KEYS if eb[k] != eh[k]]
    sb, sh = _samples(con, base), _samples(con, head)
    history = _history(con, base, head)
    repeats_b, repeats_h = _repeats(con, base, head), _repeats(con, head, head)
    base_commit = con.execute("SELECT git_commit FROM runs WHERE run_id = ?", [base]).fetchone()[0]
    for key in sorted(k for k in set(sb) & set(sh) if k[1] in METRICS):  # timings, not loss curves
        case_id, metric = key
        runs = history.get(key, [])
        level = usual_level(runs, base_commit)
        between = run_to_run_noise([v for _, v in runs]) or repeat_noise(repeats_b.get(key, []), repeats_h.get(key, []))
        rel, p, floor, verdict = judge_samples(sb[key], sh[key], METRICS.get(metric, ("", "lower"))[1],
                                               between, level)
        cmp.changes.append(Change(case_id, metric, statistics.median(sb[key]), statistics.median(sh[key]), rel, p,
                                  floor, verdict, level, label))
    cmp.changes += _speedup_changes(con, base, head, label)
    accuracy = ["sqnr_db", "reference_sqnr_db"]  # by value: deterministic on the same seeded inputs
    qb, qh = _values(con, base, accuracy), _values(con, head, accuracy)
    for case_id in sorted(set(qb) & set(qh)):
        for metric in accuracy:
            b, h = qb[case_id][metric], qh[case_id][metric]
            if b is None or h is None:
                continue
            delta = h - b
            verdict = ("unchanged" if abs(delta) <= SQNR_TOLERANCE_DB or delta != delta
                       else "improvement" if delta > 0 else "regression")
            cmp.changes.append(Change(case_id, metric, b, h, delta / abs(b) if b else 0.0, None, None, verdict,
                                      None, label))
    return cmp


def _speedup_changes(con, base: str, head: str, label: str) -> list[Change]:
    """Speedups are judged by their intervals: a change when each run's speedup lies outside the other's 95%
    interval of what a box of this GPU model measures (speedup_vs_bf16[_kernel]_box_lo/hi). With only the
    runs' own intervals over rounds (no between-box spread for this device), an apparent change is
    "insufficient data"; a figure host-bound on either side is "host-bound", not a property of the GPU."""
    out = []
    for name in ("speedup_vs_bf16", "speedup_vs_bf16_kernel"):
        cols = [name, f"{name}_box_lo", f"{name}_box_hi", f"{name}_lo", f"{name}_hi", "host_bound"]
        b, h = _values(con, base, cols), _values(con, head, cols)
        for case_id in sorted(set(b) & set(h)):
            mb, mh = b[case_id], h[case_id]
            sb, sh = mb[name], mh[name]
            if sb is None or sh is None:
                continue
            boxed = all(m[k] is not None for m in (mb, mh) for k in (f"{name}_box_lo", f"{name}_box_hi"))
            lo, hi = (f"{name}_box_lo", f"{name}_box_hi") if boxed else (f"{name}_lo", f"{name}_hi")
            known = None not in (mb[lo], mb[hi], mh[lo], mh[hi])
            apart = known and not (mb[lo] <= sh <= mb[hi]) and not (mh[lo] <= sb <= mh[hi])
            if 1.0 in (mb["host_bound"], mh["host_bound"]):
                verdict = "host-bound"
            elif not known:  # a speedup derived from two separately timed cases (before version 4): no interval
                verdict = "unchanged" if sb == sh else "insufficient data"
            elif not apart:
                verdict = "unchanged"
            elif not boxed:
                verdict = "insufficient data"
            else:
                verdict = "improvement" if sh > sb else "regression"
            out.append(Change(case_id, name, sb, sh, (sh - sb) / sb if sb else 0.0, None, None, verdict, None, label))
    return out


def to_markdown(cmp: Comparison) -> str:
    lines = [f"### fp8bench compare: {cmp.base_run} → {cmp.head_run} ({cmp.device})", ""]
    if cmp.base_version != cmp.head_version:
        lines += [f"**Across measurement versions {cmp.base_version} → {cmp.head_version}**: a change below can be "
                  "the timing method's.", ""]
    if cmp.env_changes:
        lines += ["Environment changed (a likely cause of any change below): " + "; ".join(cmp.env_changes), ""]
    shown = [c for c in cmp.changes if c.verdict in ("regression", "improvement")]
    lines.append(cmp.summary())
    if shown:
        rows = [[f"`{c.case_id}`", c.metric, f"{c.base:.4g}", f"{c.level:.4g}" if c.level is not None else "",
                 f"{c.head:.4g}", f"{c.rel_change:+.2%}", f"{c.p_value:.2g}" if c.p_value is not None else "",
                 f"{c.floor:.1%}" if c.floor is not None else "", f"**{c.verdict}**"] for c in shown]
        lines += ["", markdown.table(["case", "metric", "base", "usual", "head", "change", "p", "floor", "verdict"],
                                     rows).rstrip("\n")]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- change points

@dataclass(frozen=True)
class StepChange:
    series: str
    index: int
    """Position of the first point of the new level."""
    commit: str | None
    run_id: str
    before: float
    after: float
    versions: str = ""
    """'v3 → v4' when the step joins runs of different measurement versions (history --across-versions)."""

    @property
    def rel_change(self) -> float:
        return (self.after - self.before) / self.before if self.before else float("inf")


def change_points(values: list[float], min_rel: float = 0.02, min_segment: int = 2) -> list[int]:
    """Indices where a persistent level shift starts (binary segmentation with an L1 cost around medians).

    The split that most reduces the summed absolute deviation from each side's median is kept when both
    sides have `min_segment` points, their medians differ by at least `min_rel`, and the split removes at
    least 30% of the segment's deviation (noise alone removes little); then each side is searched again. A
    blip shorter than `min_segment` points never moves a median, so it is never reported.
    """
    def cost(xs: list[float]) -> float:
        m = statistics.median(xs)
        return sum(abs(x - m) for x in xs)

    def best_split(lo: int, hi: int) -> int | None:
        candidates = range(lo + min_segment, hi - min_segment + 1)
        if not candidates:
            return None
        k = min(candidates, key=lambda j: cost(values[lo:j]) + cost(values[j:hi]))
        ml, mr = statistics.median(values[lo:k]), statistics.median(values[k:hi])
        whole = cost(values[lo:hi])
        reduction = 1.0 - (cost(values[lo:k]) + cost(values[k:hi])) / whole if whole else 0.0
        rel = abs(mr - ml) / abs(ml) if ml else float("inf")
        return k if rel >= min_rel and reduction >= 0.3 else None

    found: list[int] = []
    stack = [(0, len(values))]
    while stack:
        lo, hi = stack.pop()
        k = best_split(lo, hi)
        if k is not None:
            found.append(k)
            stack += [(lo, k), (k, hi)]
    return sorted(found)


def history_steps(con, metric: str = "time_ms", min_runs: int = 5, across_versions: bool = False) -> list[StepChange]:
    """Change points of every (device, case) series of `metric` medians, runs ordered by start time. A series
    never spans measurement versions (a new version starts a new series, as in asv) unless `across_versions`,
    in which case each step says which versions it joins."""
    rows = con.execute("""
        SELECT r.device_name, m.case_id, r.run_id, r.git_commit, r.started_at, m.value, r.measurement_version
        FROM measurements m JOIN runs r USING (run_id) JOIN cases c USING (run_id, case_id)
        WHERE m.metric = ? AND c.status = 'ok' ORDER BY r.device_name, m.case_id, r.started_at""",
                       [metric]).fetchall()
    series: dict[tuple, list[tuple]] = {}
    for device, case_id, run_id, commit, _, value, version in rows:
        key = (device, case_id) if across_versions else (device, case_id, version)
        series.setdefault(key, []).append((run_id, commit, value, version))
    steps = []
    for key, pts in series.items():
        if len(pts) < min_runs:
            continue
        vals = [v for _, _, v, _ in pts]
        cps = change_points(vals)
        name = f"{key[0]} · {key[1]}" + ("" if across_versions else f" · v{key[2]}")
        for k in cps:
            prev_k = max([j for j in cps if j < k], default=0)
            next_k = min([j for j in cps if j > k], default=len(vals))
            joined = sorted({p[3] for p in pts[prev_k:next_k]}, key=lambda v: (v is None, v))
            steps.append(StepChange(name, k, pts[k][1], pts[k][0], statistics.median(vals[prev_k:k]),
                                    statistics.median(vals[k:next_k]),
                                    " → ".join(f"v{v}" for v in joined) if len(joined) > 1 else ""))
    return steps
