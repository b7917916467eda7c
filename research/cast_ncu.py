"""What holds the two-layout casts below copy speed? Nsight Compute's counters for each cast kernel and a copy.

The cast line (`scripts/recipe_bench.py --only cast`) times the kernels and divides bytes by time; it cannot say
why the along-M cast (an activation's Yᵀ) runs at 73-75% of a same-bytes copy where the 1x128 cast runs at
93-96%, or what limits the weight's two-layout cast. This script is the program that `ncu` profiles: each cast
of `kernels/` (autotuned first, outside the profiled range; the two-layout ones are Gluon kernels since 84e0e41),
the Triton two-layout kernels beside them, and a copy of the input as a kernel (x * 1), called once each per
shape between `cudaProfilerStart` and `cudaProfilerStop`, so `ncu --profile-from-start off` records exactly those
kernels with DRAM throughput, achieved occupancy, warp stall reasons, L2 hit rates and shared-memory bank
conflicts. ncu replays each kernel with the caches flushed (its default `--cache-control all`); leave the clocks
alone (`--clock-control none`), as the timers do.

Usage on the GPU box (ncu is on PATH there):
    ncu --clock-control none --profile-from-start off --set full -o casts python3 research/cast_ncu.py
    ncu --import casts.ncu-rep --page raw --csv > casts_raw.csv
    python3 research/cast_ncu.py --summarize casts_raw.csv   # per kernel: the counters that decide it
"""

from __future__ import annotations

import csv
import re
import sys

SHAPES = [(4096, 4096), (8192, 4096)]

# raw-page metrics (ncu --page raw) shown per kernel, and their short names
SUMMARY = {
    "gpu__time_duration.sum": "time",
    "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": "dram%",
    "l1tex__throughput.avg.pct_of_peak_sustained_elapsed": "l1/shared%",
    "dram__bytes_read.sum": "read",
    "dram__bytes_write.sum": "written",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy%",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical%",
    "launch__registers_per_thread": "regs",
    "launch__occupancy_limit_registers": "blocks/SM(regs)",
    "launch__occupancy_limit_shared_mem": "blocks/SM(smem)",
    "lts__t_sector_hit_rate.pct": "L2 hit%",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "smem ld conflicts",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": "smem st conflicts",
    "smsp__issue_active.avg.pct_of_peak_sustained_active": "issue%",
}
STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+)_per_issue_active\.ratio$")


def profile() -> None:
    import torch
    from act_cast_probe import along_m_call, weight_call  # research/: the script's own folder
    from fp8bench_kernels import quantize_blockwise as qb

    calls = {}
    for m, k in SHAPES:
        x = torch.randn(m, k, device="cuda").bfloat16()
        out = torch.empty_like(x)
        calls[f"{m}x{k}"] = [
            # an elementwise kernel, not copy_ (a cudaMemcpy, which ncu does not profile)
            ("copy", lambda x=x, out=out: torch.mul(x, 1, out=out)),
            ("1x128", lambda x=x: qb.quantize_blockwise(x, (1, 128), m_major_scales=True)),
            ("1x128 both (Gluon, one kernel)", lambda x=x: qb.quantize_blockwise_both(x)),
            ("along-M (Triton, the interpreter's second kernel)", lambda x=x: along_m_call(x, 64, 4)),
            ("128x128", lambda x=x: qb.quantize_blockwise(x, (128, 128))),
            ("128x128 both (Gluon)", lambda x=x: qb.quantize_blockwise_both(x, weight=True)),
            ("128x128 both (Triton, two passes)", lambda x=x: weight_call(x, 64, 64, 8)),
        ]
        for _, fn in calls[f"{m}x{k}"]:
            fn()  # autotune outside the profiled range
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for shape, fns in calls.items():
        for name, fn in fns:
            torch.cuda.nvtx.range_push(f"{name} {shape}")
            fn()
            torch.cuda.nvtx.range_pop()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print("profiled:", ", ".join(f"{n} {s}" for s, fns in calls.items() for n, _ in fns), file=sys.stderr)


def summarize(path: str) -> None:
    """One block per profiled kernel from ncu's raw page: the SUMMARY metrics, then the five largest warp stall
    reasons (warps stalled per issued instruction)."""
    lines = [line for line in open(path) if line.startswith('"')]
    header, units, *rows = list(csv.reader(lines))
    unit = dict(zip(header, units, strict=True))
    for row in rows:
        r = dict(zip(header, row, strict=True))
        print(f"{r.get('ID', '?'):>3} {r.get('Kernel Name', '?')[:48]} grid {r.get('Grid Size', '?')} "
              f"block {r.get('Block Size', '?')}")
        print("    " + "  ".join(f"{short}={r[full]}{unit.get(full, '')}" for full, short in SUMMARY.items()
                                 if r.get(full)))
        stalls = sorted(((float(v.replace(",", "")), STALL.match(k).group(1)) for k, v in r.items()
                         if STALL.match(k) and v.replace(",", "").replace(".", "").isdigit()), reverse=True)[:5]
        print("    stalls: " + ", ".join(f"{name}={value:.2f}" for value, name in stalls))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--summarize":
        summarize(sys.argv[2])
    else:
        profile()
