"""Metrics computed at ingest from several cases of one run (or from a run and its GPU model's between-box
spread): the speedups over each case's BF16 twin, their across-box intervals and the training parity verdicts."""

from __future__ import annotations

from fp8bench.analysis.parity import derive_parity
from fp8bench.core.records import CaseRecord, Metric, derive_box_intervals, derive_speedups


def derived_metrics(records: list[CaseRecord], spread: dict[str, float] | None = None,
                    ) -> list[tuple[CaseRecord, list[Metric], bool]]:
    """Every metric computed from several cases of one run, or from a run and its device's calibration:
    speedups, their across-box intervals (`spread`: derive_box_intervals), the training parity verdicts."""
    return derive_speedups(records) + derive_box_intervals(records, spread or {}) + derive_parity(records)
