"""Hydra launcher plugin `local-gpus`: Hydra's joblib launcher, handing out a sweep's jobs longest first.

Hydra discovers launchers only in the `hydra_plugins` namespace package; fp8bench puts this folder's parent
on sys.path when it loads Hydra (fp8bench.config.compose), so the plugin works from a source checkout, an
editable install and the GPU box's PYTHONPATH alike.

Why the order: the joblib workers (one per GPU) take jobs as they free up, in the order given. Hydra gives
them in declaration order, so a sweep whose heaviest points come last ends with one GPU busy and the other
idle (docs/launchers.md: what that cost a two-GPU sweep). Longest first (LPT scheduling) ends with the short
jobs, which fill the gaps.
"""

from __future__ import annotations

from collections.abc import Sequence

from hydra.core.utils import JobReturn
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher


class LongestFirstJoblibLauncher(JoblibLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from fp8bench.run.launch import job_seconds_from_history, longest_first

        assert self.config is not None and self.hydra_context is not None
        loader = self.hydra_context.config_loader
        jobs = [loader.load_sweep_config(self.config, list(o)) for o in job_overrides]
        seconds = job_seconds_from_history(jobs)
        order = longest_first(seconds)
        returns = super().launch([job_overrides[i] for i in order], initial_job_idx)
        by_declaration: list[JobReturn] = [None] * len(order)  # type: ignore[list-item]
        for position, i in enumerate(order):
            by_declaration[i] = returns[position]
        return by_declaration
