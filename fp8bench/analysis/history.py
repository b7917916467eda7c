"""Persistent steps in each case's series of runs (`fp8bench history`), judged like `compare` judges changes.

Candidate steps are found by binary segmentation around medians (change_points); each is then tested: the
step between the medians of the segments around it, in log, against the series' own run-to-run spread within
those segments (robustly: step_test), and all steps of one call are judged together by
Benjamini-Hochberg (fp8bench.core.judging.FDR). A series is one (device, case, metric) and never spans
measurement versions unless asked to. Runs whose case the bound rule calls `unsettled` are left out of its
series and counted; host-bound series are judged on their own (wider) variance and say so.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass

import numpy as np
from scipy.special import stdtr, stdtrit

from fp8bench.core.bound import Bound, label_of_record
from fp8bench.core.judging import FDR, MAD_EFFICIENCY, MIN_CHANGE, POWER, benjamini_hochberg


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
    p_value: float | None = None
    bound: str = ""
    """The bound label of the series' runs ('device-bound', 'host-bound', 'unknown', '' on a CPU)."""
    detectable: float | None = None
    """The smallest step this series' variance lets a test of this size catch with 80% power."""

    @property
    def rel_change(self) -> float:
        return (self.after - self.before) / self.before if self.before else float("inf")


@dataclass
class History:
    """What `fp8bench history` found: the judged steps, and what was left out and why."""

    steps: list[StepChange]
    candidates: int
    """Steps the segmentation proposed, before the test."""
    series: int
    unsettled_points: int
    """Runs left out of their series because the bound rule called the case unsettled in them."""


def change_points(values: list[float], min_rel: float = MIN_CHANGE, min_segment: int = 2) -> list[int]:
    """Indices where a persistent level shift starts (binary segmentation with an L1 cost around medians).

    The split that most reduces the summed absolute deviation from each side's median is kept when both
    sides have `min_segment` points, their medians differ by at least `min_rel`, and the split removes at
    least 30% of the segment's deviation (noise alone removes little); then each side is searched again. A
    blip shorter than `min_segment` points never moves a median, so it is never reported. These are
    candidates: step_test decides.
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


def step_test(before: list[float], after: list[float]) -> tuple[float, float, float]:
    """(p-value, df, standard error) of the step between the medians of two segments of run values, in log:
    robust, since the segments are found around medians and a one-run blip sits inside them. The scale is
    1.4826 x the median absolute deviation of both segments around their own medians; a median's variance
    is pi / 2 x scale^2 / n; df MAD_EFFICIENCY x the residual count. With no spread on either side
    (identical runs) the p-value is 0 for any step."""
    a, b = np.log(before), np.log(after)
    resid = np.concatenate([a - np.median(a), b - np.median(b)])
    scale = 1.4826 * float(np.median(np.abs(resid)))
    step = float(np.median(b) - np.median(a))
    df = max(1.0, MAD_EFFICIENCY * (len(a) + len(b) - 2))
    se = scale * math.sqrt(math.pi / 2 * (1 / len(a) + 1 / len(b)))
    if se <= 0:
        return (0.0 if step else 1.0), df, 0.0
    return float(2 * stdtr(df, -abs(step) / se)), df, se


def _points(con, metric: str, across_versions: bool) -> tuple[dict, int]:
    """{series key: [(run_id, commit, value, version, label)]} in start order, and the unsettled points left
    out. A point's label comes from its stored block times (fp8bench.core.bound.label_of_record)."""
    rows = con.execute("""
        SELECT r.device_name, m.case_id, r.run_id, r.git_commit, m.value, r.measurement_version, c.measurement,
               e.device_kind
        FROM measurements m JOIN runs r USING (run_id) JOIN cases c USING (run_id, case_id)
        LEFT JOIN environments e USING (env_id)
        WHERE m.metric = ? AND c.status = 'ok'
          AND coalesce(json_extract_string(r.config, '$.base.slowdown'), '') = ''
        ORDER BY r.device_name, m.case_id, r.started_at""", [metric]).fetchall()
    blocks: dict = {}
    for run_id, case_id, name, value in con.execute(
            "SELECT run_id, case_id, metric, value FROM samples WHERE metric LIKE '%block_%_ms' ORDER BY i").fetchall():
        blocks.setdefault((run_id, case_id), {}).setdefault(name, []).append(value)
    series: dict = {}
    unsettled = 0
    for device, case_id, run_id, commit, value, version, measurement, kind in rows:
        label = label_of_record(blocks.get((run_id, case_id), {}), json.loads(measurement or "{}"),
                                is_cuda=(kind or "cuda") != "cpu")
        if label is Bound.UNSETTLED:
            unsettled += 1
            continue
        key = (device, case_id) if across_versions else (device, case_id, version)
        if metric.startswith("speedup_vs_bf16"):  # a speedup formed another way starts a series of its own
            key += (json.loads(measurement or "{}").get("method", ""),)
        series.setdefault(key, []).append((run_id, commit, value, version, label))
    return series, unsettled


def history_steps(con, metric: str = "time_ms", min_runs: int = 5, across_versions: bool = False) -> list[StepChange]:
    """The judged steps of every series of `metric` (judge_history's, without the counts)."""
    return judge_history(con, metric, min_runs, across_versions).steps


def judge_history(con, metric: str = "time_ms", min_runs: int = 5, across_versions: bool = False) -> History:
    """Change points of every (device, case) series of `metric` medians, runs ordered by start time, each tested
    (module docstring). A series never spans measurement versions (a new version starts a new series, as in
    asv) unless `across_versions`, in which case each step says which versions it joins."""
    series, unsettled = _points(con, metric, across_versions)
    found: list[tuple] = []
    judged = 0
    for key, pts in series.items():
        if len(pts) < min_runs:
            continue
        judged += 1
        vals = [v for _, _, v, _, _ in pts]
        cps = change_points(vals)
        labels = {p[4] for p in pts}
        bound = next((b.value for b in (Bound.HOST, Bound.UNKNOWN, Bound.DEVICE) if b in labels), "")
        name = f"{key[0]} · {key[1]}" + ("" if across_versions else f" · v{key[2]}")
        for k in cps:
            lo = max([j for j in cps if j < k], default=0)
            hi = min([j for j in cps if j > k], default=len(vals))
            p, df, se = step_test(vals[lo:k], vals[k:hi])
            joined = sorted({q[3] for q in pts[lo:hi]}, key=lambda v: (v is None, v))
            found.append((StepChange(name, k, pts[k][1], pts[k][0], statistics.median(vals[lo:k]),
                                     statistics.median(vals[k:hi]),
                                     " → ".join(f"v{v}" for v in joined) if len(joined) > 1 else "", p, bound),
                          df, se))
    keep = benjamini_hochberg([s.p_value for s, _, _ in found], FDR)
    m = max(len(found), 1)
    steps = []
    for (s, df, se), ok in zip(found, keep, strict=True):
        reach = (stdtrit(df, 1 - FDR / (2 * m)) + stdtrit(df, POWER)) * se
        if ok:
            steps.append(StepChange(**{**s.__dict__, "detectable": float(math.expm1(reach))}))
    return History(steps, len(found), judged, unsettled)
