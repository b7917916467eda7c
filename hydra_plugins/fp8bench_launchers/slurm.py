"""Hydra launcher plugin behind `slurm` and `slurm-cpu`: hydra-submitit's Slurm launcher, plus what a sweep
needs when its jobs do not all complete.

- The launching process waits for every job of the sweep (not only up to the first that failed), then, for
  each job that ended other than COMPLETED, records the cases it did not finish `failed` with the job's id
  and its state from accounting (fp8bench.run.unfinished), and raises that job's error as before.
- Ctrl-C while it waits cancels the sweep's jobs still queued or running (`scancel`), waits for them to leave
  the queue, records their unfinished cases the same way (state CANCELLED) and lets the interrupt through.
- In a job, Slurm's time-limit warning (`--signal=USR2@signal_delay_s`) that submitit takes for the job's
  end (a time-out with no requeue left) stops the job where it is: the case in flight is left unrecorded
  rather than recorded as that recipe's failure, no further case starts, and the job waits for Slurm to end
  it at its limit (state TIMEOUT). A signal submitit answers with a requeue (a preemption, or
  `max_num_timeout` above 0) is left to submitit.

submitit pickles the launcher as each job's callable: each job gets this folder's parent on its PYTHONPATH
(`setup`), so it can import the class.
"""

from __future__ import annotations

import logging
import shlex
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
from omegaconf import OmegaConf

PLUGIN_ROOT = Path(__file__).resolve().parents[1]
POLL_S = 2.0
"""How often the launching process looks at its jobs' states."""
GONE_WAIT_S = 180.0
"""How long it waits for a failed or cancelled job's processes to end (Slurm's KillWait, 30 s by default)."""

log = logging.getLogger(__name__)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def stop_at_time_limit() -> None:
    """In a job: turn submitit's "not requeued" at the time-limit signal into TimeLimitReached, which no
    case's `except Exception` catches."""
    from submitit.core.utils import UncompletedJobError

    from fp8bench.run.unfinished import TimeLimitReached

    previous = signal.getsignal(signal.SIGUSR2)
    if not callable(previous):
        return

    def handler(signum: int, frame: Any) -> None:
        try:
            previous(signum, frame)
        except UncompletedJobError as exc:
            raise TimeLimitReached(str(exc)) from None

    signal.signal(signal.SIGUSR2, handler)


class SlurmSweepLauncher(SlurmLauncher):
    def __call__(self, *args: Any, **kwargs: Any) -> JobReturn:
        from fp8bench.run.unfinished import TimeLimitReached

        stop_at_time_limit()
        try:
            return super().__call__(*args, **kwargs)
        except TimeLimitReached as stop:
            _say(f"time limit: {stop}; the case in flight is left for resume, waiting for Slurm to end the job")
            while True:
                time.sleep(60)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        import submitit

        assert self.config is not None
        setup = [f"export PYTHONPATH={shlex.quote(str(PLUGIN_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}",
                 *(self.params.get("setup") or [])]
        init_keys = {"submitit_folder", "max_num_timeout"}
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, folder=self.params["submitit_folder"],
                                         **{f"{self._EXECUTOR}_max_num_timeout": self.params["max_num_timeout"]}
                                         if "max_num_timeout" in self.params else {})
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        executor.update_parameters(**{k if k in base else f"{self._EXECUTOR}_{k}": v
                                      for k, v in {**self.params, "setup": setup}.items() if k not in init_keys})
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        params = []
        for offset, overrides in enumerate(job_overrides):
            log.info(f"\t#{initial_job_idx + offset} : {' '.join(filter_overrides(overrides))}")
            params.append((list(overrides), "hydra.sweep.dir", initial_job_idx + offset,
                           f"job_id_for_{initial_job_idx + offset}", Singleton.get_state()))
        jobs = executor.map_array(self, *zip(*params, strict=True))
        self._remember(jobs, job_overrides)
        try:
            while not all(j.done() for j in jobs):
                time.sleep(POLL_S)
        except KeyboardInterrupt:
            self._cancel(jobs)
            self._record_unfinished(jobs, job_overrides)
            raise
        self._record_unfinished(jobs, job_overrides)
        return [j.results()[0] for j in jobs]

    def _remember(self, jobs: list, job_overrides: Sequence[Sequence[str]]) -> None:
        """Each run folder of the sweep lists the jobs submitted into it: a resume after a launcher killed
        outside Ctrl-C finds those still queued."""
        from fp8bench.run import slurm_jobs

        assert self.hydra_context is not None and self.config is not None
        by_run: dict[Path, list[str]] = {}
        where: dict[tuple, Path] = {}  # composed once per distinct run_id= / results_dir= of the jobs
        for job, overrides in zip(jobs, job_overrides, strict=True):
            key = tuple(o for o in overrides if o.startswith(("run_id=", "results_dir=")))
            if key not in where:
                cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
                where[key] = Path(str(cfg.results_dir)) / "runs" / str(cfg.run_id)
            by_run.setdefault(where[key], []).append(job.job_id)
        for run_dir, ids in by_run.items():
            slurm_jobs.remember(run_dir, ids)

    def _cancel(self, jobs: list) -> None:
        from fp8bench.run import slurm_jobs

        left = sorted(slurm_jobs.queued([j.job_id for j in jobs]))
        if left:
            _say(f"interrupted: cancelling the sweep's Slurm jobs {' '.join(left)}")
            slurm_jobs.cancel(left)

    def _record_unfinished(self, jobs: list, job_overrides: Sequence[Sequence[str]]) -> None:
        """For each job that ended other than COMPLETED, record the cases it did not finish with its state."""
        from fp8bench.run import slurm_jobs
        from fp8bench.run.unfinished import record_unfinished

        assert self.hydra_context is not None and self.config is not None
        ids = [j.job_id for j in jobs]
        states = slurm_jobs.final_states(ids)
        ended = [i for i in ids if states[i] != "COMPLETED"]
        if not ended:
            return
        still = slurm_jobs.wait_gone(ended, GONE_WAIT_S)
        deadline = time.monotonic() + 30
        while True:  # accounting hears of a job's end shortly after the queue
            states = slurm_jobs.final_states(ended)
            if time.monotonic() > deadline or all(states[i] and states[i] not in slurm_jobs.RUNNING_STATES
                                                  for i in ended if i not in still):
                break
            time.sleep(1)
        loader = self.hydra_context.config_loader
        for job_id, overrides in zip(ids, job_overrides, strict=True):
            state = states.get(job_id, "COMPLETED")
            if state == "COMPLETED":
                continue
            if job_id in still or not state or state in slurm_jobs.RUNNING_STATES:
                _say(f"Slurm job {job_id} has not ended ({state or 'no state in accounting'}): its unfinished "
                     "cases are not recorded")
                continue
            cfg = loader.load_sweep_config(self.config, list(overrides))
            run_dir = Path(str(cfg.results_dir)) / "runs" / str(cfg.run_id)
            recorded = record_unfinished(run_dir, str(cfg.run_id), int(cfg.job_group), job_id, state)
            _say(f"Slurm job {job_id} ended {state}: {len(recorded)} case(s) it did not finish recorded failed "
                 f"in {run_dir}")
