"""The bound label: a rule over every timed block's wall and device time gives the planted regime, calls a
mixed or borderline case unsettled, and labels records from before the rule `unknown`."""

import math

import numpy as np
import pytest

from fp8bench.core.bound import RULE, Bound, BoundRule, combine, label_blocks, label_of_record

BLOCKS = 10
"""One process at the presets' 10 rounds: one timed block per round."""


def _blocks(rng: np.random.Generator, busy: np.ndarray) -> tuple[list[float], list[float]]:
    """Wall times per iteration of a ~1 ms op under a drifting clock, and device times that are `busy` of
    them; one replay in twenty has no device time (the host fell behind its sleep)."""
    wall = 1.0 * np.exp(np.cumsum(rng.normal(0, 0.02, len(busy)))) * rng.lognormal(0, 0.01, len(busy))
    device = wall * busy
    device[rng.random(len(busy)) < 0.05] = np.nan
    return wall.tolist(), device.tolist()


def _hiccups(rng, busy: np.ndarray, to: float, rate: float = 0.03) -> np.ndarray:
    """A block now and then read in the noise band (a host hiccup during a replay, a clock step)."""
    return np.where(rng.random(len(busy)) < rate, to, busy)


def _device_bound(rng):
    """Busy about 98% (replays follow a sleep, so a power-capped GPU runs them a little faster), read up to
    101% by event overheads (as stored H200 figures do)."""
    return _hiccups(rng, np.clip(rng.normal(0.98, 0.015, BLOCKS), None, 1.01), 0.89)


def _host_bound(rng):
    """The GPU idle for a quarter to a third of each block, as a small TE linear on a slow host."""
    return _hiccups(rng, rng.normal(0.70, 0.05, BLOCKS), 0.88)


def _mixed(rng):
    """Blocks that disagree: some rounds the host kept up, others it did not (a case on the edge)."""
    host = rng.permutation(np.arange(BLOCKS) < rng.integers(3, 8))
    return np.where(host, rng.normal(0.72, 0.04, BLOCKS), rng.normal(0.98, 0.015, BLOCKS))


def _in_the_margin(rng):
    """Every block busy about 88%: between the thresholds, within noise of both."""
    return rng.normal(0.885, 0.01, BLOCKS)


@pytest.mark.parametrize("series,planted", [(_device_bound, Bound.DEVICE), (_host_bound, Bound.HOST),
                                            (_mixed, Bound.UNSETTLED), (_in_the_margin, Bound.UNSETTLED)])
def test_the_rule_gives_the_planted_label_in_at_least_99_of_100_trials(series, planted):
    rng = np.random.default_rng(20261205)
    got = [label_blocks(*_blocks(rng, series(rng))).label for _ in range(100)]
    assert sum(g is planted for g in got) >= 99, {b: got.count(b) for b in Bound}


def test_the_evidence_keeps_the_figures_and_the_thresholds_it_was_made_from():
    ev = label_blocks([1.0, 1.0, 2.0, 1.0, 1.0, 1.0], [0.99, 1.0, 1.98, 1.01, math.nan, 0.97])
    assert ev.label is Bound.DEVICE and ev.measured == 5 and ev.device_share == 1.0
    assert ev.samples()["block_device_ms"][4] != ev.samples()["block_device_ms"][4]  # NaN kept: not measured
    assert ev.busy_pct == pytest.approx(99.0)
    m = ev.to_measurement()
    assert m["label"] == "device-bound" and m["rule"] == {"device_min": 0.92, "host_max": 0.85,
                                                          "max_against": 0.1, "min_blocks": 5}
    assert set(ev.samples("twin_")) == {"twin_block_wall_ms", "twin_block_device_ms"}


def test_too_few_measured_blocks_are_unknown_not_guessed():
    wall, device = [1.0] * 10, [0.7] * 4 + [math.nan] * 6
    assert label_blocks(wall, device).label is Bound.UNKNOWN
    with pytest.raises(ValueError, match="10 wall times but 4 device times"):
        label_blocks(wall, device[:4])


def test_the_rule_refuses_thresholds_that_overlap():
    with pytest.raises(ValueError, match="host_max=0.95 must be above 0 and below device_min=0.92"):
        BoundRule(host_max=0.95)


def test_a_speedup_is_unsettled_if_either_side_is_else_host_bound_if_either_side_is():
    assert combine(Bound.DEVICE, Bound.DEVICE) is Bound.DEVICE
    assert combine(Bound.DEVICE, Bound.HOST) is Bound.HOST
    assert combine(Bound.HOST, Bound.UNSETTLED) is Bound.UNSETTLED
    assert combine(Bound.DEVICE, Bound.UNKNOWN) is Bound.UNKNOWN
    assert not Bound.UNSETTLED.comparable and Bound.UNKNOWN.comparable and Bound.HOST.comparable


def test_a_record_from_before_the_rule_is_unknown_whatever_its_probe_said():
    """Stored before per-block device times existed: a `gpu_busy_pct` of one probe and a `host_bound` flag are
    not evidence under the rule; a record with block samples is relabelled by the thresholds it stored."""
    assert label_of_record({"time_ms": [1.0, 1.1]}, {"version": 4}, is_cuda=True) is Bound.UNKNOWN
    assert label_of_record({"time_ms": [1.0]}, {}, is_cuda=False) is None
    blocks = {"block_wall_ms": [1.0] * 6, "block_device_ms": [0.9] * 6,
              "twin_block_wall_ms": [1.0] * 6, "twin_block_device_ms": [0.6] * 6}
    assert label_of_record(blocks, {}, is_cuda=True) is Bound.UNSETTLED  # 90% busy: the noise band
    strict = {"bound": {"rule": {**RULE.__dict__, "device_min": 0.88}}}
    assert label_of_record(blocks, strict, is_cuda=True) is Bound.DEVICE
    assert label_of_record(blocks, {}, is_cuda=True, prefix="twin_") is Bound.HOST


def test_on_a_cpu_there_is_no_label():
    import torch

    from fp8bench.core.measure import time_interleaved

    timings = time_interleaved({"a": lambda: sum(range(100)), "b": lambda: sum(range(200))},
                               device=torch.device("cpu"), warmup=1, rounds=6, block_ms=0.05)
    assert all(t.bound is None and t.gpu_busy_pct is None and len(t.rounds) == 6 for t in timings.values())
