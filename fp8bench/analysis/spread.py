"""How far the same speedups move between two boxes of one GPU model: the between-box spread that widens each
speedup's interval (records.derive_box_intervals) into the range another box measures.

From the run folders recorded on box A and on box B (measurement version 4 or later: speedups measured side by
side, with their own intervals): for every case with a speedup on both boxes, not labelled host-bound on either
(host-bound figures move with the host CPU, not the GPU), |log(speedup_A / speedup_B)|; the spread of a series
(the workload, or the workload + '_kernel' for kernel-only speedups) is its `quantile`. The result, written as
results/spread/<device>.json (`scripts/speedup_spread.py`), keeps every pair it was computed from; `fp8bench
ingest` loads it and derives speedup_vs_bf16[_kernel]_box_lo/hi for every run of that device.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from pathlib import Path

from fp8bench.core.records import CaseRecord, read_run


def speedups(run_dirs: list[Path]) -> tuple[dict[tuple[str, str], tuple[CaseRecord, float]], list[dict]]:
    """{(case_id, series): (record, speedup)} of the ok cases with a speedup and its interval, and the runs'
    manifests. ValueError for a folder that holds no run."""
    out, manifests = {}, []
    for d in run_dirs:
        manifest, records, _ = read_run(d)
        if manifest is None:
            raise ValueError(f"{d} holds no run (no manifest.json)")
        manifests.append(manifest)
        for r in records:
            for suffix in ("", "_kernel"):
                s = r.metric(f"speedup_vs_bf16{suffix}")
                if r.status == "ok" and s and r.metric(f"speedup_vs_bf16{suffix}_lo") is not None:
                    out[(r.case_id, r.workload + suffix)] = (r, s)
    return out, manifests


def quantile(xs: list[float], q: float) -> float:
    """The q-quantile of `xs` as an order statistic (the smallest value with at least q of them at or below)."""
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(q * len(xs)) - 1)]


def between_box_spread(box_a: list[Path], box_b: list[Path], q: float = 0.95) -> dict:
    """The spread file's content for the runs of box A and box B: per series its half-width (the q-quantile of
    |log(speedup_A / speedup_B)|) and case count, with the runs, commits, boxes and pairs it came from.
    ValueError when the runs span several GPU models or the two boxes share a GPU."""
    a, ma = speedups(box_a)
    b, mb = speedups(box_b)
    devices = {m["device_name"] for m in ma + mb}
    if len(devices) != 1:
        raise ValueError(f"the runs span several GPU models {sorted(devices)}; give runs of one")
    boxes = [sorted({m["env"].get("gpu_uuid") for m in ms}) for ms in (ma, mb)]
    if set(boxes[0]) & set(boxes[1]):
        raise ValueError(f"box A and box B share a GPU ({boxes}): the spread is between boxes")
    series: dict[str, list[float]] = defaultdict(list)
    pairs = []
    for key in sorted(set(a) & set(b)):
        (ra, sa), (rb, sb) = a[key], b[key]
        if 1.0 in (ra.metric("host_bound"), rb.metric("host_bound")):
            continue
        series[key[1]].append(abs(math.log(sa / sb)))
        pairs.append([key[0], key[1], round(sa, 5), round(sb, 5)])
    return {
        "device_name": devices.pop(), "quantile": q, "measured_at": time.time(),
        "series": {name: {"half_width": quantile(d, q), "cases": len(d)} for name, d in sorted(series.items())},
        "runs": {"a": [m["run_id"] for m in ma], "b": [m["run_id"] for m in mb]},
        "commits": sorted({str(m.get("git_commit")) + ("+dirty" if m.get("git_dirty") else "") for m in ma + mb}),
        "boxes": {"a": boxes[0], "b": boxes[1]},
        "pairs": pairs,
    }
