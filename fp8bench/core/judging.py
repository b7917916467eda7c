"""Judging many changes at once against the variance between runs: the rule behind `compare`, `history` and the
asv gate. Vectorised over all series of one comparison; no torch, no duckdb.

A series is one case x metric; its change is d = log(head) - log(base), a difference of two runs. Runs differ
in two ways: each series by its own noise, and whole classes of like series together (another box, another
day: every large GEMM a little faster on one box than on the next). So each series is put in a class (the most
specific of the given class levels with MIN_CLASS series in the comparison), and:

- **a series** is judged on its change beyond its class's shared shift, e = d - median(d over the class)
  (where the class moved together: COHERENT), against the variance of that part: from its **history** (its
  values in earlier runs of the same GPU model and measurement version, each earlier run's class offset
  taken out, moderated by a prior fitted over the class by quantiles, fp8bench.core.intervals.
  fit_prior_robust, so a series with three earlier runs borrows strength from its class and one far noisier
  than its class keeps its own), else from the **cross-section** (the spread of e over the class in this
  comparison, Rousseeuw and Croux's Qn, against a t with at most CROSS_SECTION_DF degrees of freedom, since
  series of a class differ in noise and a pooled spread is too narrow for some);
- **a class's shift** is judged against how far that class shifted between its earlier runs (history only:
  one comparison cannot tell a whole class's shift from a box's or a day's difference).

Every series and class shift with a variance gets a t-statistic and a two-sided p-value, and all of one
comparison are judged together by Benjamini-Hochberg at FDR; a change must also exceed MIN_CHANGE. The
smallest change each would be caught at with 80% power is reported beside it.
"""

from __future__ import annotations

import math
import warnings
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import stdtr, stdtrit

from fp8bench.core.intervals import MIN_PRIOR_SERIES, fit_prior_robust, moderate

FDR = 0.01
"""Benjamini-Hochberg level over all series of one comparison. BH rather than a family-wise rule (Holm): where
many series really change (a new torch, a driver) it keeps the power to see them, and where none does (an A/A
pair) its false discovery rate is its family-wise rate, so an A/A comparison calls anything at all in about
1% of pairs, a regression in about half of those. 1% and not 5%: the p-values rest on a model of the
variances (a scaled inverse-chi-square prior) that real series only approximate, where a class's series
differ in noise the realised rate runs above the nominal one (docs/regression.md)."""
MIN_CHANGE = 0.01
"""No change under 1% is called, however significant: about twice what a device-bound median moves between two
processes on one box (docs/regression.md), and below what a user acts on."""
MIN_CLASS = MIN_PRIOR_SERIES
"""Series a class needs in a comparison to have a shared shift, a prior and a cross-section."""
MIN_HISTORY = 5
"""Earlier runs of a series that stand on their own as its variance where its class is too small."""
CROSS_SECTION_DF = 10
"""At most this many degrees of freedom for a class's cross-section spread, however many series it has."""
MAD_EFFICIENCY = 0.37
"""Degrees of freedom of a median absolute deviation over n values, as a fraction of n (its efficiency
against the standard deviation for normal data)."""
QN_EFFICIENCY = 0.55
"""Degrees of freedom of Qn over n values, as a fraction of n: its efficiency against the standard deviation
for normal data at the 8-17 values where CROSS_SECTION_DF does not cap it (0.51-0.63 by simulation; 0.82 for
large n). A class of a dozen series gets 6.6 degrees of freedom where a median absolute deviation gives 4.4,
and a lone change among 60 series is called at about 8 of its class's spreads instead of 12."""
POWER = 0.8

REGRESSION, IMPROVEMENT, UNCHANGED = "regression", "improvement", "unchanged"

QN_SMALL = {2: 0.399, 3: 0.994, 4: 0.512, 5: 0.844, 6: 0.611, 7: 0.857, 8: 0.669, 9: 0.872}
"""Qn's small-sample correction factors below ten values (Croux and Rousseeuw 1992, as R's robustbase)."""


def qn_scale(x: np.ndarray) -> float:
    """Rousseeuw and Croux's Qn: the k-th smallest of the pairwise distances |x_i - x_j|, k = h(h-1)/2 with
    h = n // 2 + 1, scaled to the standard deviation for normal data. As robust as the median absolute
    deviation (half the values may be wild) but with more than half a standard deviation's efficiency, where
    the median absolute deviation has 37%."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    if n < 2:
        return 0.0
    k = (n // 2 + 1) * (n // 2) // 2
    i, j = np.triu_indices(n, 1)
    kth = float(np.partition(np.abs(x[i] - x[j]), k - 1)[k - 1])
    small = QN_SMALL.get(n, n / (n + 1.4) if n % 2 else n / (n + 3.8))
    return 2.2219 * small * kth


@dataclass(frozen=True)
class ClassShift:
    """The shift a whole class of series made between base and head, and its verdict ('' not judged: no
    history of the class's shifts)."""

    key: object
    members: int
    shift: float
    """Median of d over the class (log)."""
    p: float
    verdict: str
    detectable: float


@dataclass(frozen=True)
class Judged:
    """Per series (arrays in the order given): its class's shared shift and its own change beyond it (log),
    the change judged and its variance, its degrees of freedom and source ('history', 'cross-section', or '' where
    neither exists and the series is not judged), the p-value, the verdict ('' where not judged) and the
    smallest relative change caught with 80% power; and the class shifts."""

    shift: np.ndarray
    beyond: np.ndarray
    change: np.ndarray
    """What was judged: the change beyond the class's shift (`beyond`; the whole change where the class's
    series moved apart and no shift was taken out)."""
    var: np.ndarray
    df: np.ndarray
    source: np.ndarray
    p: np.ndarray
    verdict: np.ndarray
    detectable: np.ndarray
    classes: list[ClassShift]


def assign_classes(levels: Sequence[Sequence], present: Sequence[bool]) -> list:
    """Each series' class: (depth, key) at the most specific level where its key still has MIN_CLASS `present`
    series not placed at a finer level, else None (a lone series). A class is the series placed in it."""
    out: list = [None] * (len(levels[0]) if levels else 0)
    for depth, keys in enumerate(levels):
        counts = Counter(k for i, (k, ok) in enumerate(zip(keys, present, strict=True)) if ok and out[i] is None)
        for i, k in enumerate(keys):
            if out[i] is None and counts[k] >= MIN_CLASS:
                out[i] = (depth, k)
    return out


def _nan_reduce(fn, x: np.ndarray, axis: int) -> np.ndarray:
    """fn (nanmean, nanmedian) along `axis`, NaN where a slice is all NaN, without numpy's warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(x, axis=axis)


def _as_matrix(history) -> np.ndarray:
    if isinstance(history, np.ndarray):
        width = history.shape[1] if history.ndim == 2 else 0
        return history.astype(float).reshape(len(history), width)
    width = max((len(h) for h in history), default=0)
    return np.array([list(h) + [np.nan] * (width - len(h)) for h in history], dtype=float).reshape(
        len(history), width)


def history_stats(history, classes: Sequence | None = None) -> tuple[np.ndarray, np.ndarray, dict]:
    """(sample variance, degrees of freedom) per series of its earlier log values with each earlier run's class
    offset (the median over the class of the run's deviation from each series' mean) taken out, and per class
    (variance of those offsets, df). `history`: value lists, or an array (series x runs) with NaN where a run
    lacks the series; the runs' columns line up across series of a class. NaN variance under two values."""
    x = _as_matrix(history)
    x = np.log(np.where(x > 0, x, np.nan))
    n = np.sum(np.isfinite(x), axis=1)
    shifts: dict = {}
    if classes is not None and x.shape[1]:
        for key, idx in _class_members(list(classes)).items():
            dev = x[idx] - _nan_reduce(np.nanmean, x[idx], axis=1)[:, None]
            offset = _nan_reduce(np.nanmedian, dev, axis=0)
            x[idx] -= np.where(np.isfinite(offset), offset, 0.0)[None, :]
            runs = offset[np.isfinite(offset)]
            if len(runs) >= 2:
                shifts[key] = (float(np.var(runs, ddof=1)), len(runs) - 1.0)
    s2 = np.full(len(x), np.nan)
    ok = n >= 2
    if ok.any():
        s2[ok] = np.nanvar(x[ok], ddof=1, axis=1)
    return s2, np.where(ok, n - 1, 0).astype(float), shifts


COHERENT = 0.75
"""A class's shift is taken out of its series' changes only where at least this share of them lie within their
own noise (3 standard deviations, or MIN_CHANGE) of it: where a class split (half its series moved and half
did not), its median is no shift they share, and taking it out would make the unmoved ones read as changed."""


def _coherent(e: np.ndarray, var: np.ndarray) -> bool:
    ok = np.isfinite(e)
    reach = np.maximum(3 * np.sqrt(np.where(np.isfinite(var), var, 0.0)), math.log1p(MIN_CHANGE))
    return bool(ok.any()) and float(np.mean(np.abs(e[ok]) <= reach[ok])) >= COHERENT


def _class_members(classes: list) -> dict:
    out: dict = {}
    for i, c in enumerate(classes):
        if c is not None:
            out.setdefault(c, []).append(i)
    return {c: np.array(m) for c, m in out.items()}


def _series_variance(e: np.ndarray, s2: np.ndarray, df: np.ndarray, members: dict) -> tuple:
    """(variance of e, df, source) per series: history moderated by its class's prior (or its own with
    MIN_HISTORY runs when it has no class), else the class's cross-section."""
    var, dfs = 2 * np.where(df >= MIN_HISTORY - 1, s2, np.nan), np.where(df >= MIN_HISTORY - 1, df, 0.0)
    source = np.where(np.isfinite(var), "history", "").astype(object)
    for idx in members.values():
        fit = fit_prior_robust(s2[idx], np.maximum(df[idx], 1.0), "history")
        if fit is not None:  # every member: its own history where it has some, the class's where not
            prior, outlier = fit
            v, d = moderate(np.where(df[idx] > 0, s2[idx], 0.0), df[idx], prior)
            # a series far noisier than its class stands on its own variance (if it has one)
            v, d = np.where(outlier, s2[idx], v), np.where(outlier, df[idx], d)
            var[idx], dfs[idx], source[idx] = 2 * v, d, "history"
            continue
        x = e[idx][np.isfinite(e[idx])]
        scale = qn_scale(x) if len(x) >= MIN_CLASS else 0.0
        cross = (source[idx] == "") & (scale > 0)
        var[idx[cross]] = scale ** 2
        dfs[idx[cross]] = min(CROSS_SECTION_DF, max(1.0, QN_EFFICIENCY * len(x)))
        source[idx[cross]] = "cross-section"
    return var, dfs, source


def benjamini_hochberg(p: Sequence[float], q: float = FDR) -> np.ndarray:
    """Which p-values are discoveries at false discovery rate q (NaN: never)."""
    p = np.asarray(p, dtype=float)
    ok = np.isfinite(p)
    m = int(ok.sum())
    out = np.zeros(len(p), bool)
    if not m:
        return out
    order = np.argsort(np.where(ok, p, np.inf))[:m]
    passed = p[order] <= q * np.arange(1, m + 1) / m
    if passed.any():
        out[order[: np.nonzero(passed)[0].max() + 1]] = True
    return out


def _tests(x: np.ndarray, var: np.ndarray, df: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(p-value, judged) of each change x against its variance; NaN p where there is none."""
    judged = np.isfinite(x) & np.isfinite(var) & (var > 0)
    se, dfs = np.sqrt(np.where(judged, var, 1.0)), np.where(judged, df, 1.0)
    return np.where(judged, 2 * stdtr(dfs, -np.abs(x) / se), np.nan), judged


def _detectable(var, df, m: int, q: float, min_change: float) -> np.ndarray:
    """The relative change caught with POWER: a lone change among m clears BH at about q / m."""
    ok = np.isfinite(var) & (var > 0)
    dfs = np.where(ok, df, 1.0)
    reach = (stdtrit(dfs, 1 - q / (2 * max(m, 1))) + stdtrit(dfs, POWER)) * np.sqrt(np.where(ok, var, 0.0))
    return np.where(ok, np.maximum(np.expm1(reach), min_change), np.nan)


def _verdicts(x, found, higher_is_better, judged, min_change) -> np.ndarray:
    found = found & (np.abs(x) >= math.log1p(min_change))
    worse = np.where(higher_is_better, x < 0, x > 0)
    return np.where(~judged, "", np.where(found, np.where(worse, REGRESSION, IMPROVEMENT), UNCHANGED)).astype(object)


def judge_comparison(d: Sequence[float], history, levels: Sequence[Sequence], higher_is_better: Sequence[bool], *,
                     q: float = FDR, min_change: float = MIN_CHANGE) -> Judged:
    """Judge every series of one comparison at once (module docstring). `d`: log(head / base) per series;
    `history`: each series' earlier run values (not base or head; an array series x runs, or lists whose
    positions line up by run within a class); `levels`: class keys per series, most specific first, e.g.
    [(metric, bound, workload, model), (metric, bound, workload), (metric, bound)]; `higher_is_better` per
    series. A class's shift is judged only where all its members share one direction."""
    d = np.asarray(d, dtype=float)
    hib = np.asarray(higher_is_better, bool)
    classes = assign_classes(levels, np.isfinite(d))
    members = _class_members(classes)
    shift = np.zeros(len(d))
    for idx in members.values():
        shift[idx] = np.nanmedian(d[idx])
    s2, df, class_hist = history_stats(history, classes)
    var, dfs, source = _series_variance(d - shift, s2, df, members)
    for idx in members.values():  # a class whose series moved apart has no shared shift to take out
        if not _coherent(d[idx] - shift[idx], var[idx]):
            shift[idx] = 0.0
    e = d - shift
    change = e
    keys = list(members)
    cx = np.array([shift[members[k][0]] for k in keys])
    cvar = np.array([2 * class_hist[k][0] if k in class_hist and len(set(hib[members[k]])) == 1 else np.nan
                     for k in keys])
    cdf = np.array([class_hist.get(k, (0, 1.0))[1] for k in keys])
    p_s, judged_s = _tests(change, var, dfs)
    p_c, judged_c = _tests(cx, cvar, cdf)
    found = benjamini_hochberg(np.concatenate([p_s, p_c]), q)
    m = int(judged_s.sum() + judged_c.sum())
    verdict = _verdicts(change, found[: len(d)], hib, judged_s, min_change)
    chib = np.array([bool(hib[members[k][0]]) for k in keys], bool)
    cverdict = _verdicts(cx, found[len(d):], chib, judged_c, min_change)
    cdet = _detectable(cvar, cdf, m, q, min_change)
    shifts = [ClassShift(k[1], len(members[k]), float(cx[j]), float(p_c[j]), str(cverdict[j]), float(cdet[j]))
              for j, k in enumerate(keys)]
    return Judged(shift, e, change, var, dfs, source, p_s, verdict, _detectable(var, dfs, m, q, min_change), shifts)
