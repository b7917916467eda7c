"""Hydra launcher plugin `local-processes`: submitit's local executor, one job at a time, each job seeing the
GPUs of the `fp8bench run` that launched it.

hydra-submitit's local launcher submits a sweep's jobs as one array, and submitit's local executor starts every
job of an array at once: the jobs would time their kernels side by side, each one's figures slowed by the others.
It also sets each job's CUDA_VISIBLE_DEVICES from `gpus_per_node` (the preset's 0: no GPU at all, so a GPU
sweep would run on the CPU). This launcher submits the jobs one after another, waiting for each to finish, and
gives each the launching process's CUDA_VISIBLE_DEVICES (unset where it was unset: every GPU). A job whose
process dies does not stop the others; the sweep then fails with the first such error, as the one array does.
Parallel jobs are `local-gpus`'s work (one worker per GPU).

submitit pickles the launcher as each job's callable, and Hydra accepts launcher classes only from the
`hydra_plugins` namespace package: each job's interpreter gets this folder's parent on its PYTHONPATH, so it
can import the class (fp8bench.config.compose puts it on sys.path for the launching process).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from pathlib import Path

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher

PLUGIN_ROOT = Path(__file__).resolve().parents[1]


def job_setup(environ: dict[str, str]) -> list[str]:
    """Shell lines a job runs before it starts (submitit's `setup`, after its controller has set
    CUDA_VISIBLE_DEVICES from gpus_per_node): this plugin importable, and the launching process's GPUs."""
    devices = environ.get("CUDA_VISIBLE_DEVICES")
    return [f"export PYTHONPATH={shlex.quote(str(PLUGIN_ROOT))}${{PYTHONPATH:+:$PYTHONPATH}}",
            "unset CUDA_VISIBLE_DEVICES" if devices is None else f"export CUDA_VISIBLE_DEVICES={shlex.quote(devices)}"]


class SequentialLocalLauncher(LocalLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        self.params["setup"] = [*job_setup(dict(os.environ)), *self.params.get("setup", [])]
        returns: list[JobReturn] = []
        failure: Exception | None = None
        for offset, overrides in enumerate(job_overrides):
            try:  # each call submits an array of one job and waits for its result
                returns += super().launch([overrides], initial_job_idx + offset)
            except Exception as e:  # noqa: BLE001 - a job whose process died: the sweep's other jobs still run
                failure = failure or e
        if failure is not None:
            raise failure
        return returns
