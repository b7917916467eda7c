"""Metrics computed at ingest from several cases of one run (or from a run and its GPU model's between-box
spread): the speedups over each case's BF16 twin, whether a training step's speedup is host-bound, their
across-box intervals, the training parity verdicts and what each training curve did (plateau, spike,
diverged)."""

from __future__ import annotations

import dataclasses

from fp8bench.analysis.parity import PARITY_METRICS, derive_parity
from fp8bench.analysis.taxonomy import CURVE_METRICS, curve_metrics
from fp8bench.core.intervals import SpeedupInterval, moderated_intervals, speedup_class
from fp8bench.core.records import CaseRecord, Metric, derive_box_intervals, derive_speedups, pairs
from fp8bench.core.speedup import is_host_bound


def step_busy_pct(r: CaseRecord) -> float | None:
    """The share of a training step the GPU was busy: the profiled steps' kernel time per step
    (`gpu_busy_ms`) over the timed steps' median (`time_ms`); None where either was not measured."""
    busy, step = r.metric("gpu_busy_ms"), r.metric("time_ms")
    if busy is None or not step:
        return None
    return min(100.0, 100.0 * busy / step)


def derive_train_host_bound(records: list[CaseRecord]) -> list[tuple[CaseRecord, list[Metric], bool]]:
    """`host_bound` for training steps, whose speedups are formed here rather than in the run: 1 when the
    recipe's step or its BF16 twin's kept the GPU busy for less than HOST_BOUND_BUSY_PCT of the step, as the
    one-step workloads judge their timings in the run (fp8bench.run.groups). A host-bound training speedup
    compares the two recipes' Python and launch costs as much as their kernels: a small model's step can hold
    a fraction of its time in kernels and the rest in the host's launch path (docs/training.md)."""
    out = []
    for r, twin in pairs(records):
        if r.workload != "train" or r.measurement.get("method") == "once" or r.metric("host_bound") is not None:
            continue
        bound = is_host_bound(step_busy_pct(twin), step_busy_pct(r))
        if bound is not None:
            out.append((r, [Metric.of("host_bound", float(bound))], True))
    return out


TRAINING_VERDICT_METRICS = PARITY_METRICS + CURVE_METRICS
"""What derive_training_verdicts stores: ingest replaces these when it judges a stored run again."""


def derive_curve_classes(records: list[CaseRecord]) -> list[tuple[CaseRecord, list[Metric], bool]]:
    """Each training curve's class (fp8bench.analysis.taxonomy), BF16 seeds and runs without a band included."""
    out = []
    for r in records:
        if r.workload == "train" and r.status in ("ok", "diverged") and (metrics := curve_metrics(r)):
            out.append((r, metrics, True))
    return out


def derive_training_verdicts(records: list[CaseRecord]) -> list[tuple[CaseRecord, list[Metric], bool]]:
    """The parity verdicts and curve classes of a run's training cases (both read the loss curves)."""
    return derive_parity(records) + derive_curve_classes(records)


def derived_metrics(records: list[CaseRecord], spread: dict[str, float] | None = None,
                    ) -> list[tuple[CaseRecord, list[Metric], bool]]:
    """Every metric computed from several cases of one run, or from a run and its device's calibration:
    speedups, whether training speedups are host-bound, their across-box intervals (`spread`:
    derive_box_intervals), the training parity verdicts and curve classes."""
    return (derive_speedups(records) + derive_train_host_bound(records) + derive_box_intervals(records, spread or {})
            + derive_training_verdicts(records))


INTERVALS = {"speedup_vs_bf16": "interval", "speedup_vs_bf16_kernel": "interval_kernel"}
"""Each interleaved speedup and the key of its record's measurement that says what its interval rests on."""


def _stored_interval(r: CaseRecord, name: str) -> SpeedupInterval | None:
    """The interval the run stored for `name`, over the processes its measurement lists."""
    what = r.measurement.get(INTERVALS[name]) or {}
    value, lo, hi = r.metric(name), r.metric(f"{name}_lo"), r.metric(f"{name}_hi")
    per = tuple(float(x) for x in what.get("per_process") or ())
    if r.status != "ok" or None in (value, lo, hi) or not per:
        return None
    return SpeedupInterval(value, lo, hi, int(what.get("processes") or len(per)), what.get("unit", ""),
                           what.get("df"), per, int(what.get("boxes") or 1))


def moderate_speedup_intervals(records: list[CaseRecord]) -> list[CaseRecord]:
    """One run's records with each speedup interval over several processes moderated by its class's prior over
    the run (fp8bench.core.intervals.moderated_intervals: what the pages publish), its measurement saying so;
    every other record as it is."""
    keyed, where = [], []
    for i, r in enumerate(records):
        for name in INTERVALS:
            iv = _stored_interval(r, name)
            if iv is not None:
                keyed.append((speedup_class(r.workload, name.endswith("_kernel"), r.measurement.get("speedup_bound")),
                              iv))
                where.append((i, name))
    out = list(records)
    for (i, name), (_, before), after in zip(where, keyed, moderated_intervals(keyed), strict=True):
        if after is before or after is None:
            continue
        r = out[i]
        replaced = {f"{name}_lo": after.lo, f"{name}_hi": after.hi}
        metrics = [Metric.of(m.name, replaced[m.name]) if m.name in replaced else m for m in r.metrics]
        measurement = {**r.measurement, INTERVALS[name]: after.to_measurement()}
        out[i] = dataclasses.replace(r, metrics=metrics, measurement=measurement)
    return out
