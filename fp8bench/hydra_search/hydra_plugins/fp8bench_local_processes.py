"""Hydra launcher plugin `local-processes`: submitit's local executor, one job at a time.

hydra-submitit's local launcher submits a sweep's jobs as one array, and submitit's local executor starts every
job of an array at once. For a benchmark that is wrong twice: the jobs time their kernels on the same device
(and the same cores) side by side, each one's figures slowed by the others, and every job of a multi-GPU box
runs on GPU 0. This launcher submits the jobs one after another, each into its own process, waiting for one to
finish before the next starts; parallel jobs are `local-gpus`'s work (one worker per GPU).
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import LocalLauncher


class SequentialLocalLauncher(LocalLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        returns: list[JobReturn] = []
        for offset, overrides in enumerate(job_overrides):
            # each call submits an array of one job and waits for its result
            returns += super().launch([overrides], initial_job_idx + offset)
        return returns

    def __reduce__(self):
        # submitit pickles the launcher as each job's callable, and the job's new interpreter unpickles it before
        # fp8bench has put this plugin folder on sys.path: it travels as hydra-submitit's own LocalLauncher,
        # whose __call__ (run one job) is all a job needs
        return object.__new__, (LocalLauncher,), self.__dict__
