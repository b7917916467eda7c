"""What the blockwise GEMMs do per clock: each runs back to back for a few seconds while NVML samples the SM
clock, board power and throttle reasons, on random operands and on all-zero ones.

Why: on the H200 a sustained FP8 GEMM of random data draws the 700 W cap, so the SM clock drops to ~1.4-1.5 GHz
and TFLOPS follow the energy per FLOP as much as the schedule. TFLOPS per GHz of median SM clock separates the
two: the schedule's efficiency (how many tensor-core cycles the kernel keeps busy) from the clock the power
budget allows. Zeros toggle no datapath bits, so they draw far less power: a kernel much faster on zeros is
power-bound. `do_bench` (kernel_bench, the probes) times ~100 ms bursts, which start at higher clocks than these
sustained runs hold.

Kernels, all on the same quantized operands (A's scales M-major, as the triton backend quantizes them): cuBLAS
tensorwise and blockwise (torch backend), the Gluon kernel's unscaled structure (research/gluon_unscaled.py:
each K group waited for; with a per-row multiply of both accumulators each group; with 64 or 128 multiplies
per group on other registers, which ptxas places amid the warpgroup's own wgmmas; the first, second and last
also with the math warpgroups taking turns), and the Gluon kernel's
promote and rescale on 128x256 tiles with a persistent grid, with the math warpgroups taking turns at the tensor
cores (the kernel's default since e8337d4) and running free (before).

Usage: python3 research/gemm_power_probe.py OUT.json [--shape M N K] [--seconds 2] [--rounds 2]
                                              [--data random zeros]
Results (results/h200-kernels/): gemm_power.json (at 459d225), gemm_power_side.json (SIDE), gemm_power_turns.json
(at e8337d4, with the turns): a row per data, round and kernel.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time

import torch


def sampled_run(fn, flops: float, seconds: float, nvml, handle) -> dict:
    """Run `fn` back to back for `seconds`, sampling clock and power every 20 ms; the first quarter (the ramp
    into the power cap) is left out of the medians."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    samples: list[tuple[int, float, int]] = []
    stop = threading.Event()

    def sample():
        while not stop.is_set():
            samples.append((nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM),
                            nvml.nvmlDeviceGetPowerUsage(handle) / 1000,
                            nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle)))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    calls, deadline = 0, time.perf_counter() + seconds
    start.record()
    while time.perf_counter() < deadline:
        for _ in range(10):
            fn()
        calls += 10
        torch.cuda.synchronize()
    end.record()
    torch.cuda.synchronize()
    stop.set()
    sampler.join()
    tflops = flops / (start.elapsed_time(end) / calls) / 1e9
    tail = samples[len(samples) // 4:]
    mhz = sorted(s[0] for s in tail)[len(tail) // 2]
    reasons = 0
    for s in tail:
        reasons |= s[2]
    return {"tflops": round(tflops, 1), "sm_mhz_median": mhz, "sm_mhz_min": min(s[0] for s in tail),
            "power_w_median": round(sorted(s[1] for s in tail)[len(tail) // 2]),
            "throttle_reasons": hex(reasons), "tflops_per_ghz": round(tflops / mhz * 1000, 1)}


def kernels(a: torch.Tensor, b: torch.Tensor, zeros: bool) -> dict:
    from fp8bench_kernels import gemm_blockwise_gluon as gluon
    from fp8bench_kernels.quantize_blockwise import quantize_blockwise
    from gemm_variant_probe import cublas_blockwise
    from gluon_unscaled import unscaled_gluon_gemm
    from kernel_bench import recipe

    from fp8bench.backends import get_backend
    from fp8bench.core.types import GemmRole

    qa, sa = quantize_blockwise(a, (1, 128), True, m_major_scales=True)
    qb, sb = quantize_blockwise(b, (128, 128), True)
    if zeros:  # an all-zero block's scale is 448 / 1e-12: make them 1, so no kernel multiplies by huge numbers
        sa.fill_(1.0)
        sb.fill_(1.0)
    promote, rescale = gluon.Config(128, 128, 2, 3, True), gluon.Config(128, 128, 2, 3, False)
    return {
        "cublas tensorwise": get_backend("torch").gemm(a, b, GemmRole.FPROP, recipe("torch", "current")).kernel_only,
        "cublas blockwise": lambda: cublas_blockwise(qa, sa, qb, sb, False),
        "gluon unscaled (each group waited for)": lambda: unscaled_gluon_gemm(qa, qb, 0, 3, True, False),
        "gluon unscaled + per-row multiply": lambda: unscaled_gluon_gemm(qa, qb, 0, 3, True, True),
        "gluon unscaled + 64 multiplies amid its wgmmas": lambda: unscaled_gluon_gemm(qa, qb, 0, 3, True, side=1),
        "gluon unscaled + 128 multiplies amid its wgmmas": lambda: unscaled_gluon_gemm(qa, qb, 0, 3, True, side=2),
        "gluon unscaled, turns": lambda: unscaled_gluon_gemm(qa, qb, 0, 3, True, turns=True),
        "gluon unscaled + per-row multiply, turns": lambda: unscaled_gluon_gemm(qa, qb, 0, 3, True, True, turns=True),
        "gluon unscaled + 128 multiplies amid its wgmmas, turns": lambda: unscaled_gluon_gemm(qa, qb, 0, 3, True, side=2,
                                                                                          turns=True),
        "gluon promote 128x256": lambda: gluon.gemm_blockwise_gluon(qa, sa, qb, sb, promote, True),
        "gluon rescale 128x256": lambda: gluon.gemm_blockwise_gluon(qa, sa, qb, sb, rescale, True),
        "gluon promote 128x256, free-running": lambda: gluon.gemm_blockwise_gluon(
            qa, sa, qb, sb, promote._replace(pingpong=False), True),
        "gluon rescale 128x256, free-running": lambda: gluon.gemm_blockwise_gluon(
            qa, sa, qb, sb, rescale._replace(pingpong=False), True),
    }


def main() -> int:
    sys.path.insert(0, "scripts")
    import pynvml

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--shape", type=int, nargs=3, default=[8192, 8192, 8192], metavar=("M", "N", "K"))
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--data", nargs="+", choices=["random", "zeros"], default=["random", "zeros"])
    args = ap.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    m, n, k = args.shape
    flops = 2.0 * m * n * k
    rows: list[dict] = [{"power_limit_w": pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000,
                         "max_sm_mhz": pynvml.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_SM),
                         "mnk": args.shape}]
    for data in args.data:
        a = torch.randn(m, k, device="cuda").bfloat16()
        b = torch.randn(n, k, device="cuda").bfloat16()
        if data == "zeros":
            a.zero_()
            b.zero_()
        runs = kernels(a, b, data == "zeros")
        for rnd in range(args.rounds):  # rounds interleave the kernels, so drift hits each alike
            for name, fn in runs.items():
                row = {"data": data, "round": rnd, "kernel": name,
                       **sampled_run(fn, flops, args.seconds, pynvml, handle)}
                print(json.dumps(row), flush=True)
                rows.append(row)
                with open(args.out, "w") as f:
                    json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
