"""A training speedup's interval over the seeds of one run.

A training case and its BF16 twin are each timed once, apart (not interleaved): one seed's speedup is one
measurement and carries no interval. Where a run trained a recipe on several seeds, each against the BF16
twin of its own seed, each seed is an independent repeat of the whole measurement, both timings included;
the published speedup is then the geometric mean over the seeds with a t-interval of their log speedups
(fp8bench.core.intervals.process_interval, the seeds standing for processes). No torch, no duckdb.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from fp8bench.core.intervals import SpeedupInterval, process_interval

MIN_SEEDS = 3
"""Seeds an interval over seeds needs: with two, the t-interval has one degree of freedom and spans more than
an order of magnitude for a few percent of spread between them (0.02x-30x over two seeds of 0.7x and 0.8x)."""


def over_seeds(speedups: Sequence[float], twins: Sequence[str]) -> SpeedupInterval | None:
    """The speedup over the seeds of one recipe in one run (each seed's speedup against its BF16 twin, the
    twins' case ids in `twins`) and its 95% interval; None with fewer than MIN_SEEDS seeds, or where two seeds
    share a twin (their ratios would share one BF16 timing: not independent repeats)."""
    if len(speedups) < MIN_SEEDS or len(set(twins)) != len(twins) or any(not t for t in twins):
        return None
    iv = process_interval([math.log(s) for s in speedups])
    return None if iv is None else dataclasses.replace(iv, unit="seeds")
