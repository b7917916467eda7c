"""How far the same speedups move between two boxes of one GPU model: the between-box spread that widens
each speedup's interval (records.derive_box_intervals) into the range another box measures.

Give the run folders recorded on box A and on box B (MEASUREMENT_VERSION 4 or later: speedups measured side
by side, with their own intervals). For every case with a speedup on both boxes, not labelled host-bound on
either (host-bound figures move with the host CPU, not the GPU), |log(speedup_A / speedup_B)| is taken; the
spread of a series (the workload, or the workload + '_kernel' for kernel-only speedups) is its `--quantile`
(0.95). The output, results/spread/<device>.json, keeps every pair it was computed from; `fp8bench ingest`
loads it and derives speedup_vs_bf16[_kernel]_box_lo/hi for every run of that device.

Usage: python3 scripts/speedup_spread.py --box-a RUN_DIR [RUN_DIR...] --box-b RUN_DIR [RUN_DIR...] --out FILE
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fp8bench.core.records import CaseRecord, read_run  # noqa: E402


def speedups(run_dirs: list[Path]) -> tuple[dict[tuple[str, str], tuple[CaseRecord, float]], list[dict]]:
    """{(case_id, series): (record, speedup)} of the non-emulated ok cases, and the runs' manifests."""
    out, manifests = {}, []
    for d in run_dirs:
        manifest, records, _ = read_run(d)
        if manifest is None:
            raise SystemExit(f"{d} holds no run (no manifest.json)")
        manifests.append(manifest)
        for r in records:
            for suffix in ("", "_kernel"):
                s = r.metric(f"speedup_vs_bf16{suffix}")
                if r.status == "ok" and s and r.metric(f"speedup_vs_bf16{suffix}_lo") is not None:
                    out[(r.case_id, r.workload + suffix)] = (r, s)
    return out, manifests


def quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(q * len(xs)) - 1)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--box-a", nargs="+", type=Path, required=True)
    p.add_argument("--box-b", nargs="+", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--quantile", type=float, default=0.95)
    ns = p.parse_args(argv)
    a, ma = speedups(ns.box_a)
    b, mb = speedups(ns.box_b)
    devices = {m["device_name"] for m in ma + mb}
    if len(devices) != 1:
        raise SystemExit(f"the runs span several GPU models {sorted(devices)}; give runs of one")
    boxes = [sorted({m["env"].get("gpu_uuid") for m in ms}) for ms in (ma, mb)]
    if set(boxes[0]) & set(boxes[1]):
        raise SystemExit(f"box A and box B share a GPU ({boxes}): the spread is between boxes")
    series: dict[str, list[float]] = defaultdict(list)
    pairs = []
    for key in sorted(set(a) & set(b)):
        (ra, sa), (rb, sb) = a[key], b[key]
        if 1.0 in (ra.metric("host_bound"), rb.metric("host_bound")):
            continue
        series[key[1]].append(abs(math.log(sa / sb)))
        pairs.append([key[0], key[1], round(sa, 5), round(sb, 5)])
    result = {
        "device_name": devices.pop(), "quantile": ns.quantile, "measured_at": time.time(),
        "series": {name: {"half_width": quantile(d, ns.quantile), "cases": len(d)} for name, d in sorted(series.items())},
        "runs": {"a": [m["run_id"] for m in ma], "b": [m["run_id"] for m in mb]},
        "commits": sorted({str(m.get("git_commit")) + ("+dirty" if m.get("git_dirty") else "") for m in ma + mb}),
        "boxes": {"a": boxes[0], "b": boxes[1]},
        "pairs": pairs,
    }
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, v in result["series"].items():
        print(f"{name}: {100 * v['half_width']:.2f}% ({v['cases']} cases)")
    print(f"written: {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
