"""How fp8bench's autotuners time a config: `triton.testing.do_bench`, after the GPU has been kept busy long
enough to leave its idle clocks. Without that, the first kernel tuned in a process is timed while the clocks
ramp up, and a ~60 µs cast can keep a config that is 2x slower than the best (seen on the H200)."""

from __future__ import annotations

import time

import torch
import triton

_RAMP_S = 0.3
_ramped: set[int] = set()


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
