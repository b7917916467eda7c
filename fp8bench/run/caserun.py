"""One case run on its own, and the record of any case's outcome (ok, skipped, failed, diverged)."""

from __future__ import annotations

import gc
import time
import traceback
from pathlib import Path

import torch

from fp8bench.backends import get_backend
from fp8bench.config.schema import Config
from fp8bench.core.hardware import DeviceInfo
from fp8bench.core.records import MEASUREMENT_VERSION, NOT_TIMED, CaseRecord
from fp8bench.core.types import Status
from fp8bench.run.plan import Case
from fp8bench.run.scheduler import slurm_context
from fp8bench.workloads import get_workload
from fp8bench.workloads.common import CaseInput, Diverged


def run_dir_for(config: Config, run_id: str) -> Path:
    return Path(config.results_dir) / "runs" / run_id


def measurement_of(case: Case, method: str, **extra) -> dict:
    """The record's `measurement`: the version, how the case was timed and the timer's settings (whether the
    timed work replayed graphs is what ran: the record's `ran`)."""
    if method == "alone" and not get_backend(case.config.backend_name).timed:
        method = NOT_TIMED  # the emulator: its time is what emulation costs, run once
    timer = {k: v for k, v in vars(case.config.measure).items() if k != "cuda_graph"}
    return {"version": MEASUREMENT_VERSION, "method": method, **timer, **extra}


def what_ran(case: Case, out, device: DeviceInfo | None) -> dict:
    """The record's `ran`: the device, whether the timed work replayed CUDA graphs and whether it was compiled,
    as the workload and backend report them, and the kernels a backend chose; {} for a case that never ran."""
    if out is None:
        return {"device": device.kind} if device is not None else {}
    return {"device": device.kind if device is not None else "", "graphs": bool(out.graphs),
            "compiled": bool(out.compiled), **out.ran}


def check_ran(case: Case, out) -> None:
    """A case whose backend did not do what its identity asks (graphs, compilation) is not that case: raise,
    so it is recorded `failed` with the reason, never `ok` under a request that did not run."""
    asked = {"graphs": bool(getattr(case.recipe.knobs, "cuda_graph", False)) or
             (case.config.measure.cuda_graph and case.config.workload.name == "gemm"),
             "compiled": bool(getattr(case.recipe.knobs, "compile", False))}
    did = {"graphs": bool(out.graphs), "compiled": bool(out.compiled)}
    wrong = [f"{k}: asked {asked[k]}, ran {did[k]}" for k in asked if asked[k] != did[k]]
    if wrong:
        raise RuntimeError(f"{case.config.backend_name} did not run what the case asks ({'; '.join(wrong)})")


def case_record(case: Case, run_id: str, status: Status, reason: str = "", out=None, started: float = 0.0,
                measurement: dict | None = None, device: DeviceInfo | None = None) -> CaseRecord:
    c = case.config
    return CaseRecord(run_id=run_id, case_id=case.case_id, label=case.label, twin_id=case.twin_id,
                      workload=c.workload.name, model=c.model.name, format=c.format.name, scaling=c.scaling.name,
                      backend=c.backend_name, shape_name=case.shape_name, shape=case.shape, params=case.params,
                      ran=what_ran(case, out, device if status is not Status.SKIPPED else None),
                      scheduler=slurm_context(),
                      status=status.value,
                      reason=reason, metrics=out.metrics if out else [], samples=out.samples if out else {},
                      started_at=started, duration_s=time.time() - started if started else 0.0,
                      measurement=measurement or {})


def failure_reason(exc: BaseException) -> str:
    """`Type: message (at file:line)`, short enough for a table cell."""
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" (at {Path(where.filename).name}:{where.lineno})" if where else ""
    return f"{type(exc).__name__}: {str(exc)[:400]}{at}"


def check_injected_failure(case: Case) -> None:
    """The test-only `fail_on` knob: a case whose id contains it raises at run time."""
    if case.config.fail_on and case.config.fail_on in case.case_id:
        raise RuntimeError(f"injected failure (fail_on={case.config.fail_on!r})")


def case_input(case: Case, run_id: str, device: DeviceInfo, others_bytes: int = 0) -> CaseInput:
    torch.manual_seed(case.config.seed)
    return CaseInput(case.config, case.shape_name, case.shape, case.recipe, get_backend(case.config.backend_name),
                     device.torch_device, work_dir=run_dir_for(case.config, run_id) / "work" / case.case_id,
                     others_bytes=others_bytes)


def run_case(case: Case, run_id: str, device: DeviceInfo) -> CaseRecord:
    """Run one case alone (its own timings, no twin beside it)."""
    if not case.runnable:
        return case_record(case, run_id, Status.SKIPPED, case.reason)
    started = time.time()
    resident = torch.cuda.memory_allocated() if device.is_cuda else 0
    measurement = measurement_of(case, "alone")
    try:
        check_injected_failure(case)
        out = get_workload(case.config.workload.name).run(case_input(case, run_id, device))
        check_ran(case, out)
        return case_record(case, run_id, Status.OK, "", out, started, measurement, device)
    except Diverged as exc:  # a finding about the recipe, with the curve up to the bad step
        return case_record(case, run_id, Status.DIVERGED, str(exc), exc.output, started, measurement, device)
    except Exception as exc:  # one case's failure never takes the sweep down
        return case_record(case, run_id, Status.FAILED, failure_reason(exc), None, started, measurement, device)
    finally:
        release(device, resident)


def release(device: DeviceInfo, resident: int = 0) -> None:
    """The next case starts from an empty caching allocator, ok or not. What only reference cycles still hold
    (a Lightning Trainer and its module) would count in the next case's peak (seen on the H200: TE FP8 after
    Lightning and Accelerate cases peaked 0.34 GB higher), so collect them, but only when the case left
    memory behind: a full collection costs 0.1-0.25 s with these libraries loaded."""
    if device.is_cuda:
        if torch.cuda.memory_allocated() > resident:
            gc.collect()
        if torch.cuda.memory_allocated() > resident and hasattr(torch._C, "_cuda_clearCublasWorkspaces"):
            # cuBLAS keeps a workspace per stream it ran on, for the process's life: a CUDA-graph capture warms
            # up on streams of its own, so each graphed training case left ~64 MiB that the next one's peak
            # counted (train-bw10's replayed BF16 seeds peaked 2.43, 2.67, 2.86, 2.92, 2.98 GiB in run order)
            torch._C._cuda_clearCublasWorkspaces()
        torch.cuda.empty_cache()
