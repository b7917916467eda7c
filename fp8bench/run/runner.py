"""Run planned cases: one record per case, written and fsync'ed as soon as it exists.

Cases of gemm, linear and layer shapes run as groups timed beside their BF16 twin (fp8bench.run.groups); the
rest run one at a time (fp8bench.run.caserun). A case that raises is recorded `failed` with its error and the
sweep goes on; `resume=<run_id>` skips the cases a run already finished.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from fp8bench.cases import twin_config
from fp8bench.config.schema import Config, ConfigError
from fp8bench.core.hardware import DeviceInfo, environment, git_state
from fp8bench.core.records import MEASUREMENT_VERSION, CaseRecord, ShardWriter, done_case_ids, read_manifest
from fp8bench.core.types import Status
from fp8bench.run.caserun import case_record, failure_reason, run_case, run_dir_for
from fp8bench.run.groups import is_group, run_group, units
from fp8bench.run.plan import Case
from fp8bench.run.train_sandwich import with_sandwich

__all__ = ["run_case", "run_cases", "run_dir_for", "execute"]

PLAIN_PROGRESS_EVERY_S = 15.0
"""Without a terminal (a batch job, CI, a GPU box's log), a progress line at most this often."""


def new_run_id() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()) + "-" + secrets.token_hex(2)


RESUME_FREE_KEYS = ("run_id", "resume", "results_dir", "store.", "hydra/launcher", "hydra.launcher.")
"""Overrides a resumed run may change: where it lives, how it is stored and where and how long its jobs run,
not what it measures."""


def _measuring(overrides: list[str]) -> list[str]:
    return sorted(o for o in overrides if o not in ("-m", "--multirun") and not o.startswith(RESUME_FREE_KEYS))


def check_resume(config: Config, overrides: list[str] | None = None) -> None:
    """resume= names a run of this results folder, asked for with the same overrides (a resumed run that
    measured something else would mix two studies under one id)."""
    if not config.resume:
        return
    run_dir = run_dir_for(config, config.resume)
    if not run_dir.is_dir():
        runs = sorted(p.name for p in (Path(config.results_dir) / "runs").glob("*") if p.is_dir())
        raise ConfigError(f"resume={config.resume!r} is not a run in {config.results_dir}/runs; choose one of {runs[-10:]}")
    recorded = ((read_manifest(run_dir) or {}).get("config") or {}).get("overrides")
    if overrides is not None and recorded is not None and _measuring(recorded) != _measuring(overrides):
        raise ConfigError(f"resume={config.resume!r} was a run of {' '.join(_measuring(recorded)) or 'the defaults'}; "
                          f"this command asks for {' '.join(_measuring(overrides)) or 'the defaults'}; resume it with "
                          f"the same overrides, or start a new run")
    from fp8bench.run.slurm_jobs import still_queued

    if left := still_queued(run_dir):
        arrays = " ".join(sorted({j.split("_")[0] for j in left}))
        raise ConfigError(f"resume={config.resume!r}: Slurm jobs {' '.join(left)} of this run's earlier launch are "
                          f"still queued or running, and would measure their cases beside the resume; `scancel "
                          f"{arrays}` or wait for them to end, then resume")


def manifest_for(config: Config, run_id: str, overrides: list[str], n_cases: int) -> dict:
    commit, dirty = git_state()
    env = environment()
    return {"run_id": run_id, "started_at": time.time(), "git_commit": commit, "git_dirty": dirty,
            "device_name": env["device_name"], "env": env,
            "measurement": {"version": MEASUREMENT_VERSION, **asdict(config.measure)},
            "config": {"overrides": overrides, "sweep_name": config.sweep_name, "base": asdict(config)},
            "n_cases": n_cases}


PLAN = "plan.json"
"""A run's twin groups (each the points of one job: `fp8bench run -m` launches one job per group)."""


def write_plan(run_dir: Path, groups: list[list[Case]]) -> None:
    """Each group's points (the configs its cases come from, the twins the planner added included), for the
    jobs that run them in other processes; written atomically."""
    data = {"groups": []}
    for group in groups:
        points: list[dict] = []
        for case in group:
            point = asdict(twin_config(case.config) if case.added else case.config)
            if point not in points:
                points.append(point)
        data["groups"].append(points)
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{PLAN}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(data, default=str))
    os.replace(tmp, run_dir / PLAN)


def group_points(run_dir: Path, index: int) -> list[Config]:
    """The points of group `index` of a run's plan."""
    from fp8bench.config.schema import config_from_values

    groups = json.loads((run_dir / PLAN).read_text())["groups"]
    if not 0 <= index < len(groups):
        raise ConfigError(f"job_group={index} is not a group of run {run_dir.name} (it has {len(groups)})")
    return [config_from_values(p) for p in groups[index]]


def run_cases(cases: list[Case], run_id: str, device: DeviceInfo, emit: Callable[[CaseRecord], None],
              keep: Callable[[CaseRecord], None] | None = None) -> None:
    """Run `cases` in order, groups side by side with their twin, calling `emit` with each record. A group
    that breaks outside any one case's work (the GPU itself failing, say) records its unrecorded cases as
    failed with that error, and the sweep goes on. `keep` writes a training run's record before its sandwich
    (fp8bench.run.train_sandwich), which the emitted one replaces."""
    for unit in units(cases):
        if not is_group(unit):
            for case in unit:
                emit(with_sandwich(run_case(case, run_id, device), case, run_id, device, keep))
            continue
        recorded: set[str] = set()

        def emit_once(rec: CaseRecord, recorded: set[str] = recorded) -> None:
            recorded.add(rec.case_id)
            emit(rec)
        try:
            run_group(unit, run_id, device, emit_once)
        except Exception as exc:
            reason = failure_reason(exc)
            for case in unit:
                if case.case_id not in recorded:
                    emit(case_record(case, run_id, Status.FAILED, f"the group failed: {reason}"))


class _PlainProgress:
    """Progress as plain lines (done/total, statuses, elapsed, ETA) where a live bar would draw nothing."""

    def __init__(self, console: Console, run_id: str, cases: list[Case]) -> None:
        self.console, self.run_id, self.total = console, run_id, len(cases)
        self.runnable_left = sum(c.runnable for c in cases)
        self.runnable_done = 0
        self.counts: Counter = Counter()
        self.start = self.last = time.monotonic()

    def advance(self, rec: CaseRecord) -> None:
        self.counts[rec.status] += 1
        if rec.status != "skipped":
            self.runnable_done += 1
            self.runnable_left -= 1
        now = time.monotonic()
        if now - self.last >= PLAIN_PROGRESS_EVERY_S or sum(self.counts.values()) == self.total:
            self.last = now
            self.console.print(self.line(now), highlight=False, markup=False, soft_wrap=True)

    def line(self, now: float) -> str:
        elapsed = now - self.start
        eta = (elapsed / self.runnable_done * self.runnable_left) if self.runnable_done else None
        statuses = ", ".join(f"{s} {n}" for s, n in sorted(self.counts.items()))
        return (f"run {self.run_id}: {sum(self.counts.values())}/{self.total} cases ({statuses}), "
                f"{format_duration(elapsed)} elapsed" + (f", ETA {format_duration(eta)}" if eta is not None else ""))


def format_duration(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


def execute(cases: list[Case], run_dir: Path, run_id: str, device: DeviceInfo, *, job: str = "",
            resume: bool = False, console: Console | None = None, progress: bool = True) -> list[CaseRecord]:
    """Run cases in order, appending each record to a new shard of `run_dir`. Progress: a live bar on a
    terminal, plain lines otherwise (or none with progress=False)."""
    console = console or Console(stderr=True)
    done = done_case_ids(run_dir) if resume else set()
    todo = [c for c in cases if c.case_id not in done]
    if done:
        console.print(f"resume {run_id}: {len(cases) - len(todo)} cases already recorded, {len(todo)} to run")
    records: list[CaseRecord] = []
    live = progress and console.is_terminal
    plain = _PlainProgress(console, run_id, todo) if progress and not live else None
    with ShardWriter(run_dir, job) as shard, Progress(
            TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[case]}"), console=console, disable=not live, transient=False) as bar:
        task = bar.add_task(f"run {run_id}", total=len(todo), case="")

        def emit(rec: CaseRecord) -> None:
            shard.write(rec)
            records.append(rec)
            bar.update(task, advance=1, case=rec.case_id)
            if plain:
                plain.advance(rec)

        run_cases(todo, run_id, device, emit, keep=shard.write)
    return records
