"""The blockwise recipe's kernels as a training step pays them, on a GPU, printed and written as JSON:

1. GEMM rounds: per shape (the Llama shapes of `fp8bench.workloads.kernel_bench.GEMMS`, 8192³, 4096³ and 2048³), ROUNDS
   interleaved rounds of the `triton` backend's blockwise GEMM (the Gluon kernel on sm_90, as the sweeps run it)
   and cuBLAS's (torch._scaled_mm with 1x128 / 128x128 scales), their order alternating between rounds; each
   round is one `do_bench` median with the L2 flushed, and the same op timed device-only right after it (its
   launches queued ahead, so a small shape's host cost per call cannot fall inside the timed span). Per shape and
   for each timing: the median and best of the rounds, the spread (median over best, a bimodal shape shows
   here) and cuBLAS's median over ours.
2. Casts, eager: every cast kernel called as a user calls it, timed per call with the L2 flushed (fp8bench's
   timer), at shapes of 32 MB and more: GB/s of the bytes the kernels move, as % of a 2 GB copy's bandwidth and
   of a copy of the same bytes timed the same way (which pays the flush's write-back as the cast does), with the
   same call replayed from a CUDA graph beside it (the launches and allocations taken out). The eager timing
   stays a measure of the GPU only while the host enqueues an iteration (flush, event, call, event) faster than
   the GPU runs it: each cell also runs that loop once more and records the host's and the GPU's time per
   iteration, and a cell whose host took at least `HOST_PACED` of the GPU's time (`host_paced`) is marked: the
   GPU waited for that host, so its eager figure may hold host time. Beside it, the same loop device-only
   (`time_device_only`: batches of iterations queued behind a GPU sleep, so the host is ahead as in a GPU-bound
   training step and no kernel waits for its launch), against a same-bytes copy timed that way too: the GPU
   time such a step pays for the call, its kernels and the gaps between them, while the host's cost per call
   is part 3's figure.
3. Host cost: wall time per call at a shape whose kernels take a few microseconds, what each call costs the CPU;
   a call is GPU-bound only while this stays under its kernels' time.
4. Weight-gradient GEMM rounds: per linear of Llama-2-7B (and gpt-125m's qkv), dW = dYᵀ·X with both operands in
   1x128 groups along the tokens, the Gluon kernel (`gemm_blockwise_gluon_wgrad`, what the backend runs on
   sm_90 since 7c8a8fb) beside the Triton one (`gemm_blockwise_wgrad`), interleaved as in 1, each with its SQNR
   against the dequantized FP32 product. A shape whose kernel fails is recorded with its error; the others
   still run.

Usage on the GPU box: python3 scripts/recipe_bench.py [--out FILE.json] [--rounds N] [--only gemm,cast,host,wgrad]
Anywhere, the Markdown tables of a recorded file: python3 scripts/recipe_bench.py --markdown FILE.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from triton.testing import do_bench

from fp8bench.analysis.calibrate import copy_gbps, copy_op
from fp8bench.backends import get_backend
from fp8bench.core.measure import DEVICE_ONLY_BATCH, L2Flusher, time_device_only, time_fn
from fp8bench.core.types import GemmRole
from fp8bench.report.kernel_tables import HOST_PACED, device_only_summary, markdown
from fp8bench.workloads.kernel_bench import GEMMS, e4m3_recipe, wgrad_shapes

SHAPES = {**GEMMS, "4096^3": (4096, 4096, 4096), "2048^3": (2048, 2048, 2048)}
CAST_SHAPES = [(4096, 4096), (8192, 4096), (8192, 8192), (8192, 11008), (8192, 14336)]
"""BF16 inputs of 32 MB (Llama-2-7B's hidden at 4096 tokens) to 224 MB (Llama-3-8B's MLP at 8192 tokens)."""


def gemm_rounds(rounds: int) -> list[dict]:
    rows = []
    for name, (m, n, k) in SHAPES.items():
        a = torch.randn(m, k, device="cuda").bfloat16()
        b = torch.randn(n, k, device="cuda").bfloat16()
        ops = {impl: get_backend(impl).gemm(a, b, GemmRole.FPROP, e4m3_recipe(impl, "blockwise"))
               for impl in ("triton", "torch")}
        ops["triton"].kernel_only()  # the Gluon kernel's per-shape tuning, before any timing
        times, dev = _rounds({impl: op.kernel_only for impl, op in ops.items()}, rounds, device_only=True)
        flops = 2.0 * m * n * k
        row = {"shape": name, "mnk": [m, n, k], "ran": ops["triton"].ran}
        for impl, label in (("triton", "ours"), ("torch", "cublas")):
            med, best = statistics.median(times[impl]), min(times[impl])
            row[label] = {"rounds_ms": times[impl], "median_tflops": flops / med / 1e9,
                          "best_tflops": flops / best / 1e9, "median_over_best": med / best}
        row["ratio_to_cublas"] = statistics.median(times["torch"]) / statistics.median(times["triton"])
        for impl, label in (("triton", "ours"), ("torch", "cublas")):
            row[label] |= device_only_summary(dev[impl], flops)
        ours, cublas = (row[label]["device_only_median_tflops"] for label in ("ours", "cublas"))
        row["device_only_ratio_to_cublas"] = ours / cublas if ours and cublas else None  # cuBLAS's time / ours
        rows.append(row)
        print(f"{name:>24} ours {row['ours']['median_tflops']:6.0f} TFLOPS (best {row['ours']['best_tflops']:5.0f},"
              f" median/best {row['ours']['median_over_best']:.3f})  cuBLAS {row['cublas']['median_tflops']:6.0f}"
              f" (median/best {row['cublas']['median_over_best']:.3f})  ratio {row['ratio_to_cublas']:.3f}; device-only"
              + (f" ours {row['ours']['device_only_median_tflops']:6.0f} (median/best "
                 f"{row['ours']['device_only_median_over_best']:.3f}) cuBLAS "
                 f"{row['cublas']['device_only_median_tflops']:6.0f} ratio {row['device_only_ratio_to_cublas']:.3f}"
                 if row["device_only_ratio_to_cublas"] else " not measured (the host could not get ahead)"),
              flush=True)
        del ops, a, b
        torch.cuda.empty_cache()
    ratios = [r["ratio_to_cublas"] for r in rows]
    print(f"GEMM: median ratio to cuBLAS {statistics.median(ratios):.3f}, lowest {min(ratios):.3f}; widest "
          f"median/best {max(r['ours']['median_over_best'] for r in rows):.3f}", flush=True)
    measured = [r for r in rows if r["device_only_ratio_to_cublas"]]
    if measured:
        ratios = [r["device_only_ratio_to_cublas"] for r in measured]
        print(f"GEMM device-only: median ratio to cuBLAS {statistics.median(ratios):.3f}, lowest {min(ratios):.3f}; "
              f"widest median/best {max(r['ours']['device_only_median_over_best'] for r in measured):.3f}; "
              f"{len(rows) - len(measured)} shapes not measured", flush=True)
    return rows


ROUND_MS = 100.0
"""GPU time of one device-only round per op, as do_bench's `rep`, at most DEVICE_ONLY_BATCH iterations: a shape
under 2 ms a call gets less (about 1 ms of iterations at 2048³, 6 ms at 4096³)."""


def _rounds(ops: dict, rounds: int, device_only: bool = False) -> tuple[dict[str, list[float]], dict | None]:
    """`rounds` do_bench medians of each op, the order alternating between rounds; with `device_only`, each
    round also times each op device-only (`time_device_only`, the L2 flushed, up to ROUND_MS of iterations
    queued behind a GPU sleep), its median kept, or None where the host could not get ahead. do_bench enqueues flush, event, call, event per iteration
    with the host's time in between: where a call's host time exceeds the flush's GPU time the GEMM waits
    for its launch inside the timed span (2048³ at 20 µs a call, its rounds read 0.30x of cuBLAS on two boxes,
    recipe_bench_88f89ad.json and recipe_bench_e83c31e.json, and 0.49x on a third, recipe_bench_gemm_6ff10d9.json),
    so there the device-only rounds are the kernels' own figure. At large shapes do_bench's are: a device-only
    round is a short batch right after the GPU idled through the sleep, and under the H200's power cap it read
    0-12% more TFLOPS than the sustained rounds (recipe_bench_gemm_300739f.json; within 3% on the shapes of 2 ms
    and more a call), the clocks not yet down to their level under load. Each device-only batch follows its
    op's do_bench round, so since 300739f the next do_bench round starts after that batch (and its sleep)."""
    times: dict[str, list[float]] = {impl: [] for impl in ops}
    dev: dict[str, list[float]] | None = {impl: [] for impl in ops} if device_only else None
    for r in range(rounds):
        for impl in (ops if r % 2 == 0 else reversed(list(ops))):
            times[impl].append(do_bench(ops[impl], warmup=25, rep=100, return_mode="median"))
            if dev is not None:
                batch = max(2, min(DEVICE_ONLY_BATCH, math.ceil(ROUND_MS / times[impl][-1])))
                t = time_device_only(ops[impl], device=torch.device("cuda"), warmup=2, batches=1, batch=batch,
                                     flush_l2=True)
                dev[impl].append(t.median_ms if t else None)
    return times, dev


def _wgrad_row(name: str, m: int, n: int, k: int, rounds: int) -> dict:
    from fp8bench_kernels.gemm_blockwise_gluon import gemm_blockwise_gluon_wgrad
    from fp8bench_kernels.gemm_blockwise_wgrad import gemm_blockwise_wgrad, gemm_blockwise_wgrad_reference
    from fp8bench_kernels.quantize_blockwise import quantize_blockwise

    from fp8bench.core.numerics import sqnr_db

    a, sa = quantize_blockwise(torch.randn(m, k, device="cuda").bfloat16(), (1, 128), m_major_scales=True)
    b, sb = quantize_blockwise(torch.randn(n, k, device="cuda").bfloat16(), (1, 128), m_major_scales=True)
    ops = {"gluon": lambda: gemm_blockwise_gluon_wgrad(a, sa, b, sb),
           "triton": lambda: gemm_blockwise_wgrad(a, sa, b, sb)}
    ref = gemm_blockwise_wgrad_reference(a, sa, b, sb)
    sqnr = {impl: sqnr_db(ref, op().float()) for impl, op in ops.items()}  # tunes both before any timing
    del ref
    times, _ = _rounds(ops, rounds)
    row: dict = {"shape": name, "mnk": [m, n, k]}
    for impl in ops:
        med, best = statistics.median(times[impl]), min(times[impl])
        row[impl] = {"rounds_ms": times[impl], "median_tflops": 2.0 * m * n * k / med / 1e9,
                     "median_over_best": med / best, "sqnr_db": sqnr[impl]}
    row["ratio_to_triton"] = statistics.median(times["triton"]) / statistics.median(times["gluon"])
    return row


def wgrad_rounds(rounds: int) -> list[dict]:
    rows = []
    for name, (m, n, k) in wgrad_shapes().items():
        try:
            row = _wgrad_row(name, m, n, k, rounds)
            print(f"{name:>24} gluon {row['gluon']['median_tflops']:6.0f} TFLOPS ({row['gluon']['sqnr_db']:.1f} dB)"
                  f"  triton {row['triton']['median_tflops']:6.0f} ({row['triton']['sqnr_db']:.1f} dB)  ratio "
                  f"{row['ratio_to_triton']:.3f}", flush=True)
        except Exception as exc:  # noqa: BLE001 - a kernel that fails on a shape is recorded, the rest still run
            row = {"shape": name, "mnk": [m, n, k], "error": f"{type(exc).__name__}: {exc}"}
            print(f"{name:>24} failed: {row['error']}", flush=True)
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


def cast_calls(x: torch.Tensor) -> dict:
    """name: (eager call, bytes its kernels move)."""
    from fp8bench_kernels import quantize_blockwise as qb
    from fp8bench_kernels import quantize_blockwise_gluon as qg
    from fp8bench_kernels import quantize_current as qc
    from fp8bench_kernels import quantize_mx as qm

    row_bytes = qb.bytes_moved(x, (1, 128))
    return {
        "current+transpose": (lambda: qc.quantize_current(x), qc.bytes_moved(x)),
        "blockwise 1x128": (lambda: qb.quantize_blockwise(x, (1, 128), m_major_scales=True), row_bytes),
        "blockwise 128x128": (lambda: qb.quantize_blockwise(x, (128, 128)), qb.bytes_moved(x, (128, 128))),
        # both layouts, from one read of X (the Gluon kernel since 84e0e41). Earlier files counted what the
        # Triton kernels moved: for an activation X read once per layout (2n more), for a weight its one read
        # (recipe_bench_casts_f5e8879.json and earlier: n more, Y read again and Yᵀ written by a transposing copy)
        "blockwise 1x128 both": (lambda: qb.quantize_blockwise_both(x), qg.bytes_moved(x, weight=False)),
        "blockwise 128x128 both": (lambda: qb.quantize_blockwise_both(x, weight=True), qg.bytes_moved(x, weight=True)),
        "mx": (lambda: qm.quantize_mx(x), qm.bytes_moved(x)),
    }


CAST_TIMER = dict(device=torch.device("cuda"), warmup=10, iters=5000, min_samples=100, max_time_s=0.3, flush_l2=True)
PACE_ITERATIONS = 1000
"""Iterations of the loop `eager_pace` times (`HOST_PACED` says how its two spans are read)."""
def eager_pace(fn, flush: L2Flusher, iterations: int = PACE_ITERATIONS) -> tuple[float, float]:
    """(host µs, GPU µs) per iteration of the eager timing's loop (`time_fn`'s: the L2 flushed, events around
    `fn`, no sync between iterations): the host's wall time to enqueue them, the GPU's from the first start
    event to the last end event."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iterations)]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(iterations):
        flush()
        starts[i].record()
        fn()
        ends[i].record()
    host = time.perf_counter() - t0
    torch.cuda.synchronize()
    return 1e6 * host / iterations, 1e3 * starts[0].elapsed_time(ends[-1]) / iterations


def same_bytes_copy_gbps(nbytes: int) -> tuple[float, float | None]:
    """GB/s of a copy moving `nbytes` (half read, half written), called and timed as the casts are: eager, the L2
    flushed by the same zeroing before each call, and device-only (None where the host could not get ahead). At
    32 MB a copy pays that flush's write-back and its ramp as a cast does (~74% of the 2 GB copy's bandwidth:
    results/h200-checks/l2_flush_probe_6c8d7e1.log)."""
    copy = copy_op(torch.device("cuda"), nbytes // 2)
    eager = time_fn(copy, **CAST_TIMER)
    device_only = time_device_only(copy, device=torch.device("cuda"), flush_l2=True)
    return nbytes / eager.median_ms / 1e6, (nbytes / device_only.median_ms / 1e6 if device_only else None)


def casts(copy: float) -> list[dict]:
    """Each cell's GB/s as % of the 2 GB copy (`copy`) and of a copy of the same bytes timed the same way."""
    rows = []
    flush = L2Flusher()
    for m, k in CAST_SHAPES:
        x = torch.randn(m, k, device="cuda").bfloat16()
        same_copy: dict[int, float] = {}
        same_copy_device_only: dict[int, float | None] = {}
        for name, (fn, nbytes) in cast_calls(x).items():
            fn()  # autotune outside the timing
            eager_timing = time_fn(fn, **CAST_TIMER)
            eager = eager_timing.median_ms
            host_us, gpu_us = eager_pace(fn, flush)
            graph = time_fn(fn, cuda_graph=True, **CAST_TIMER).median_ms
            device_only = time_device_only(fn, device=torch.device("cuda"), flush_l2=True)
            if nbytes not in same_copy:
                same_copy[nbytes], same_copy_device_only[nbytes] = same_bytes_copy_gbps(nbytes)
            row = {"kernel": name, "shape": [m, k], "input_mb": x.numel() * 2 / 2**20, "bytes": nbytes,
                   "eager_ms": eager, "eager_quartiles_ms": statistics.quantiles(eager_timing.samples_ms, n=4,
                                                                                method="inclusive"),
                   "eager_gbps": nbytes / eager / 1e6, "graph_ms": graph,
                   "graph_gbps": nbytes / graph / 1e6, "same_bytes_copy_gbps": same_copy[nbytes],
                   "loop_host_us": host_us, "loop_gpu_us": gpu_us, "host_paced": host_us >= HOST_PACED * gpu_us}
            row["eager_pct_of_copy"] = 100 * row["eager_gbps"] / copy
            row["graph_pct_of_copy"] = 100 * row["graph_gbps"] / copy
            row["eager_pct_of_same_bytes_copy"] = 100 * row["eager_gbps"] / same_copy[nbytes]
            # None where the host could not get ahead (time_device_only): the cell then says so, not a figure
            copy_dev = same_copy_device_only[nbytes]
            row["device_only_ms"] = device_only.median_ms if device_only else None
            row["device_only_gbps"] = nbytes / device_only.median_ms / 1e6 if device_only else None
            row["same_bytes_copy_device_only_gbps"] = copy_dev
            row["device_only_pct_of_same_bytes_copy"] = (100 * row["device_only_gbps"] / copy_dev
                                                         if device_only and copy_dev else None)
            rows.append(row)
            print(f"{name:>24} {m}x{k} ({row['input_mb']:.0f} MB): eager {row['eager_gbps']:6.0f} GB/s "
                  f"{row['eager_pct_of_copy']:5.1f}% of copy, {row['eager_pct_of_same_bytes_copy']:5.1f}% of a "
                  f"same-bytes copy ({same_copy[nbytes]:.0f}); graph {row['graph_gbps']:6.0f} GB/s "
                  f"{row['graph_pct_of_copy']:5.1f}%; loop per iteration: host {host_us:.1f} µs, GPU {gpu_us:.1f} µs"
                  + (" (host-paced)" if row["host_paced"] else "") + "; device-only "
                  + (f"{row['device_only_gbps']:6.0f} GB/s " if row["device_only_gbps"] else
                     "not measured (the host could not get ahead) ")
                  + (f"{row['device_only_pct_of_same_bytes_copy']:5.1f}% of a same-bytes copy ({copy_dev:.0f})"
                     if row["device_only_pct_of_same_bytes_copy"] else ""), flush=True)
        del x
        torch.cuda.empty_cache()
    lowest = min(rows, key=lambda r: r["eager_pct_of_copy"])
    lowest_same = min(rows, key=lambda r: r["eager_pct_of_same_bytes_copy"])
    print(f"casts: lowest eager {lowest['eager_pct_of_copy']:.1f}% of copy ({lowest['kernel']} at "
          f"{lowest['shape']}); lowest {lowest_same['eager_pct_of_same_bytes_copy']:.1f}% of a same-bytes copy "
          f"({lowest_same['kernel']} at {lowest_same['shape']})", flush=True)
    dev = [r["device_only_pct_of_same_bytes_copy"] for r in rows]
    print(f"casts device-only: {sum(d is not None and d >= 80 for d in dev)} of {len(rows)} cells at 80% or more of "
          f"a same-bytes copy timed so; lowest {min((d for d in dev if d is not None), default=0):.1f}%; "
          f"{dev.count(None)} not measured", flush=True)
    return rows


def host_us_per_call(fn, calls: int, warmup: int = 20) -> float:
    """Wall µs per call of `fn` over `calls` calls in a loop, after `warmup`: where its kernels take
    microseconds the queue never fills, so this is the host's cost of a call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def host_cost(calls: int = 300, rounds: int = 4, profile: tuple[str, ...] = ()) -> list[dict]:
    """Wall time per call where the kernels take microseconds: the queue never fills, so this is the CPU's
    cost of one call (Python, allocations, launches). Each op is timed with its kernels launched directly
    (`Launcher.direct`, the default) and through Triton's dispatch, in rounds that alternate which goes first
    (an even number: each goes first equally often; the host's speed drifts too); the median round of each
    is kept. Each op named in `profile` is also run under cProfile (direct launches), its most expensive
    functions printed."""
    from fp8bench_kernels._launch import Launcher

    rows = []
    x = torch.randn(256, 256, device="cuda").bfloat16()
    ops = dict((name, fn) for name, (fn, _) in cast_calls(x).items())
    for impl in ("triton", "torch"):
        op = get_backend(impl).gemm(x, x, GemmRole.FPROP, e4m3_recipe(impl, "blockwise"))
        ops[f"gemm blockwise {impl}"] = op.kernel_only

    for name, fn in ops.items():
        times: dict[bool, list[float]] = {True: [], False: []}
        for r in range(rounds):
            for direct in ((True, False) if r % 2 == 0 else (False, True)):
                Launcher.direct = direct
                times[direct].append(host_us_per_call(fn, calls))
        Launcher.direct = True
        direct_us, triton_us = statistics.median(times[True]), statistics.median(times[False])
        rows.append({"op": name, "host_us_per_call": direct_us, "host_us_per_call_via_triton": triton_us})
        print(f"{name:>24} host {direct_us:6.1f} µs per call ({triton_us:6.1f} through Triton's dispatch)",
              flush=True)
        if name in profile:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            prof.runcall(lambda fn=fn: [fn() for _ in range(calls)])
            pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    return rows


def main() -> int:
    if sys.argv[1:2] == ["--markdown"]:
        print(markdown(json.loads(Path(sys.argv[2]).read_text())))
        return 0
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=Path("recipe_bench.json"))
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--only", default="host,cast,gemm,wgrad", help="comma-separated parts: host, cast, gemm, wgrad")
    ns = p.parse_args()
    parts = set(ns.only.split(","))
    out: dict = {"device": torch.cuda.get_device_name(0)}
    copy = copy_gbps(torch.device("cuda"), 2 * 1024**3, 0.3)
    out["copy_gbps"] = copy
    print(f"copy bandwidth: {copy:.0f} GB/s", flush=True)
    if "host" in parts:
        out["host"] = host_cost(profile=("gemm blockwise triton", "blockwise 1x128 both", "current+transpose"))
    if "cast" in parts:
        out["casts"] = casts(copy)
    if "gemm" in parts:
        out["gemm"] = gemm_rounds(ns.rounds)
    if "wgrad" in parts:
        out["wgrad"] = wgrad_rounds(ns.rounds)
    ns.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
