"""Speedups timed side by side: a recipe and its BF16 twin interleaved in rounds, one ratio per round, and a
95% confidence interval over the rounds.

Why rounds: on a power-capped GPU the clock a case runs at moves by a few percent over seconds and differs
between boxes; a speedup formed from two medians taken minutes apart (the BF16 case, later the FP8 case)
carries that drift whole. Timed in the same rounds (BF16, FP8, BF16, FP8, ...), both sides see the same clocks
and a round's ratio cancels them.

The interval is distribution-free: the per-round ratios are treated as independent draws whose median is the
speedup, and the interval is the pair of order statistics that covers that median with at least 95%
probability (the binomial sign-test interval, e.g. the 2nd and 9th of 10 rounds: 97.9%). It asks for no
normality, one odd round cannot drag it, and it is what a bootstrap of the median over rounds approximates.
No torch here: the report, `compare` and the tests use it on any machine.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

# the binomial CDF itself (what scipy.stats.binom.cdf evaluates): importing scipy.stats costs every `fp8bench
# run` process about a second more than scipy.special
from scipy.special import bdtr

CONFIDENCE = 0.95
MIN_ROUNDS = 6
"""The fewest rounds with a finite 95% interval: with 5, even the extreme rounds cover the median with only
1 - 2/32 = 93.75%."""


@dataclass(frozen=True)
class RatioEstimate:
    """A speedup and its interval: `value` is the median of the per-round ratios base / head."""

    value: float
    lo: float
    hi: float
    rounds: int
    coverage: float
    """The interval's exact coverage of the median under the sign-test model (>= CONFIDENCE)."""


def order_statistic_ranks(n: int, confidence: float = CONFIDENCE) -> tuple[int, int, float] | None:
    """(k, n - k + 1, coverage): 1-based ranks of the narrowest symmetric pair of order statistics that covers
    the median of n i.i.d. draws with probability >= `confidence`; None when n is too small for any pair."""
    best = None
    for k in range(1, n // 2 + 1):
        coverage = 1.0 - 2.0 * float(bdtr(k - 1, n, 0.5))
        if coverage < confidence:
            break
        best = (k, n - k + 1, coverage)
    return best


def per_round_ratios(base_rounds: list[list[float]], head_rounds: list[list[float]]) -> list[float]:
    """median(base samples of round r) / median(head samples of round r), for every round both sides timed."""
    out = []
    for b, h in zip(base_rounds, head_rounds, strict=False):
        if b and h:
            mh = statistics.median(h)
            out.append(statistics.median(b) / mh if mh > 0 else math.inf)
    return out


def ratio_interval(base_rounds: list[list[float]], head_rounds: list[list[float]],
                   confidence: float = CONFIDENCE) -> RatioEstimate | None:
    """The speedup base / head (times in ms: a BF16 twin over a recipe) from interleaved rounds, with its
    interval; None with fewer than MIN_ROUNDS rounds."""
    ratios = sorted(per_round_ratios(base_rounds, head_rounds))
    ranks = order_statistic_ranks(len(ratios), confidence)
    if len(ratios) < MIN_ROUNDS or ranks is None:
        return None
    lo_rank, hi_rank, coverage = ranks
    return RatioEstimate(statistics.median(ratios), ratios[lo_rank - 1], ratios[hi_rank - 1], len(ratios), coverage)


def rounds_of(samples: list[float], round_of: list[float]) -> list[list[float]]:
    """A case's samples grouped by the round each was timed in (its `<metric>_round` samples)."""
    rounds: dict[int, list[float]] = {}
    for value, r in zip(samples, round_of, strict=True):
        rounds.setdefault(int(r), []).append(value)
    return [rounds[r] for r in sorted(rounds)]


HOST_BOUND_BUSY_PCT = 90.0
"""A timing whose GPU was busy for less than this share of each iteration (measure.Timing.gpu_busy_pct) is
host-bound: at least a tenth of what was timed is the GPU waiting for Python and the launches, so the figure
(and any speedup formed from it) says as much about the host CPU as about the GPU."""


def bound_label(host_bound: float | None) -> str:
    """A case's `host_bound` metric in words: 'host-bound' (the figure is the host CPU's as much as the
    GPU's), 'device-bound', or '' where the run did not measure it."""
    return {1.0: "host-bound", 0.0: "device-bound"}.get(host_bound, "")


def is_host_bound(*busy_pcts: float | None) -> bool | None:
    """True if any of the timings behind a figure is host-bound; None when any share is unknown."""
    if any(b is None for b in busy_pcts):
        return None
    return any(b < HOST_BOUND_BUSY_PCT for b in busy_pcts)
