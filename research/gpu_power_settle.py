"""How long a GPU takes to reach the clocks it holds under sustained load, and whether a filler keeps them there
(issue: regression detection that engineers trust).

On the H200, a BF16 GEMM's per-iteration times step down through discrete clock levels during a 40-iteration
run (1.86 → 2.04 → 2.17 ms), so a run's median depended on where the steps fell and moved ~7% between
processes. This script measures, per operation, after an idle pause:
- the settling curve: back-to-back iterations for `--seconds`, medians per 50 ms window;
- fillers in the settled state: the op alone against the op followed by an idle wait (`torch.cuda._sleep`) or
  by tensor-core work (`fp8bench_kernels.tensor_core_load`) sized to 3% and 10% of the op, in interleaved
  blocks; the fraction each actually added.

Usage (GPU): python3 research/gpu_power_settle.py [--seconds 2] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from fp8bench_kernels.tensor_core_load import make_operand, tensor_core_load

from fp8bench.core.measure import event_samples


def operations(dev):
    g = torch.Generator(device=dev).manual_seed(0)
    m, n, k = 8192, 22016, 4096  # Llama-2-7B gate_up fprop at 8192 tokens
    a = torch.randn(m, k, generator=g, device=dev).bfloat16()
    b = torch.randn(n, k, generator=g, device=dev).bfloat16()
    a8, b8 = (a * 4).to(torch.float8_e4m3fn), (b * 4).to(torch.float8_e4m3fn)
    one = torch.ones((), device=dev)
    src = torch.empty(1 << 28, device=dev)
    dst = torch.empty_like(src)
    return {
        "bf16_gemm_8192x22016x4096": lambda: a @ b.t(),
        "fp8_gemm_8192x22016x4096": lambda: torch._scaled_mm(a8, b8.t(), scale_a=one, scale_b=one,
                                                             out_dtype=torch.bfloat16),
        "copy_1GiB": lambda: dst.copy_(src),
    }


def settle_curve(fn, seconds):
    fn()
    torch.cuda.synchronize()
    one = statistics.median(event_samples(fn, 3))
    times = event_samples(fn, max(10, int(seconds * 1e3 / one)))
    out, t, window = [], 0.0, []
    for x in times:
        window.append(x)
        t += x
        if sum(window) >= 50.0:
            out.append((round(t, 1), round(statistics.median(window), 4)))
            window = []
    return out


def filler_check(fn, rounds=4, block_ms=150.0):
    dev = torch.device("cuda")
    a = make_operand(dev)
    programs = torch.cuda.get_device_properties(dev).multi_processor_count
    buf = torch.empty(programs, a.shape[0], a.shape[0], device=dev)
    event_samples(fn, int(1000 / statistics.median(event_samples(fn, 3))))  # settle ~1 s
    op_ms = statistics.median(event_samples(fn, 20))
    lo, hi = (statistics.median(event_samples(lambda n=n: tensor_core_load(a, n, programs, buf), 20)) for n in (256, 1024))
    slope, icpt = (hi - lo) / 768, lo - 256 * (hi - lo) / 768
    sleep_probe = statistics.median(event_samples(lambda: torch.cuda._sleep(1_000_000), 5))
    kinds = {"alone": fn}
    for frac in (0.03, 0.10):
        n_load = max(1, round((frac * op_ms - icpt) / slope))
        cycles = int(frac * op_ms / sleep_probe * 1_000_000)
        kinds[f"load{int(frac * 100)}"] = lambda n=n_load: (fn(), tensor_core_load(a, n, programs, buf))
        kinds[f"sleep{int(frac * 100)}"] = lambda c=cycles: (fn(), torch.cuda._sleep(c))
    per = {k: [] for k in kinds}
    n = max(5, int(block_ms / op_ms))
    for _ in range(rounds):
        for k, f in kinds.items():
            per[k] += event_samples(f, n)
    alone = statistics.median(per["alone"])
    return {"op_ms": round(op_ms, 4), "load_ms_per_iter": round(slope, 6), "load_launch_ms": round(icpt, 4),
            "added_pct": {k: round(100 * (statistics.median(v) / alone - 1), 2) for k, v in per.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--pause", type=float, default=2.0, help="idle seconds before each curve")
    ap.add_argument("--json")
    a = ap.parse_args()
    dev = torch.device("cuda")
    result = {"device": torch.cuda.get_device_name(), "ops": {}}
    for name, fn in operations(dev).items():
        time.sleep(a.pause)
        curve = settle_curve(fn, a.seconds)
        fill = filler_check(fn)
        result["ops"][name] = {"curve_ms": curve, **fill}
        print(name, "curve:", " ".join(f"{t:.0f}:{m:.3f}" for t, m in curve[:12]), "...",
              " ".join(f"{t:.0f}:{m:.3f}" for t, m in curve[-4:]))
        print("   fillers (% added to the op):", fill["added_pct"], "op", fill["op_ms"], "ms", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
