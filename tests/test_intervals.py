"""Speedup intervals over processes: coverage of a planted speedup with between-process offsets, width against
an oracle that knows the planted noise, training sandwiches under drift, and the repetition planner."""

import math

import numpy as np
import pytest

from fp8bench.core.intervals import (
    block_summary,
    box_variance,
    fit_prior,
    moderate,
    moderated_intervals,
    process_interval,
    process_log_ratios,
    run_prior,
    sandwich,
    sandwich_logs,
    speedup_class,
    speedup_of_rounds,
    training_interval,
)
from fp8bench.core.repetitions import plan_repetitions
from fp8bench.core.speedup import RatioEstimate

TRIALS, CASES, PROCESSES, ROUNDS, BLOCK = 1000, 24, 3, 10, 3
"""The GPU presets' settings: 10 rounds, 3 processes; a run holds many like speedups (24 here)."""


def _interleaved_runs(rng, offset_sd: float):
    """(per-process log speedups (trials, cases, processes), planted log speedups (cases,)): each trial is a
    run of CASES recipes, each timed with its twin in PROCESSES processes of ROUNDS interleaved rounds. The
    clock drifts by ~2% a round, alike for both sides of a round; samples carry skewed noise (1-2.5% by
    case) and one in twenty is a 10-40% outlier; each process shifts each ratio by its own offset (sd
    `offset_sd`), which no amount of rounds removes."""
    shape = (TRIALS, CASES, PROCESSES, ROUNDS, BLOCK)
    planted = rng.uniform(0.6, 1.9, CASES)
    noise = np.linspace(0.01, 0.025, CASES)[None, :, None, None, None]
    drift = np.exp(np.cumsum(rng.normal(0, 0.02, shape[:4]), axis=-1))[..., None]
    offset = rng.normal(0, offset_sd, shape[:3])[..., None, None]

    def samples(ms):
        x = ms * drift * rng.lognormal(0, 1, shape) ** noise
        return np.where(rng.random(shape) < 0.05, x * (1 + rng.uniform(0.1, 0.4, shape)), x)
    base = samples(2.0)
    head = samples(2.0 / planted[None, :, None, None, None] * np.exp(-offset))
    return process_log_ratios(base, head), np.log(planted)


@pytest.mark.parametrize("offset_sd", [0.005, 0.01])
def test_the_process_interval_covers_a_planted_speedup_and_is_not_wider_than_it_must_be(offset_sd):
    """Through the published path: each case's interval over its own processes (what the run stores), then
    moderated over the run's like cases (what ingest and the audit publish)."""
    logs, truth = _interleaved_runs(np.random.default_rng(58), offset_sd)
    covered = np.zeros((TRIALS, CASES), bool)
    half, own_half = np.zeros((TRIALS, CASES)), np.zeros((TRIALS, CASES))
    like = speedup_class("gemm", False, "device")
    for t in range(TRIALS):
        stored = [process_interval(logs[t, k]) for k in range(CASES)]
        published = moderated_intervals([(like, est) for est in stored])
        for k, est in enumerate(published):
            assert est.unit == "processes + run prior"
            covered[t, k] = est.lo <= math.exp(truth[k]) <= est.hi
            half[t, k], own_half[t, k] = est.half_width_log, stored[k].half_width_log
    # the oracle knows the planted noise: the estimator's true spread, per case
    oracle = 1.96 * np.std(logs.mean(axis=-1) - truth, axis=0)
    coverage, width = covered.mean(), np.median(half / oracle)
    print(f"offset {offset_sd:.1%}: coverage {coverage:.3f}, median half-width / oracle {width:.2f}, worst "
          f"case's {np.median(half / oracle, axis=0).max():.2f} (each case's own processes alone: "
          f"{np.median(own_half / oracle):.2f})")
    assert coverage >= 0.93
    assert covered[:, 0].mean() >= 0.93  # one planted speedup per trial, as well as all of them
    assert np.median(half / oracle, axis=0).max() <= 1.5


def test_with_one_process_the_interval_says_what_it_rests_on():
    within = RatioEstimate(1.5, 1.48, 1.52, 10, 0.979)
    alone = process_interval([math.log(1.5)], within=within)
    assert alone.unit == "within-process only" and (alone.lo, alone.hi) == (1.48, 1.52)
    prior = fit_prior(np.random.default_rng(1).chisquare(2, 40) / 2 * 0.01 ** 2, 2)
    widened = process_interval([math.log(1.5)], prior=prior, within=within)
    assert widened.unit == "process + history" and widened.lo < 1.48 and widened.hi > 1.52
    assert process_interval([math.log(1.5)]) is None
    three = process_interval(np.log([1.49, 1.5, 1.52]), prior=prior)
    assert three.unit == "processes + run prior" and three.processes == 3
    assert len(three.per_process) == 3 and three.lo < 1.5 < three.hi


def test_moderation_pools_like_cases_and_leaves_unlike_ones_alone():
    rng = np.random.default_rng(7)
    alike = fit_prior(rng.chisquare(2, 400) / 2 * 1e-4, 2)
    assert alike.df >= 20 and 0.8e-4 < alike.var < 1.2e-4  # agreeing cases: much pooling
    spread = fit_prior(rng.chisquare(2, 400) / 2 * 1e-4 * np.exp(rng.normal(0, 1.5, 400)), 2)
    assert spread.df < 3  # cases whose variances differ by 4x and more: little
    var, df = moderate(4e-4, 2, alike)
    assert 1e-4 < var < 4e-4 and df == alike.df + 2
    assert fit_prior([1e-4] * 7, 2) is None  # too few cases to fit a prior over


def test_the_box_component_needs_two_boxes():
    assert box_variance([0.40, 0.41], ["a", "a"]) is None
    box = box_variance([0.40, 0.41, 0.45], ["a", "a", "b"])
    assert box.df == 1 and box.var == pytest.approx(np.var([0.405, 0.45], ddof=1))
    wide = process_interval(np.log([1.49, 1.5, 1.51]), box=box, boxes=2)
    assert wide.boxes == 2 and wide.half_width_log > process_interval(np.log([1.49, 1.5, 1.51])).half_width_log / 2


STEPS = 12
"""Steps per training block (after its warm-up steps)."""
TRAIN_CASES = 8
"""Training twins in a run (recipes x sizes of a training study)."""


def _sandwiches(rng, offset_sd: float, drift_per_block: float, order: str):
    """(block medians and their variances (trials, cases, processes, blocks), planted speedups (cases,)):
    TRAIN_CASES training twins per run, each in PROCESSES processes of blocks of STEPS steps in `order`; the
    step time drifts linearly (in log) by `drift_per_block` per block, each step has 1.5% noise and each
    process its own offset of the ratio; the planted speedup is A / B."""
    planted = rng.uniform(1.1, 1.6, TRAIN_CASES)
    shape = (TRIALS, TRAIN_CASES, PROCESSES, len(order), STEPS)
    t = np.arange(len(order))[:, None] + (np.arange(STEPS) + 0.5) / STEPS - 0.5  # each step's place, in blocks
    ms = 600.0 * np.exp(drift_per_block * t) * rng.lognormal(0, 0.015, shape)
    recipe = np.array([side == "B" for side in order])[:, None]
    offset = rng.normal(0, offset_sd, shape[:3])[..., None, None]
    ms = np.where(recipe, ms / planted[None, :, None, None, None] * np.exp(-offset), ms)
    return block_summary(ms), planted


@pytest.mark.parametrize("order,offset_sd", [("ABA", 0.005), ("ABA", 0.01), ("ABAB", 0.01)])
def test_a_training_sandwich_covers_the_planted_speedup_under_linear_drift_and_reports_the_drift(order, offset_sd):
    drift = 0.02  # 2% a block: a GPU warming over a minute of steps
    (med, var), planted = _sandwiches(np.random.default_rng(1205), offset_sd, drift, order)
    logs, drifts, _ = sandwich_logs(order, med, var)  # (trials, cases, processes)
    covered, half = np.zeros(logs.shape[:2], bool), np.zeros(logs.shape[:2])
    for t in range(TRIALS):
        prior = fit_prior(np.var(logs[t], ddof=1, axis=-1), PROCESSES - 1)
        for k in range(TRAIN_CASES):
            est = process_interval(logs[t, k], prior=prior)
            covered[t, k] = est.lo <= planted[k] <= est.hi
            half[t, k] = est.half_width_log
    oracle = 1.96 * np.std(logs.mean(axis=-1) - np.log(planted), axis=0)
    print(f"{order} offset {offset_sd:.1%}: coverage {covered.mean():.3f}, half-width / oracle "
          f"{np.median(half / oracle):.2f}, drift {np.median(drifts):.4f}")
    assert covered.mean() >= 0.93 and covered[:, 0].mean() >= 0.93
    assert np.median(half / oracle, axis=0).max() <= 1.5
    span = order.rindex("A") - order.index("A")
    assert np.median(drifts) == pytest.approx(math.expm1(drift * span), rel=0.05)
    naive = med[..., order.index("A")] - med[..., order.index("B")]  # A then B, no sandwich: drift biases it
    assert abs(np.median(naive.mean(axis=-1) - np.log(planted))) > 0.015


def test_a_sandwich_without_drift_correction_would_miss_and_one_process_is_within_process_only():
    rng = np.random.default_rng(3)
    steps = [("A", 600 * rng.lognormal(0, 0.01, STEPS)), ("B", 400 * 1.03 * rng.lognormal(0, 0.01, STEPS)),
             ("A", 600 * 1.06 * rng.lognormal(0, 0.01, STEPS))]
    s = sandwich(steps)
    assert s.drift == pytest.approx(0.06, abs=0.01) and math.exp(s.log_speedup) == pytest.approx(1.5, rel=0.01)
    est, drifts = training_interval([steps])
    assert est.unit == "within-process only" and est.lo < 1.5 < est.hi and drifts == (s.drift,)
    with pytest.raises(ValueError, match="hold an alternating triple"):
        sandwich([("A", [1.0] * 3), ("A", [1.0] * 3), ("B", [1.0] * 3)])


def test_the_planner_buys_processes_when_they_vary_more_than_rounds():
    # between processes 0.5%, a round 2.5%; a process costs 20 s to start and settle, a round 50 ms
    plan = plan_repetitions(0.005 ** 2, 0.025 ** 2, 20.0, 0.05, 120.0)
    assert plan.optimal_rounds == pytest.approx(100.0) and plan.cost_s <= 120.0
    assert plan.processes >= 4
    noisy_rounds = plan_repetitions(0.001 ** 2, 0.05 ** 2, 1.0, 0.05, 30.0)
    assert noisy_rounds.rounds > plan.rounds / 4 and noisy_rounds.processes >= 2
    with pytest.raises(ValueError, match="buys no plan"):
        plan_repetitions(1e-4, 1e-4, 20.0, 0.05, 10.0)


def test_a_record_s_rounds_give_its_published_speedup_and_what_it_rests_on():
    """What the runner stores per process (per-round medians of twin and recipe) is all the published interval
    needs; a run's like cases give the prior."""
    rng = np.random.default_rng(4)
    cases = [[np.log(1.5) + rng.normal(0, 0.006, 3)] for _ in range(12)]
    prior = run_prior([c[0] for c in cases])
    assert prior is not None and prior.series == 12
    twin = [list(2.0 * rng.lognormal(0, 0.01, 10)) for _ in range(3)]
    recipe = [[t / 1.5 for t in rounds] for rounds in twin]
    est = speedup_of_rounds(twin, recipe, prior=prior)
    assert est.value == pytest.approx(1.5) and est.lo < 1.5 < est.hi and est.unit == "processes + run prior"
    assert set(est.metrics()) == {"speedup_vs_bf16", "speedup_vs_bf16_lo", "speedup_vs_bf16_hi",
                                  "speedup_vs_bf16_processes"}
    assert est.to_measurement()["processes"] == 3 and len(est.to_measurement()["per_process"]) == 3
    assert run_prior([[0.4]] * 20) is None  # one process each: nothing to pool


def test_a_run_publishes_its_like_speedups_moderated_and_leaves_other_intervals_alone():
    rng = np.random.default_rng(7)
    like, other = speedup_class("gemm", False, "device"), speedup_class("gemm", True, "device")
    stored = [process_interval(np.log(1.4) + rng.normal(0, 0.01, 3)) for _ in range(10)]
    few = [process_interval(np.log(1.2) + rng.normal(0, 0.01, 3)) for _ in range(3)]
    alone = RatioEstimate(1.3, 1.25, 1.35, 10, 0.98)
    one = process_interval([np.log(1.3)], within=alone)
    out = moderated_intervals([(like, s) for s in stored] + [(other, s) for s in few] + [(like, one), (like, None)])
    assert all(o.unit == "processes + run prior" and o.df > 2 for o in out[:10])
    assert [o.value for o in out[:10]] == pytest.approx([s.value for s in stored])
    assert out[10:13] == few  # three like speedups fit no prior: each keeps its own processes' interval
    assert out[13] is one and out[14] is None
    assert moderated_intervals([(like, o) for o in out[:10]]) == out[:10]  # moderated once, not twice


SANDWICH_PRESET = dict(order="ABABA", steps=10, processes=3)
"""The GPU training presets' sandwich: measure.sandwich_blocks=5, sandwich_steps=10, processes=3."""


def _sandwiched_run(rng, offset_sd: float, drift_per_block: float):
    """One trial's run as the runner stores it: TRAIN_CASES recorded training recipes, each with the blocks of
    its sandwich in three processes (a drift linear in log time, 1.5% step noise, a per-process offset of the
    ratio), through fp8bench.run.train_sandwich.sandwiched_record; and the planted speedups."""
    from types import SimpleNamespace

    from fp8bench.core.records import CaseRecord
    from fp8bench.run.train_sandwich import sandwiched_record

    order, steps, procs = SANDWICH_PRESET["order"], SANDWICH_PRESET["steps"], SANDWICH_PRESET["processes"]
    measure = SimpleNamespace(sandwich_blocks=len(order), sandwich_steps=steps, warmup=3)
    planted = rng.uniform(1.1, 1.6, TRAIN_CASES)
    t = np.arange(len(order))[:, None] + (np.arange(steps) + 0.5) / steps - 0.5
    records = []
    for k in range(TRAIN_CASES):
        processes = []
        for _ in range(procs):
            ms = 600.0 * np.exp(drift_per_block * t) * rng.lognormal(0, 0.015, t.shape)
            offset = math.exp(-rng.normal(0, offset_sd))
            processes.append([(side, list(ms[b] / planted[k] * offset if side == "B" else ms[b]))
                              for b, side in enumerate(order)])
        rec = CaseRecord(run_id="r", case_id=f"train.m{k}.seed0.e4m3.current.te", twin_id=f"train.m{k}.seed0.bf16",
                         workload="train", model=f"m{k}", format="e4m3", scaling="current", backend="te",
                         shape_name="s", shape={}, status="ok", measurement={"method": "alone"})
        records.append(sandwiched_record(rec, processes, ["resident"] * procs, [], measure, rec.twin_id))
    return records, planted


@pytest.mark.parametrize("offset_sd", [0.005, 0.01])
def test_a_training_speedup_as_published_covers_the_planted_speedup_under_drift(offset_sd):
    """Training included, through the published path: what the run stores for each recipe's sandwich, then
    ingest's moderation over the run's training speedups (fp8bench.analysis.derive), at the presets' settings,
    with a clock drifting 2% a block; the drift each record reports is the planted one."""
    from fp8bench.analysis.derive import moderate_speedup_intervals
    from fp8bench.analysis.rebuild import rebuild_one

    rng, drift = np.random.default_rng(5812), 0.02
    trials = TRIALS
    covered, half, logs = np.zeros((trials, TRAIN_CASES), bool), np.zeros((trials, TRAIN_CASES)), []
    planted_all, drifts = [], []
    for i in range(trials):
        records, planted = _sandwiched_run(rng, offset_sd, drift)
        published = moderate_speedup_intervals(records)
        for k, r in enumerate(published):
            value, lo, hi = (r.metric(f"speedup_vs_bf16{s}") for s in ("", "_lo", "_hi"))
            covered[i, k] = lo <= planted[k] <= hi
            half[i, k] = max(math.log(hi / value), math.log(value / lo))
            drifts += r.measurement["sandwich"]["drift"]
            assert r.measurement["interval"]["processes"] == 3
        if i == 0:  # what the audit rebuilds from the stored samples is what the run stored
            for r in records:
                got = rebuild_one("speedup_vs_bf16", r.measurement, r.samples, {})
                assert got[:3] == pytest.approx([r.metric(f"speedup_vs_bf16{s}") for s in ("", "_lo", "_hi")])
        logs.append([math.log(r.metric("speedup_vs_bf16")) for r in records])
        planted_all.append(np.log(planted))
    oracle = 1.96 * np.std(np.asarray(logs) - np.asarray(planted_all))
    width = np.median(half) / oracle
    print(f"training, offset {offset_sd:.1%}: coverage {covered.mean():.3f}, median half-width / oracle "
          f"{width:.2f}, median drift {np.median(drifts):.4f}")
    assert covered.mean() >= 0.93 and covered[:, 0].mean() >= 0.93
    assert width <= 1.5
    assert np.median(drifts) == pytest.approx(math.expm1(drift * 4), rel=0.05)  # first A block to last: 4 blocks
