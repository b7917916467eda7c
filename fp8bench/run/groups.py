"""Cases timed side by side with their BF16 twin.

Every FP8 case of a gemm, linear, mlp or layer shape is built beside its BF16 twin (the same backend, knobs,
shape and seeded inputs, in BF16) and timed with it, interleaved in rounds (measure.time_interleaved), so its
`speedup_vs_bf16` is a ratio of times taken under the same clocks, with a 95% interval (fp8bench.core.speedup).
Timed minutes apart, as separate cases, the two sides would carry the GPU's clock drift into the ratio.

A unit is the cases that share one twin (`Case.twin_id`). The twin is always a recorded case of the run (the
planner adds it where the request did not name it), so every speedup divides by a row anyone can read. The
recipes are built in batches as GPU memory allows, and each batch is timed with the twin. A case that fails
to build or finish is recorded `failed` and the unit goes on; a batch whose timing fails runs its cases alone
(fp8bench.run.caserun.run_case), without a speedup.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import torch

from fp8bench.backends import get_backend
from fp8bench.core.bound import Bound, combine, label_blocks
from fp8bench.core.hardware import DeviceInfo
from fp8bench.core.intervals import recorded_speedup
from fp8bench.core.measure import Timing, time_interleaved
from fp8bench.core.records import CaseRecord, Metric
from fp8bench.core.types import Format, Status
from fp8bench.run.caserun import (
    case_input,
    case_record,
    check_injected_failure,
    check_ran,
    failure_reason,
    measurement_of,
    release,
    run_case,
)
from fp8bench.run.plan import INTERLEAVED, Case, needs_twin
from fp8bench.run.replica import time_elsewhere
from fp8bench.workloads import get_workload
from fp8bench.workloads.common import Prepared, timing_samples

MAX_BATCH = {"gemm": 8, "linear": 8, "mlp": 4, "layer": 4}
"""Recipes built and timed together at most; fewer when GPU memory is short (RESERVE_BYTES)."""
RESERVE_BYTES = 4 << 30
"""Another recipe joins a batch only while the GPU keeps this much free beyond twice the largest recipe."""

Emit = Callable[[CaseRecord], None]


def interleavable(case: Case) -> bool:
    return case.runnable and needs_twin(case) or (case.runnable and case.recipe.format is Format.BF16
                                                  and case.config.workload.name in INTERLEAVED
                                                  and get_backend(case.config.backend_name).timed)


def units(cases: list[Case]) -> list[list[Case]]:
    """The cases in execution order, as units to run: a group (its BF16 case, if any, first) wherever a shape
    has a recipe to time beside a twin, else one case at a time."""
    out: list[list[Case]] = []
    groups: dict[tuple, list[Case]] = {}
    for case in cases:
        if not interleavable(case):
            out.append([case])
            continue
        key = case.twin_id
        if key not in groups:
            groups[key] = []
            out.append(groups[key])
        groups[key].append(case)
    return [sorted(u, key=lambda c: c.config.format.name != "bf16") if len(u) > 1 else u for u in out]


def is_group(unit: list[Case]) -> bool:
    return any(interleavable(c) and c.config.format.name != "bf16" for c in unit)


_PRIMED: set[tuple[str, str]] = set()


def _prime(twin: Case, run_id: str, device: DeviceInfo) -> None:
    """Once per process and (backend, workload): build the twin, step it, drop it. Libraries allocate global
    state on first use (cuBLAS and TE workspaces) that stays for the process; made before any case is built,
    it counts for every case alike instead of for the group's first only."""
    key = (twin.config.backend_name, twin.config.workload.name)
    if not device.is_cuda or key in _PRIMED:
        return
    _PRIMED.add(key)
    prepared, _ = _try_prepare(twin, run_id, device, 0)  # a failure: the twin's own build reports it
    if prepared is not None:
        for fn in prepared.timed.values():
            try:
                fn()
            except Exception:
                break
    del prepared
    release(device)


def _allocated(device: DeviceInfo) -> int:
    return int(torch.cuda.memory_allocated()) if device.is_cuda else 0


def _room_for_another(device: DeviceInfo, largest: int) -> bool:
    if not device.is_cuda:
        return True
    free, _ = torch.cuda.mem_get_info()
    return free + torch.cuda.memory_reserved() - torch.cuda.memory_allocated() > 2 * largest + RESERVE_BYTES


def run_group(unit: list[Case], run_id: str, device: DeviceInfo, emit: Emit) -> None:
    """Run a group's cases (see the module docstring), emitting each record as soon as it exists. Every
    fallback to running cases alone starts after the group's own memory is released: an exception's
    traceback would otherwise keep the twin or the batch alive, and the cases run alone would count it."""
    recorded_twin = next((c for c in unit if c.config.format.name == "bf16"), None)
    recipes = [c for c in unit if c is not recorded_twin]
    for case in [c for c in recipes if not interleavable(c)]:
        emit(run_case(case, run_id, device))
    recipes = [c for c in recipes if interleavable(c)]
    if recorded_twin is None or not recipes:  # no runnable twin to time beside: each case alone, no speedup
        for case in ([recorded_twin] if recorded_twin else []) + recipes:
            emit(run_case(case, run_id, device))
        return
    twin = recorded_twin
    _prime(twin, run_id, device)
    base = _allocated(device)
    started = time.time()
    twin_prepared, twin_error = _try_prepare(twin, run_id, device, 0)
    if twin_prepared is None:  # without a twin there is nothing to time beside: every recipe runs alone
        release(device)
        emit(case_record(twin, run_id, Status.FAILED, twin_error, None, started, measurement_of(twin, "alone"), device))
        for case in recipes:
            emit(run_case(case, run_id, device))
        return
    twin_resident = _allocated(device)
    pending_twin = recorded_twin
    alone: list[Case] = []
    while recipes and not alone:
        batch = _build_batch(twin, recipes, base, run_id, device, emit)
        if not batch:
            break
        timed = _time_batch(twin, twin_prepared, pending_twin, started, batch, run_id, device, emit)
        if timed:
            pending_twin = None
        else:  # one op broke the rounds: these cases, and the rest, run alone, as before side-by-side timing
            alone = [case for case, _, _ in batch] + recipes
        del batch
        release(device, twin_resident)
    del twin_prepared
    release(device)
    for case in alone:
        emit(run_case(case, run_id, device))
    if pending_twin is not None:  # no recipe was timed beside it: the BF16 case still gets its own timing
        emit(run_case(pending_twin, run_id, device))


def _try_prepare(case: Case, run_id: str, device: DeviceInfo, others_bytes: int) -> tuple[Prepared | None, str]:
    """(prepared, '') or (None, the failure's reason): the exception, and the half-built case its traceback
    holds, are gone when this returns."""
    try:
        check_injected_failure(case)
        return _prepare(case, run_id, device, others_bytes), ""
    except Exception as exc:
        return None, failure_reason(exc)


def _build_batch(twin: Case, recipes: list[Case], base: int, run_id: str, device: DeviceInfo,
                 emit: Emit) -> list[tuple[Case, Prepared, float]]:
    """Build recipes (taken from the front of `recipes`) while MAX_BATCH and GPU memory allow. A recipe that
    fails to build is recorded `failed`, unless it ran out of memory beside others: then it goes back to the
    front of `recipes` for the next batch, which starts with less resident."""
    batch: list[tuple[Case, Prepared, float]] = []
    largest = 0
    while recipes and len(batch) < MAX_BATCH[twin.config.workload.name] and (
            not batch or _room_for_another(device, largest)):
        case = recipes.pop(0)
        before, t0 = _allocated(device), time.time()
        prepared, error = _try_prepare(case, run_id, device, before - base)
        if prepared is not None:
            batch.append((case, prepared, t0))
            largest = max(largest, _allocated(device) - before)
        elif batch and "OutOfMemoryError" in error:
            recipes.insert(0, case)
            break
        else:
            emit(case_record(case, run_id, Status.FAILED, error, None, t0,
                             measurement_of(case, "interleaved", twin=twin.case_id), device))
    return batch


def _prepare(case: Case, run_id: str, device: DeviceInfo, others_bytes: int) -> Prepared:
    return get_workload(case.config.workload.name).prepare(case_input(case, run_id, device, others_bytes))


def _time_batch(twin: Case, twin_prepared: Prepared, record_twin: Case | None, twin_started: float,
                batch: list[tuple[Case, Prepared, float]], run_id: str, device: DeviceInfo, emit: Emit) -> bool:
    """Time the twin and the batch interleaved, then finish and emit each; False (nothing emitted) when the
    rounds themselves failed."""
    ms = twin.config.measure
    ops = {f"twin:{name}": fn for name, fn in twin_prepared.timed.items()}
    for i, (_, prepared, _) in enumerate(batch):
        ops.update({f"{i}:{name}": fn for name, fn in prepared.timed.items()})
    try:
        timings = time_interleaved(ops, device=device.torch_device, warmup=ms.warmup,
                                   rounds=ms.rounds, block_ms=ms.block_ms, settle_ms=ms.settle_ms,
                                   flush_l2=ms.flush_l2, cuda_graph=twin_prepared.cuda_graph,
                                   slowdown=twin.config.slowdown_for(twin.config.backend_name))
    except Exception:
        return False
    members = [twin.case_id] + [c.case_id for c, _, _ in batch]
    replicas = [time_elsewhere([twin] + [c for c, _, _ in batch], run_id, device.kind)
                for _ in range(ms.processes - 1)]
    failures = [r for r in replicas if isinstance(r, str)]
    timings = _with_replicas(timings, [r for r in replicas if isinstance(r, dict)]) if ms.processes > 1 else timings
    twin_t = {name: timings[f"twin:{name}"] for name in twin_prepared.timed}
    method = {"twin": twin.case_id, "rounds": ms.rounds, "timed_with": members,
              "processes": ms.processes - len(failures)} | ({"replica_failures": failures} if failures else {})
    if record_twin is not None:
        _finish(record_twin, twin_prepared, twin_t, None, twin_started, run_id, emit,
                measurement_of(record_twin, "interleaved", **method), device)
    for i, (case, prepared, t0) in enumerate(batch):
        own = {name: timings[f"{i}:{name}"] for name in prepared.timed}
        _finish(case, prepared, own, twin_t["time_ms"], t0, run_id, emit,
                measurement_of(case, "interleaved", **method), device)
    return True


def _speedups(twin: Timing, own: dict[str, Timing]) -> tuple[list[Metric], dict]:
    """speedup_vs_bf16 (with quantization) and _kernel (the kernel alone) with their intervals, rebuilt from the
    samples both records store (fp8bench.core.intervals.recorded_speedup: one implementation for the run, the
    audit and the tests), and the speedup's bound label: the combination of both sides' (fp8bench.core.bound).
    Returns the metrics and what the record's measurement adds."""
    out, extra = [], {}
    for name, suffix in (("time_ms", ""), ("time_ms_kernel", "_kernel")):
        if name not in own:
            continue
        est = recorded_speedup(timing_samples("time_ms", twin), timing_samples("time_ms", own[name]))
        if est is not None:
            out += [Metric.of(k, v) for k, v in est.metrics(f"speedup_vs_bf16{suffix}").items()]
            extra[f"interval{suffix}"] = est.to_measurement()
    if twin.bound is not None and own["time_ms"].bound is not None:
        label = combine(twin.bound.label, own["time_ms"].bound.label)
        extra["speedup_bound"] = label.value
        if label in (Bound.HOST, Bound.DEVICE):
            out.append(Metric.of("host_bound", float(label is Bound.HOST)))
    return out, extra


def _with_replicas(timings: dict[str, Timing], replicas: list[dict]) -> dict[str, Timing]:
    """Each op's timing with the rounds other processes timed appended (process by process), its samples and
    bound label over all of them."""
    out = {}
    for name, t in timings.items():
        rounds, procs = list(t.rounds or []), [0] * len(t.rounds or [])
        wall = list(t.bound.wall_ms) if t.bound else []
        dev = list(t.bound.device_ms) if t.bound else []
        for p, rep in enumerate(replicas, 1):
            rounds += rep[name]["rounds"]
            procs += [p] * len(rep[name]["rounds"])
            wall += rep[name]["wall"] or []
            dev += rep[name]["device"] or []
        bound = label_blocks(wall, dev) if t.bound is not None else None
        out[name] = dataclasses.replace(t, samples_ms=[x for r in rounds for x in r], rounds=rounds,
                                        process_of_round=procs, bound=bound,
                                        gpu_busy_pct=bound.busy_pct if bound else None)
    return out


def _finish(case: Case, prepared: Prepared, timings: dict, twin_timing, started: float, run_id: str,
            emit: Emit, measurement: dict, device: DeviceInfo) -> None:
    """The case's output from its timings (and, for a recipe, its speedups against `twin_timing`); emitted
    once, ok or failed, outside the try so a failing emit never records the case twice."""
    try:
        out = prepared.finish(timings)
        check_ran(case, out)
        own = timings["time_ms"].bound
        if own is not None:
            measurement = {**measurement, "bound": own.to_measurement()}
        if twin_timing is not None:
            metrics, extra = _speedups(twin_timing, timings)
            out.metrics += metrics
            measurement = {**measurement, **extra}
        elif own is not None and own.label in (Bound.HOST, Bound.DEVICE):  # the twin: its own label
            out.metrics.append(Metric.of("host_bound", float(own.label is Bound.HOST)))
        record = case_record(case, run_id, Status.OK, "", out, started, measurement, device)
    except Exception as exc:
        record = case_record(case, run_id, Status.FAILED, failure_reason(exc), None, started, measurement, device)
    emit(record)
