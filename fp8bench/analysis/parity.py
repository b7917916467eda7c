"""Training parity: is a low-precision run's loss inside what BF16 itself varies by? (no torch, no duckdb)

Each `train` case of a run is judged against the BF16 runs of the same model and setting (batch, seq, steps)
with different seeds, all of one implementation (`_band`: the case's own backend and variant if it trained
MIN_SEEDS seeds, else the one with the most). docs/training.md says why these rules and how they do on BF16.

One run, by two one-sided prediction intervals for one more BF16 seed, t(PI_LEVEL, n-1) · s · sqrt(1 + 1/n)
above the seeds' mean (a BF16 seed judged against the others passes each with probability PI_LEVEL):

- `final-loss prediction interval`: the final validation loss minus the seeds' mean (`loss_gap_vs_bf16`)
  against `loss_gap_allowed`, in nats;
- `curve-area prediction interval`: the training-loss curve's area (mean loss over steps) above the seeds'
  mean area (`loss_area_gap_pct`) against `loss_area_gap_allowed_pct`, in percent.

A recipe, over the seeds it trained in the run (`recipe_verdict`): it passes when at least MIN_SEEDS seeds were
judged, every one passed, and the paired test did not find it worse. The paired test (`same-seed paired curve area`)
compares each seed with the BF16 run of the same seed (same initial weights, same batches), which removes the
seed-to-seed spread that dominates the unpaired rule: the mean of the paired area gaps against
t(PAIRED_LEVEL, n-1) · s / sqrt(n) of those gaps.

Time to quality (`quality_speedup`): BF16's time to its final validation loss over the time the FP8 run takes
to first reach it, with an interval over seeds and an explicit count of seeds that never reach it (a run that
never comes within the final-loss allowance of it).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass

from fp8bench.analysis.taxonomy import smooth, smoothing_window
from fp8bench.core.records import CaseRecord, Metric, is_timed, seedless, variant_of

MIN_SEEDS = 3
PI_LEVEL = 0.975
PAIRED_LEVEL = 0.95
"""One-sided: the paired test has the power the unpaired rule lacks (a 2% area gap over three seeds), at the
price of a 5% false alarm for a recipe exactly as good as BF16."""

PARITY_METRICS = (
    "loss_gap_vs_bf16", "loss_gap_allowed", "loss_area_gap_pct", "loss_area_gap_allowed_pct", "parity_final_pass",
    "parity_area_pass", "parity_pass", "loss_gap_same_seed", "loss_area_gap_same_seed_pct", "loss_band_exit_step",
    "quality_speedup", "quality_reached", "parity_seeds", "parity_passes", "parity_recipe_pass", "parity_worst_gap",
    "parity_worst_area_gap_pct", "parity_band_exit_step", "parity_paired_area_gap_pct",
    "parity_paired_area_allowed_pct", "quality_speedup_seeds", "quality_speedup_lo", "quality_speedup_hi",
    "quality_never_seeds")
"""Every metric derive_parity stores (what ingest replaces when it judges a stored run again)."""

FINAL_RULE = "final-loss prediction interval"
AREA_RULE = "curve-area prediction interval"
PAIRED_RULE = "same-seed paired curve area"
DIVERGED_RULE = "diverged"
RECORDED_RULE = "stored verdict (its rules' figures were not stored)"


@dataclass(frozen=True, kw_only=True)
class Criterion:
    """One parity rule's figure against its allowance: passes when `gap` <= `allowed` (a lower loss than BF16
    never fails)."""

    rule: str
    gap: float
    allowed: float
    unit: str
    """'nats' or '%'."""

    @property
    def passed(self) -> bool:
        return self.gap <= self.allowed

    def text(self) -> str:
        if self.unit == "%":
            return f"{self.rule}: {self.gap:+.2f}% against {self.allowed:.2f}% allowed"
        return f"{self.rule}: {self.gap:+.3f} {self.unit} against {self.allowed:.3f} allowed"


@dataclass(frozen=True, kw_only=True)
class RunVerdict:
    """One FP8 run judged against its BF16 band."""

    criteria: tuple[Criterion, ...] = ()
    diverged: str = ""
    """The run's own reason when it stopped on a non-finite loss ('' when it did not)."""
    same_seed_gap: float | None = None
    """Final validation loss minus that of the BF16 run of its implementation and seed in its run (nats), where
    the run has one."""
    same_seed_area_gap_pct: float | None = None
    """The curve area against that same BF16 run's, in percent (what the paired test averages)."""
    exit_step: int | None = None
    """The step from which the smoothed training loss stays above the band's upper edge to the end."""
    recorded_pass: bool | None = None
    """The verdict the run stored (parity_pass), which stands even where the figures of its rules were not
    stored with it."""

    @property
    def _unexplained_fail(self) -> bool:
        return self.recorded_pass is False and all(c.passed for c in self.criteria)

    @property
    def passed(self) -> bool:
        return not self.diverged and all(c.passed for c in self.criteria) and self.recorded_pass is not False

    @property
    def failed(self) -> tuple[str, ...]:
        return (((DIVERGED_RULE,) if self.diverged else ()) + tuple(c.rule for c in self.criteria if not c.passed)
                + ((RECORDED_RULE,) if self._unexplained_fail and not self.diverged else ()))

    def text(self) -> str:
        if self.diverged:
            return f"FAIL: {DIVERGED_RULE} ({self.diverged})"
        bad = [c.text() for c in self.criteria if not c.passed]
        if not bad and self._unexplained_fail:
            bad = [RECORDED_RULE]
        return "FAIL: " + "; ".join(bad) if bad else "pass"


def _number(m: Mapping[str, float | None], name: str) -> float | None:
    v = m.get(name)
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def verdict_from_metrics(m: Mapping[str, float | None], diverged: str = "") -> RunVerdict | None:
    """A run's verdict rebuilt from its stored metrics (what the report reads; NaN counts as absent), so that a
    FAIL names its rule with figure and allowance; None where the run was not judged. `diverged`: the case's
    reason when its status is 'diverged'."""
    if diverged:
        return RunVerdict(diverged=diverged)
    if _number(m, "parity_pass") is None:
        return None
    pairs = [(FINAL_RULE, "loss_gap_vs_bf16", "loss_gap_allowed", "nats"),
             (AREA_RULE, "loss_area_gap_pct", "loss_area_gap_allowed_pct", "%")]
    criteria = tuple(Criterion(rule=rule, gap=_number(m, gap), allowed=_number(m, allowed), unit=unit)
                     for rule, gap, allowed, unit in pairs
                     if _number(m, gap) is not None and _number(m, allowed) is not None)
    step = _number(m, "loss_band_exit_step")
    return RunVerdict(criteria=criteria, same_seed_gap=_number(m, "loss_gap_same_seed"),
                      same_seed_area_gap_pct=_number(m, "loss_area_gap_same_seed_pct"),
                      exit_step=None if step is None else int(step), recorded_pass=_number(m, "parity_pass") >= 0.5)


def prediction_allowance(values: list[float], level: float = PI_LEVEL) -> float:
    """How far above the mean of `values` one more draw lands with probability 1 - `level` (t-distribution)."""
    from scipy import stats

    n = len(values)
    return float(stats.t.ppf(level, n - 1) * statistics.stdev(values) * math.sqrt(1 + 1 / n))


def curve_area(r: CaseRecord) -> float | None:
    """The training-loss curve's area per step (mean loss over steps); None with a non-finite loss."""
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


def band_exit_step(losses: list[float], band: list[list[float]]) -> int | None:
    """The step from which a run's smoothed training loss stays above the band's upper edge (the prediction
    interval of the BF16 seeds' smoothed losses at each step) to the end of the run; None when it ends inside."""
    from scipy import stats

    n = min([len(losses)] + [len(b) for b in band])
    if n == 0 or len(band) < 2 or not all(math.isfinite(v) for b in [losses, *band] for v in b[:n]):
        return None
    w = smoothing_window(n)
    own, seeds = smooth(losses[:n], w), [smooth(b[:n], w) for b in band]
    k = stats.t.ppf(PI_LEVEL, len(seeds) - 1) * math.sqrt(1 + 1 / len(seeds))
    exit_step = None
    for t in range(n - 1, -1, -1):
        at = [s[t] for s in seeds]
        if own[t] <= statistics.fmean(at) + k * statistics.stdev(at):
            break
        exit_step = t
    return exit_step


def judge_run(r: CaseRecord, band: dict[int, CaseRecord], same_seed: CaseRecord | None = None) -> RunVerdict:
    """One FP8 run (ok, or diverged) against the BF16 seeds of its band; `same_seed`: the BF16 run of its own
    implementation and seed (same initial weights, same batches), where the run has one."""
    if r.status == "diverged":
        return RunVerdict(diverged=r.reason or "loss became non-finite")
    finals = [b.metric("loss_final") for b in band.values()]
    gap = r.metric("loss_final") - statistics.fmean(finals)
    criteria = [Criterion(rule=FINAL_RULE, gap=gap, allowed=prediction_allowance(finals), unit="nats")]
    areas = [a for a in (curve_area(b) for b in band.values()) if a is not None]
    area = curve_area(r)
    if area is not None and len(areas) >= 2:
        mean = statistics.fmean(areas)
        criteria.append(Criterion(rule=AREA_RULE, gap=100.0 * (area / mean - 1.0),
                                  allowed=100.0 * prediction_allowance(areas) / mean, unit="%"))
    pair_area = curve_area(same_seed) if same_seed is not None else None
    return RunVerdict(
        criteria=tuple(criteria),
        same_seed_gap=r.metric("loss_final") - same_seed.metric("loss_final") if same_seed is not None else None,
        same_seed_area_gap_pct=100.0 * (area / pair_area - 1.0) if area is not None and pair_area else None,
        exit_step=band_exit_step(r.samples.get("loss") or [], [b.samples.get("loss") or [] for b in band.values()]))


def paired_area_test(gaps_pct: list[float]) -> Criterion | None:
    """The paired test over a recipe's seeds: the mean of their same-seed area gaps (percent) against
    t(PAIRED_LEVEL, n-1) · s / sqrt(n); None with fewer than MIN_SEEDS pairs."""
    from scipy import stats

    n = len(gaps_pct)
    if n < MIN_SEEDS:
        return None
    allowed = float(stats.t.ppf(PAIRED_LEVEL, n - 1) * statistics.stdev(gaps_pct) / math.sqrt(n))
    return Criterion(rule=PAIRED_RULE, gap=statistics.fmean(gaps_pct), allowed=allowed, unit="%")


@dataclass(frozen=True, kw_only=True)
class RecipeVerdict:
    """A recipe over the seeds it trained against one band: its pass rate and what failed."""

    seeds: int
    passes: int
    worst_gap: float | None = None
    """The largest final-loss gap over the seeds (nats)."""
    worst_area_gap_pct: float | None = None
    exit_step: int | None = None
    """The earliest step where a seed's curve leaves the band for good (None: none did)."""
    paired: Criterion | None = None
    failed_rules: tuple[str, ...] = ()

    @property
    def passed(self) -> bool | None:
        """True: MIN_SEEDS or more seeds, all passing, the paired test not failing; False: a seed or the
        paired test failed; None: every seed passed but too few were trained to say the recipe passes."""
        if self.passes < self.seeds or (self.paired is not None and not self.paired.passed):
            return False
        return True if self.seeds >= MIN_SEEDS else None

    def text(self) -> str:
        rate = f"{self.passes}/{self.seeds}"
        if self.passed is None:
            return f"{rate} pass (fewer than {MIN_SEEDS} seeds: no verdict on the recipe)"
        if self.passed:
            return f"passes {rate}"
        return f"FAIL {rate} pass: " + ", ".join(self.failed_rules)


def recipe_verdict(runs: list[RunVerdict]) -> RecipeVerdict:
    """The verdict on a recipe from its seeds' run verdicts (one per seed)."""
    gaps = [c.gap for v in runs for c in v.criteria if c.rule == FINAL_RULE]
    area_gaps = [c.gap for v in runs for c in v.criteria if c.rule == AREA_RULE]
    pairs = [v.same_seed_area_gap_pct for v in runs if v.same_seed_area_gap_pct is not None]
    paired = paired_area_test(pairs) if len(pairs) == len(runs) else None
    exits = [v.exit_step for v in runs if v.exit_step is not None]
    failed = [rule for v in runs for rule in v.failed] + ([PAIRED_RULE] if paired and not paired.passed else [])
    return RecipeVerdict(seeds=len(runs), passes=sum(v.passed for v in runs), worst_gap=max(gaps, default=None),
                         worst_area_gap_pct=max(area_gaps, default=None), exit_step=min(exits, default=None),
                         paired=paired, failed_rules=tuple(dict.fromkeys(failed)))


@dataclass(frozen=True, kw_only=True)
class QualitySpeedup:
    """BF16's time to its final validation loss over an FP8 recipe's time to reach it, over its seeds."""

    value: float | None
    """Geometric mean over the seeds that reached the loss (None: none did, or no step times)."""
    lo: float | None = None
    hi: float | None = None
    """95% interval of that mean (t over the seeds' log ratios; needs two seeds that reached it)."""
    seeds: int = 0
    never: int = 0
    """Seeds whose run never reached BF16's final loss: their time to quality is unbounded."""

    def text(self) -> str:
        if self.seeds and self.never == self.seeds:
            return "never"
        if self.value is None:
            return "not timed"
        own = f"{self.value:.2f}x" + (f" ({self.lo:.2f}-{self.hi:.2f})" if self.lo is not None else "")
        return own if not self.never else f"never on {self.never} of {self.seeds} seeds; {own} on the rest"


def quality_speedup(runs: list[tuple[CaseRecord, float | None]], target: float, allowed: float) -> QualitySpeedup:
    """Time to quality of an FP8 recipe over its seeds. `runs`: each seed's run with the step time (ms) of
    its BF16 twin (same implementation, seed and layout; None when there is none); `target`: the BF16 seeds'
    mean final validation loss, which BF16 reaches at its last step; `allowed`: the final-loss prediction
    interval's allowance. A run that first reaches `target` at step s takes s steps; one that ends within
    `allowed` of it without reaching it takes all its steps, as a BF16 seed above the mean does; one that ends
    further away never reaches BF16's loss."""
    from scipy import stats

    ratios, never = [], 0
    for r, base_ms in runs:
        reach = steps_to_reach(r, target) if r.status == "ok" else None
        if reach is None and r.status == "ok" and r.metric("loss_final") <= target + allowed:
            reach = r.shape["steps"]
        if reach is None:
            never += 1
        elif base_ms and r.metric("time_ms") and reach > 0:
            ratios.append(math.log(r.shape["steps"] * base_ms / (reach * r.metric("time_ms"))))
    value = math.exp(statistics.fmean(ratios)) if ratios else None
    if len(ratios) < 2:
        return QualitySpeedup(value=value, seeds=len(runs), never=never)
    half = stats.t.ppf(0.975, len(ratios) - 1) * statistics.stdev(ratios) / math.sqrt(len(ratios))
    return QualitySpeedup(value=value, lo=value * math.exp(-half), hi=value * math.exp(half), seeds=len(runs),
                          never=never)


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


def _setting(r: CaseRecord) -> tuple:
    """Everything in a case's shape but its seed: the seeds of one recipe in one setting share it."""
    return tuple(sorted((k, v) for k, v in r.shape.items() if k != "seed"))


def _bf16_bands(train: list[CaseRecord]) -> dict[tuple, dict[tuple, dict[int, CaseRecord]]]:
    """group → implementation → seed → the one-process BF16 run."""
    bands: dict[tuple, dict[tuple, dict[int, CaseRecord]]] = {}
    for r in train:
        if (r.format == "bf16" and r.status == "ok" and r.metric("loss_final") is not None
                and r.shape.get("nproc", 1) == 1):
            bands.setdefault(_group_key(r), {}).setdefault(_implementation(r), {}).setdefault(r.shape.get("seed"), r)
    return bands


def _run_metrics(v: RunVerdict, q: QualitySpeedup) -> list[Metric]:
    by_rule = {c.rule: c for c in v.criteria}
    named = [("loss_gap_vs_bf16", FINAL_RULE, "gap"), ("loss_gap_allowed", FINAL_RULE, "allowed"),
             ("loss_area_gap_pct", AREA_RULE, "gap"), ("loss_area_gap_allowed_pct", AREA_RULE, "allowed")]
    out = [Metric.of(name, getattr(by_rule[rule], field)) for name, rule, field in named if rule in by_rule]
    out += [Metric.of(name, float(by_rule[rule].passed)) for name, rule in
            (("parity_final_pass", FINAL_RULE), ("parity_area_pass", AREA_RULE)) if rule in by_rule]
    out.append(Metric.of("parity_pass", float(v.passed)))
    optional = {"loss_gap_same_seed": v.same_seed_gap, "loss_area_gap_same_seed_pct": v.same_seed_area_gap_pct,
                "loss_band_exit_step": v.exit_step, "quality_speedup": q.value}
    out += [Metric.of(name, value) for name, value in optional.items() if value is not None]
    out.append(Metric.of("quality_reached", 0.0 if q.never else 1.0))
    return out


def _recipe_metrics(rv: RecipeVerdict, q: QualitySpeedup) -> list[Metric]:
    """What every case of a recipe carries about the recipe over its seeds in the run."""
    optional = {"parity_recipe_pass": None if rv.passed is None else float(rv.passed),
                "parity_worst_gap": rv.worst_gap, "parity_worst_area_gap_pct": rv.worst_area_gap_pct,
                "parity_band_exit_step": rv.exit_step,
                "parity_paired_area_gap_pct": rv.paired.gap if rv.paired else None,
                "parity_paired_area_allowed_pct": rv.paired.allowed if rv.paired else None,
                "quality_speedup_seeds": q.value if q.seeds > 1 else None,
                "quality_speedup_lo": q.lo, "quality_speedup_hi": q.hi}
    return ([Metric.of("parity_seeds", rv.seeds), Metric.of("parity_passes", rv.passes),
             Metric.of("quality_never_seeds", q.never)]
            + [Metric.of(name, value) for name, value in optional.items() if value is not None])


def derive_parity(records: list[CaseRecord]) -> list[tuple[CaseRecord, list[Metric], bool]]:
    """The parity metrics of every FP8 training case of a run that has a BF16 band (PARITY_METRICS): its own
    verdict, and its recipe's over the seeds the run trained it on."""
    train = [r for r in records if r.workload == "train" and r.status in ("ok", "diverged")]
    bands = _bf16_bands(train)
    bf16_time = {(r.backend, variant_of(r.case_id), _group_key(r), r.shape.get("seed"), _layout(r)): r.metric("time_ms")
                 for r in train if r.format == "bf16" and r.status == "ok"}
    recipes: dict[tuple, list[tuple[CaseRecord, RunVerdict, float | None, tuple[float, float]]]] = {}
    for r in train:
        if r.format == "bf16" or (r.status == "ok" and r.metric("loss_final") is None):
            continue
        by_impl = bands.get(_group_key(r), {})
        seeds = _band(by_impl, _implementation(r))
        if len(seeds) < MIN_SEEDS:
            continue
        verdict = judge_run(r, seeds, by_impl.get(_implementation(r), {}).get(r.shape.get("seed")))
        base = None if not is_timed(r) else bf16_time.get(
            (r.backend, variant_of(r.case_id), _group_key(r), r.shape.get("seed"), _layout(r)))
        finals = [b.metric("loss_final") for b in seeds.values()]
        # the recipe's seeds: its case id less the seed says everything else it is (two cases of one recipe
        # label with other scaling knobs, an ablation's amax history say, are two recipes with two pass rates)
        key = (_group_key(r), _implementation(r), r.format, r.scaling, _setting(r), seedless(r.case_id))
        recipes.setdefault(key, []).append((r, verdict, base, (statistics.fmean(finals), prediction_allowance(finals))))
    out = []
    for runs in recipes.values():
        band = runs[0][3]
        shared = _recipe_metrics(recipe_verdict([v for _, v, _, _ in runs]),
                                 quality_speedup([(r, base) for r, _, base, _ in runs], *band))
        out += [(r, _run_metrics(v, quality_speedup([(r, base)], *band)) + shared, True) for r, v, base, _ in runs]
    return out
