"""Speedup intervals over the unit that varies: processes (and boxes), not rounds.

Within one process, a recipe and its BF16 twin are timed interleaved in rounds and the per-round ratios give
a sign-test interval (fp8bench.core.speedup). That interval is sound for the process, but a second process
on the same box lands a little elsewhere (its clocks settle at another level under the power cap, and a
ratio of a compute-bound GEMM to memory-bound casts moves with it), and another box further still. So each
case with its twin is measured in `measure.processes` processes, and the published interval is a
t-interval over the per-process median log-ratios:

    estimate = exp(mean_p m_p),   m_p = median over rounds of log(twin / recipe) in process p
    half-width (log) = t_{df, 0.975} * sqrt(s~^2 / P [+ between-box variance])

With P = 3 a case's own variance has 2 degrees of freedom, which alone makes the interval about twice as
wide as one built from the true variance. So s~^2 is *moderated* (Smyth 2004, limma's empirical Bayes): the
case's own s^2 is pooled with a prior fitted over the like cases of the run (or of its history),
s~^2 = (d0 s0^2 + (P-1) s^2) / (d0 + P - 1) with d0 + P - 1 degrees of freedom; d0 is estimated from how much
the cases' variances differ, so unlike cases get little pooling. With P = 1 there is no between-process
variance of the case's own: the interval widens by a prior from history when one is given ('process +
history') and is otherwise the within-process interval, labelled 'within-process only'.

Training twins that cannot share a step loop are timed as a sandwich of blocks of steps (BF16, FP8, BF16, or
longer alternations) in one process; a linear drift over the blocks cancels in each triple of neighbours,
and the drift itself (the two BF16 blocks' difference) is reported.

How many processes and rounds buy the narrowest interval in a time budget follows Kalibera and Jones,
"Rigorous benchmarking in reasonable time" (ISMM 2013): plan_repetitions. No torch here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import chdtri, digamma, fdtrc, fdtri, polygamma, stdtrit

from fp8bench.core.speedup import CONFIDENCE, RatioEstimate, ratio_interval

MIN_PRIOR_SERIES = 8
"""Cases with a variance of their own needed to fit a prior over them: fewer give no prior."""


@dataclass(frozen=True)
class VariancePrior:
    """What like series say about one series' variance (log scale): an estimate and its degrees of freedom."""

    var: float
    df: float
    """Finite: where the series agree so well that the fit says 'infinite', the pooled degrees of freedom."""
    series: int
    """How many series it was fitted over."""
    source: str = "run"
    """Where the series came from: 'run' (like cases of the same run) or 'history' (earlier runs)."""


def _trigamma_inverse(x: float) -> float:
    """y with trigamma(y) = x (Newton's method on 1/trigamma, as limma's trigammaInverse)."""
    if x > 1e7:
        return 1.0 / math.sqrt(x)
    if x < 1e-6:
        return 1.0 / x
    y = 0.5 + 1.0 / x
    for _ in range(50):
        tri = float(polygamma(1, y))
        step = tri * (1.0 - tri / x) / float(polygamma(2, y))
        y += step
        if -step / y < 1e-8:
            break
    return y


def fit_prior(s2: Sequence[float], df: Sequence[float] | float, source: str = "run") -> VariancePrior | None:
    """The scaled inverse-chi-square prior (s0^2, d0) that the sample variances `s2` (each with `df` degrees of
    freedom) are most consistent with, by moments of log s^2 (Smyth 2004, limma's fitFDist). None with fewer
    than MIN_PRIOR_SERIES positive variances."""
    s2 = np.asarray(s2, dtype=float)
    d = np.broadcast_to(np.asarray(df, dtype=float), s2.shape)
    keep = (s2 > 0) & np.isfinite(s2) & (d > 0)
    s2, d = s2[keep], d[keep]
    if len(s2) < MIN_PRIOR_SERIES:
        return None
    e = np.log(s2) - digamma(d / 2) + np.log(d / 2)
    excess = float(np.var(e, ddof=1) - np.mean(polygamma(1, d / 2)))
    pooled = float(d.sum())
    if excess > 0:
        d0 = min(2.0 * _trigamma_inverse(excess), pooled)
    else:  # the variances agree as well as their sampling allows: pool them all
        d0 = pooled
    s0 = math.exp(float(np.mean(e)) + float(digamma(d0 / 2)) - math.log(d0 / 2))
    return VariancePrior(s0, d0, len(s2), source)


def _log_f_quantiles(k: float, d0: float, qs=(0.25, 0.5, 0.75)) -> np.ndarray:
    """Quantiles of log(s^2 / s0^2) when s^2 has k degrees of freedom and its true variance a scaled
    inverse-chi-square prior with d0 (an F(k, d0) variable; chi-square / k for d0 = inf)."""
    if math.isinf(d0):
        return np.log(chdtri(k, 1 - np.asarray(qs)) / k)
    return np.log(fdtri(k, d0, np.asarray(qs)))


def fit_prior_robust(s2: Sequence[float], df: Sequence[float] | float,
                     source: str = "history") -> tuple[VariancePrior, np.ndarray] | None:
    """As fit_prior, but by quantiles (the median and interquartile range of log s^2 matched to those of a
    scaled F(k, d0)), so that a few series far noisier than their class (a case that flips between host-
    and device-bound, a step in its history) do not drag the prior's df to nothing; those series, whose s^2
    the fitted prior makes improbable (upper tail p < 0.001), are returned as outliers, to stand on their own
    variance. k is the series' median df. None with fewer than MIN_PRIOR_SERIES positive variances."""
    s2 = np.asarray(s2, dtype=float)
    d = np.broadcast_to(np.asarray(df, dtype=float), s2.shape)
    keep = (s2 > 0) & np.isfinite(s2) & (d > 0)
    if keep.sum() < MIN_PRIOR_SERIES:
        return None
    z = np.log(s2[keep])
    k = float(np.median(d[keep]))
    q25, q50, q75 = np.percentile(z, [25, 50, 75])
    pooled = float(d[keep].sum())

    def iqr(d0: float) -> float:
        lo, _, hi = _log_f_quantiles(k, d0)
        return float(hi - lo)
    if q75 - q25 <= iqr(math.inf):
        d0 = pooled
    elif q75 - q25 >= iqr(0.05):
        d0 = 0.05
    else:  # the IQR falls as d0 grows: bisect on log d0
        lo, hi = math.log(0.05), math.log(pooled)
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if iqr(math.exp(mid)) > q75 - q25 else (lo, mid)
        d0 = min(math.exp(hi), pooled)
    var = math.exp(q50 - float(_log_f_quantiles(k, d0)[1]))
    outlier = np.zeros(len(s2), bool)
    outlier[keep] = fdtrc(k, d0, s2[keep] / var) < 1e-3
    return VariancePrior(var, d0, int(keep.sum()), source), outlier


def moderate(s2, df, prior: VariancePrior | None):
    """(variance, degrees of freedom) of a series from its own s^2 with `df` and the prior; its own alone
    without one. Works elementwise on arrays."""
    if prior is None:
        return s2, df
    return (prior.df * prior.var + np.multiply(df, s2)) / (prior.df + np.asarray(df)), prior.df + np.asarray(df)


def t_quantile(df, confidence: float = CONFIDENCE):
    """The two-sided t quantile (1.96 for infinite df at 95%)."""
    return stdtrit(df, 0.5 + confidence / 2)


def process_log_ratios(base: np.ndarray, head: np.ndarray) -> np.ndarray:
    """Per process, the median over rounds of log(median of base's block / median of head's block): arrays of
    shape (..., processes, rounds, block) in ms (base: the twin, head: the recipe); returns (..., processes)."""
    return np.median(np.log(np.median(base, axis=-1)) - np.log(np.median(head, axis=-1)), axis=-1)


def log_ratio_of_rounds(base_rounds: Sequence[float], head_rounds: Sequence[float]) -> float:
    """One process's median log-ratio from its per-round medians (base: the twin's, head: the recipe's), as
    records store them (`time_ms_round`)."""
    b, h = np.asarray(base_rounds, dtype=float), np.asarray(head_rounds, dtype=float)
    if b.shape != h.shape or not len(b):
        raise ValueError(f"log_ratio_of_rounds: {len(b)} base rounds against {len(h)} head rounds; give one "
                         "median per round of each side")
    return float(np.median(np.log(b) - np.log(h)))


@dataclass(frozen=True)
class SpeedupInterval:
    """A published speedup: the estimate, its interval, and what the interval rests on."""

    value: float
    lo: float
    hi: float
    processes: int
    unit: str
    """'processes' (between-process variance of its own), 'processes + run prior' / '+ history prior'
    (moderated), 'process + history' (P = 1, the variance from history), 'within-process only' (P = 1 and
    no history: the rounds of one process; says nothing of another process or box)."""
    df: float | None
    per_process: tuple[float, ...]
    """Each process's speedup."""
    boxes: int = 1
    """Boxes whose variance the interval covers (1: this box's processes only)."""

    @property
    def half_width_log(self) -> float:
        return max(math.log(self.hi / self.value), math.log(self.value / self.lo))

    def metrics(self, name: str = "speedup_vs_bf16") -> dict[str, float]:
        """The record's metrics: `name`, `name_lo`, `name_hi` and `name_processes` (the count it rests on)."""
        return {name: self.value, f"{name}_lo": self.lo, f"{name}_hi": self.hi,
                f"{name}_processes": float(self.processes)}

    def to_measurement(self) -> dict:
        """What a record's `measurement["interval"]` holds: what the interval rests on."""
        return {"unit": self.unit, "processes": self.processes, "boxes": self.boxes,
                "df": None if self.df is None else round(self.df, 2),
                "per_process": [round(x, 6) for x in self.per_process]}


def process_interval(per_process_log: Sequence[float], *, prior: VariancePrior | None = None,
                     within: RatioEstimate | None = None, box: VariancePrior | None = None,
                     boxes: int = 1, confidence: float = CONFIDENCE) -> SpeedupInterval | None:
    """The published interval from each process's log speedup (module docstring). `prior`: the variance of
    one process's estimate as like cases or history give it; `within`: the single process's own interval,
    used only when P = 1 and no prior exists; `box`: the between-box variance of a run's estimate, from runs
    of this measurement version on `boxes` boxes. None when P = 1 with neither a prior nor `within`."""
    x = np.asarray(per_process_log, dtype=float)
    p = len(x)
    if p == 0:
        return None
    per = tuple(float(v) for v in np.exp(x))
    if p == 1 and prior is None:
        if within is None:
            return None
        return SpeedupInterval(within.value, within.lo, within.hi, 1, "within-process only", None, per)
    if p == 1:
        var, df, unit = prior.var, prior.df, "process + history"
    else:
        var, df = moderate(float(np.var(x, ddof=1)), p - 1, prior)
        unit = "processes" if prior is None else f"processes + {prior.source} prior"
    se2 = float(var) / p
    if box is not None:
        se2, df = se2 + box.var, min(float(df), box.df)
    mean, half = float(np.mean(x)), float(t_quantile(df, confidence)) * math.sqrt(se2)
    return SpeedupInterval(math.exp(mean), math.exp(mean - half), math.exp(mean + half), p, unit, float(df), per,
                           boxes if box is not None else 1)


def run_prior(per_process_logs: Sequence[Sequence[float]], source: str = "run") -> VariancePrior | None:
    """The prior over one run's like speedups (a class: one workload, kernel-only or not, one bound label), from
    each case's per-process log speedups; cases measured in one process add nothing. None with fewer than
    MIN_PRIOR_SERIES cases of two processes or more."""
    s2 = [float(np.var(x, ddof=1)) for x in per_process_logs if len(x) >= 2]
    df = [len(x) - 1.0 for x in per_process_logs if len(x) >= 2]
    return fit_prior(s2, df, source) if s2 else None


def speedup_class(workload: str, kernel_only: bool, bound: str | None) -> tuple:
    """The class whose like speedups of one run give a speedup's prior (run_prior): its workload, whether it is
    kernel-only, and its bound label."""
    return (workload, kernel_only, bound or "")


def moderated_intervals(keyed: Sequence[tuple[object, SpeedupInterval | None]]) -> list[SpeedupInterval | None]:
    """One run's speedup intervals, each over several processes moderated by the prior its class (the key,
    speedup_class) fits over the run's like speedups (run_prior): the published intervals. An interval of one
    process, one already moderated, or one of a class too small to fit a prior comes back as it is. The run
    stores each interval over its own processes; ingest and the audit both publish through this."""
    out = [iv for _, iv in keyed]
    by: dict[object, list[int]] = {}
    for i, (key, iv) in enumerate(keyed):
        if iv is not None and iv.unit == "processes" and iv.processes >= 2 and len(iv.per_process) == iv.processes:
            by.setdefault(key, []).append(i)
    for idx in by.values():
        logs = [np.log(np.asarray(out[i].per_process, dtype=float)) for i in idx]
        prior = run_prior(logs)
        if prior is None:
            continue
        for i, x in zip(idx, logs, strict=True):
            out[i] = process_interval(x, prior=prior)
    return out


def speedup_of_rounds(twin_rounds: Sequence[Sequence[float]], recipe_rounds: Sequence[Sequence[float]], *,
                      prior: VariancePrior | None = None, within: RatioEstimate | None = None,
                      box: VariancePrior | None = None, boxes: int = 1) -> SpeedupInterval | None:
    """A published speedup from what a record stores: per process, the per-round medians of the twin and of
    the recipe (`twin_time_ms_round`, `time_ms_round`, split by process). `within`: the single process's
    sign-test interval (fp8bench.core.speedup.ratio_interval), used when there is one process and no prior."""
    logs = [log_ratio_of_rounds(t, r) for t, r in zip(twin_rounds, recipe_rounds, strict=True)]
    return process_interval(logs, prior=prior, within=within, box=box, boxes=boxes)


def recorded_speedup(twin: Mapping[str, Sequence[float]], case: Mapping[str, Sequence[float]],
                     metric: str = "time_ms") -> SpeedupInterval | None:
    """A speedup and its interval rebuilt from what two records store, the recipe's and its BF16 twin's:
    `metric` (every sample), `<metric>_round` (the round of each) and, where several processes timed them,
    `<metric>_process`. One process: the median of the per-round ratios and its sign-test interval over the
    rounds (fp8bench.core.speedup.ratio_interval), said to be within-process only; several: a t-interval over
    the processes' log speedups (`speedup_of_rounds`). The run stores exactly this."""
    key = f"{metric}_round"
    if any(k not in s for s in (twin, case) for k in (metric, key)):
        return None
    twin_by, case_by = _by_process(twin, metric), _by_process(case, metric)
    if sorted(twin_by) != sorted(case_by):
        return None
    twin_rounds = [[statistics.median(r) for r in twin_by[p]] for p in sorted(twin_by)]
    case_rounds = [[statistics.median(r) for r in case_by[p]] for p in sorted(case_by)]
    if any(len(t) != len(c) for t, c in zip(twin_rounds, case_rounds, strict=True)):
        return None
    within = ratio_interval(twin_by[0], case_by[0]) if len(twin_by) == 1 else None
    if len(twin_by) == 1 and within is None:
        return None
    return speedup_of_rounds(twin_rounds, case_rounds, within=within)


def _by_process(samples: Mapping[str, Sequence[float]], metric: str) -> dict[int, list[list[float]]]:
    """process → its rounds (each a list of samples), from a record's `metric`, `_round` and `_process`."""
    values, rounds = samples[metric], samples[f"{metric}_round"]
    procs = samples.get(f"{metric}_process") or [0.0] * len(values)
    out: dict[int, dict[int, list[float]]] = {}
    for v, r, p in zip(values, rounds, procs, strict=True):
        out.setdefault(int(p), {}).setdefault(int(r), []).append(float(v))
    return {p: [rs[r] for r in sorted(rs)] for p, rs in out.items()}


def box_variance(run_logs: Sequence[float], boxes: Sequence[str]) -> VariancePrior | None:
    """The between-box variance of a run's log estimate, from runs of the same case and measurement version
    on several boxes: the variance of the per-box means (it holds their process noise too, so it errs wide).
    None with fewer than two boxes."""
    by: dict[str, list[float]] = {}
    for v, b in zip(run_logs, boxes, strict=True):
        by.setdefault(b, []).append(float(v))
    if len(by) < 2:
        return None
    means = [float(np.mean(v)) for v in by.values()]
    return VariancePrior(float(np.var(means, ddof=1)), len(means) - 1.0, len(means), "boxes")


# --------------------------------------------------------------------------- training sandwiches

BASELINE, RECIPE = "A", "B"
"""Block sides of a training sandwich: A the BF16 twin's steps, B the recipe's."""


@dataclass(frozen=True)
class Sandwich:
    """One process's speedup from alternating blocks of training steps."""

    log_speedup: float
    """Mean over the triples of neighbouring blocks (A B A or B A B) of log(A time / B time)."""
    drift: float
    """The baseline's relative change from its first block to its last (0.01: the last A block ran 1% slower):
    what the sandwich cancelled, stored and shown beside the speedup."""
    triples: int
    within_var: float | None
    """The estimate's variance from the step samples within the blocks (None when blocks hold under 3 steps):
    the P = 1 interval's width."""


def sandwich_logs(sides: str, med, var=None):
    """The vectorised core of `sandwich`: `med` (..., blocks) the blocks' median log step times in the order
    `sides` ran (e.g. 'ABA'), `var` their variances. Returns (log speedup, drift, within variance) arrays of
    shape (...); the within variance is NaN where `var` is None."""
    triples = [i for i in range(1, len(sides) - 1) if sides[i - 1] == sides[i + 1] != sides[i]]
    if set(sides) - {BASELINE, RECIPE} or not triples:
        raise ValueError(f"sandwich: blocks {list(sides)} must each be {BASELINE!r} (BF16) or {RECIPE!r} (the "
                         "recipe) and hold an alternating triple (A B A or B A B)")
    med = np.asarray(med, dtype=float)
    sign = np.array([1.0 if sides[i] == RECIPE else -1.0 for i in triples])
    outer = (med[..., [i - 1 for i in triples]] + med[..., [i + 1 for i in triples]]) / 2
    estimate = np.mean(sign * (outer - med[..., triples]), axis=-1)
    base = [i for i, side in enumerate(sides) if side == BASELINE]
    drift = np.expm1(med[..., base[-1]] - med[..., base[0]])
    if var is None:
        return estimate, drift, np.full(np.shape(estimate), np.nan)
    var = np.asarray(var, dtype=float)
    each = var[..., triples] + (var[..., [i - 1 for i in triples]] + var[..., [i + 1 for i in triples]]) / 4
    # neighbouring triples share blocks: their mean's variance is at most that of the widest one
    return estimate, drift, np.max(each, axis=-1)


def block_summary(steps) -> tuple:
    """(median log step time, variance of that median) of a block of step times (ms), along the last axis:
    the variance of a median of n normal draws ~ (pi / 2) s^2 / n; NaN under 3 steps."""
    logs = np.log(np.asarray(steps, dtype=float))
    n = logs.shape[-1]
    var = math.pi / 2 * np.var(logs, ddof=1, axis=-1) / n if n >= 3 else np.full(logs.shape[:-1], np.nan)
    return np.median(logs, axis=-1), var


def sandwich(blocks: Sequence[tuple[str, Sequence[float]]]) -> Sandwich:
    """Speedup of side B over side A from blocks of step times (ms) in one process, in the order they ran:
    e.g. [('A', steps), ('B', steps), ('A', steps)]. Each block is summarised by its median log step time;
    each triple of neighbours with alternating sides (A B A, B A B) gives log A - log B with the outer pair
    averaged, which cancels a drift that is linear in block index when blocks are of equal length."""
    sides = "".join(s for s, _ in blocks)
    summaries = [block_summary(steps) for _, steps in blocks]
    estimate, drift, within = sandwich_logs(sides, [m for m, _ in summaries], [v for _, v in summaries])
    triples = sum(sides[i - 1] == sides[i + 1] != sides[i] for i in range(1, len(sides) - 1))
    return Sandwich(float(estimate), float(drift), triples, None if math.isnan(within) else float(within))


def training_interval(processes: Sequence[Sequence[tuple[str, Sequence[float]]]], *,
                      prior: VariancePrior | None = None,
                      confidence: float = CONFIDENCE) -> tuple[SpeedupInterval, tuple[float, ...]] | None:
    """The published interval of a training speedup from each process's sandwich, and each process's drift.
    With one process and no prior, the interval is the sandwich's within-process one ('within-process
    only'); None when even that is unknown (blocks of fewer than three steps)."""
    s = [sandwich(blocks) for blocks in processes]
    drifts = tuple(x.drift for x in s)
    logs = [x.log_speedup for x in s]
    if len(s) == 1 and prior is None:
        if s[0].within_var is None:
            return None
        half = float(t_quantile(math.inf, confidence)) * math.sqrt(s[0].within_var)
        v = math.exp(logs[0])
        return SpeedupInterval(v, v * math.exp(-half), v * math.exp(half), 1, "within-process only", None, (v,)), drifts
    return process_interval(logs, prior=prior, confidence=confidence), drifts


SANDWICH_METHOD = "sandwich"
"""`measurement.method` of a training recipe whose speedup was timed as a sandwich against its BF16 twin."""
SANDWICH_SAMPLES = ("sandwich_ms", "sandwich_side", "sandwich_block", "sandwich_process")
"""What a sandwiched record stores, one value per timed step: its time, its side (0: BF16, 1: the recipe), its
block (in the order the blocks ran in their process) and its process."""


def sandwich_order(blocks: int) -> str:
    """The sides of `blocks` alternating blocks, the BF16 twin first and last: 'ABA', 'ABABA', ..."""
    if blocks < 3 or blocks % 2 == 0:
        raise ValueError(f"a sandwich needs an odd number of blocks, at least 3 (got {blocks})")
    return "".join(BASELINE if i % 2 == 0 else RECIPE for i in range(blocks))


def sandwich_samples(processes: Sequence[Sequence[tuple[str, Sequence[float]]]]) -> dict[str, list[float]]:
    """The samples a record stores (SANDWICH_SAMPLES) for each process's blocks, in the order they ran."""
    out: dict[str, list[float]] = {k: [] for k in SANDWICH_SAMPLES}
    for p, blocks in enumerate(processes):
        for b, (side, steps) in enumerate(blocks):
            for ms in steps:
                out["sandwich_ms"].append(float(ms))
                out["sandwich_side"].append(0.0 if side == BASELINE else 1.0)
                out["sandwich_block"].append(float(b))
                out["sandwich_process"].append(float(p))
    return out


def sandwich_blocks(samples: Mapping[str, Sequence[float]]) -> list[list[tuple[str, list[float]]]]:
    """Each process's blocks back from a record's samples (the inverse of sandwich_samples)."""
    by: dict[int, dict[int, tuple[str, list[float]]]] = {}
    for ms, side, b, p in zip(*(samples[k] for k in SANDWICH_SAMPLES), strict=True):
        block = by.setdefault(int(p), {}).setdefault(int(b), (BASELINE if side == 0 else RECIPE, []))
        block[1].append(float(ms))
    return [[by[p][b] for b in sorted(by[p])] for p in sorted(by)]


def recorded_sandwich(samples: Mapping[str, Sequence[float]]) -> tuple[SpeedupInterval, tuple[float, ...]] | None:
    """A training speedup, its interval over the processes that timed it, and each process's drift, from what
    a sandwiched record stores (SANDWICH_SAMPLES): the run stores exactly this and the audit rebuilds it.
    None when the samples hold no sandwich or too few steps per block for an interval."""
    if any(k not in samples or not samples[k] for k in SANDWICH_SAMPLES):
        return None
    try:
        return training_interval(sandwich_blocks(samples))
    except ValueError:  # blocks that hold no alternating triple
        return None
