"""Blocks of training steps of a recipe and of its BF16 twin, alternated in one process: the timing a training
speedup is published from (fp8bench.run.train_sandwich runs it in each process; fp8bench.core.intervals turns
the blocks into the speedup, its interval and the twin's drift).

Each side is built as its run builds it (fp8bench.workloads.train.local.build_engine: same seed, backend,
knobs and data), from fresh weights, and takes the batches and learning rate of the steps after a run of
`steps` steps (not those of the warm-up's first steps). Both sides are built, then warmed, then timed, and stay
built where the GPU holds them (`resident`); where the
second does not fit beside the first (its build or its steps run out of memory), the blocks start over, each
building its side anew after the other is dropped (`rebuilt`), in the shortest sandwich, A B A; `warmup`
untimed steps follow every build.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

import torch

from fp8bench.core.intervals import BASELINE, RECIPE
from fp8bench.workloads.common import CaseInput
from fp8bench.workloads.train.local import build_engine
from fp8bench.workloads.train.loop import Stepper, StepTimer

RESIDENT, REBUILT = "resident", "rebuilt"


@dataclass
class SandwichTiming:
    mode: str
    """RESIDENT (both sides built once) or REBUILT (one side built at a time, for each block)."""
    blocks: list[tuple[str, list[float]]]
    """(side, step times in ms) per block, in the order they ran."""


OUT_OF_MEMORY = ("out of memory", "CUBLAS_STATUS_ALLOC_FAILED", "CUDNN_STATUS_ALLOC_FAILED")
"""How running out of GPU memory reads when it does not come as torch.OutOfMemoryError: a library's own error
(Transformer Engine's C++ checks, cuBLAS, cuDNN), or the compiler's wrapping of one."""


def _out_of_memory(exc: BaseException | None) -> bool:
    for _ in range(8):  # the exception and the ones it was raised from
        if exc is None:
            return False
        if isinstance(exc, torch.OutOfMemoryError) or any(s in str(exc) for s in OUT_OF_MEMORY):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class _Side:
    """One side's model, optimiser and data, and the step it is at."""

    def __init__(self, case: CaseInput) -> None:
        engine, data = build_engine(case)
        self.stepper = Stepper(case, engine, data)
        self.next = case.shape["steps"]
        self.timer = StepTimer(case.device)

    def steps(self, n: int, timed: bool = True) -> list[float]:
        for _ in range(n):
            begin = self.timer.start()
            self.stepper.step(self.next, None)
            self.timer.stop(begin)
            self.next += 1
        times = self.timer.drain()  # syncs: a block's steps are all done before the next block starts
        return times if timed else []


def _resident(cases: dict[str, CaseInput], order: str, steps: int, warmup: int) -> list[tuple[str, list[float]]]:
    """Both sides built before either is warmed or timed, so no build (nor the compiler state a build resets)
    falls between two timed blocks: the blocks follow each other evenly, as the drift correction assumes."""
    built = {side: _Side(cases[side]) for side in dict.fromkeys(order)}
    for side in built.values():
        side.steps(warmup, timed=False)
    return [(side, built[side].steps(steps)) for side in order]


def _rebuilt(cases: dict[str, CaseInput], order: str, steps: int, warmup: int) -> list[tuple[str, list[float]]]:
    """One side at a time: each block builds its side after the other is dropped, warms it and times it."""
    blocks = []
    for side in order:
        _free(cases[side].device)
        built = _Side(cases[side])
        built.steps(warmup, timed=False)
        blocks.append((side, built.steps(steps)))
        del built
    _free(cases[order[0]].device)
    return blocks


def time_sandwich(twin: CaseInput, recipe: CaseInput, order: str, steps: int, warmup: int) -> SandwichTiming:
    """Time blocks of `steps` steps in `order` (a string of BASELINE/RECIPE: the twin's and the recipe's);
    where both sides do not fit at once (building them, or stepping one beside the other, runs out of
    memory), the blocks start over as A B A, each block building its side anew."""
    cases = {BASELINE: twin, RECIPE: recipe}
    try:
        blocks = _resident(cases, order, steps, warmup)
    except RuntimeError as exc:  # torch.OutOfMemoryError is one; libraries raise their own
        if not _out_of_memory(exc):
            raise
        # leaving the handler drops the exception, and with it the half-built sides its frames hold
    else:
        _free(recipe.device)
        return SandwichTiming(RESIDENT, blocks)
    # every block now pays a build and its warm-up: the shortest sandwich
    return SandwichTiming(REBUILT, _rebuilt(cases, order[:3], steps, warmup))
