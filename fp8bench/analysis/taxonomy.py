"""What went wrong with a training curve, if anything: `ok`, `plateau`, `spike` or `diverged`, with the step
where it starts, read from the run's own training loss (no torch, no duckdb).

The rule, on the training loss smoothed by a centred running mean of SMOOTH_FRACTION of the run (20 steps of
1000), checked in this order:

- `diverged`: a loss that is not finite (the step of the first one), or a smoothed loss that climbs back
  above where the run started: everything it learned is lost (the step of the minimum it climbed from);
- `plateau`: the mean loss of the last PLATEAU_TAIL of the run is no more than PLATEAU_GAIN below that of the
  PLATEAU_TAIL before it, so learning stopped (from the first step that no later step beats by more than the
  smoothed curve's noise); a curve that rises and then stays up reads `plateau` too, as long as it stays below
  its starting loss;
- `spike`: the smoothed loss rises more than SPIKE_RISE above the best it had reached, then comes back within
  half of that (the step where the rise passed SPIKE_RISE);
- `ok` otherwise.

A finite curve shorter than MIN_STEPS is not read (None): a 20-step speed run is mostly warm-up, where a
large model's loss swings by several times its value on every recipe, BF16 included.
"""

from __future__ import annotations

import enum
import math
import statistics
from dataclasses import dataclass

from fp8bench.core.records import CaseRecord, Metric

SMOOTH_FRACTION = 0.02
MIN_STEPS = 100
PLATEAU_TAIL = 0.25
PLATEAU_GAIN = 0.03
"""A healthy run under a cosine schedule still loses several times this from one quarter to the last, and the
mean over a quarter of a few hundred steps scatters by a third of it at most (docs/training.md, "What a curve
did", has the committed runs' figures)."""
SPIKE_RISE = 0.30
"""Above what a hard stretch of batches does to a healthy curve, which every run of that seed shares
(docs/training.md, "What a curve did")."""


class CurveClass(enum.Enum):
    """The reading of one training curve; `code` is how the store keeps it (loss_curve_class)."""

    OK = "ok"
    PLATEAU = "plateau"
    SPIKE = "spike"
    DIVERGED = "diverged"

    @property
    def code(self) -> int:
        return list(CurveClass).index(self)

    @classmethod
    def from_code(cls, code: float) -> CurveClass:
        return list(cls)[int(code)]


@dataclass(frozen=True, kw_only=True)
class CurveReading:
    """A curve's class and the step where what it names starts (None for `ok`)."""

    kind: CurveClass
    step: int | None = None

    def text(self) -> str:
        return self.kind.value if self.step is None else f"{self.kind.value} from step {self.step}"


def smooth(losses: list[float], window: int) -> list[float]:
    """Centred running mean over `window` steps (shorter at both ends)."""
    sums = [0.0]
    for v in losses:
        sums.append(sums[-1] + v)
    half, n = window // 2, len(losses)
    return [(sums[min(n, i + half + 1)] - sums[max(0, i - half)]) / (min(n, i + half + 1) - max(0, i - half))
            for i in range(n)]


def smoothing_window(steps: int) -> int:
    return max(1, round(SMOOTH_FRACTION * steps))


def classify(losses: list[float], diverged_at: int | None = None) -> CurveReading | None:
    """The class of a training-loss curve (one value per step). `diverged_at`: the step the run itself
    stopped at on a non-finite loss, when it recorded one."""
    bad = next((i for i, v in enumerate(losses) if not math.isfinite(v)), None)
    if diverged_at is not None or bad is not None:
        return CurveReading(kind=CurveClass.DIVERGED, step=diverged_at if diverged_at is not None else bad)
    if len(losses) < MIN_STEPS:
        return None
    window = smoothing_window(len(losses))
    s = smooth(losses, window)
    return (_diverged(s) or _plateau(losses, s, _noise(losses, s, window)) or _spike(s)
            or CurveReading(kind=CurveClass.OK))


def _diverged(s: list[float]) -> CurveReading | None:
    if s[-1] <= s[0]:
        return None
    return CurveReading(kind=CurveClass.DIVERGED, step=min(range(len(s)), key=lambda i: s[i]))


def _plateau(losses: list[float], s: list[float], noise: float) -> CurveReading | None:
    n = len(losses)
    before = statistics.fmean(losses[n - 2 * int(n * PLATEAU_TAIL):n - int(n * PLATEAU_TAIL)])
    if before - statistics.fmean(losses[n - int(n * PLATEAU_TAIL):]) > PLATEAU_GAIN * before:
        return None
    # where it stopped learning: the first step that no later step beats by more than three standard
    # deviations of the smoothed curve's own noise (a flat stretch's minimum is its noise)
    later = _suffix_min(s)
    return CurveReading(kind=CurveClass.PLATEAU, step=next(i for i in range(n) if later[i] >= s[i] * (1 - 3 * noise)))


def _noise(losses: list[float], s: list[float], window: int) -> float:
    """The smoothed curve's relative noise: the steps' scatter around it over the second half, over
    sqrt(window)."""
    half = len(s) // 2
    return statistics.stdev(v / m - 1 for v, m in zip(losses[half:], s[half:], strict=True)) / math.sqrt(window)


def _spike(s: list[float]) -> CurveReading | None:
    later = _suffix_min(s)
    best = s[0]
    for i in range(1, len(s)):
        if s[i] > best * (1 + SPIKE_RISE) and later[i] <= best * (1 + SPIKE_RISE / 2):
            return CurveReading(kind=CurveClass.SPIKE, step=i)
        best = min(best, s[i])
    return None


def _suffix_min(s: list[float]) -> list[float]:
    """The lowest value from each step to the end."""
    out = list(s)
    for i in range(len(s) - 2, -1, -1):
        out[i] = min(out[i], out[i + 1])
    return out


CURVE_METRICS = ("loss_curve_class", "loss_curve_class_step")


def curve_metrics(r: CaseRecord) -> list[Metric]:
    """loss_curve_class (CurveClass.code) and, unless `ok`, loss_curve_class_step of one training case; none
    for a curve too short to read."""
    stopped = r.samples.get("diverged_at_step")
    reading = classify(r.samples.get("loss") or [], int(stopped[0]) if stopped else None)
    if reading is None:
        return []
    step = [] if reading.step is None else [Metric.of("loss_curve_class_step", reading.step)]
    return [Metric.of("loss_curve_class", reading.kind.code), *step]
