"""Is an eager cast cell of the cast line slow because of the kernel, or because the host cannot keep the GPU fed?

The cast line (`scripts/recipe_bench.py --only cast`) times each cast eager, the L2 flushed (a 256 MB zeroing)
before every call, with events around the call and no sync between iterations. Its 32 MB cells moved from run to
run on one box at 2b05fcd, for kernels that had not changed (current+transpose 54.5% of a same-bytes copy, then
90.4%; mx 92.0%, then 73.1%), while the same calls replayed from a CUDA graph held steady. The timed loop stays
GPU-bound only while the host enqueues an iteration (flush, event, call, event) faster than the GPU runs it
(flush plus cast); once the host is slower, the GPU idles between the start event and the cast's launch, and the
idle time is timed.

For each cast at 32 and 64 MB, `REPEATS` times: the eager median as the cast line times it, and the same kind of
loop (`recipe_bench.eager_pace`, here over `ITERATIONS`) enqueued again with the host's time per iteration (wall
clock of the enqueueing, before the sync) beside the GPU's (the first start event to the last end event). A host
time per iteration of at least `recipe_bench.HOST_PACED` of the GPU's means the host paced the loop. The graph
median closes each row.

Usage on the GPU box: python3 research/eager_pace_probe.py OUT.json
Anywhere, the Markdown table of a recorded file: python3 research/eager_pace_probe.py --markdown OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from recipe_bench import CAST_TIMER, HOST_PACED, cast_calls, eager_pace  # noqa: E402 - the cast line's own

from fp8bench.core.measure import L2Flusher, time_fn  # noqa: E402

SHAPES = [(4096, 4096), (8192, 4096)]
REPEATS = 3
ITERATIONS = 2000


def main(out_path: str) -> None:
    flush = L2Flusher()
    rows = []
    for m, k in SHAPES:
        x = torch.randn(m, k, device="cuda").bfloat16()
        for name, (fn, nbytes) in cast_calls(x).items():
            fn()
            for repeat in range(REPEATS):
                eager = time_fn(fn, **CAST_TIMER).median_ms * 1e3
                host_us, gpu_us = eager_pace(fn, flush, ITERATIONS)
                graph = time_fn(fn, cuda_graph=True, **CAST_TIMER).median_ms * 1e3
                row = {"kernel": name, "shape": [m, k], "bytes": nbytes, "repeat": repeat, "eager_us": eager, "graph_us": graph,
                       "host_us_per_iteration": host_us, "gpu_us_per_iteration": gpu_us}
                rows.append(row)
                print(f"{name:>24} {m}x{k} #{repeat}: eager {eager:6.1f} µs, graph {graph:6.1f} µs; per iteration "
                      f"host {host_us:6.1f} µs, GPU {gpu_us:6.1f} µs{'  HOST-PACED' if host_us >= HOST_PACED * gpu_us else ''}",
                      flush=True)
        for name in cast_calls(x):
            mine = [r for r in rows if r["kernel"] == name and r["shape"] == [m, k]]
            print(f"{name:>24} {m}x{k}: eager median of repeats {statistics.median(r['eager_us'] for r in mine):.1f} µs",
                  flush=True)
    Path(out_path).write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))


def markdown(recorded: dict) -> str:
    """Per cast and shape, its repeats in order: eager and graph medians, and the loop's host and GPU time per
    iteration (µs), a host-paced repeat marked with *."""
    groups: dict[tuple, list[dict]] = {}
    for r in recorded["rows"]:
        groups.setdefault((r["kernel"], tuple(r["shape"])), []).append(r)
    out = ["| cast | shape | eager µs | graph µs | loop per iteration, host / GPU µs (* host-paced) |",
           "|---|---|---|---|---|"]
    for (kernel, shape), rows in groups.items():
        loops = ", ".join(f"{r['host_us_per_iteration']:.1f} / {r['gpu_us_per_iteration']:.1f}"
                          + ("*" if r["host_us_per_iteration"] >= HOST_PACED * r["gpu_us_per_iteration"] else "")
                          for r in rows)
        eager = " / ".join(f"{r['eager_us']:.1f}" for r in rows)
        graph = " / ".join(f"{r['graph_us']:.1f}" for r in rows)
        out.append(f"| {kernel} | {'×'.join(map(str, shape))} | {eager} | {graph} | {loops} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--markdown"]:
        print(markdown(json.loads(Path(sys.argv[2]).read_text())), end="")
        sys.exit(0)
    main(sys.argv[1])
