"""What torch.profiler's CUDA tracing adds to each kernel it records (issue: why not 2x, the waterfall line).

The waterfall is built from per-kernel times recorded by torch.profiler (CUPTI). On the H200 the kernels of
TE's Current and Block layer steps, which launch many short cast/amax kernels, once summed to 109-115% of the
separately timed step, while Delayed (fewer kernels) summed to 99-103%; tracing cost per kernel was the
suspect. (The cause was clock state: the timed steps had run before the clocks settled. With settled timing
the kernels explain 96-98% of every recipe's step, results/h200-layer-settled.) This script measures the
tracing's cost per kernel on kernels of known length: each is launched N times back to back and timed with
CUDA events without the profiler, then again under the profiler, which gives
- the per-kernel duration the profiler reports against the event-timed one (duration inflation);
- the wall time per kernel under tracing against without (what tracing adds to a step).

Usage (GPU): python3 research/profiler_overhead.py [--n 2000] [--json FILE]
"""

from __future__ import annotations

import argparse
import json

import torch


def wall_per_kernel(fn, n):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n):
        fn()
    e.record()
    torch.cuda.synchronize()
    return s.elapsed_time(e) / n * 1e3  # µs


def main() -> None:
    from torch.profiler import ProfilerActivity, profile

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--json")
    a = ap.parse_args()
    dev = torch.device("cuda")
    rows = {}
    with profile(activities=[ProfilerActivity.CUDA]):  # CUPTI's one-time start-up stays out of the numbers
        torch.ones(1, device=dev).add_(1)
        torch.cuda.synchronize()
    for elements in (1 << 12, 1 << 20, 1 << 24, 1 << 26):
        x = torch.randn(elements, device=dev)
        def fn(x=x):
            return x.mul_(1.0000001)

        for _ in range(50):
            fn()
        torch.cuda.synchronize()
        plain = min(wall_per_kernel(fn, a.n) for _ in range(3))
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            traced = wall_per_kernel(fn, a.n)
        durs = [(e.time_range.end - e.time_range.start) for e in prof.events()
                if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start]
        reported = sum(durs) / max(len(durs), 1)
        rows[f"mul_{elements}"] = {"event_us_per_kernel": round(plain, 3), "traced_wall_us_per_kernel": round(traced, 3),
                                   "profiler_duration_us": round(reported, 3), "kernels_seen": len(durs),
                                   "added_wall_us": round(traced - plain, 3), "added_duration_us": round(reported - plain, 3)}
        print(f"mul_{elements}", rows[f"mul_{elements}"], flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "n": a.n, "kernels": rows}, f, indent=1)


if __name__ == "__main__":
    main()
