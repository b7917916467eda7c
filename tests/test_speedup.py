"""Speedups timed side by side: the interval over rounds covers the true ratio, the across-box widening, the
host-bound label, and a group runs its recipes beside one BF16 twin."""

import math
import random

import pytest

from fp8bench.core.records import CaseRecord, Metric, derive_box_intervals
from fp8bench.core.speedup import (
    HOST_BOUND_BUSY_PCT,
    MIN_ROUNDS,
    is_host_bound,
    order_statistic_ranks,
    ratio_interval,
)


def _synthetic_rounds(rng: random.Random, ratio: float, rounds: int = 10, block: int = 3):
    """BF16 and FP8 times of one interleaved group on a GPU whose clock drifts: every round scales both by a
    shared factor (a random walk of ~2% steps, as a power-capped H200's clocks move over seconds), each sample
    has its own skewed noise (lognormal, 1.5%) and one sample in twenty is a 10-40% outlier (a host hiccup)."""
    base_ms, drift = 2.0, 1.0
    bf16, fp8 = [], []
    for _ in range(rounds):
        drift *= math.exp(rng.gauss(0, 0.02))

        def sample(t: float, clock: float = drift) -> float:
            x = t * clock * rng.lognormvariate(0, 0.015)
            return x * (1 + rng.uniform(0.1, 0.4)) if rng.random() < 0.05 else x
        bf16.append([sample(base_ms) for _ in range(block)])
        fp8.append([sample(base_ms / ratio) for _ in range(block)])
    return bf16, fp8


def test_the_interval_covers_a_planted_ratio_in_at_least_93_of_100_trials():
    rng = random.Random(20261201)
    covered, widths = 0, []
    for _ in range(100):
        planted = rng.uniform(0.6, 1.9)
        est = ratio_interval(*_synthetic_rounds(rng, planted))
        assert est is not None and est.lo <= est.value <= est.hi
        covered += est.lo <= planted <= est.hi
        widths.append((est.hi - est.lo) / est.value)
    assert covered >= 93, covered
    assert sorted(widths)[50] < 0.05  # and it is not covering by being uselessly wide: median width under 5%


def test_drift_shared_by_both_sides_cancels_in_the_ratio():
    """A 30% clock change across the rounds, no other noise: every round's ratio is the planted one."""
    bf16 = [[2.0 * f] for f in (1.0, 1.1, 1.2, 1.3, 1.2, 1.1, 1.0)]
    fp8 = [[1.25 * f] for f in (1.0, 1.1, 1.2, 1.3, 1.2, 1.1, 1.0)]
    est = ratio_interval(bf16, fp8)
    assert est.value == pytest.approx(1.6) and est.lo == pytest.approx(1.6) and est.hi == pytest.approx(1.6)


def test_order_statistic_ranks_and_too_few_rounds():
    assert order_statistic_ranks(10)[:2] == (2, 9)
    assert order_statistic_ranks(10)[2] == pytest.approx(1 - 2 * 11 / 1024)
    assert order_statistic_ranks(5) is None
    assert ratio_interval([[1.0]] * (MIN_ROUNDS - 1), [[1.0]] * (MIN_ROUNDS - 1)) is None


def test_host_bound_needs_every_share_known():
    assert is_host_bound(99.0, 97.5) is False
    assert is_host_bound(99.0, HOST_BOUND_BUSY_PCT - 1) is True
    assert is_host_bound(99.0, None) is None


def _case(**metrics) -> CaseRecord:
    return CaseRecord(run_id="r", case_id="gemm.m.s.e4m3.current.torch", workload="gemm", model="m", format="e4m3",
                      scaling="current", backend="torch", shape_name="s", shape={}, status="ok",
                      metrics=[Metric.of(k, v) for k, v in metrics.items()])


def test_the_box_interval_adds_the_between_box_spread_on_a_log_scale():
    rec = _case(speedup_vs_bf16=1.5, speedup_vs_bf16_lo=1.5 / math.exp(0.03), speedup_vs_bf16_hi=1.5 * math.exp(0.01))
    [(_, metrics, derived)] = derive_box_intervals([rec], {"gemm": 0.04})
    got = {m.name: m.value for m in metrics}
    half = math.hypot(0.03, 0.04)  # the wider side of the run's own interval, with the spread
    assert derived and got["speedup_vs_bf16_box_lo"] == pytest.approx(1.5 * math.exp(-half))
    assert got["speedup_vs_bf16_box_hi"] == pytest.approx(1.5 * math.exp(half))
    assert derive_box_intervals([rec], {}) == []  # no spread measured for the device: no box interval
    bound = _case(speedup_vs_bf16=1.5, speedup_vs_bf16_lo=1.4, speedup_vs_bf16_hi=1.6, host_bound=1.0)
    assert derive_box_intervals([bound], {"gemm": 0.04}) == []  # the host's figure: no GPU model bounds it


@pytest.mark.slow
def test_a_group_times_its_recipes_beside_one_bf16_twin(tmp_path):
    from fp8bench.config.compose import expand
    from fp8bench.core.hardware import detect_device
    from fp8bench.run.plan import plan
    from fp8bench.run.runner import execute

    points, _ = expand(["workload=gemm", "backend=torch", "model=tiny", "workload.linears=[o]",
                        "workload.roles=[fprop]", "format=bf16", "scaling=none", "measure.rounds=6",
                        f"results_dir={tmp_path}"])
    fp8, _ = expand(["workload=gemm", "backend=torch", "model=tiny", "workload.linears=[o]", "workload.roles=[fprop]",
                     "format=e4m3", "scaling=current", "measure.rounds=6", f"results_dir={tmp_path}"])
    records = execute(plan(points + fp8), tmp_path / "r", "r", detect_device(), progress=False)
    by = {r.format: r for r in records}
    assert set(by) == {"bf16", "e4m3"} and all(r.status == "ok" for r in records)
    for r in records:
        assert r.measurement["method"] == "interleaved" and r.measurement["version"] >= 4
        assert r.measurement["timed_with"] == [by["bf16"].case_id, by["e4m3"].case_id]
        assert len(r.samples["time_ms"]) >= 6  # at least one sample per round
    s = by["e4m3"]
    assert s.metric("speedup_vs_bf16_lo") <= s.metric("speedup_vs_bf16") <= s.metric("speedup_vs_bf16_hi")
    assert s.metric("speedup_vs_bf16_kernel") is not None
    assert by["bf16"].metric("speedup_vs_bf16") is None


@pytest.mark.slow
def test_when_the_twin_cannot_be_built_every_recipe_runs_alone_and_each_case_is_recorded_once(tmp_path):
    from fp8bench.config.compose import expand
    from fp8bench.core.hardware import detect_device
    from fp8bench.run.plan import plan
    from fp8bench.run.runner import execute

    common = ["workload=gemm", "backend=torch", "model=tiny", "workload.linears=[o]", "measure.rounds=6",
              "fail_on=bf16.none", f"results_dir={tmp_path}"]
    points = expand([*common, "format=bf16", "scaling=none"])[0] + expand([*common, "format=e4m3",
                                                                          "scaling=current"])[0]
    records = execute(plan(points), tmp_path / "r", "r", detect_device(), progress=False)
    assert len(records) == len({r.case_id for r in records}) == 6
    for r in records:
        if r.format == "bf16":
            assert r.status == "failed" and "injected failure" in r.reason
        else:
            assert r.status == "ok" and r.measurement["method"] == "alone"
            assert r.metric("speedup_vs_bf16") is None  # nothing was timed beside it


def test_device_only_timing_is_refused_off_a_gpu():
    """Device-only time is a GPU's (launches queued behind a GPU sleep): on a CPU the call says so rather than
    returning host time under that name."""
    import torch

    from fp8bench.core.measure import time_device_only

    with pytest.raises(ValueError, match="times a GPU's work; got device cpu"):
        time_device_only(lambda: None, device=torch.device("cpu"))
