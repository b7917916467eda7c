"""Statistical A/B comparison of two runs and change-point detection over a run history.

Direction-aware (a higher `time_ms` is worse, a higher `sqnr_db` better). Timed metrics are compared on their
per-iteration samples with a Mann-Whitney U test and an effect-size floor derived from that case's own noise,
so a noisy case needs a bigger change before it is called; where the base commit has several runs on the same
GPU, the change must also hold against that commit's usual level ("usual"), not only against one base run.
Numerics are deterministic for a fixed seed and are compared by value. No duckdb import: queries go through the
store connection.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

import numpy
from scipy.stats import mannwhitneyu

from fp8bench.records import METRICS, StoreError

ALPHA = 0.01
"""Two-sided significance level of the Mann-Whitney U test."""
MIN_FLOOR = 0.015
"""No timed change under 1.5% is called. Calibrated on 23 A/A pairs of separate processes on one H200
(results/h200-checks/regression_trials.json): the largest move of a stable case between two runs of the same
commit on the same GPU was 1.1%, while its samples within a run agree to ~0.1%."""
NOISE_MULTIPLE = 2.0
"""Without a history: floor = NOISE_MULTIPLE x the case's robust relative spread (1.4826·MAD/median, the
larger of both runs')."""
MIN_SAMPLES = 3
BETWEEN_MULTIPLE = 3.0
"""With a history: floor = BETWEEN_MULTIPLE x the case's run-to-run spread. Within-run and run-to-run noise
differ in both directions on an H200: over 80 ms a BF16 GEMM's samples agreed to 0.1% while its median moved
~7% between processes (clock steps); sampled over ~1 s after settling, its samples spread 1-2.6% while the
medians agreed to ~0.5%. Only the run-to-run spread says how far a median moves by itself."""
JUMP_QUANTILE = 0.9
JUMP_MARGIN = 1.2
"""With a history the floor also covers the case's rare levels: JUMP_MARGIN x the JUMP_QUANTILE quantile of
its consecutive run-to-run moves. On an H200 a BF16 linear's median sat 1.7% above its usual level in 2 of 11
runs of one commit; the robust spread (a median of moves) does not see a level that rare, and 3x it (0.5%)
let one such run be called a regression (results/h200-checks/regression_trials_settled.json). The 90th
percentile ignores the one large move a real step in the history makes, and so also a level seen once in ~40
runs: on the out-of-sample trials (regression_trials_s6.json) a base run 2% under the BF16 linear's usual
level still made the next, usual run a false regression (1 of 34 A/A pairs)."""
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


@dataclass
class Comparison:
    base_run: str
    head_run: str
    device: str
    env_changes: list[str] = field(default_factory=list)
    changes: list[Change] = field(default_factory=list)

    @property
    def regressions(self) -> list[Change]:
        return [c for c in self.changes if c.verdict == "regression"]

    def summary(self) -> str:
        """e.g. '2 regression, 0 improvement, 78 unchanged, 0 insufficient data'."""
        return ", ".join(f"{sum(c.verdict == v for c in self.changes)} {v}"
                         for v in ("regression", "improvement", "unchanged", "insufficient data"))


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


def _values(con, run_id: str, metric: str) -> dict[str, float]:
    return dict(con.execute("SELECT m.case_id, m.value FROM measurements m JOIN cases c USING (run_id, case_id) "
                            "WHERE m.run_id = ? AND m.metric = ? AND c.status = 'ok'", [run_id, metric]).fetchall())


def _history(con, base: str, exclude: str) -> dict[tuple[str, str], list[tuple[str | None, float]]]:
    """Per (case, metric): (git commit, median) of the runs on the base run's device and environment (which
    holds the physical GPU), in start order, leaving out `exclude` and runs with an injected slowdown (the
    test-only knob)."""
    rows = con.execute("""
        SELECT m.case_id, m.metric, r.git_commit, m.value FROM measurements m JOIN runs r USING (run_id)
        JOIN cases c USING (run_id, case_id)
        WHERE c.status = 'ok' AND NOT m.derived AND r.run_id != ?
          AND r.device_name = (SELECT device_name FROM runs WHERE run_id = ?)
          AND r.env_id IS NOT DISTINCT FROM (SELECT env_id FROM runs WHERE run_id = ?)
          AND coalesce(json_extract_string(r.config, '$.base.slowdown'), '') = ''
        ORDER BY r.started_at""", [exclude, base, base]).fetchall()
    out: dict[tuple[str, str], list[tuple[str | None, float]]] = {}
    for case_id, metric, commit, value in rows:
        out.setdefault((case_id, metric), []).append((commit, value))
    return out


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
    case's median moves between runs by itself, from its history (run_to_run_noise), when known. `level`: the
    base commit's usual value on this GPU (usual_level), when known: a change is then called only if it also
    clears the floor against that level, in the same direction."""
    mb, mh = statistics.median(base), statistics.median(head)
    rel = (mh - mb) / mb if mb else float("inf")
    if len(base) < MIN_SAMPLES or len(head) < MIN_SAMPLES:
        return rel, None, None, "insufficient data"
    # With a history, the case's own run-to-run spread is its noise: on a power-capped GPU a ~1 s window of
    # samples spans several clock levels (a 1-2.6% spread within the run) while the medians of repeated
    # runs agree to ~0.5%, so the within-run spread would hide real changes. Without one, it is all we have.
    noise = between if between else NOISE_MULTIPLE * max(robust_rel_spread(base), robust_rel_spread(head))
    floor = max(MIN_FLOOR, noise)
    p = float(mannwhitneyu(base, head, alternative="two-sided").pvalue)
    if p >= ALPHA or abs(rel) < floor:
        return rel, p, floor, "unchanged"
    # A base run that landed on one of its commit's rare levels makes the next, usual run look changed (an
    # H200 BF16 linear: a base 2% under its usual level, regression_trials_s6.json). The head must also
    # differ from where that commit usually runs.
    if level and ((mh - level) / level * (1 if rel > 0 else -1)) < floor:
        return rel, p, floor, "unchanged"
    worse = rel > 0 if direction == "lower" else rel < 0
    return rel, p, floor, "regression" if worse else "improvement"


def compare_runs(con, base_spec: str, head_spec: str) -> Comparison:
    base, head = resolve_run(con, base_spec), resolve_run(con, head_spec)
    eb, eh = _env(con, base), _env(con, head)
    if eb["device_name"] != eh["device_name"]:
        raise StoreError(f"refusing to compare runs on different devices: {base} ran on {eb['device_name']!r}, "
                         f"{head} on {eh['device_name']!r}; compare runs of one GPU model")
    cmp = Comparison(base, head, eb["device_name"] or "unknown device")
    cmp.env_changes = [f"{k} {eb[k]} → {eh[k]}" for k in ENV_KEYS if eb[k] != eh[k]]
    sb, sh = _samples(con, base), _samples(con, head)
    history = _history(con, base, exclude=head)
    base_commit = con.execute("SELECT git_commit FROM runs WHERE run_id = ?", [base]).fetchone()[0]
    for key in sorted(k for k in set(sb) & set(sh) if k[1] in METRICS):  # timings, not loss curves
        case_id, metric = key
        runs = history.get(key, [])
        level = usual_level(runs, base_commit)
        rel, p, floor, verdict = judge_samples(sb[key], sh[key], METRICS.get(metric, ("", "lower"))[1],
                                               run_to_run_noise([v for _, v in runs]), level)
        cmp.changes.append(Change(case_id, metric, statistics.median(sb[key]), statistics.median(sh[key]), rel, p,
                                  floor, verdict, level))
    vb, vh = _values(con, base, "sqnr_db"), _values(con, head, "sqnr_db")
    for case_id in sorted(set(vb) & set(vh)):
        delta = vh[case_id] - vb[case_id]
        verdict = ("unchanged" if abs(delta) <= SQNR_TOLERANCE_DB or delta != delta
                   else "improvement" if delta > 0 else "regression")
        cmp.changes.append(Change(case_id, "sqnr_db", vb[case_id], vh[case_id],
                                  delta / abs(vb[case_id]) if vb[case_id] else 0.0, None, None, verdict))
    return cmp


def to_markdown(cmp: Comparison) -> str:
    lines = [f"### fp8bench compare: {cmp.base_run} → {cmp.head_run} ({cmp.device})", ""]
    if cmp.env_changes:
        lines += ["Environment changed (a likely cause of any change below): " + "; ".join(cmp.env_changes), ""]
    shown = [c for c in cmp.changes if c.verdict in ("regression", "improvement")]
    lines.append(cmp.summary())
    if shown:
        lines += ["", "| case | metric | base | usual | head | change | p | floor | verdict |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for c in shown:
            p = f"{c.p_value:.2g}" if c.p_value is not None else ""
            floor = f"{c.floor:.1%}" if c.floor is not None else ""
            usual = f"{c.level:.4g}" if c.level is not None else ""
            lines.append(f"| `{c.case_id}` | {c.metric} | {c.base:.4g} | {usual} | {c.head:.4g} | {c.rel_change:+.2%} | "
                         f"{p} | {floor} | **{c.verdict}** |")
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


def history_steps(con, metric: str = "time_ms", min_runs: int = 5) -> list[StepChange]:
    """Change points of every (device, case) series of `metric` medians, runs ordered by start time."""
    rows = con.execute("""
        SELECT r.device_name, m.case_id, r.run_id, r.git_commit, r.started_at, m.value
        FROM measurements m JOIN runs r USING (run_id) JOIN cases c USING (run_id, case_id)
        WHERE m.metric = ? AND c.status = 'ok' ORDER BY r.device_name, m.case_id, r.started_at""",
                       [metric]).fetchall()
    series: dict[tuple[str, str], list[tuple]] = {}
    for device, case_id, run_id, commit, _, value in rows:
        series.setdefault((device, case_id), []).append((run_id, commit, value))
    steps = []
    for (device, case_id), pts in series.items():
        if len(pts) < min_runs:
            continue
        vals = [v for _, _, v in pts]
        cps = change_points(vals)
        for k in cps:
            prev_k = max([j for j in cps if j < k], default=0)
            next_k = min([j for j in cps if j > k], default=len(vals))
            steps.append(StepChange(f"{device} · {case_id}", k, pts[k][1], pts[k][0],
                                    statistics.median(vals[prev_k:k]), statistics.median(vals[k:next_k])))
    return steps
