"""Stored speedups rebuilt from the samples their records store: whether each can be, and what it comes to.

A speedup is rebuilt from the recipe's samples and its BF16 twin's (same run, `twin_id`), by the rule the run
that recorded it followed (`measurement.method`):

- `interleaved` with `<metric>_round` samples: fp8bench.core.intervals.recorded_speedup, the function the run
  itself stores (method ROUNDS); where several processes timed it, its interval is then moderated by the
  prior of its class over the run's rebuilt speedups (fp8bench.core.intervals.moderated_intervals), as ingest
  publishes it.
- `interleaved` without them (measurement version 4): the run timed `measurement.rounds` rounds of an equal
  block of iterations per op and stored the samples round by round, so the round of sample i is
  i // (samples / rounds); the speedup is then the same recorded_speedup: the median of the per-round ratios
  with its sign-test interval (method BLOCKS).
- `sandwich` (a training recipe, fp8bench.run.train_sandwich): fp8bench.core.intervals.recorded_sandwich over the
  blocks of steps of both sides that the recipe's own record stores (`sandwich_ms` with side, block and
  process), moderated like the interleaved ones (method SANDWICH).
- timed alone (training steps without a sandwich, the emulator, runs before side-by-side timing): the ratio of the twin's median
  to the recipe's (method MEDIANS), which is how those runs formed it; no interval. A side without samples
  (a record written by hand) gives its stored median.

A kernel-only speedup (`speedup_vs_bf16_kernel`) is the twin's `time_ms` over the recipe's `time_ms_kernel` (a
BF16 twin quantizes nothing: its kernel time is its time).

It cannot be rebuilt when its record names no twin, when a side timed beside the other has no samples, or
when the samples its ratios came from are in no record: a run records the twin once, with the samples of the first
batch of recipes it was timed beside (`measurement.timed_with` names each batch's members), so a recipe of a
later batch, or one whose twin's record holds a timing of its own, was divided by twin samples that were not
kept. Such figures are withdrawn from the pages (fp8bench.report.data.withdraw) and listed by `fp8bench audit`.
No torch, no duckdb: queries go through the store connection.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from fp8bench.core.intervals import (
    SANDWICH_METHOD,
    SANDWICH_SAMPLES,
    SpeedupInterval,
    moderated_intervals,
    recorded_sandwich,
    recorded_speedup,
    speedup_class,
)

SPEEDUPS = {"speedup_vs_bf16": "time_ms", "speedup_vs_bf16_kernel": "time_ms_kernel"}
"""Each stored speedup and the recipe's samples it is formed from (the twin's side is its `time_ms`)."""
TWIN_SAMPLES = "time_ms"

ROUNDS = "recorded rounds"
BLOCKS = "rounds from the sample order"
MEDIANS = "ratio of medians"
SANDWICH = "training sandwich"

TOLERANCE = 0.005
"""How far a rebuilt speedup or interval end may lie from the stored one: half a unit of the second decimal,
the precision every page prints a speedup at."""

_AVAILABILITY = """
WITH n AS (SELECT run_id, case_id, metric, count(*) AS n FROM samples
           WHERE metric IN ('time_ms', 'time_ms_kernel', 'sandwich_ms') GROUP BY ALL)
SELECT m.run_id, m.case_id, m.metric, m.value, lo.value, hi.value, c.twin_id, c.measurement,
       t.status, t.measurement, nc.n, nt.n, tc.value, tt.value, c.workload, ns.n
FROM measurements m JOIN cases c USING (run_id, case_id)
LEFT JOIN measurements lo ON lo.run_id = m.run_id AND lo.case_id = m.case_id AND lo.metric = m.metric || '_lo'
LEFT JOIN measurements hi ON hi.run_id = m.run_id AND hi.case_id = m.case_id AND hi.metric = m.metric || '_hi'
LEFT JOIN cases t ON t.run_id = c.run_id AND t.case_id = c.twin_id
LEFT JOIN n nc ON nc.run_id = m.run_id AND nc.case_id = m.case_id
     AND nc.metric = CASE m.metric WHEN 'speedup_vs_bf16' THEN 'time_ms' ELSE 'time_ms_kernel' END
LEFT JOIN n nt ON nt.run_id = m.run_id AND nt.case_id = c.twin_id AND nt.metric = 'time_ms'
LEFT JOIN n ns ON ns.run_id = m.run_id AND ns.case_id = m.case_id AND ns.metric = 'sandwich_ms'
LEFT JOIN measurements tc ON tc.run_id = m.run_id AND tc.case_id = m.case_id
     AND tc.metric = CASE m.metric WHEN 'speedup_vs_bf16' THEN 'time_ms' ELSE 'time_ms_kernel' END
LEFT JOIN measurements tt ON tt.run_id = m.run_id AND tt.case_id = c.twin_id AND tt.metric = 'time_ms'
WHERE m.metric IN ('speedup_vs_bf16', 'speedup_vs_bf16_kernel') AND m.value IS NOT NULL
ORDER BY m.run_id, m.case_id, m.metric"""


@dataclass(frozen=True, kw_only=True)
class Rebuilt:
    """One stored speedup beside what its samples give."""

    run_id: str
    case_id: str
    twin_id: str
    metric: str
    """`speedup_vs_bf16` or `speedup_vs_bf16_kernel`."""
    stored: float
    stored_lo: float | None
    stored_hi: float | None
    value: float | None = None
    """The rebuilt speedup; None when it cannot be rebuilt (`reason` says why)."""
    lo: float | None = None
    hi: float | None = None
    method: str = ""
    """ROUNDS, BLOCKS, SANDWICH or MEDIANS (module docstring)."""
    reason: str = ""
    """Why it cannot be rebuilt ('' when it was)."""

    @property
    def rebuilt(self) -> bool:
        return self.value is not None

    def differences(self, tolerance: float = TOLERANCE) -> list[str]:
        """What of the stored figure its rebuild does not reproduce within `tolerance` (empty: all of it)."""
        if self.value is None:
            return []
        out = []
        for name, stored, got in (("speedup", self.stored, self.value), ("interval low end", self.stored_lo, self.lo),
                                  ("interval high end", self.stored_hi, self.hi)):
            if stored is None:
                continue
            if got is None:
                out.append(f"{name} {stored:.4f} is stored but the samples give no interval ({self.method})")
            elif abs(got - stored) > tolerance:
                out.append(f"{name} {stored:.4f} stored, {got:.4f} from the samples ({self.method})")
        return out


def _json(text) -> dict:
    return json.loads(text) if isinstance(text, str) and text else {}


@dataclass(frozen=True)
class _Row:
    """One stored speedup as _AVAILABILITY reads it."""

    run_id: str
    case_id: str
    metric: str
    value: float
    lo: float | None
    hi: float | None
    twin_id: str | None
    measurement: dict
    twin_status: str | None
    twin_measurement: dict
    case_samples: int | None
    twin_samples: int | None
    case_time: float | None
    """The recipe's stored time (`time_ms`, or `time_ms_kernel` for a kernel-only speedup)."""
    twin_time: float | None
    workload: str
    sandwich_samples: int | None
    """The recipe's `sandwich_ms` samples: a training speedup timed as a sandwich rests on these alone."""

    @property
    def interleaved(self) -> bool:
        return self.measurement.get("method") == "interleaved"

    def unavailable(self) -> str:
        """Why the speedup cannot be rebuilt from what is committed ('' when it can)."""
        samples = SPEEDUPS[self.metric]
        if self.measurement.get("method") == SANDWICH_METHOD:  # both sides' steps are in the recipe's record
            return "" if self.sandwich_samples else "its sandwich's step samples (sandwich_ms) are not committed"
        if not self.twin_id:
            return "its record names no BF16 twin"
        if self.twin_status is None:
            return "its BF16 twin has no record in the run"
        if not self.interleaved:  # a ratio of two medians: each side's samples, or its stored median
            if not (self.case_samples or self.case_time):
                return f"its own {samples} is not recorded"
            return "" if self.twin_samples or self.twin_time else f"its BF16 twin's {TWIN_SAMPLES} is not recorded"
        if not self.case_samples:
            return f"its own {samples} samples are not committed"
        if not self.twin_samples:
            return f"its BF16 twin's {TWIN_SAMPLES} samples are not committed"
        batch, twin_batch = self.measurement.get("timed_with"), self.twin_measurement.get("timed_with")
        if not batch or batch == twin_batch:
            return ""
        if not twin_batch:
            return (f"timed beside its BF16 twin, whose record holds a timing of its own "
                    f"({self.twin_measurement.get('method')!r}), not the twin's samples beside it")
        return "timed beside its BF16 twin in a later batch; the twin's record holds the first batch's samples"


def _rows(con) -> list[_Row]:
    return [_Row(*r[:7], _json(r[7]), r[8], _json(r[9]), *r[10:]) for r in con.execute(_AVAILABILITY).fetchall()]


def withdrawn(con) -> dict[tuple[str, str, str], str]:
    """{(run_id, case_id, metric): why} for every stored speedup that cannot be rebuilt from the committed
    samples: what the pages must not show."""
    return {(r.run_id, r.case_id, r.metric): why for r in _rows(con) if (why := r.unavailable())}


def _samples(con, run_ids: Sequence[str]) -> dict[tuple[str, str], dict[str, list[float]]]:
    """{(run_id, case_id): {metric: samples in order}} of the timing samples a speedup is formed from."""
    names = [f"{m}{s}" for m in ("time_ms", "time_ms_kernel") for s in ("", "_round", "_process")]
    names += list(SANDWICH_SAMPLES)
    out: dict[tuple[str, str], dict[str, list[float]]] = {}
    for run_id, case_id, metric, values in con.execute(
            "SELECT run_id, case_id, metric, list(value ORDER BY i) FROM samples "
            "WHERE metric IN (SELECT unnest(?::VARCHAR[])) AND run_id IN (SELECT unnest(?::VARCHAR[])) GROUP BY ALL",
            [names, list(run_ids)]).fetchall():
        out.setdefault((run_id, case_id), {})[metric] = values
    return out


def _as(samples: Mapping[str, list[float]], metric: str) -> dict[str, list[float]]:
    """`metric`'s samples (and its `_round`, `_process`) under the names recorded_speedup reads (time_ms...)."""
    return {TWIN_SAMPLES + k[len(metric):]: v for k, v in samples.items()
            if k == metric or k in (f"{metric}_round", f"{metric}_process")}


def _with_blocks(samples: dict[str, list[float]], rounds: int) -> dict[str, list[float]] | None:
    """The samples with their round (`time_ms_round`) recovered from their order: `rounds` equal blocks."""
    n = len(samples[TWIN_SAMPLES])
    if not rounds or n % rounds:
        return None
    block = n // rounds
    return {**samples, f"{TWIN_SAMPLES}_round": [float(i // block) for i in range(n)]}


def _estimate(metric: str, measurement: Mapping, case: Mapping[str, list[float]],
              twin: Mapping[str, list[float]]) -> tuple:
    """(SpeedupInterval or a ratio of medians, method, reason) of one speedup from its samples (rebuild_one)."""
    if measurement.get("method") == SANDWICH_METHOD:
        got = recorded_sandwich(case)
        return (None, SANDWICH, "its sandwich's blocks give no interval") if got is None else (got[0], SANDWICH, "")
    own, base = _as(case, SPEEDUPS[metric]), _as(twin, TWIN_SAMPLES)
    if measurement.get("method") != "interleaved":
        return statistics.median(base[TWIN_SAMPLES]) / statistics.median(own[TWIN_SAMPLES]), MEDIANS, ""
    method = ROUNDS
    if f"{TWIN_SAMPLES}_round" not in own or f"{TWIN_SAMPLES}_round" not in base:
        rounds = int(measurement.get("rounds") or 0)
        own, base, method = _with_blocks(own, rounds), _with_blocks(base, rounds), BLOCKS
        if own is None or base is None:
            return None, method, (f"its samples ({len(case[SPEEDUPS[metric]])} and the twin's "
                                  f"{len(twin[TWIN_SAMPLES])}) do not split into its {rounds} rounds")
    est = recorded_speedup(base, own)
    if est is None:
        return None, method, "its rounds are too few for the interval it stores"
    return est, method, ""


def _parts(est) -> tuple:
    if isinstance(est, SpeedupInterval):
        return est.value, est.lo, est.hi
    return est, None, None


def rebuild_one(metric: str, measurement: Mapping, case: Mapping[str, list[float]],
                twin: Mapping[str, list[float]]) -> tuple:
    """(value, lo, hi, method, reason) of one speedup from the recipe's and the twin's samples (all metrics of
    each record, as _samples gives them), its interval over its own processes (rebuild moderates a run's)."""
    est, method, why = _estimate(metric, measurement, case, twin)
    return (*_parts(est), method, why)


def rebuild(con, run_ids: Iterable[str] | None = None) -> list[Rebuilt]:
    """Every stored speedup (of `run_ids`, or of every run) with what its committed samples give. A side timed
    alone without samples (a record written by hand, a test's) is divided by its stored median."""
    rows = [r for r in _rows(con) if run_ids is None or r.run_id in set(run_ids)]
    samples = _samples(con, sorted({r.run_id for r in rows}))
    out, estimates = [], []
    for r in rows:
        head = dict(run_id=r.run_id, case_id=r.case_id, twin_id=r.twin_id or "", metric=r.metric, stored=r.value,
                    stored_lo=r.lo, stored_hi=r.hi)
        why = r.unavailable()
        if why:
            out.append(Rebuilt(**head, reason=why))
            estimates.append(None)
            continue
        case = dict(samples.get((r.run_id, r.case_id), {}))
        twin = dict(samples.get((r.run_id, r.twin_id), {}))
        case.setdefault(SPEEDUPS[r.metric], [r.case_time])
        twin.setdefault(TWIN_SAMPLES, [r.twin_time])
        est, method, why = _estimate(r.metric, r.measurement, case, twin)
        out.append(Rebuilt(**head, method=method, reason=why))
        estimates.append(est)
    # a run's intervals over several processes are published moderated by their class's prior over the run
    by_run: dict[str, list[int]] = {}
    for i, est in enumerate(estimates):
        if isinstance(est, SpeedupInterval):
            by_run.setdefault(rows[i].run_id, []).append(i)
    for idx in by_run.values():
        keyed = [(speedup_class(rows[i].workload, rows[i].metric.endswith("_kernel"),
                                rows[i].measurement.get("speedup_bound")), estimates[i]) for i in idx]
        for i, est in zip(idx, moderated_intervals(keyed), strict=True):
            estimates[i] = est
    return [dataclasses.replace(o, **dict(zip(("value", "lo", "hi"), _parts(est), strict=True)))
            if est is not None else o for o, est in zip(out, estimates, strict=True)]
