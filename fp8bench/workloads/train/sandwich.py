"""Blocks of training steps of a recipe and of its BF16 twin, alternated in one process: the timing a training
speedup is published from (fp8bench.run.train_sandwich runs it in each process; fp8bench.core.intervals turns
the blocks into the speedup, its interval and the twin's drift).

Each side is built as its run builds it (fp8bench.workloads.train.local.build_engine: same seed, backend,
knobs and data) and steps on from where a run of `steps` steps ends, so its batches and learning rate are a
run's, not a fresh model's first steps. Both sides stay built where the GPU holds them (`resident`); where the
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


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class _Side:
    """One side's model, optimiser and data, and the step it is at."""

    def __init__(self, case: CaseInput, warmup: int) -> None:
        engine, data = build_engine(case)
        self.stepper = Stepper(case, engine, data)
        self.next = case.shape["steps"]
        self.timer = StepTimer(case.device)
        self.steps(warmup, timed=False)

    def steps(self, n: int, timed: bool = True) -> list[float]:
        for _ in range(n):
            begin = self.timer.start()
            self.stepper.step(self.next, None)
            self.timer.stop(begin)
            self.next += 1
        times = self.timer.drain()  # syncs: a block's steps are all done before the next block starts
        return times if timed else []


def time_sandwich(twin: CaseInput, recipe: CaseInput, order: str, steps: int, warmup: int) -> SandwichTiming:
    """Time blocks of `steps` steps in `order` (a string of BASELINE/RECIPE: the twin's and the recipe's);
    where both sides do not fit at once (building the second, or stepping beside it, runs out of memory), the
    blocks start over as A B A, each block building its side anew."""
    cases, device = {BASELINE: twin, RECIPE: recipe}, recipe.device
    built: dict[str, _Side] = {}
    mode = RESIDENT
    blocks: list[tuple[str, list[float]]] = []
    while len(blocks) < len(order):
        side = order[len(blocks)]
        if mode == RESIDENT:
            try:
                if side not in built:
                    built[side] = _Side(cases[side], warmup)
                blocks.append((side, built[side].steps(steps)))
                continue
            except torch.OutOfMemoryError:
                pass
            # from here on one side at a time, in the shortest sandwich: every block now pays a build and its
            # warm-up, and blocks timed beside the other side's memory are not mixed with blocks timed alone
            mode, order, blocks = REBUILT, order[:3], []
            built.clear()
            _free(device)
            continue
        if side not in built:
            built.clear()
            _free(device)
            built[side] = _Side(cases[side], warmup)
        blocks.append((side, built[side].steps(steps)))
    built.clear()
    _free(device)
    return SandwichTiming(mode, blocks)
