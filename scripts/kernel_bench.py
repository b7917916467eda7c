"""Tuning table for fp8bench's kernels on a GPU: every launch variant of each kernel (the GEMM's Gluon configs
and candidates on sm_90 too), next to TE's and torch's (cuBLAS) kernels for the same work, at the issue's
shapes. The sweeps (`fp8bench run workload=quantize|gemm backend=triton,te,torch`) are the recorded results;
this script is how the kernels' defaults were chosen.

Usage on the GPU box: python3 scripts/kernel_bench.py [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from triton.testing import do_bench

from fp8bench.analysis.calibrate import copy_gbps
from fp8bench.backends import get_backend
from fp8bench.core.types import GemmRole
from fp8bench.workloads.kernel_bench import GEMMS, e4m3_recipe


def ms(fn) -> float:
    return do_bench(fn, warmup=25, rep=200, return_mode="median")


def quantize_table(copy: float) -> list[dict]:
    from fp8bench_kernels import quantize_blockwise as qb
    from fp8bench_kernels import quantize_current as qc

    x = torch.randn(8192, 8192, device="cuda").bfloat16()
    rows = []

    def add(kernel, variant, nbytes, fn):
        t = ms(fn)
        rows.append({"kernel": kernel, "variant": variant, "ms": t, "gbps": nbytes / t / 1e6,
                     "pct_of_copy": 100 * nbytes / t / 1e6 / copy})

    cur = qc.bytes_moved(x)
    for config in qc.CONFIGS:
        label = "triton one launch {BLOCK_M}x{BLOCK_N} {num_warps} warps, {per_sm}/SM".format(**config)
        add("current+transpose", label + (", reversed" if config["reverse"] else ""), cur,
            lambda c=config: qc.quantize_current(x, config=c))
    for name, be in [("te", "te"), ("torch eager", "torch")]:
        op = get_backend(be).quantize(x, e4m3_recipe(be, "current"), False)
        add("current+transpose" if be == "te" else "current (no transpose)", name, op.bytes_moved, op.run)
    for block in [(1, 128), (128, 128)]:
        nb = qb.bytes_moved(x, block)
        add(f"blockwise {block[0]}x{block[1]}", "triton", nb, lambda b=block: qb.quantize_blockwise(x, b, True))
        tuned = qb._quantize_1x128_kernel if block == (1, 128) else qb._quantize_128x128_kernel
        rows[-1]["variant"] += f" {tuned.best_config}"
        for be in ("te", "torch"):
            op = get_backend(be).quantize(x, e4m3_recipe(be, "blockwise"), block == (128, 128))
            add(f"blockwise {block[0]}x{block[1]}", be, op.bytes_moved, op.run)
    return rows


def gemm_row(name: str, m: int, n: int, k: int) -> dict:
    """One shape: cuBLAS blockwise and tensorwise; on sm_90 the Gluon kernel as the `triton` backend runs it
    (tuned within each numerics) and each of its configs and CANDIDATES; the Triton kernel, autotuned and per
    config. Each of ours is checked against cuBLAS's result first."""
    from fp8bench_kernels.gemm_blockwise import CONFIGS, gemm_blockwise
    from fp8bench_kernels.gemm_blockwise_gluon import CANDIDATES, gemm_blockwise_gluon, runs_on
    from fp8bench_kernels.gemm_blockwise_gluon import CONFIGS as GLUON_CONFIGS
    from fp8bench_kernels.quantize_blockwise import quantize_blockwise

    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(n, k, device="cuda").bfloat16()
    # the scales cuBLAS's operands get from the torch backend's blockwise recipe (not powers of two), so the
    # check against its result compares accumulation only; A's M-major, as the triton backend quantizes them
    qa, sa = quantize_blockwise(a, (1, 128), m_major_scales=True)
    qb, sb = quantize_blockwise(b, (128, 128))
    flops = 2.0 * m * n * k
    row: dict = {"shape": name, "mnk": [m, n, k]}
    op = get_backend("torch").gemm(a, b, GemmRole.FPROP, e4m3_recipe("torch", "blockwise"))
    want = op.kernel_only().float()
    row["cublas_blockwise"] = flops / ms(op.kernel_only) / 1e9
    op = get_backend("torch").gemm(a, b, GemmRole.FPROP, e4m3_recipe("torch", "current"))
    row["cublas_tensorwise"] = flops / ms(op.kernel_only) / 1e9

    def timed(label, fn, rescale):
        try:
            got = fn().float()  # also tunes, before the timing
            err = ((got - want).norm() / want.norm()).item()
            # rescale sums in the tensor cores' accumulator, whose error grows with K: 0.014 from cuBLAS's
            # promoted result at K = 57344 on the H200, against ~0.002 for promote
            tolerance = 3e-2 if rescale else 1e-2
            row[label] = f"wrong: rel err {err:.3g} vs cuBLAS" if err > tolerance else flops / ms(fn) / 1e9
        except Exception as e:  # noqa: BLE001 - a config that fails to compile (registers, smem) is a row
            row[label] = f"failed: {type(e).__name__}: {str(e)[:120]}"

    if runs_on(a.device):
        for fast in (False, True):
            timed(f"gluon tuned {'rescale' if fast else 'promote'}",
                  lambda fast=fast: gemm_blockwise_gluon(qa, sa, qb, sb, fast_accum=fast), fast)
        for c in GLUON_CONFIGS + CANDIDATES:
            label = f"gluon {'promote' if c.promote else 'rescale'} {c.block_m}x{c.block_n} s{c.stages}"
            timed(label + (" (candidate)" if c in CANDIDATES else ""),
                  lambda c=c: gemm_blockwise_gluon(qa, sa, qb, sb, c, True), not c.promote)
    timed("triton_autotuned", lambda: gemm_blockwise(qa, sa, qb, sb), False)
    for c in CONFIGS:
        kw = c.kwargs
        timed(f"{'promote' if kw['PROMOTE'] else 'rescale'} {kw['BLOCK_M']}x{128 * kw['NSUB']} "
              f"w{c.num_warps} s{c.num_stages}", lambda c=c: gemm_blockwise(qa, sa, qb, sb, c), not kw["PROMOTE"])
    return row


def gemm_table() -> list[dict]:
    rows = []
    for name, mnk in GEMMS.items():
        rows.append(gemm_row(name, *mnk))
        print(json.dumps({k: (round(v) if isinstance(v, float) else v) for k, v in rows[-1].items()}), flush=True)
        torch.cuda.empty_cache()
    return rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=Path("kernel_bench.json"))
    ns = p.parse_args()
    copy = copy_gbps(torch.device("cuda"), 2 * 1024**3, 0.5)
    print(f"copy bandwidth: {copy:.0f} GB/s", flush=True)
    q = quantize_table(copy)
    for r in q:
        print(f"{r['kernel']:>24} {r['variant']:>44} {r['ms'] * 1000:8.1f} us {r['gbps']:7.0f} GB/s "
              f"{r['pct_of_copy']:5.1f}% of copy", flush=True)
    g = gemm_table()
    ns.out.write_text(json.dumps({"copy_gbps": copy, "quantize": q, "gemm": g}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
