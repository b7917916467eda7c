"""The one timer: warm-up, per-iteration samples, median and IQR; CUDA events on GPU, perf_counter_ns on CPU.

Changing how anything is timed changes MEASUREMENT_VERSION, which starts new asv series on purpose.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

MEASUREMENT_VERSION = 1
L2_FLUSH_BYTES = 256 * 1024 * 1024  # > the 50-60 MB L2 of H100/H200/B200


@dataclass(frozen=True)
class Timing:
    samples_ms: list[float]
    flushed_l2: bool
    cuda_graph: bool

    @property
    def median_ms(self) -> float:
        return statistics.median(self.samples_ms)

    @property
    def iqr_ms(self) -> float:
        if len(self.samples_ms) < 2:
            return 0.0
        q = statistics.quantiles(self.samples_ms, n=4, method="inclusive")
        return q[2] - q[0]


class _L2Flusher:
    def __init__(self) -> None:
        self.buf = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")

    def __call__(self) -> None:
        self.buf.zero_()


def time_fn(fn: Callable[[], object], *, device: torch.device, warmup: int, iters: int, min_samples: int,
            max_time_s: float, flush_l2: bool = False, cuda_graph: bool = False) -> Timing:
    """Time `fn` per iteration: `warmup` untimed calls, then samples until `iters` or `max_time_s`."""
    if device.type == "cuda":
        return _time_cuda(fn, warmup, iters, min_samples, max_time_s, flush_l2, cuda_graph)
    return _time_cpu(fn, warmup, iters, min_samples, max_time_s)


def _time_cpu(fn: Callable[[], object], warmup: int, iters: int, min_samples: int, max_time_s: float) -> Timing:
    for _ in range(warmup):
        fn()
    samples: list[float] = []
    deadline = time.perf_counter() + max_time_s
    while len(samples) < iters and (len(samples) < min_samples or time.perf_counter() < deadline):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1e6)
    return Timing(samples, False, False)


def _time_cuda(fn: Callable[[], object], warmup: int, iters: int, min_samples: int, max_time_s: float,
               flush_l2: bool, cuda_graph: bool) -> Timing:
    run = fn
    if cuda_graph:
        fn()  # allocate outside capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        run = graph.replay
    for _ in range(warmup):
        run()
    torch.cuda.synchronize()
    flush = _L2Flusher() if flush_l2 else None
    samples: list[float] = []
    deadline = time.perf_counter() + max_time_s
    while len(samples) < iters and (len(samples) < min_samples or time.perf_counter() < deadline):
        if flush:
            flush()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return Timing(samples, flush is not None, cuda_graph)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_memory_bytes(device: torch.device) -> int | None:
    """Peak bytes allocated by torch since the last reset; None on CPU (torch keeps no such counter there)."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())
    return None
