"""Run planned cases: one record per case, written and fsync'ed as soon as it exists.

A case that raises is recorded `failed` with its error and the sweep goes on; `resume=<run_id>` skips the
cases a run already finished.
"""

from __future__ import annotations

import gc
import secrets
import time
import traceback
from collections import Counter
from dataclasses import asdict
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from fp8bench.backends import get_backend
from fp8bench.config.schema import Config, ConfigError
from fp8bench.hardware import DeviceInfo, environment, git_state
from fp8bench.plan import Case
from fp8bench.records import CaseRecord, ShardWriter, done_case_ids
from fp8bench.types import Status
from fp8bench.workloads import get_workload
from fp8bench.workloads.common import CaseInput, Diverged


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(2)


def run_dir_for(config: Config, run_id: str) -> Path:
    return Path(config.results_dir) / "runs" / run_id


def check_resume(config: Config) -> None:
    if config.resume and not run_dir_for(config, config.resume).is_dir():
        runs = sorted(p.name for p in (Path(config.results_dir) / "runs").glob("*") if p.is_dir())
        raise ConfigError(f"resume={config.resume!r} is not a run in {config.results_dir}/runs; choose one of {runs[-10:]}")


def manifest_for(config: Config, run_id: str, overrides: list[str], n_cases: int) -> dict:
    commit, dirty = git_state()
    env = environment()
    return {"run_id": run_id, "started_at": time.time(), "git_commit": commit, "git_dirty": dirty,
            "device_name": env["device_name"], "env": env,
            "config": {"overrides": overrides, "sweep_name": config.sweep_name, "base": asdict(config)},
            "n_cases": n_cases}


def _record(case: Case, run_id: str, status: Status, reason: str = "", out=None, started: float = 0.0) -> CaseRecord:
    c = case.config
    return CaseRecord(run_id=run_id, case_id=case.case_id, workload=c.workload.name, model=c.model.name,
                      format=c.format.name, scaling=c.scaling.name, backend=c.backend.name,
                      shape_name=case.shape_name, shape=case.shape, params=case.params, status=status.value,
                      reason=reason, metrics=out.metrics if out else [], samples=out.samples if out else {},
                      started_at=started, duration_s=time.time() - started if started else 0.0)


def run_case(case: Case, run_id: str, device: DeviceInfo) -> CaseRecord:
    if not case.runnable:
        return _record(case, run_id, Status.SKIPPED, case.reason)
    started = time.time()
    resident = torch.cuda.memory_allocated() if device.is_cuda else 0
    try:
        if case.config.fail_on and case.config.fail_on in case.case_id:
            raise RuntimeError(f"injected failure (fail_on={case.config.fail_on!r})")
        torch.manual_seed(case.config.seed)
        inp = CaseInput(case.config, case.shape_name, case.shape, case.recipe, get_backend(case.config.backend.name),
                        device.torch_device, work_dir=run_dir_for(case.config, run_id) / "work" / case.case_id)
        out = get_workload(case.config.workload.name).run(inp)
        return _record(case, run_id, Status.OK, "", out, started)
    except Diverged as exc:  # a finding about the recipe, with the curve up to the bad step
        return _record(case, run_id, Status.DIVERGED, str(exc), exc.output, started)
    except Exception as exc:  # one case's failure never takes the sweep down
        where = traceback.extract_tb(exc.__traceback__)[-1]
        reason = f"{type(exc).__name__}: {str(exc)[:400]} (at {Path(where.filename).name}:{where.lineno})"
        return _record(case, run_id, Status.FAILED, reason, None, started)
    finally:
        if device.is_cuda:
            # the next case starts from an empty caching allocator, ok or not. What only reference cycles still
            # hold (a Lightning Trainer and its module) would count in the next case's peak (seen on the H200:
            # TE FP8 after Lightning and Accelerate cases peaked 0.34 GB higher), so collect them, but only
            # when the case left memory behind: a full collection costs 0.1-0.25 s with these libraries loaded
            if torch.cuda.memory_allocated() > resident:
                gc.collect()
            torch.cuda.empty_cache()


def execute(cases: list[Case], run_dir: Path, run_id: str, device: DeviceInfo, *, job: str = "",
            resume: bool = False, console: Console | None = None, progress: bool = True) -> list[CaseRecord]:
    """Run cases in order, appending each record to a new shard of `run_dir`."""
    console = console or Console(stderr=True)
    done = done_case_ids(run_dir) if resume else set()
    todo = [c for c in cases if c.case_id not in done]
    if done:
        console.print(f"resume {run_id}: {len(cases) - len(todo)} cases already recorded, {len(todo)} to run")
    records = []
    with ShardWriter(run_dir, job) as shard, Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[case]}"), console=console, disable=not progress, transient=False) as bar:
        task = bar.add_task(f"run {run_id}", total=len(todo), case="")
        for case in todo:
            bar.update(task, case=case.case_id)
            rec = run_case(case, run_id, device)
            shard.write(rec)
            records.append(rec)
            bar.advance(task)
    return records


def summary_table(records: list[CaseRecord]) -> Table:
    """Per workload × backend: how many ok/skipped/failed, and the median time of the ok ones."""
    table = Table(title="fp8bench run summary")
    statuses = ("ok", "skipped", "failed") + (("diverged",) if any(r.status == "diverged" for r in records) else ())
    for col in ("workload", "backend", *statuses):
        table.add_column(col, justify="right" if col in statuses else "left")
    counts: Counter = Counter((r.workload, r.backend, r.status) for r in records)
    for wl, be in sorted({(r.workload, r.backend) for r in records}):
        table.add_row(wl, be, *(str(counts[(wl, be, s)]) for s in statuses))
    return table
