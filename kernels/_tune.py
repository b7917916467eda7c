"""How fp8bench's kernels are tuned. Under Triton's interpreter (CPU, tests) nothing can be timed, so each
autotuner gets one config there; on a GPU a config is timed with `triton.testing.do_bench` after the GPU has
been kept busy long enough to leave its idle clocks. The ramp is there because a ~60 µs cast, tuned first in
its process, once kept a config about half as fast as the same case measured in another run (H200); that
clock ramp-up is the cause is likely, not yet shown.

Each option is then timed replayed from a CUDA graph (`triton.testing.do_bench_cudagraph`), not with `do_bench`,
whose loop enqueues flush, event, call, event from the host: where a call's host cost exceeds its kernels' time
the GPU waits inside the timed span and the loop times the host. At 2048³ on the H200 at fec7093
(research/gemm_pick_probe.py) do_bench read 33-59 µs for Gluon GEMM configs that ran 20-26 µs with their
launches queued ahead, and the order among them followed host time. A graph replays the calls back to back,
without an L2 flush between them: operands that fit in L2 stay there, as they do between a step's kernels."""

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
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=100, quantiles=quantiles, return_mode="median")
    except RuntimeError:  # a call that cannot be captured (it synchronizes): timed as the host launches it
        return triton.testing.do_bench(fn, warmup=25, rep=100, quantiles=quantiles)
