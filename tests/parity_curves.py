"""Synthetic training runs for the parity tests: loss curves with the noise a BF16 band has, seeded.

The model, in log loss: a curve shape shared by every run, plus a seed effect shared by the runs of one seed
(initial weights and batches), plus a run effect of its own (rounding, reduction order), plus each step's
batch noise, shared by the runs of one seed (the same batches). The spreads are those of the committed
gpt-125m bands (docs/training.md, "Choosing the rule"): the curve area of different seeds differs by 1.56%
(standard deviation), that of one seed run again by 0.47%; one step's loss scatters by about 10% around the
curve (the batches of 8x512 byte tokens).
"""

from __future__ import annotations

import math

import numpy as np

from fp8bench.core.records import CaseRecord, Metric

SEED_SD = 0.0156
RUN_SD = 0.0047
BATCH_SD = 0.10
STEPS = 300
EVAL_EVERY = 30


def shape(steps: int = STEPS) -> np.ndarray:
    """A loss curve from ln(256) down to about 1.2 nats (byte-level vocabulary)."""
    t = np.arange(steps) * (1000 / steps)
    return 1.15 + 3.3 * np.exp(-t / 25) + 1.1 * np.exp(-t / 350)


def run(fmt: str, seed: int, seed_effect: float, batches: np.ndarray, rng: np.random.Generator, *,
        gap: float = 0.0, curve: np.ndarray | None = None, time_ms: float = 10.0, run_id: str = "r",
        run_sd: float = RUN_SD) -> CaseRecord:
    """One training run: `gap` multiplies its loss (a planted relative gap); `curve` replaces the shape."""
    base = shape(len(batches)) if curve is None else curve
    level = np.log(base) + seed_effect + rng.normal(0.0, run_sd) + math.log1p(gap)
    losses = np.exp(level + batches)
    val_steps = list(range(0, len(batches), EVAL_EVERY)) + [len(batches)]
    val = [float(np.exp(level[min(s, len(batches) - 1)])) for s in val_steps]
    scaling = "none" if fmt == "bf16" else "delayed"
    return CaseRecord(run_id=run_id, case_id=f"train.m.b8s128n{len(batches)}.seed{seed}.{fmt}.{scaling}.te",
                      workload="train", model="m", format=fmt, scaling=scaling, backend="te",
                      shape_name=f"b8s128n{len(batches)}.seed{seed}",
                      shape={"batch": 8, "seq": 128, "steps": len(batches), "seed": seed}, status="ok",
                      metrics=[Metric.of("loss_final", val[-1]), Metric.of("time_ms", time_ms)],
                      samples={"loss": [float(v) for v in losses], "val_loss": val,
                               "val_step": [float(s) for s in val_steps]})


def band_and_recipe(rng: np.random.Generator, seeds: int = 3, gap: float = 0.0, fp8_seeds: int | None = None,
                    steps: int = STEPS, **fp8) -> tuple[list[CaseRecord], list[CaseRecord]]:
    """A BF16 band of `seeds` seeds and an FP8 recipe trained on the first `fp8_seeds` of them (all by
    default), with a planted relative `gap`."""
    bf16, recipe = [], []
    for seed in range(seeds):
        effect, batches = rng.normal(0.0, SEED_SD), rng.normal(0.0, BATCH_SD, steps)
        bf16.append(run("bf16", seed, effect, batches, rng))
        if seed < (seeds if fp8_seeds is None else fp8_seeds):
            recipe.append(run("e4m3", seed, effect, batches, rng, gap=gap, **fp8))
    return bf16, recipe
