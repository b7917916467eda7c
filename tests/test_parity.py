"""The parity rules on synthetic curves with a BF16 band's own noise (tests/parity_curves.py): BF16 judged
against itself passes at the nominal rate, a planted 2% area gap fails the recipe, a recipe's pass rate is
counted over its seeds, time to quality has an interval and a `never`, and a FAIL names its rule."""

import statistics

import numpy as np
import pytest
from parity_curves import STEPS, band_and_recipe, run, shape

from fp8bench.analysis.parity import (
    AREA_RULE,
    FINAL_RULE,
    PAIRED_RULE,
    Criterion,
    RunVerdict,
    band_exit_step,
    derive_parity,
    judge_run,
    quality_speedup,
    recipe_verdict,
    verdict_from_metrics,
)

TRIALS = 200


def _metrics(records) -> dict[int, dict[str, float]]:
    """{seed: {metric: value}} of the FP8 runs derive_parity judged."""
    return {r.shape["seed"]: {m.name: m.value for m in ms} for r, ms, _ in derive_parity(records)}


def test_a_bf16_seed_judged_against_the_rest_of_its_band_passes_at_the_nominal_rate():
    """Leave-one-out on synthetic bands of four and five seeds (three and four judging): each criterion is a
    97.5% prediction interval, so a seed exchangeable with the others passes both at least 95% of the time."""
    rng = np.random.default_rng(59)
    passed = judged = 0
    for trial in range(TRIALS):
        bf16, _ = band_and_recipe(rng, seeds=4 + trial % 2, fp8_seeds=0)
        for held in bf16:
            rest = {b.shape["seed"]: b for b in bf16 if b is not held}
            passed += judge_run(held, rest).passed
            judged += 1
    assert passed / judged >= 0.95, f"{passed}/{judged}"


def test_a_planted_two_percent_area_gap_over_a_three_seed_band_fails_the_recipe():
    """An FP8 recipe whose loss is 2% above BF16's all along, trained on the band's three seeds: the paired
    test (each seed against the BF16 run of the same seed) fails it in at least 80% of trials. The unpaired
    rules alone see it rarely: three seeds that differ by 1.56% leave an allowance of about 8%."""
    rng = np.random.default_rng(2)
    recipe_fails = unpaired_fails = runs = 0
    for _ in range(TRIALS):
        bf16, fp8 = band_and_recipe(rng, gap=0.02)
        out = _metrics(bf16 + fp8)
        recipe_fails += out[0]["parity_recipe_pass"] == 0.0
        unpaired_fails += sum(m["parity_pass"] == 0.0 for m in out.values())
        runs += len(out)
    assert recipe_fails / TRIALS >= 0.80, f"{recipe_fails}/{TRIALS}"
    assert unpaired_fails / runs < 0.25, f"{unpaired_fails}/{runs}"


def test_a_recipe_as_good_as_bf16_passes_on_all_its_seeds_most_of_the_time():
    """Pass rates over seeds: with no gap planted, a recipe reads 'passes 3/3' in at least 85% of trials (the
    paired test's 5% and each seed's unpaired allowance are the misses) and never fails on two seeds of three;
    a recipe whose loss sits 40% above BF16 (a plateau) fails on every seed."""
    rng = np.random.default_rng(3)
    rates = []
    for _ in range(TRIALS):
        out = _metrics(sum(band_and_recipe(rng), []))
        rates.append((out[0]["parity_passes"], out[0]["parity_seeds"], out[0]["parity_recipe_pass"]))
    assert sum(p == 1.0 for *_, p in rates) / TRIALS >= 0.85
    assert all(passes >= seeds - 1 for passes, seeds, _ in rates)
    plateau = _metrics(sum(band_and_recipe(np.random.default_rng(4), gap=0.40), []))
    assert {m["parity_passes"] for m in plateau.values()} == {0.0}
    assert {m["parity_recipe_pass"] for m in plateau.values()} == {0.0}


def test_a_recipe_verdict_needs_three_seeds_and_names_what_failed():
    ok = RunVerdict(criteria=(Criterion(rule=FINAL_RULE, gap=0.01, allowed=0.1, unit="nats"),),
                    same_seed_area_gap_pct=0.3)
    bad = RunVerdict(criteria=(Criterion(rule=FINAL_RULE, gap=2.26, allowed=0.292, unit="nats"),
                               Criterion(rule=AREA_RULE, gap=124.7, allowed=15.58, unit="%")),
                     same_seed_area_gap_pct=131.9)
    two = recipe_verdict([ok, ok])
    assert two.passed is None and two.text() == "2/2 pass (fewer than 3 seeds: no verdict on the recipe)"
    assert recipe_verdict([ok, ok, ok]).passed is False  # three identical pairs: no spread, a positive mean
    spread = [RunVerdict(criteria=ok.criteria, same_seed_area_gap_pct=g) for g in (0.4, -0.5, 0.1)]
    assert recipe_verdict(spread).passed is True and recipe_verdict(spread).text() == "passes 3/3"
    one_bad = recipe_verdict([*spread[:2], bad])
    assert one_bad.passed is False and one_bad.passes == 2 and one_bad.worst_gap == pytest.approx(2.26)
    assert one_bad.text() == f"FAIL 2/3 pass: {FINAL_RULE}, {AREA_RULE}"
    assert bad.text() == (f"FAIL: {FINAL_RULE}: +2.260 nats against 0.292 allowed; "
                          f"{AREA_RULE}: +124.70% against 15.58% allowed")
    worse = [RunVerdict(criteria=ok.criteria, same_seed_area_gap_pct=g) for g in (1.9, 2.1, 2.0)]
    assert recipe_verdict(worse).failed_rules == (PAIRED_RULE,)


def test_a_stored_verdict_is_read_back_with_its_rules():
    stored = {"parity_pass": 0.0, "loss_gap_vs_bf16": 0.01, "loss_gap_allowed": 0.1, "loss_area_gap_pct": 9.0,
              "loss_area_gap_allowed_pct": 5.0, "loss_band_exit_step": 420.0, "loss_gap_same_seed": float("nan")}
    v = verdict_from_metrics(stored)
    assert v.failed == (AREA_RULE,) and v.exit_step == 420 and v.same_seed_gap is None
    assert verdict_from_metrics({"loss_gap_vs_bf16": 0.01}) is None  # never judged
    assert verdict_from_metrics({}, diverged="loss became nan at step 1").text() == \
        "FAIL: diverged (loss became nan at step 1)"


def test_the_curve_leaves_the_band_where_the_planted_gap_starts():
    rng = np.random.default_rng(5)
    bf16, _ = band_and_recipe(rng, fp8_seeds=0)
    curve = shape()
    curve[150:] *= 1.5
    late = run("e4m3", 0, 0.0, np.zeros(len(curve)), rng, curve=curve)
    step = band_exit_step(late.samples["loss"], [b.samples["loss"] for b in bf16])
    assert 140 <= step <= 152
    assert band_exit_step(bf16[0].samples["loss"], [b.samples["loss"] for b in bf16[1:]]) is None


def _reaching(rng, speed: float, fraction: float, seed: int, never: bool = False):
    """An FP8 run with `speed` times BF16's step rate that follows BF16's curve `1/fraction` times faster, so
    that it reaches BF16's final loss after `fraction` of the steps and stays there (or 20% above it: never)."""
    steps = STEPS
    t = np.minimum(np.arange(steps) / fraction, steps - 1)
    curve = np.interp(t, np.arange(steps), shape(steps)) * (1.2 if never else 1.0)
    return run("e4m3", seed, 0.0, np.zeros(steps), rng, curve=curve, time_ms=10.0 / speed, run_sd=0.0)


def test_time_to_quality_has_an_interval_over_seeds_and_an_explicit_never():
    """BF16 takes 300 steps of 10 ms to its final loss. FP8 runs 1.2x faster per step and reaches that loss
    after 80%, 100% or 90% of the steps: 1.2/0.8, 1.2 and 1.2/0.9 times sooner; one that stays 20% above the
    loss never reaches it."""
    rng = np.random.default_rng(6)
    target = float(shape()[-1])
    runs = [(_reaching(rng, 1.2, f, seed), 10.0) for seed, f in enumerate((0.8, 1.0, 0.9))]
    q = quality_speedup(runs, target, allowed=0.05)
    expected = statistics.geometric_mean([1.2 / 0.8, 1.2, 1.2 / 0.9])
    assert q.value == pytest.approx(expected, rel=0.03) and q.never == 0 and q.seeds == 3
    assert q.lo < q.value < q.hi and q.lo < 1.2 / 0.8 * 0.97 and q.hi > 1.2
    never = (_reaching(rng, 1.2, 0.8, 3, never=True), 10.0)
    assert quality_speedup([never], target, allowed=0.05).text() == "never"
    mixed = quality_speedup([*runs, never], target, allowed=0.05)
    assert mixed.never == 1 and mixed.text().startswith("never on 1 of 4 seeds; ")
    assert mixed.value == pytest.approx(q.value)


def test_time_to_quality_is_derived_per_run_and_per_recipe_with_never_stored():
    rng = np.random.default_rng(7)
    bf16, fp8 = band_and_recipe(rng, time_ms=8.0)
    _, plateau = band_and_recipe(np.random.default_rng(8), gap=0.40, fp8_seeds=1)
    out = _metrics(bf16 + fp8)
    assert all(m["quality_reached"] == 1.0 and m["quality_speedup"] > 1.0 for m in out.values())
    assert out[0]["quality_speedup_lo"] < out[0]["quality_speedup_seeds"] < out[0]["quality_speedup_hi"]
    assert out[0]["quality_never_seeds"] == 0.0
    stuck = _metrics(bf16 + [plateau[0]])[0]
    assert stuck["quality_reached"] == 0.0 and "quality_speedup" not in stuck and stuck["quality_never_seeds"] == 1.0
