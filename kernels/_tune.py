"""How fp8bench's kernels are tuned. Under Triton's interpreter (CPU, tests) nothing can be timed, so each
autotuner gets one config there; on a GPU a config is timed with `triton.testing.do_bench` after the GPU has
been kept busy long enough to leave its idle clocks. The ramp is there because a short kernel tuned first in
its process, on a GPU still at its idle clocks, can keep a config far slower than the one the same case picks
in another run (docs/kernels.md); that the clocks' ramp-up is the cause is likely, not shown."""

from __future__ import annotations

import os
import time

import torch
import triton

INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"
"""Set before the kernels are imported (tests/conftest.py does so when there is no GPU)."""

_RAMP_S = 0.3
_ramped: set[int] = set()


def tuning_configs(gpu: list[triton.Config], interpreter: triton.Config) -> list[triton.Config]:
    """What an autotuner chooses from: `gpu` on a GPU, the single `interpreter` config under the interpreter."""
    return [interpreter] if INTERPRETING else gpu


def steady_do_bench(fn, quantiles=None):
    device = torch.cuda.current_device()
    if device not in _ramped:
        end = time.perf_counter() + _RAMP_S
        while time.perf_counter() < end:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        _ramped.add(device)
    return triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=quantiles)
