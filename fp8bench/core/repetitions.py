"""How many processes and rounds buy the narrowest speedup interval within a time budget.

Kalibera and Jones, "Rigorous benchmarking in reasonable time" (ISMM 2013): with a variance component per
level of repetition (here: between processes, and between rounds within a process) and a cost per repetition
at each level, the variance of the mean is var_process / P + var_round / (P R). A process costs its start-up,
its build and warm-up and its settling (`cost_process_s`); a round costs its timed blocks (`cost_round_s`).
Their optimum for the lower level is R* = sqrt(cost_process var_round / (cost_round var_process)) (their
equation for the repetition count of a level): rounds beyond it buy less than another process would.
plan_repetitions searches the integer plans in the budget. No torch here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fp8bench.core.speedup import MIN_ROUNDS


@dataclass(frozen=True)
class RepetitionPlan:
    processes: int
    rounds: int
    """Rounds per process."""
    se_log: float
    """Standard error of the log estimate this plan gives."""
    cost_s: float
    optimal_rounds: float
    """Kalibera and Jones' continuous optimum R* (before the budget and MIN_ROUNDS are applied)."""


def plan_repetitions(var_process: float, var_round: float, cost_process_s: float, cost_round_s: float,
                     budget_s: float, *, min_processes: int = 1, max_rounds: int = 200) -> RepetitionPlan:
    """The (processes, rounds) within `budget_s` with the smallest standard error, rounds at least MIN_ROUNDS
    (the within-process interval needs them) and processes at least `min_processes`."""
    if min(var_process, var_round) < 0 or min(cost_process_s, cost_round_s) <= 0:
        raise ValueError(f"plan_repetitions: variances ({var_process}, {var_round}) must be >= 0 and costs "
                         f"({cost_process_s}, {cost_round_s}) > 0")
    optimal = math.sqrt(cost_process_s * var_round / (cost_round_s * var_process)) if var_process else math.inf
    best = None
    for rounds in range(MIN_ROUNDS, max_rounds + 1):
        processes = int(budget_s // (cost_process_s + rounds * cost_round_s))
        if processes < min_processes:
            break
        se = math.sqrt(var_process / processes + var_round / (processes * rounds))
        if best is None or se < best.se_log - 1e-15:
            best = RepetitionPlan(processes, rounds, se, processes * (cost_process_s + rounds * cost_round_s),
                                  optimal)
    if best is None:
        need = min_processes * (cost_process_s + MIN_ROUNDS * cost_round_s)
        raise ValueError(f"plan_repetitions: budget_s={budget_s} buys no plan; {min_processes} process(es) of "
                         f"{MIN_ROUNDS} rounds need {need:.1f} s")
    return best
