import os
import subprocess
import sys
from pathlib import Path

import forked_cli
import pytest
import torch

# Without a GPU, every Triton kernel runs in Triton's interpreter (correctness only). It must be set before
# any kernel is defined: triton.jit chooses interpreter or compiler when the decorated function is created.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

ROOT = Path(__file__).resolve().parents[1]


def _share_the_cores() -> None:
    """Under pytest-xdist (`make test` runs one worker per core) each worker, and every process it starts (the
    forked CLI, new interpreters, torchrun's ranks), gets its share of the cores as torch threads: workers of
    two threads each on two cores spin against each other. An OMP_NUM_THREADS already set is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // workers)))
    if threads := forked_cli.torch_threads(os.environ):
        torch.set_num_threads(threads)


_share_the_cores()

DATA_SIDE = ["test_advisor.py", "test_audit.py", "test_compare.py", "test_docs.py", "test_launch.py", "test_memory_model.py",
             "test_report.py", "test_report_selection.py", "test_roofline.py", "test_runner.py", "test_shared_results.py", "test_slurm.py", "test_store.py",
             "test_training_steps_report.py", "test_waterfall.py"]
"""Test modules of the data side (DuckDB, the plotly report). A GPU box needs neither library (`fp8bench run`
writes shards there; ingest and report run elsewhere), so where one is missing these are not collected and
the header says so; none holds a GPU test."""


def _missing_data_libraries() -> list[str]:
    missing = []
    for name in ("duckdb", "plotly"):
        try:
            __import__(name)
        except ImportError:
            missing.append(name)
    return missing


MISSING = _missing_data_libraries()
collect_ignore = DATA_SIDE if MISSING else []


def pytest_report_header(config):
    if MISSING:
        return [f"{' and '.join(MISSING)} not installed: the data-side test modules are not collected "
                f"({', '.join(DATA_SIDE)})"]
    return []


def fp8bench(*args: str, cwd: Path | None = None, timeout: int = 300, env: dict | None = None,
             fresh: bool = False) -> subprocess.CompletedProcess:
    """Run the real CLI in a new process, capturing output; `env` adds variables. The process is forked from a
    server that has the imports done (`forked_cli`); `fresh=True` starts a new interpreter instead
    (`python -m fp8bench`), for what happens during the imports themselves (their warnings, `entry()`)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLUMNS="200", **(env or {}))
    if fresh:
        return subprocess.run([sys.executable, "-m", "fp8bench", *args], capture_output=True, text=True,
                              cwd=cwd or ROOT, env=env, timeout=timeout)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        proc = forked_cli.start(list(args), cwd or ROOT, env, str(out), str(err))
        proc.join(timeout)
        if proc.exitcode is None:
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired(["fp8bench", *args], timeout)
        return subprocess.CompletedProcess(["fp8bench", *args], proc.exitcode, out.read_text(), err.read_text())


def fp8bench_process(*args: str, cwd: Path | None = None, env: dict | None = None, new_session: bool = False):
    """`fp8bench ARGS` started and left running, output discarded (a test that kills it midway): a
    multiprocessing.Process forked as `fp8bench` forks them; `new_session` for killing its process group."""
    return forked_cli.start(list(args), cwd or ROOT, dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
                            new_session=new_session)


def fp8bench_many(calls: list[dict], workers: int = 2) -> list[subprocess.CompletedProcess]:
    """`fp8bench(**call)` for each call, `workers` processes at a time, results in order: the CLI tests that
    start many independent processes (each mostly interpreter start and imports) overlap them on the cores.
    Each process gets one torch thread (OMP_NUM_THREADS=1, unless the call's env says otherwise): processes
    of two threads each, side by side on two cores, spin against each other."""
    from concurrent.futures import ThreadPoolExecutor

    def one(call: dict) -> subprocess.CompletedProcess:
        options = {k: v for k, v in call.items() if k != "args"}
        options["env"] = {"OMP_NUM_THREADS": "1", **(options.get("env") or {})}
        return fp8bench(*call["args"], **options)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(one, calls))


@pytest.fixture
def cli():
    return fp8bench


@pytest.fixture(scope="session")
def cli_process():
    return fp8bench_process


@pytest.fixture(scope="session")
def cli_many():
    return fp8bench_many


@pytest.fixture(scope="session")
def slurm_cluster():
    """The Slurm that answers here (tests/slurm_cluster.py's probe: a usable node and accounting). Without
    one the test is skipped with the probe's reason; under CI (`.ci/run` starts a local cluster) it fails."""
    import slurm_cluster

    cluster, why = slurm_cluster.probe()
    if cluster is None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must bring up a local Slurm (.ci/run runs scripts/slurm/cluster.sh up): {why}")
        pytest.skip(why)
    return cluster


@pytest.fixture(scope="session")
def page_text():
    """fp8bench.report.browser.page_text through one Chromium for every test of a pytest run."""
    from fp8bench.report.browser import PageReader

    with PageReader() as read:
        yield read


SLOWEST_FIRST = ["test_slurm.py", "test_asv.py", "test_train_modes.py", "test_report.py", "test_sweep_semantics.py",
                 "test_triton_backend.py", "test_cli.py", "test_compare.py", "test_train_presets.py", "test_train.py",
                 "test_case_model.py", "test_runner.py", "test_launch.py", "test_te_reference.py", "test_integrations.py",
                 "test_backend_plugin.py"]
"""Test files by their CPU time in `make test` (`--durations=0` summed per file at 91a5d91, 88 s down to 16 s),
longest first: `--dist loadfile` hands files to its two workers in collection order, so a long file collected
last (alphabetically, test_train_modes.py) leaves one worker running alone at the end (~11 s of a 290 s run).
A file not listed goes after these, in its usual order; a stale list costs balance, never a test."""


def pytest_collection_modifyitems(config, items):
    """Longest files first (SLOWEST_FIRST); GPU tests skip on CPU with the probe's reason (run them with
    `pytest -m gpu` on the GPU box)."""
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: each file keeps its own order
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="no CUDA device: torch.cuda.is_available() is False")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
