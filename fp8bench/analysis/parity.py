"""Training parity: is a low-precision run's loss inside what BF16 itself varies by? (no torch, no duckdb)

For each `train` case of a run, against the BF16 runs of the same model and shape (batch, seq, steps) with
different seeds, all of one implementation (`_band`: the case's own backend and variant if it trained enough
seeds, else the one with the most):

- `loss_gap_vs_bf16`: final validation loss minus the BF16 seeds' mean;
- `loss_gap_allowed`: the upper half-width of the 95% prediction interval for one more BF16 seed,
  t(0.975, n-1) · s · sqrt(1 + 1/n): how far above the BF16 mean a run with BF16's own variability lands
  once in twenty (Megatron's FP8 CI judges against the spread of BF16 runs in the same way);
- `loss_area_gap_pct`: the training-loss curve's area (mean loss over steps) against the BF16 seeds' mean
  area, in percent (positive: the run learned slower);
- `parity_pass`: 1 when the gap is within the allowance and the area gap under AREA_LIMIT_PCT, else 0;
- `quality_speedup`: BF16's time to its final loss (steps x median step time of the BF16 run of the same
  backend and seed) over the time this run takes to first reach that loss (validation points, linearly
  interpolated). Absent when the run never reaches it.
Needs at least MIN_SEEDS BF16 seeds; with fewer there is no verdict.
"""

from __future__ import annotations

import math
import statistics

from fp8bench.core.records import CaseRecord, Metric, variant_of

MIN_SEEDS = 3
AREA_LIMIT_PCT = 1.0


def _group_key(r: CaseRecord) -> tuple:
    s = r.shape
    return (r.model, s.get("batch"), s.get("seq"), s.get("steps"))


def _layout(r: CaseRecord) -> tuple:
    """How a run was spread over GPUs: a distributed run is judged against the one-GPU BF16 band (same global
    batch, same tokens), but its speed only against BF16 laid out the same way."""
    s = r.shape
    return (s.get("nproc", 1), s.get("strategy"))


def _implementation(r: CaseRecord) -> tuple[str, str]:
    return (r.backend, variant_of(r.case_id))


def _band(by_implementation: dict[tuple, dict[int, CaseRecord]], own: tuple) -> dict[int, CaseRecord]:
    """The BF16 seeds a case is judged against: its own implementation's when it trained MIN_SEEDS of them,
    else those of the implementation with the most seeds. Never a mix: one seed's BF16 final loss can differ
    across implementations by more than the spread of one implementation's seeds (docs/training.md)."""
    if len(by_implementation.get(own, {})) >= MIN_SEEDS:
        return by_implementation[own]
    if not by_implementation:
        return {}
    return max(sorted(by_implementation.items()), key=lambda kv: len(kv[1]))[1]


def _area(r: CaseRecord) -> float | None:
    losses = r.samples.get("loss") or []
    return statistics.fmean(losses) if losses and all(math.isfinite(v) for v in losses) else None


def steps_to_reach(r: CaseRecord, target: float) -> float | None:
    """First (interpolated) step at which the validation loss reaches `target`."""
    steps, losses = r.samples.get("val_step") or [], r.samples.get("val_loss") or []
    for i, (s, v) in enumerate(zip(steps, losses, strict=False)):
        if v <= target:
            if i == 0:
                return s
            s0, v0 = steps[i - 1], losses[i - 1]
            return s0 + (s - s0) * (v0 - target) / (v0 - v) if v0 != v else s
    return None


def prediction_allowance(values: list[float]) -> float:
    from scipy import stats

    n = len(values)
    return float(stats.t.ppf(0.975, n - 1) * statistics.stdev(values) * math.sqrt(1 + 1 / n))


def derive_parity(records: list[CaseRecord]) -> list[tuple[CaseRecord, list[Metric], bool]]:
    train = [r for r in records if r.workload == "train" and r.status == "ok"]
    bands: dict[tuple, dict[tuple, dict[int, CaseRecord]]] = {}  # group → implementation → seed → BF16 run
    for r in train:
        if r.format == "bf16" and r.metric("loss_final") is not None and r.shape.get("nproc", 1) == 1:
            bands.setdefault(_group_key(r), {}).setdefault(_implementation(r), {}).setdefault(r.shape.get("seed"), r)
    bf16_time = {(r.backend, variant_of(r.case_id), _group_key(r), r.shape.get("seed"), _layout(r)): r.metric("time_ms")
                 for r in train if r.format == "bf16"}
    out = []
    for r in train:
        seeds = _band(bands.get(_group_key(r), {}), _implementation(r))
        if len(seeds) < MIN_SEEDS or r.format == "bf16":
            continue
        finals = [b.metric("loss_final") for b in seeds.values()]
        areas = [a for a in (_area(b) for b in seeds.values()) if a is not None]
        mean_final = statistics.fmean(finals)
        gap = r.metric("loss_final") - mean_final
        allowed = prediction_allowance(finals)
        metrics = [Metric.of("loss_gap_vs_bf16", gap), Metric.of("loss_gap_allowed", allowed)]
        area, passed = _area(r), gap <= allowed
        if area is not None and areas:
            area_gap = 100.0 * (area / statistics.fmean(areas) - 1.0)
            metrics.append(Metric.of("loss_area_gap_pct", area_gap))
            passed = passed and area_gap <= AREA_LIMIT_PCT
        metrics.append(Metric.of("parity_pass", 1.0 if passed else 0.0))
        base_ms = bf16_time.get((r.backend, variant_of(r.case_id), _group_key(r), r.shape.get("seed"), _layout(r)))
        reach = steps_to_reach(r, mean_final)
        if r.backend != "emulated" and base_ms and r.metric("time_ms") and reach:
            metrics.append(Metric.of("quality_speedup", r.shape["steps"] * base_ms / (reach * r.metric("time_ms"))))
        out.append((r, metrics, True))
    return out
