"""A training recipe's speedup over its BF16 twin, timed as a sandwich after its run.

A training run's own steps time one side only; its BF16 twin's run happened minutes before or after, under
other clocks. So once a recipe's run is recorded, blocks of steps of its twin (A) and of the recipe (B)
alternate in one process, A B A B A for `measure.sandwich_blocks=5` (fp8bench.workloads.train.sandwich): each
triple of neighbouring blocks gives a ratio in which a drift linear in time cancels, and the twin's first and
last blocks say how far the box drifted. The first process is the run's own; `measure.processes - 1` fresh
interpreters (`python -m fp8bench.run.train_sandwich PAYLOAD RESULT`) time the same sandwich, and the
speedup's interval covers the variance between them (fp8bench.core.intervals.training_interval).

The record keeps every timed step (`sandwich_ms` with its side, block and process), so the audit rebuilds the
speedup from the record alone; its `measurement.method` becomes `sandwich`, with the order, the mode (both
sides resident, or rebuilt per block where they do not fit together), each process's drift and the seconds
it took. The run's record is written before the sandwich starts, so a sweep stopped during it keeps the run;
a recipe whose sandwich cannot run keeps its record with the reason (`sandwich_failures`), and its speedup
stays a ratio of two runs timed apart. Runs of fp8bench's own one-process loop only: a framework's loop or a multi-process run
is not stepped block by block.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from fp8bench.backends import get_backend
from fp8bench.cases.case import Case, twin_case
from fp8bench.core.hardware import DeviceInfo
from fp8bench.core.intervals import SANDWICH_METHOD, recorded_sandwich, sandwich_order, sandwich_samples
from fp8bench.core.records import CaseRecord, Metric
from fp8bench.core.types import Status
from fp8bench.run.caserun import case_input, failure_reason, release
from fp8bench.run.replica import in_fresh_process


def sandwiched(case: Case) -> bool:
    """Whether `case`'s speedup is timed as a sandwich: a runnable FP8 training case of fp8bench's one-process
    loop on a backend whose time is its kernels' (not the emulator's), with measure.sandwich_blocks set."""
    c = case.config
    backend = get_backend(c.backend_name)
    return (case.runnable and c.workload.name == "train" and not case.is_bf16 and c.measure.sandwich_blocks > 0
            and backend.timed and backend.loop == "fp8bench" and c.workload.train.nproc == 1)


def _time_here(twin: Case, case: Case, run_id: str, device: DeviceInfo) -> dict:
    from fp8bench.workloads.train.sandwich import time_sandwich

    ms = case.config.measure
    got = time_sandwich(_untracked(case_input(twin, run_id, device)), _untracked(case_input(case, run_id, device)),
                        sandwich_order(ms.sandwich_blocks), ms.sandwich_steps, ms.warmup)
    return {"mode": got.mode, "blocks": got.blocks}


def _untracked(case_input):
    return dataclasses.replace(case_input, work_dir=None)  # a sandwich keeps no checkpoint


PENDING = "the sandwich after the run did not finish"
"""What the record written before its sandwich says: a sweep stopped during the sandwich keeps the run."""


def with_sandwich(rec: CaseRecord, case: Case, run_id: str, device: DeviceInfo,
                  keep: Callable[[CaseRecord], None] | None = None) -> CaseRecord:
    """`rec` (a recorded training run) with its speedup over its BF16 twin from a sandwich in
    `measure.processes` processes; `rec` itself where the case is not sandwiched or its run did not finish.
    `keep` writes the run's record before the sandwich starts (the record returned replaces it), so a sweep
    stopped during the sandwich keeps the run; a sandwich that fails leaves the record as it was, with why."""
    if rec.status != Status.OK or not sandwiched(case):
        return rec
    if keep is not None:
        keep(dataclasses.replace(rec, measurement={**rec.measurement, "sandwich_failures": [PENDING]}))
    started = time.time()
    try:
        processes, modes, failures, twin_id = _time_sandwich(case, run_id, device)
        out = sandwiched_record(rec, processes, modes, failures, case.config.measure, twin_id)
    except Exception as exc:  # the run is recorded: keep it, with why its speedup has no sandwich
        return dataclasses.replace(rec, measurement={**rec.measurement, "sandwich_failures": [failure_reason(exc)]})
    if "sandwich" in out.measurement:
        out.measurement["sandwich"]["seconds"] = round(time.time() - started, 1)
    return out


def _time_sandwich(case: Case, run_id: str, device: DeviceInfo) -> tuple[list, list[str], list[str], str]:
    """Each process's blocks, their modes, the failures (a process that did not finish), the twin's id."""
    twin = twin_case(case)
    if twin is None:
        return [], [], ["its BF16 twin has no shape matching the recipe's"], ""
    processes, modes, failures = [], [], []
    try:
        got = _time_here(twin, case, run_id, device)
        processes.append(got["blocks"])
        modes.append(got["mode"])
    except Exception as exc:
        failures.append(failure_reason(exc))
    finally:
        release(device)
    for _ in range(case.config.measure.processes - 1 if processes else 0):
        got = in_fresh_process("fp8bench.run.train_sandwich",
                               {"twin": twin, "case": case, "run_id": run_id, "device": device.kind})
        if isinstance(got, str):
            failures.append(got)
        else:
            processes.append([(side, steps) for side, steps in got["blocks"]])
            modes.append(got["mode"])
    return processes, modes, failures, twin.case_id


def sandwiched_record(rec: CaseRecord, processes: list, modes: list[str], failures: list[str], measure,
                      twin_id: str) -> CaseRecord:
    """`rec` with the speedup its sandwich gives: each process's blocks [(side, step times)], their modes,
    the processes that failed, and the timer settings (`measure`) they ran with."""
    samples = sandwich_samples(processes)
    estimate = recorded_sandwich(samples) if processes else None
    if estimate is None:
        why = failures or ["its blocks give no interval"]
        return dataclasses.replace(rec, measurement={**rec.measurement, "sandwich_failures": why})
    interval, drifts = estimate
    metrics = [m for m in rec.metrics if not m.name.startswith("speedup_vs_bf16") and m.name != "twin_drift"]
    metrics += [Metric.of(k, v) for k, v in interval.metrics("speedup_vs_bf16").items()]
    metrics.append(Metric.of("twin_drift", max(drifts, key=abs)))
    measurement = {**rec.measurement, "method": SANDWICH_METHOD, "twin": twin_id,
                   "processes": len(processes), "interval": interval.to_measurement(),
                   "sandwich": {"orders": ["".join(side for side, _ in blocks) for blocks in processes],
                                "steps": measure.sandwich_steps,
                                "warmup": measure.warmup, "modes": modes, "drift": [round(d, 6) for d in drifts]}}
    if failures:
        measurement["sandwich_failures"] = failures
    return dataclasses.replace(rec, metrics=metrics, samples={**rec.samples, **samples}, measurement=measurement)


def main(argv: list[str]) -> int:
    import pickle

    from fp8bench.core.hardware import detect_device

    payload = pickle.loads(Path(argv[0]).read_bytes())
    device = detect_device() if payload["device"] == "cuda" else DeviceInfo("cpu", "cpu", None, None)
    got = _time_here(payload["twin"], payload["case"], payload["run_id"], device)
    Path(argv[1]).write_text(json.dumps(got))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
