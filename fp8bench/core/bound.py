"""Whether a timed case is device-bound or host-bound, decided from its timed blocks themselves.

Every timed block (one op's back-to-back iterations in one round of `measure.time_interleaved`) is timed
twice, both with CUDA events and no host sync inside the timed region: as launched normally (its *wall*
time per iteration, what the published figure is made of) and replayed with every launch queued behind a
GPU sleep long enough for the host to enqueue the whole replay first (its *device* time per iteration: the
GPU's own work with the host out of the way). A block's busy fraction is device / wall. A device-bound block
reads about 1: the GPU never waited for a launch. A host-bound block reads well under 1: the GPU idled
while Python and the launch calls caught up.

The label is a rule over all blocks of a case (BoundRule): `device-bound` when the blocks' median busy
fraction clears the device threshold and hardly any block reads host-bound, `host-bound` the other way
round, `unsettled` when the median lies in the noise band between the thresholds or the blocks disagree.
Records made before the rule existed carry no device time per block: their label is `unknown`
(label_of_record), never inferred from the single probe iteration they kept. On a CPU there is no label.
No torch here: the rule is tested on synthetic blocks and applied to stored records anywhere.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import Enum


class Bound(str, Enum):
    """What a case's timed blocks say about who sets its pace."""

    DEVICE = "device-bound"
    """The GPU was busy through nearly every block: the figure is the GPU's."""
    HOST = "host-bound"
    """The GPU waited for the host in nearly every block: the figure is the host CPU's as much as the GPU's."""
    UNSETTLED = "unsettled"
    """Blocks disagree, or their busy fractions lie within the noise margin: no regime can be named."""
    UNKNOWN = "unknown"
    """Not measured by this rule (a record from before it, or replays the host could never get ahead of)."""

    @property
    def comparable(self) -> bool:
        """Whether a figure with this label can be judged against another run (compare, history, asv)."""
        return self is not Bound.UNSETTLED


@dataclass(frozen=True, kw_only=True)
class BoundRule:
    """The thresholds of the label (docs/measurement.md says where each comes from)."""

    device_min: float = 0.92
    """A block with busy >= this is device-bound. Below 1 by a margin: a replay follows a GPU sleep, during
    which a power-capped GPU's clocks rise, so its device time can read a few percent short of the wall
    time of a block that never waited, and event overheads make busy fractions read a little over 1
    (docs/measurement.md has the figures)."""
    host_max: float = 0.85
    """A block with busy < this is host-bound: the GPU idled for more than 15% of it. Between the two
    thresholds a block is in the noise band and supports neither label."""
    max_against: float = 0.1
    """At most this share of measured blocks may lie beyond the other threshold (more: the blocks disagree,
    and the case is unsettled)."""
    min_blocks: int = 5
    """Fewer measured blocks than this: `unknown` (too little to call)."""

    def __post_init__(self) -> None:
        if not 0 < self.host_max < self.device_min:
            raise ValueError(f"BoundRule: host_max={self.host_max} must be above 0 and below device_min="
                             f"{self.device_min}")
        if not 0 <= self.max_against < 0.5:
            raise ValueError(f"BoundRule: max_against={self.max_against} must lie in [0, 0.5)")
        if self.min_blocks < 1:
            raise ValueError(f"BoundRule: min_blocks={self.min_blocks} must be at least 1")


RULE = BoundRule()


@dataclass(frozen=True)
class BoundEvidence:
    """A case's label with the figures it was made from (stored with the case: samples and measurement)."""

    wall_ms: tuple[float, ...]
    """Per timed block: wall time per iteration (ms), as launched normally."""
    device_ms: tuple[float, ...]
    """Per timed block: device time per iteration (ms) of its replay behind a sleep; NaN where the host did not
    get ahead of the sleep (that block has no device time)."""
    label: Bound
    rule: BoundRule
    device_share: float
    """Share of measured blocks with busy >= rule.device_min."""
    host_share: float
    """Share of measured blocks with busy < rule.host_max."""
    measured: int
    """Blocks with a device time."""

    @property
    def busy(self) -> tuple[float, ...]:
        return tuple(d / w if w > 0 and math.isfinite(d) else math.nan
                     for w, d in zip(self.wall_ms, self.device_ms, strict=True))

    @property
    def busy_pct(self) -> float | None:
        """The median busy fraction of the measured blocks, in percent (the `gpu_busy_pct` metric)."""
        measured = [b for b in self.busy if math.isfinite(b)]
        return 100.0 * statistics.median(measured) if measured else None

    def samples(self, prefix: str = "") -> dict[str, list[float]]:
        """The per-block figures as record samples: `block_wall_ms`, `block_device_ms` (prefix 'twin_' for
        a recipe's twin)."""
        return {f"{prefix}block_wall_ms": list(self.wall_ms), f"{prefix}block_device_ms": list(self.device_ms)}

    def to_measurement(self) -> dict:
        """What a record's `measurement["bound"]` holds: the label, the counts and the rule's thresholds."""
        return {"label": self.label.value, "blocks": len(self.wall_ms), "measured": self.measured,
                "busy_median": None if self.busy_pct is None else round(self.busy_pct / 100, 4),
                "device_share": round(self.device_share, 4), "host_share": round(self.host_share, 4),
                "rule": asdict(self.rule)}


def label_blocks(wall_ms: Sequence[float], device_ms: Sequence[float], rule: BoundRule = RULE) -> BoundEvidence:
    """The label of one timed op from its blocks' wall and device times per iteration (ms)."""
    if len(wall_ms) != len(device_ms):
        raise ValueError(f"label_blocks: {len(wall_ms)} wall times but {len(device_ms)} device times; give one "
                         "of each per timed block")
    busy = [d / w for w, d in zip(wall_ms, device_ms, strict=True) if w > 0 and math.isfinite(d) and d > 0]
    n = len(busy)
    device = sum(b >= rule.device_min for b in busy) / n if n else 0.0
    host = sum(b < rule.host_max for b in busy) / n if n else 0.0
    middle = statistics.median(busy) if n else math.nan
    if n < rule.min_blocks:
        label = Bound.UNKNOWN
    elif middle >= rule.device_min and host <= rule.max_against:
        label = Bound.DEVICE
    elif middle < rule.host_max and device <= rule.max_against:
        label = Bound.HOST
    else:  # the median in the noise band, or blocks on both sides
        label = Bound.UNSETTLED
    return BoundEvidence(tuple(float(w) for w in wall_ms), tuple(float(d) for d in device_ms), label, rule,
                         device, host, n)


def combine(*labels: Bound) -> Bound:
    """The label of a figure made of several timings (a speedup: the recipe's and its twin's). Unsettled if
    any side is (no regime can be named for the ratio); else host-bound if any side is (the ratio carries that
    host time); else unknown if any side is; else device-bound."""
    for label in (Bound.UNSETTLED, Bound.HOST, Bound.UNKNOWN):
        if label in labels:
            return label
    return Bound.DEVICE


def label_of_record(samples: Mapping[str, Sequence[float]], measurement: Mapping | None, *, is_cuda: bool,
                    prefix: str = "") -> Bound | None:
    """A stored case's label, from what the record holds: its per-block wall and device samples
    (`<prefix>block_wall_ms`, `<prefix>block_device_ms`), judged by the thresholds stored with them (else
    RULE). None on a CPU (no label there). A CUDA record without per-block device times was made before the
    rule: `unknown`, whatever single-probe share (`gpu_busy_pct`) or `host_bound` flag it kept."""
    if not is_cuda:
        return None
    wall, device = samples.get(f"{prefix}block_wall_ms"), samples.get(f"{prefix}block_device_ms")
    if not wall or not device or len(wall) != len(device):
        return Bound.UNKNOWN
    stored = ((measurement or {}).get("bound") or {}).get("rule") if not prefix else (
        (measurement or {}).get("twin_bound") or {}).get("rule")
    rule = BoundRule(**stored) if isinstance(stored, dict) else RULE
    return label_blocks(wall, device, rule).label
