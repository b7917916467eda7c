"""The divergence taxonomy on planted curves: plateau, spike and divergence are named with the step where
they start; a healthy curve, noise and all, reads ok; a speed run's few steps are not read."""

import math

import numpy as np
import pytest
from parity_curves import BATCH_SD, shape

from fp8bench.analysis.taxonomy import MIN_STEPS, CurveClass, classify, curve_metrics
from fp8bench.core.records import CaseRecord

STEPS = 1000


def _noisy(curve: np.ndarray, seed: int = 0) -> list[float]:
    return list(curve * np.exp(np.random.default_rng(seed).normal(0.0, BATCH_SD, len(curve))))


@pytest.mark.parametrize("seed", range(5))
def test_a_healthy_curve_reads_ok(seed):
    assert classify(_noisy(shape(STEPS), seed)).kind is CurveClass.OK


def test_a_curve_that_climbs_to_a_flat_level_and_stays_reads_plateau_from_where_it_stopped_learning():
    """As llama-350m's E4M3-delayed run did: it follows BF16 to a low, climbs back and stays flat."""
    curve = shape(STEPS)
    curve[130:] = np.minimum(curve[130] * np.linspace(1.0, 1.45, STEPS - 130), curve[130] * 1.45)
    reading = classify(_noisy(curve))
    assert reading.kind is CurveClass.PLATEAU and 80 <= reading.step <= 135, reading


def test_a_curve_that_stops_improving_reads_plateau():
    curve = shape(STEPS)
    curve[400:] = curve[400]
    reading = classify(_noisy(curve, 1))
    assert reading.kind is CurveClass.PLATEAU and 280 <= reading.step <= 410, reading


def test_a_rise_that_comes_back_reads_spike_from_where_it_rose():
    curve = shape(STEPS)
    curve[600:640] *= 2.0
    reading = classify(_noisy(curve, 2))
    assert reading.kind is CurveClass.SPIKE and 585 <= reading.step <= 605, reading


def test_a_non_finite_loss_or_a_climb_above_the_start_reads_diverged():
    curve = list(shape(STEPS))
    assert classify(curve[:500] + [math.nan]) .text() == "diverged from step 500"
    assert classify(curve[:40], diverged_at=40).step == 40  # a run stopped on its non-finite loss, however short
    climbing = shape(STEPS)
    climbing[300:] = climbing[300] * np.exp(np.linspace(0.0, 2.0, STEPS - 300))
    reading = classify(_noisy(climbing, 3))
    assert reading.kind is CurveClass.DIVERGED and 250 <= reading.step <= 310, reading


def test_a_short_finite_curve_is_not_read():
    assert classify(list(shape(MIN_STEPS - 1))) is None


def test_the_reading_is_stored_as_a_code_and_a_step():
    record = CaseRecord(run_id="r", case_id="train.x", workload="train", model="m", format="e4m3",
                        scaling="delayed", backend="te", shape_name="x", shape={}, status="diverged",
                        samples={"loss": [5.0, 4.0], "diverged_at_step": [2.0]})
    assert {m.name: m.value for m in curve_metrics(record)} == {
        "loss_curve_class": CurveClass.DIVERGED.code, "loss_curve_class_step": 2.0}
    assert CurveClass.from_code(CurveClass.PLATEAU.code) is CurveClass.PLATEAU
