"""How long planned cases will take, from how long the same kind of case took before (`fp8bench plan`).

A planned case is matched with the stored cases of its workload, model, format, scaling and backend that ran
(ok or diverged) on the device named (else of its workload, model and backend; else of its workload and model),
and takes their median duration per timing process (times `measure.processes` planned); a training case scales that duration by its steps over theirs (a run's time
is its steps', plus validation and start-up, which this folds in), its steps including those of the sandwich
that times a recipe against its BF16 twin after its run. Cases with no such history have no
estimate, and the total says how many were left out.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class Estimate:
    seconds: dict[str, float]
    """case id → expected seconds, for the cases with a history."""
    missing: int
    """Planned runnable cases with no history to go by."""

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def expected_seconds(con, cases: list, device_name: str) -> Estimate:
    """`cases`: planned cases (fp8bench.cases.Case); `device_name`: the device whose history counts (a
    substring of the stored device name, e.g. 'H200')."""
    rows = con.execute("""
        SELECT c.workload, c.model, c.format, c.scaling, c.backend, c.shape,
               c.duration_s / CASE WHEN c.workload = 'train' THEN 1  -- one run; its sandwich is priced apart
                                   ELSE coalesce(try_cast(json_extract_string(c.measurement, '$.processes') AS DOUBLE), 1) END
        FROM cases c JOIN runs r USING (run_id)
        WHERE c.status IN ('ok', 'diverged') AND c.duration_s > 0 AND r.device_name LIKE ?""",
                       [f"%{device_name}%"]).fetchall()
    history: dict[tuple, list[tuple[dict, float]]] = {}
    for workload, model, fmt, scaling, backend, shape, seconds in rows:
        for key in ((workload, model, fmt, scaling, backend), (workload, model, backend), (workload, model)):
            history.setdefault(key, []).append((json.loads(shape or "{}"), seconds))
    out, missing = {}, 0
    for case in cases:
        if not case.runnable:
            continue
        c = case.config
        keys = ((c.workload.name, c.model.name, c.format.name, c.scaling.name, c.backend_name),
                (c.workload.name, c.model.name, c.backend_name), (c.workload.name, c.model.name))
        past = next((history[k] for k in keys if k in history), None)
        guess = None if past is None else _seconds(case, past)
        if guess is not None and c.workload.name != "train":  # every process builds and times the unit again
            guess *= c.measure.processes
        if guess is None:
            missing += 1
        else:
            out[case.case_id] = guess
    return Estimate(out, missing)


def _seconds(case, past: list[tuple[dict, float]]) -> float | None:
    if case.config.workload.name != "train":
        return statistics.median(s for _, s in past)
    per_step = [s / shape["steps"] for shape, s in past if shape.get("steps")]
    if not per_step:
        return None
    step = statistics.median(per_step)
    return step * (case.shape["steps"] + _sandwich_steps(case))


def _sandwich_steps(case) -> int:
    """The steps a recipe's sandwich adds after its run (fp8bench.run.train_sandwich), in every process: its
    blocks and each side's warm-up. Priced at the run's own time per step, which folds in start-up, so the
    sandwich's two builds are paid for about as often as a run of that many steps would pay its one."""
    from fp8bench.run.train_sandwich import sandwiched

    ms = case.config.measure
    if not sandwiched(case):
        return 0
    return ms.processes * (ms.sandwich_blocks * ms.sandwich_steps + 2 * ms.warmup)
