"""What every workload shares: the case being run, seeded inputs, and the emulator cross-check."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fp8bench.backends.base import Backend, Recipe
from fp8bench.config.schema import Config, MeasureConfig
from fp8bench.core.measure import time_fn
from fp8bench.core.numerics import TOLERANCE
from fp8bench.core.records import Metric
from fp8bench.core.types import Format


class Diverged(RuntimeError):
    """A training run's loss became NaN/Inf: recorded `diverged` with what it measured up to that step."""

    def __init__(self, message: str, output: CaseOutput) -> None:
        super().__init__(message)
        self.output = output


class NumericsMismatch(RuntimeError):
    """A real backend disagreed with the emulator beyond the tolerance table: the case is `failed`."""


@dataclass(frozen=True)
class CaseInput:
    """What a workload's `run` receives."""

    config: Config
    shape_name: str
    shape: dict
    recipe: Recipe
    backend: Backend
    device: torch.device
    work_dir: Path | None = None
    """A folder of this case inside its run (checkpoints); None when the case has nowhere to keep state."""
    others_bytes: int = 0
    """CUDA bytes held, when this case is built, by other cases built before it and still alive (cases timed
    side by side: fp8bench.run.groups). Subtracted from allocator readings, so a case's memory is its own."""

    @property
    def measure(self) -> MeasureConfig:
        return self.config.measure


@dataclass
class CaseOutput:
    metrics: list[Metric]
    samples: dict[str, list[float]]
    ran: dict = field(default_factory=dict)
    """What the backend chose to run (a kernel, a module option): recorded in the case's `ran`, so no choice
    made at run time hides under the case id."""
    graphs: bool = False
    """The timed work replayed CUDA graphs (a GEMM under measure.cuda_graph, a train step under
    `backend.cuda_graph`), as set where the replay happened."""
    compiled: bool = False
    """The timed work ran torch.compile's code, as read from the module that ran (`is_compiled`)."""


@dataclass
class Prepared:
    """A case built and ready to be timed (gemm, linear, layer): what to time, by the metric each timing
    becomes (`time_ms`: what the case measures; `time_ms_kernel`: the kernel on operands quantized up front),
    and `finish(timings)`, which turns those timings into the case's output (speed metrics, numerics). Memory
    is measured while building, before other cases are built beside it."""

    timed: dict[str, Callable[[], object]]
    finish: Callable[[dict], CaseOutput]
    cuda_graph: bool = False
    """Time replays of a captured graph (measure.cuda_graph; GEMMs only)."""


def timing_samples(name: str, timing) -> dict[str, list[float]]:
    """A timing's samples under `name`, and for one timed in rounds beside a twin (measure.time_interleaved) the
    round of each sample under `<name>_round`: what a speedup is recomputed from (core.speedup)."""
    out = {name: list(timing.samples_ms)}
    if timing.rounds:
        out[f"{name}_round"] = [float(r) for r, rnd in enumerate(timing.rounds) for _ in rnd]
    if timing.rounds and timing.process_of_round:  # several processes: rounds listed process by process
        out[f"{name}_process"] = [float(p) for p, rnd in zip(timing.process_of_round, timing.rounds, strict=True)
                                  for _ in rnd]
    if timing.bound is not None:  # the evidence of the bound label: every timed block's wall and device time
        out |= {f"{name}_{k}": v for k, v in timing.bound.samples().items()}
    return out


def run_alone(case: CaseInput, prepare: Callable[[CaseInput], Prepared]) -> CaseOutput:
    """Build, time each callable on its own (fp8bench.core.measure.time_fn), finish: how a case runs without a
    twin to be timed beside (the emulator, BF16 cases, or a group that could not be timed together)."""
    prepared = prepare(case)
    timer = timer_kwargs(case, cuda_graph=prepared.cuda_graph)
    return prepared.finish({name: time_fn(fn, **timer) for name, fn in prepared.timed.items()})


NUMERICS_ROWS = 1024
"""Accuracy is computed on the first rows of each output: the FP64 reference of a full 8192-token GEMM
would cost more than the case itself, and on i.i.d. Gaussian inputs the first 1024 rows estimate SQNR to
well under 0.1 dB. Quantization still sees the whole tensor (tensorwise amax over all rows)."""


def timer_kwargs(case: CaseInput, cuda_graph: bool = False) -> dict:
    """The timer settings of a case: the emulator runs once."""
    ms = case.measure
    if not case.backend.timed:
        return dict(device=case.device, warmup=0, iters=1, min_samples=1, max_time_s=0.0, flush_l2=False)
    return dict(device=case.device, warmup=ms.warmup, iters=ms.iters, min_samples=ms.min_samples,
                max_time_s=ms.max_time_s, flush_l2=ms.flush_l2, cuda_graph=cuda_graph, settle_ms=ms.settle_ms,
                slowdown=case.config.slowdown_for(case.backend.name))


def generator(config: Config, shape_name: str, device: torch.device) -> torch.Generator:
    """Same inputs for every format and backend of one shape: speedups and emulator checks compare like
    with like. Seeded from (seed, model, workload, shape)."""
    key = f"{config.seed}|{config.model.name}|{config.workload.name}|{shape_name}".encode()
    seed = int.from_bytes(hashlib.sha256(key).digest()[:6], "little")
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def randn(shape: tuple[int, ...], g: torch.Generator, device: torch.device, scale: float = 1.0) -> torch.Tensor:
    """Gaussian BF16 (never zeros: they hide unwritten outputs and run faster than real data)."""
    return (torch.randn(shape, generator=g, device=device, dtype=torch.float32) * scale).bfloat16()


def speed_metrics(case: CaseInput, timing, flops: float, pct_of_peak: bool = True,
                  peak_bytes: int | None = None) -> list[Metric]:
    """time_ms, peak_mem_bytes (when given: CUDA), and for real kernels TFLOPS and % of the spec-sheet peak
    of the case's format (BF16 or FP8). The emulator's time is not a kernel's, so it gets neither."""
    from fp8bench.core.hardware import detect_device, spec_sheet

    metrics = [Metric.of("time_ms", timing.median_ms)]
    if timing.gpu_busy_pct is not None:
        metrics.append(Metric.of("gpu_busy_pct", timing.gpu_busy_pct))
    if timing.injected_slowdown is not None:
        metrics.append(Metric.of("injected_slowdown_pct", 100.0 * timing.injected_slowdown))
    if peak_bytes is not None:
        metrics.append(Metric.of("peak_mem_bytes", peak_bytes))
    if not case.backend.timed:
        return metrics
    tflops = flops / timing.median_ms / 1e9
    metrics.append(Metric.of("tflops", tflops))
    sheet = spec_sheet(detect_device()) if pct_of_peak and case.device.type == "cuda" else None
    if sheet:
        peak_tflops = sheet.bf16_tflops if case.recipe.format is Format.BF16 else sheet.fp8_tflops
        metrics.append(Metric.of("pct_of_peak", 100.0 * tflops / peak_tflops))
    return metrics


def check_against_emulator(fmt: Format, sqnr_vs_emulated: float, what: str) -> None:
    tol = TOLERANCE[fmt]
    if not sqnr_vs_emulated >= tol.min_sqnr_db:  # also catches NaN
        raise NumericsMismatch(f"{what} differs from the emulator: SQNR {sqnr_vs_emulated:.1f} dB < "
                               f"{tol.min_sqnr_db} dB ({tol.source})")
