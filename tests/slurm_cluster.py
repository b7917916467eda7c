"""A real Slurm for the tests: the probe that says whether one answers here, a sweep started through it, and
the faults a sweep meets on a cluster (a job cancelled, a node drained, a time limit, a requeue).

The cluster is the one `make slurm-up` starts (scripts/slurm/cluster.sh), or any Slurm whose commands are on
PATH with accounting (`sacct`): submitit reads a finished job's state from it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ("sinfo", "squeue", "sbatch", "scancel", "scontrol", "sacct")
USABLE_NODE_STATES = ("idle", "mixed", "allocated", "completing")
JOB_FOLDER = re.compile(r"^\d+(_\d+)?$")
"""submitit's folder of one task of a job array: <array job id>_<task>, the id squeue and sacct print."""


@dataclass(frozen=True)
class Cluster:
    node: str
    partition: str


def slurm(*args: str, timeout: float = 30) -> str:
    """Run a Slurm command; its stdout, or RuntimeError with its stderr."""
    res = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {res.returncode}: {(res.stderr or res.stdout).strip()}")
    return res.stdout


def probe() -> tuple[Cluster | None, str]:
    """(the cluster, "") when Slurm answers here with a usable node and accounting; (None, why) otherwise."""
    hint = "`make slurm-up` installs and starts a local one-node cluster (root, Debian)"
    missing = [c for c in COMMANDS if shutil.which(c) is None]
    if missing:
        return None, f"Slurm commands {missing} are not on PATH; {hint}"
    try:
        nodes = [line.split("|") for line in slurm("sinfo", "-h", "-N", "-o", "%N|%P|%T").split()]
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return None, f"sinfo does not answer ({exc}); {hint}"
    usable = [(n, p, s) for n, p, s in nodes if s in USABLE_NODE_STATES]
    if not usable:
        return None, f"no Slurm node is usable (sinfo: {nodes}); {hint}"
    try:
        slurm("sacct", "-X", "-n", "-S", "now")
    except (RuntimeError, subprocess.TimeoutExpired) as exc:
        return None, f"sacct does not answer, so job states cannot be read ({exc}); {hint}"
    node, partition, _ = usable[0]
    return Cluster(node=node, partition=partition.rstrip("*")), ""


def node_cpus(node: str) -> int:
    return int(slurm("sinfo", "-h", "-n", node, "-o", "%c").strip())


def wait_until(predicate: Callable[[], object], timeout: float, what: str, every: float = 0.2):
    """Poll `predicate` until it returns something true (which is returned); TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(every)


# --- a sweep through Slurm -------------------------------------------------------------------------------


def _default_sigint() -> None:
    """In the sweep's process: Ctrl-C interrupts it, as at a terminal, even where the tests were started in
    the background (a shell's background job ignores SIGINT, and its children inherit that)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Sweep:
    """`fp8bench run -m OVERRIDES` started in its own process group, its output in a file."""

    def __init__(self, results_dir: Path, *overrides: str, log_name: str = "sweep") -> None:
        self.results_dir = results_dir
        self.log = results_dir / f"{log_name}.log"
        results_dir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200")
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "fp8bench", "run", "-m", *overrides, f"results_dir={results_dir}"],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                preexec_fn=_default_sigint)

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float = 600) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            raise

    def interrupt(self, timeout: float = 120) -> int:
        """Ctrl-C, as a user who gives up waiting: the launcher cancels the sweep's jobs, waits for them to leave
        the queue and reads their end from accounting."""
        self.proc.send_signal(signal.SIGINT)
        return self.wait(timeout)

    def stop(self) -> None:
        if self.running():
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")


def submitted_jobs(results_dir: Path) -> list[str]:
    """Ids of the jobs fp8bench's sweeps submitted into `results_dir` (submitit's folders under
    <results_dir>/hydra/.submitit/), in submission order."""
    folder = results_dir / "hydra" / ".submitit"
    names = [p.name for p in folder.iterdir() if JOB_FOLDER.match(p.name)] if folder.is_dir() else []
    arrays = {n.split("_")[0] for n in names if "_" in n}
    names = [n for n in names if "_" in n or n not in arrays]  # an array's own folder is not a job: its tasks are
    return sorted(names, key=lambda j: tuple(int(x) for x in j.split("_")))


def job_states(job_ids: list[str], history: bool = False) -> dict[str, list[str]]:
    """Slurm's accounting states of each job, oldest first: one entry per run of the job with
    `history` (a requeued job: REQUEUED, then how its next run ended), else its latest. 'CANCELLED by 0' is
    read as CANCELLED."""
    if not job_ids:
        return {}
    arrays = sorted({j.split("_")[0] for j in job_ids})
    out = slurm("sacct", "-X", "-n", "-P", "-o", "JobID,State", *(["-D"] if history else []),
                *[a for array in arrays for a in ("-j", array)])
    states: dict[str, list[str]] = {j: [] for j in job_ids}
    for line in out.splitlines():
        job, _, state = line.partition("|")
        if job in states:
            states[job].append(state.split()[0] if state else "")
    return states


def queued(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """The jobs of `job_ids` still in the queue: id → (state, reason)."""
    out = slurm("squeue", "-h", "-r", "-o", "%i|%T|%r")
    rows = {}
    for line in out.splitlines():
        job, state, reason = line.split("|", 2)
        if job in job_ids:
            rows[job] = (state, reason)
    return rows


def wait_gone(job_ids: list[str], timeout: float = 300) -> None:
    """Until none of `job_ids` is pending or running (a launcher that failed leaves its other jobs running)."""
    wait_until(lambda: not queued(job_ids), timeout, f"jobs {job_ids} to leave the queue", every=1.0)


def job_shards(run_dir: Path, task: int) -> list[Path]:
    """The shards a sweep's job `task` (its index in the job array, Hydra's job number) wrote in `run_dir`."""
    return sorted(run_dir.glob(f"shard-*-job{task}.jsonl"))


def running_job_with_records(results_dir: Path, run_dir: Path, at_least: int, timeout: float = 300) -> str:
    """Wait for a running job of the sweep that has recorded `at_least` cases; its id."""
    def find() -> str | None:
        jobs = submitted_jobs(results_dir)
        running = {j for j, (state, _) in queued(jobs).items() if state == "RUNNING"}
        for job in sorted(running):
            if sum(len(lines(s)) for s in job_shards(run_dir, int(job.split("_")[1]))) >= at_least:
                return job
        return None
    return wait_until(find, timeout, f"a running job with {at_least} recorded cases")


# --- faults ----------------------------------------------------------------------------------------------


def cancel(job_id: str) -> None:
    slurm("scancel", job_id)


def requeue(job_id: str) -> None:
    """Slurm kills the job and queues it again (it runs again once Slurm's requeue delay has passed)."""
    slurm("scontrol", "requeue", job_id)


def expire(job_id: str) -> None:
    """Lower a running job's time limit to zero: Slurm ends it as TIMEOUT at its next time-limit check (every
    30 s), sending the job's --signal and SIGTERM, then SIGKILL after KillWait."""
    slurm("scontrol", "update", f"JobId={job_id}", "TimeLimit=0")


@contextlib.contextmanager
def drained(node: str, reason: str = "fp8bench test: maintenance") -> Iterator[None]:
    """The node drained (running jobs finish, waiting ones stay queued) for the block; resumed and idle after."""
    slurm("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
    try:
        yield
    finally:
        slurm("scontrol", "update", f"NodeName={node}", "State=RESUME")
        wait_until(lambda: slurm("sinfo", "-h", "-n", node, "-o", "%T").strip() in USABLE_NODE_STATES, 60,
                   f"node {node} to come back")


# --- what a run folder holds -----------------------------------------------------------------------------


def lines(shard: Path) -> list[dict]:
    """Every record of a shard as written (a torn last line of a killed job is left out)."""
    out = []
    for line in shard.read_text(errors="replace").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            out.append(json.loads(line))
    return out


def all_records(run_dir: Path) -> list[dict]:
    return [rec for shard in sorted(run_dir.glob("shard-*.jsonl")) for rec in lines(shard)]


def snapshot(run_dir: Path) -> dict[str, tuple[str, int]]:
    """Every shard's content hash and modification time (ns)."""
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(run_dir.glob("shard-*.jsonl"))}
