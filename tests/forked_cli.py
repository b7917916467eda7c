"""The tests' `fp8bench` processes, forked from a server that has done the imports once (conftest's `fp8bench`
and `cli_process`). A module of its own: a forked child imports this, not the conftest."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# What every `fp8bench` process imports before it does anything: ~5 s of a ~8 s small run on two cores.
_PRELOAD = ["torch", "pandas", "scipy.special", "duckdb", "pyarrow", "hydra", "omegaconf", "rich.console",
            "fp8bench.cli", "fp8bench.config.compose", "fp8bench.run.plan", "fp8bench.run.runner",
            "fp8bench.data.store", "fp8bench.backends.scaled_mm", "fp8bench.backends.emulated", "forked_cli"]
_forks = None


def torch_threads(env: dict) -> int | None:
    """The thread count OMP_NUM_THREADS asks torch for (OpenMP allows "4,2": the outer level), None if unset."""
    threads = env.get("OMP_NUM_THREADS", "").split(",")[0].strip()
    return int(threads) if threads.isdigit() and int(threads) > 0 else None


def fork_context():
    """multiprocessing's forkserver, its server having imported `_PRELOAD` once. Each CLI call is still a new
    process (its own memory, Hydra and Triton state, exit status, signals), forked from a process that has
    only imported and never computed, so no thread pool is forked mid-use."""
    global _forks
    if _forks is None:
        import multiprocessing

        _forks = multiprocessing.get_context("forkserver")
        _forks.set_forkserver_preload(_PRELOAD)
    return _forks


def start(args: list[str], cwd: Path, env: dict, stdout: str = os.devnull, stderr: str = os.devnull,
          new_session: bool = False):
    """Start `fp8bench ARGS` as a forked process (a multiprocessing.Process: .pid, .kill(), .join(),
    .exitcode, negative for a signal as subprocess has it); `new_session` makes it a process group leader."""
    proc = fork_context().Process(target=cli_child, args=(list(args), str(cwd), dict(env), stdout, stderr,
                                                          new_session))
    proc.start()
    return proc


def cli_child(args: list[str], cwd: str, env: dict, stdout: str, stderr: str, new_session: bool) -> None:
    """What `python -m fp8bench ARGS` does after its imports: in the working directory and the environment
    given, stdout and stderr (the file descriptors, so C-level output too) into the files given."""
    import importlib

    if new_session:
        os.setsid()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    if threads := torch_threads(env):  # a new interpreter's torch reads it at import; the server's has imported
        import torch

        torch.set_num_threads(threads)
    for fd, path in ((1, stdout), (2, stderr)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115 - the process's own stdout, flushed on exit
    sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
    sys.stdin = open(os.devnull)  # noqa: SIM115
    sys.argv = [str(ROOT / "fp8bench" / "__main__.py"), *args]
    # fp8bench.cli sizes its consoles by whether stdout is a terminal when it is imported: again, for this one
    cli = importlib.reload(sys.modules["fp8bench.cli"])
    try:
        code = cli.main(list(args))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)
