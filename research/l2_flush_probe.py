"""Does flushing L2 by writing charge a memory-bound kernel for the flush's own write-back? And where does the
Gluon GEMM's host time go?

1. L2 flush. fp8bench's timer (like Triton's `do_bench`) empties L2 before each timed call by zeroing a 256 MB
   buffer, which leaves L2 full of dirty lines: the timed kernel's first ~L2-size of traffic then evicts them,
   and DRAM takes their write-back inside its timing. A kernel moving 50 MB (a cast of a 32 MB BF16 tensor)
   would pay up to the H200's 50 MB of L2 again. Reading the buffer instead (a sum) also evicts everything,
   but leaves clean lines, dropped for free. Each kernel is replayed from a CUDA graph (no host time in the
   figure), timed per call with cuda events: after a zeroing flush, after a reading flush, and with no flush
   (warm L2). Beside each cast: a plain copy of the same input (`dst.copy_(x)`), the same way. Percentages are
   of the 2 GB copy's bandwidth (`fp8bench.analysis.calibrate.copy_gbps`, the cast line's reference).
2. Host time of one call of the Gluon blockwise GEMM at 256x256x256 (its kernel takes a few microseconds), and
   of its parts, each timed alone in a loop: its four tensor descriptors (kept by address, and built anew as
   `TensorDescriptor.from_tensor` builds them), binding the arguments, the direct launch of the compiled kernel
   with ready descriptors, and cuBLAS's blockwise call through torch.

Usage on the GPU box: python3 research/l2_flush_probe.py OUT.json
Anywhere, the Markdown tables of a recorded file: python3 research/l2_flush_probe.py --markdown OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys

import torch

from fp8bench.analysis.calibrate import copy_gbps

FLUSH_BYTES = 256 * 1024**2
SHAPES = [(4096, 4096), (8192, 4096), (8192, 8192), (8192, 14336)]


def graph_of(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def per_call_ms(replay, flush, calls: int = 200) -> float:
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(calls)]
    for _ in range(20):
        flush()
        replay()
    for i in range(calls):
        flush()
        starts[i].record()
        replay()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends, strict=True))


def cast_rows(m: int, k: int, copy: float, flushes: dict) -> list[dict]:
    from fp8bench_kernels import quantize_blockwise as qb
    from fp8bench_kernels import quantize_current as qc

    x = torch.randn(m, k, device="cuda").bfloat16()
    dst = torch.empty_like(x)
    kernels = {
        "copy": (lambda: dst.copy_(x), 2 * x.nbytes),
        "blockwise 1x128": (lambda: qb.quantize_blockwise(x, (1, 128), m_major_scales=True),
                            qb.bytes_moved(x, (1, 128))),
        "current+transpose": (lambda: qc.quantize_current(x), qc.bytes_moved(x)),
        "blockwise 128x128 both": (lambda: qb.quantize_blockwise_both(x, weight=True),
                                   qb.bytes_moved(x, (128, 128)) + 2 * x.numel()),
    }
    rows = []
    for name, (fn, nbytes) in kernels.items():
        fn()  # autotune before capture
        graph = graph_of(fn)
        row = {"kernel": name, "shape": [m, k], "input_mb": x.nbytes / 2**20, "bytes": nbytes}
        for flush_name, flush in flushes.items():
            ms = per_call_ms(graph.replay, flush)
            row[f"{flush_name}_ms"] = ms
            row[f"{flush_name}_pct_of_copy"] = 100 * nbytes / ms / 1e6 / copy
        rows.append(row)
        print(f"{name:>24} {m}x{k} ({row['input_mb']:4.0f} MB): % of 2 GB copy after zeroing flush "
              f"{row['zeroing_pct_of_copy']:5.1f}, reading flush {row['reading_pct_of_copy']:5.1f}, none "
              f"{row['none_pct_of_copy']:5.1f}", flush=True)
    return rows


def l2_flush(copy: float) -> list[dict]:
    buf = torch.ones(FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
    flushes = {"zeroing": buf.zero_, "reading": lambda: buf.sum(), "none": lambda: None}
    rows = []
    for m, k in SHAPES:
        rows += cast_rows(m, k, copy, flushes)
        torch.cuda.empty_cache()
    return rows


def gemm_host(calls: int = 2000) -> dict:
    from fp8bench_kernels import gemm_blockwise_gluon as gg

    from fp8bench.backends import get_backend
    from fp8bench.core.types import GemmRole
    sys.path.insert(0, "scripts")
    from kernel_bench import recipe
    from recipe_bench import host_us_per_call

    x = torch.randn(256, 256, device="cuda").bfloat16()
    ops = {impl: get_backend(impl).gemm(x, x, GemmRole.FPROP, recipe(impl, "blockwise")).kernel_only
           for impl in ("triton", "torch")}
    ops["triton"]()
    launcher = gg._launch_gemm

    class Recording:  # `_launch` looks its launcher up at each call: this one keeps the last call's arguments
        def launch(self, key, grid, args, kwargs):
            self.call = (key, grid, args, kwargs)
            launcher.launch(key, grid, args, kwargs)
    recording = gg._launch_gemm = Recording()
    try:
        ops["triton"]()
    finally:
        gg._launch_gemm = launcher
    key, grid, args, kwargs = recording.call
    compiled = launcher._compiled[key][0]
    named = launcher.arguments(args, kwargs, {})
    ordered = [named[n] for n in launcher.arg_names]
    launch = compiled[(*grid, 1, 1)[:3]]
    blocks = [(d.base, tuple(d.block_shape), d.layout) for d in args[:4]]
    tensors = [torch.empty(d.shape, dtype=d.base.dtype, device="cuda") for d in args[:4]]

    parts = {"gluon gemm call": ops["triton"], "cublas blockwise call": ops["torch"],
             "four descriptors, kept": lambda: [gg._descriptor(t, blk, lay) for t, (_, blk, lay)
                                                in zip(tensors, blocks, strict=True)],
             "four descriptors, built": lambda: [gg.TensorDescriptor.from_tensor(t, list(blk), lay) for t, (_, blk, lay)
                                                 in zip(tensors, blocks, strict=True)],
             "bind arguments": lambda: launcher.arguments(args, kwargs, {}),
             "direct launch, ready arguments": lambda: launch(*ordered),
             "torch.empty C": lambda: torch.empty(256, 256, device="cuda", dtype=torch.bfloat16)}
    out = {}
    for _ in range(3):
        for name, fn in parts.items():
            out.setdefault(name, []).append(host_us_per_call(fn, calls, warmup=50))
    result = {name: statistics.median(v) for name, v in out.items()}
    for name, us in result.items():
        print(f"{name:>32} {us:6.1f} µs per call", flush=True)
    return result


def markdown(recorded: dict) -> str:
    out = ["| kernel | input | % of copy, zeroing flush | reading flush | no flush |", "|---|---|---|---|---|"]
    for r in recorded["l2_flush"]:
        out.append(f"| {r['kernel']} | {r['shape'][0]}×{r['shape'][1]} ({r['input_mb']:.0f} MB) | "
                   f"{r['zeroing_pct_of_copy']:.1f} | {r['reading_pct_of_copy']:.1f} | {r['none_pct_of_copy']:.1f} |")
    out += ["", f"Copy bandwidth (2 GB) {recorded['copy_gbps']:.0f} GB/s.", "",
            "| host, Gluon GEMM at 256×256×256 | µs per call |", "|---|---|"]
    out += [f"| {name} | {us:.1f} |" for name, us in recorded["gemm_host_us"].items()]
    return "\n".join(out) + "\n"


def main() -> int:
    if sys.argv[1] == "--markdown":
        print(markdown(json.loads(open(sys.argv[2]).read())), end="")
        return 0
    copy = copy_gbps(torch.device("cuda"), 2 * 1024**3, 0.3)
    print(f"copy bandwidth (2 GB): {copy:.0f} GB/s", flush=True)
    out = {"device": torch.cuda.get_device_name(), "copy_gbps": copy, "gemm_host_us": gemm_host(),
           "l2_flush": l2_flush(copy)}
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
