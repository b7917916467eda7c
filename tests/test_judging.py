"""Judging thousands of series at once: seeded A/A comparisons call almost nothing, a planted 5% change in one
device-bound series is caught, Benjamini-Hochberg and the detectable change."""

import numpy as np
import pytest

from fp8bench.core.judging import (
    FDR,
    REGRESSION,
    benjamini_hochberg,
    history_stats,
    judge_comparison,
    qn_scale,
)

SERIES, COMPARISONS, HISTORY = 2760, 200, 5
CLASSES = [  # (share of the series, run-to-run sd of a series' log value beside its class's shift): from
    # device-bound Llama-size GEMMs (hopper-c, -d, -e: 0.2-0.35%) to host-bound microsecond cases (gpt-125m: 5-40%)
    (0.30, 0.003), (0.20, 0.005), (0.15, 0.01), (0.10, 0.02), (0.10, 0.05), (0.08, 0.15), (0.07, 0.4)]


def _population(rng):
    """Class of each series and its own sd (a class's series differ by ~30% in sd)."""
    sizes = [round(share * SERIES) for share, _ in CLASSES]
    sizes[0] += SERIES - sum(sizes)
    cls = np.repeat(np.arange(len(CLASSES)), sizes)
    sd = np.array([sd for _, sd in CLASSES])[cls] * np.exp(rng.normal(0, 0.3, SERIES))
    return cls, sd


def _runs(rng, cls, sd, n):
    """n runs' values of every series: each run on its own box, which shifts a whole class by a shared
    offset (half the class's sd), plus each series' own run-to-run noise."""
    class_sd = np.array([s for _, s in CLASSES])
    shared = rng.normal(0, 1, (n, len(CLASSES))) * class_sd / 2
    return np.exp(1.0 + shared[:, cls] + rng.normal(0, 1, (n, SERIES)) * sd)


def _compare(rng, cls, sd, planted=None, history=True):
    """One comparison's verdicts: HISTORY earlier runs (or none), a base and a head run; `planted`: (series,
    relative change) applied to the head."""
    vals = _runs(rng, cls, sd, HISTORY + 2)
    if planted:
        vals[-1, planted[0]] *= 1 + planted[1]
    d = np.log(vals[-1]) - np.log(vals[-2])
    hist = vals[:HISTORY].T if history else np.full((SERIES, 0), np.nan)
    return judge_comparison(d, hist, [cls], np.zeros(SERIES, bool))


@pytest.mark.parametrize("history", [True, False])
def test_a_a_comparisons_of_2760_series_call_a_regression_in_at_most_3_percent(history):
    """Each run on its own box (a shared shift per class) and each series with its own noise; with five
    earlier runs the variance is the series' own history, with none its class's cross-section."""
    rng = np.random.default_rng(5858)
    cls, sd = _population(rng)
    any_regression = any_call = 0
    for _ in range(COMPARISONS):
        verdicts = _compare(rng, cls, sd, history=history)
        assert set(verdicts.source) == {"history" if history else "cross-section"}
        any_regression += (verdicts.verdict == REGRESSION).any()
        any_call += np.isin(verdicts.verdict, ["regression", "improvement"]).any()
    print(f"A/A, history={history}: any regression in {any_regression} of {COMPARISONS}, any verdict in {any_call}")
    assert any_regression <= 0.03 * COMPARISONS


@pytest.mark.parametrize("history", [True, False])
def test_a_planted_five_percent_change_in_one_device_bound_series(history):
    """Caught in at least 80% of comparisons with five earlier runs; with none, only the cross-section of the
    comparison gives its class's variance (and a box shift of the whole class counts against it)."""
    rng = np.random.default_rng(1205)
    cls, sd = _population(rng)
    target = int(np.argmin(np.where(cls == 0, np.abs(sd - 0.003), np.inf)))  # a typical quiet series
    caught, detectable = 0, []
    for _ in range(COMPARISONS):
        verdicts = _compare(rng, cls, sd, planted=(target, 0.05), history=history)
        caught += verdicts.verdict[target] == REGRESSION
        detectable.append(verdicts.detectable[target])
    print(f"history={history}: caught {caught} of {COMPARISONS}; median detectable change "
          f"{np.median(detectable):.1%}")
    assert caught >= (0.8 if history else 0.5) * COMPARISONS
    assert np.median(detectable) <= (0.05 if history else 0.06)


def test_benjamini_hochberg_is_the_step_up_rule():
    p = np.array([0.001, 0.008, 0.039, 0.041, 0.042, 0.06, 0.074, 0.205, np.nan])
    assert benjamini_hochberg(p, 0.05).tolist() == [True, True] + [False] * 7
    assert benjamini_hochberg(p, 0.2).tolist() == [True] * 7 + [False, False]
    assert not benjamini_hochberg([np.nan, np.nan]).any() and FDR == 0.01


def test_qn_is_the_standard_deviation_for_normal_data_and_ignores_one_wild_value():
    """The cross-section's spread: 1..12 by hand (the 21st smallest of the 66 distances is 2, times 2.2219 and
    12 / 15.8); about 1 over normal samples of a dozen; one value moved 10 spreads out moves it by a sixth,
    where the standard deviation grows four-fold (a lone change must not widen the spread it is judged by)."""
    assert qn_scale(np.arange(1.0, 13.0)) == pytest.approx(2 * 2.2219 * 12 / 15.8)
    rng = np.random.default_rng(7)
    samples = rng.normal(0, 1, (4000, 12))
    assert np.mean([qn_scale(x) for x in samples]) == pytest.approx(1.0, abs=0.03)
    x, wild = samples[0], np.append(samples[0][:-1], 10.0)
    assert qn_scale(wild) / qn_scale(x) < 1.25 and np.std(wild) / np.std(x) > 4
    assert qn_scale(np.array([3.0])) == 0.0


def test_history_stats_reads_ragged_runs_and_takes_each_run_s_class_offset_out():
    s2, df, _ = history_stats([[1.0, 1.0, 1.0], [1.0], [1.0, np.e, np.nan]])
    assert s2[0] == 0 and df[0] == 2
    assert np.isnan(s2[1]) and df[1] == 0
    assert s2[2] == pytest.approx(0.5) and df[2] == 1
    # eight series whose runs all moved together by +-2%: no noise of their own, a class offset per run
    runs = np.exp(np.array([0.0, 0.02, -0.02, 0.01]))
    hist = np.outer(np.linspace(1, 2, 8), runs)
    s2, df, shifts = history_stats(hist, ["c"] * 8)
    assert np.allclose(s2, 0) and df.tolist() == [3.0] * 8
    assert shifts["c"][0] == pytest.approx(np.var(np.log(runs), ddof=1)) and shifts["c"][1] == 3


def _class_history(rng, n, class_sd, own_sd=0.002, runs=6):
    """Earlier runs of n series whose whole class moves by class_sd between runs, each series by own_sd more."""
    return np.outer(np.ones(n), np.exp(rng.normal(0, class_sd, runs))) * np.exp(rng.normal(0, own_sd, (n, runs)))


def test_a_whole_class_moving_as_far_as_it_did_before_is_no_verdict():
    """Earlier runs show the class moving 1.5% between runs (boxes, days): a 2% shift of all forty is no
    verdict, per series or for the class; a lone series without any variance is not judged."""
    rng = np.random.default_rng(11)
    n = 40
    d = np.full(n, -0.02) + rng.normal(0, 0.002 * np.sqrt(2), n)
    j = judge_comparison(np.append(d, 0.5), np.vstack([_class_history(rng, n, 0.015), np.full(6, np.nan)]),
                         [["gemm"] * n + ["alone"]], [False] * (n + 1))
    assert (j.verdict[:n] == "unchanged").all() and j.verdict[n] == "" and j.source[n] == ""
    [cls] = j.classes
    assert cls.members == n and cls.shift == pytest.approx(-0.02, abs=0.002) and cls.verdict == "unchanged"


def test_against_a_quiet_history_one_series_and_a_whole_class_shift_are_caught():
    """The class moved 0.2% between earlier runs: one series 6% slower is a regression, a 0.6% move is not
    (under MIN_CHANGE, though significant); when all forty move 3% more, that is the class's verdict, not
    forty more."""
    rng = np.random.default_rng(12)
    n = 40
    hist = _class_history(rng, n, 0.002)
    d = rng.normal(0, 0.002 * np.sqrt(2), n)
    d[3] += 0.06
    d[5] += 0.006
    j = judge_comparison(d, hist, [["gemm"] * n], [False] * n)
    assert j.verdict[3] == "regression" and j.verdict[5] == "unchanged"
    assert (j.verdict == "unchanged").sum() == n - 1 and set(j.source) == {"history"}
    assert 0.01 <= np.median(j.detectable) < 0.03  # this class's series: a 1-3% change is caught
    j = judge_comparison(d + 0.03, hist, [["gemm"] * n], [False] * n)
    assert j.verdict[3] == "regression" and (j.verdict == "unchanged").sum() == n - 1
    assert j.classes[0].verdict == "regression" and j.classes[0].shift == pytest.approx(0.03, abs=0.002)
