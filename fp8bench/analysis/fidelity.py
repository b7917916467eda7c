"""Is fp8bench's timer faithful? Its median for a fixed kernel against `triton.testing.do_bench` in the same
process, in interleaved rounds (the design asks for agreement within 2%). `pytest -m gpu` and
`scripts/gpu_checks.py` run it; docs/regression.md says what the H200 boxes showed."""

from __future__ import annotations

import statistics
import time

import torch

from fp8bench.config.schema import MeasureConfig
from fp8bench.core.measure import time_fn


def sustain(fn, seconds: float) -> None:
    """Call `fn` for `seconds`, syncing every 10 calls: a power-capped GPU's clocks step down under sustained
    load, and the timers compared here should meet them already lowered."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(10):
            fn()
        torch.cuda.synchronize()


def fp8bench_samples(fn, settle_ms: float) -> list[float]:
    """fp8bench's timer as the fidelity check runs it, every sample (ms). Same time budget as do_bench's
    rep=300 ms (not an iteration cap): the GPU's duty cycle, and with it its clocks, must match for short
    kernels."""
    return time_fn(fn, device=torch.device("cuda"), warmup=10, iters=100_000, min_samples=50, max_time_s=0.3,
                   flush_l2=True, settle_ms=settle_ms).samples_ms


def compare_timers(fn, rounds: int = 6, settle_s: float = 3.0) -> tuple[float, float, float]:
    """fp8bench's timer against do_bench over interleaved rounds: (median of ours, median of theirs, median of
    the per-round ratios ours/theirs). A power-capped GPU's clocks drift with power and temperature over
    seconds, so timing one method after the other compares two GPU states; the ratio of the two runs of one
    round pairs them in time, and its median over rounds outvotes a round that met a clock step.

    Both timers settle the same time before their samples (fp8bench's `measure.settle_ms` default; do_bench's
    `warmup` is in ms): otherwise each starts in whatever state the gap between the two left the GPU in, and
    one may sample the clocks' step-down that the other's warm-up has already taken. Settling alike times ours
    as the sweeps run it.

    `settle_s` of untimed calls come first, so that both timers meet clocks already lowered by sustained load
    rather than the faster ones of a GPU that has just left idle."""
    from triton.testing import do_bench

    settle_ms = MeasureConfig.settle_ms
    sustain(fn, settle_s)

    def ours() -> float:
        return statistics.median(fp8bench_samples(fn, settle_ms))

    def theirs() -> float:
        return do_bench(fn, warmup=settle_ms, rep=300, return_mode="median")

    times: dict = {ours: [], theirs: []}
    for r in range(rounds):
        # the order alternates: whichever runs second in a round meets a GPU the first has heated
        for method in ((ours, theirs) if r % 2 == 0 else (theirs, ours)):
            times[method].append(method())
    ratios = [o / t for o, t in zip(times[ours], times[theirs], strict=True)]
    return statistics.median(times[ours]), statistics.median(times[theirs]), statistics.median(ratios)
