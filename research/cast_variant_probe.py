"""Which structure makes the blockwise casts that write a transposed layout, and the MX cast, run at copy speed?

`scripts/recipe_bench.py --only cast` found the two-layout casts ("both") at 53.5-80% and the MX cast at 54-82% of
the 2 GB copy's bandwidth on the H200 at f5e8879, the one-layout 1x128 and 128x128 casts at 58-89%. Each
variant here is checked bit for bit against the kernels in `kernels/` and timed as the cast line times them
(fp8bench's timer, L2 flushed by zeroing before each call, replayed from a CUDA graph so only the kernels
count), beside an eager copy of the same number of bytes after the same flush (at 32 MB a copy itself reaches
~74% of the 2 GB copy after that flush: `results/h200-checks/l2_flush_probe_6c8d7e1.log`).

Variants:
- weight (128x128 blocks, Y and Yᵀ): the kernel in `kernels/` (at f5e8879: the whole block in registers, Yᵀ
  stored through `tl.trans`); the same with X loaded and Y, Yᵀ stored through TMA descriptors; and "passes":
  the block's amax from row chunks [SUB_M, 128], then X again (from L2) in column chunks [128, SUB_K], each
  stored as Y and transposed as Yᵀ ("rows": Y from a second row-chunk pass, Yᵀ from a third in columns).
- weight 1 (Y alone): the kernel in `kernels/` beside the passes.
- activation (1x128 groups along K into Y and along M into Yᵀ): the two kernels of `kernels/` (X read once per
  layout; timed against both byte counts), the along-M kernel with TMA, one kernel reading X once through TMA
  (both layouts from one 128x128 tile), and "passes": row chunks for Y, then column chunks (from L2) for Yᵀ.
- MX: tiles of rows x 32-element blocks (at f5e8879 the kernel ran 16 x 4).

The recorded file (`results/h200-recipe-blockwise/cast_variant_probe_f5e8879.json`, the kernels of f5e8879 as
"kernels/") timed its copies replayed from a graph, where a memcpy ran at 2.1-4.1 TB/s by size alone: its
percentages are not to be read; its times are. The copy is timed eager now.

Usage on the GPU box: python3 research/cast_variant_probe.py OUT.json
"""

from __future__ import annotations

import json
import sys

import torch
import triton
import triton.language as tl
from fp8bench_kernels import quantize_blockwise as qb
from fp8bench_kernels import quantize_mx as qm
from fp8bench_kernels._fp8 import e4m3_scale, exact_rcp, scale_to_e4m3
from triton.tools.tensor_descriptor import TensorDescriptor

from fp8bench.analysis.calibrate import copy_gbps
from fp8bench.core.measure import time_fn

SHAPES = [(4096, 4096), (8192, 4096), (8192, 8192), (8192, 14336)]
TIMER = dict(device=torch.device("cuda"), warmup=10, iters=2000, min_samples=50, max_time_s=0.2, flush_l2=True,
             cuda_graph=True)


@triton.jit
def weight_tma(x_desc, y_desc, yt_desc, s_ptr, n_groups):
    pm, pk = tl.program_id(0), tl.program_id(1)
    x = x_desc.load([pm * 128, pk * 128]).to(tl.float32)
    scale = e4m3_scale(tl.max(tl.max(tl.abs(x), axis=1), axis=0))
    q = scale_to_e4m3(x, scale)
    y_desc.store([pm * 128, pk * 128], q)
    yt_desc.store([pk * 128, pm * 128], tl.trans(q))
    tl.store(s_ptr + pm * n_groups + pk, exact_rcp(scale))


@triton.jit
def along_m_tma(x_desc, yt_desc, st_ptr, K, st_sk, st_sm, BLOCK_K: tl.constexpr):
    pm, pk = tl.program_id(0), tl.program_id(1)
    x = x_desc.load([pm * 128, pk * BLOCK_K]).to(tl.float32)
    scale = e4m3_scale(tl.max(tl.abs(x), axis=0))
    yt_desc.store([pk * BLOCK_K, pm * 128], tl.trans(scale_to_e4m3(x, scale[None, :])))
    cols = pk * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(st_ptr + cols * st_sk + pm * st_sm, exact_rcp(scale), mask=cols < K)


@triton.jit
def both_tma(x_desc, y_desc, yt_desc, s_ptr, st_ptr, M, K, s_sm, s_sg, st_sk, st_sm):
    pm, pk = tl.program_id(0), tl.program_id(1)
    x = x_desc.load([pm * 128, pk * 128]).to(tl.float32)
    a = tl.abs(x)
    row_scale = e4m3_scale(tl.max(a, axis=1))
    col_scale = e4m3_scale(tl.max(a, axis=0))
    y_desc.store([pm * 128, pk * 128], scale_to_e4m3(x, row_scale[:, None]))
    yt_desc.store([pk * 128, pm * 128], tl.trans(scale_to_e4m3(x, col_scale[None, :])))
    rows = pm * 128 + tl.arange(0, 128)
    cols = pk * 128 + tl.arange(0, 128)
    tl.store(s_ptr + rows * s_sm + pk * s_sg, exact_rcp(row_scale), mask=rows < M)
    tl.store(st_ptr + cols * st_sk + pm * st_sm, exact_rcp(col_scale), mask=cols < K)


@triton.jit
def weight_rows_passes(x_ptr, y_ptr, yt_ptr, s_ptr, M, K, stride_m, stride_k, n_groups,
                       SUB_M: tl.constexpr, SUB_K: tl.constexpr, TRANSPOSE: tl.constexpr):
    # pass 1: the block's amax over row chunks, nothing held; pass 2: X reloaded (from L2) by row chunks
    # [SUB_M, 128] into Y; pass 3 (TRANSPOSE): X again by column chunks [128, SUB_K] into Yᵀ. (Y and Yᵀ from one
    # column-chunk pass is the kernel in kernels/, run below at each chunk config.)
    pm, pk = tl.program_id(0), tl.program_id(1)
    cols = pk * 128 + tl.arange(0, 128)
    scale = e4m3_scale(qb.block_amax_by_rows(x_ptr, pm, pk, M, K, stride_m, stride_k, SUB_M))
    for r in tl.range(0, 128, SUB_M):
        rows = pm * 128 + r + tl.arange(0, SUB_M)
        mask = (rows[:, None] < M) & (cols[None, :] < K)
        x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_k, mask=mask, other=0.0)
        tl.store(y_ptr + rows[:, None] * K + cols[None, :], scale_to_e4m3(x.to(tl.float32), scale), mask=mask)
    if TRANSPOSE:
        rows = pm * 128 + tl.arange(0, 128)
        for c in tl.range(0, 128, SUB_K):
            ccols = pk * 128 + c + tl.arange(0, SUB_K)
            mask = (rows[:, None] < M) & (ccols[None, :] < K)
            x = tl.load(x_ptr + rows[:, None] * stride_m + ccols[None, :] * stride_k, mask=mask, other=0.0)
            tl.store(yt_ptr + ccols[:, None] * M + rows[None, :], tl.trans(scale_to_e4m3(x.to(tl.float32), scale)),
                     mask=tl.trans(mask))
    tl.store(s_ptr + pm * n_groups + pk, exact_rcp(scale))


@triton.jit
def act_passes(x_ptr, y_ptr, yt_ptr, s_ptr, st_ptr, M, K, stride_m, stride_k, s_sm, s_sg, st_sk, st_sm,
               SUB_M: tl.constexpr, SUB_K: tl.constexpr):
    # one 128x128 tile, both layouts: row chunks [SUB_M, 128] hold whole 1x128 groups (Y and its scales), then
    # column chunks [128, SUB_K] reloaded (from L2) hold whole 128x1 groups (Yᵀ and its scales)
    pm, pk = tl.program_id(0), tl.program_id(1)
    cols = pk * 128 + tl.arange(0, 128)
    for r in tl.range(0, 128, SUB_M):
        rows = pm * 128 + r + tl.arange(0, SUB_M)
        mask = (rows[:, None] < M) & (cols[None, :] < K)
        x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_k, mask=mask, other=0.0).to(tl.float32)
        scale = e4m3_scale(tl.max(tl.abs(x), axis=1))
        tl.store(y_ptr + rows[:, None] * K + cols[None, :], scale_to_e4m3(x, scale[:, None]), mask=mask)
        tl.store(s_ptr + rows * s_sm + pk * s_sg, exact_rcp(scale), mask=rows < M)
    rows = pm * 128 + tl.arange(0, 128)
    for c in tl.range(0, 128, SUB_K):
        ccols = pk * 128 + c + tl.arange(0, SUB_K)
        mask = (rows[:, None] < M) & (ccols[None, :] < K)
        x = tl.load(x_ptr + rows[:, None] * stride_m + ccols[None, :] * stride_k, mask=mask, other=0.0).to(tl.float32)
        scale = e4m3_scale(tl.max(tl.abs(x), axis=0))
        tl.store(yt_ptr + ccols[:, None] * M + rows[None, :], tl.trans(scale_to_e4m3(x, scale[None, :])), mask=tl.trans(mask))
        tl.store(st_ptr + ccols * st_sk + pm * st_sm, exact_rcp(scale), mask=ccols < K)


def weight_passes_call(x, sub_m, sub_k, warps, transpose=True, y_by_rows=False):
    """The weight cast in passes at one chunk config: Y and Yᵀ from one column-chunk pass (the kernel in
    kernels/, its JIT function launched untuned), or `y_by_rows` (this file's kernel)."""
    m, k = x.shape
    y = torch.empty((m, k), device=x.device, dtype=torch.float8_e4m3fn)
    yt = torch.empty((k, m), device=x.device, dtype=torch.float8_e4m3fn) if transpose else y
    s = torch.empty((m // 128, k // 128), device=x.device, dtype=torch.float32)
    args = (x, y, yt, s, m, k, x.stride(0), x.stride(1), k // 128)
    if y_by_rows:
        weight_rows_passes[(m // 128, k // 128)](*args, SUB_M=sub_m, SUB_K=sub_k, TRANSPOSE=transpose,
                                                 num_warps=warps)
    else:
        qb._quantize_128x128_both_kernel.fn[(m // 128, k // 128)](*args, SUB_M=sub_m, SUB_K=sub_k, POW2=False,
                                                                   num_warps=warps)
    return (y, s, yt, s.t().contiguous()) if transpose else (y, s)


def act_passes_call(x, sub_m, sub_k, warps):
    m, k = x.shape
    y = torch.empty((m, k), device=x.device, dtype=torch.float8_e4m3fn)
    yt = torch.empty((k, m), device=x.device, dtype=torch.float8_e4m3fn)
    s = qb.m_major_empty(m, k // 128, x.device)
    st = qb.m_major_empty(k, m // 128, x.device)
    act_passes[(m // 128, k // 128)](x, y, yt, s, st, m, k, x.stride(0), x.stride(1), s.stride(0), s.stride(1),
                                     st.stride(0), st.stride(1), SUB_M=sub_m, SUB_K=sub_k, num_warps=warps)
    return y, s, yt, st


def weight_tma_call(x, warps):
    m, k = x.shape
    y = torch.empty((m, k), device=x.device, dtype=torch.float8_e4m3fn)
    yt = torch.empty((k, m), device=x.device, dtype=torch.float8_e4m3fn)
    s = torch.empty((m // 128, k // 128), device=x.device, dtype=torch.float32)
    d = [TensorDescriptor.from_tensor(t, [128, 128]) for t in (x, y, yt)]
    weight_tma[(m // 128, k // 128)](*d, s, k // 128, num_warps=warps)
    return y, s, yt, s.t().contiguous()


def along_m_tma_call(x, block_k, warps):
    y, s = qb.quantize_blockwise(x, (1, 128), m_major_scales=True)
    m, k = x.shape
    yt = torch.empty((k, m), device=x.device, dtype=torch.float8_e4m3fn)
    st = qb.m_major_empty(k, m // 128, x.device)
    xd = TensorDescriptor.from_tensor(x, [128, block_k])
    ytd = TensorDescriptor.from_tensor(yt, [block_k, 128])
    along_m_tma[(m // 128, k // block_k)](xd, ytd, st, k, st.stride(0), st.stride(1), BLOCK_K=block_k,
                                          num_warps=warps)
    return y, s, yt, st


def both_tma_call(x, warps):
    m, k = x.shape
    y = torch.empty((m, k), device=x.device, dtype=torch.float8_e4m3fn)
    yt = torch.empty((k, m), device=x.device, dtype=torch.float8_e4m3fn)
    s = qb.m_major_empty(m, k // 128, x.device)
    st = qb.m_major_empty(k, m // 128, x.device)
    d = [TensorDescriptor.from_tensor(t, [128, 128]) for t in (x, y, yt)]
    both_tma[(m // 128, k // 128)](*d, s, st, m, k, s.stride(0), s.stride(1), st.stride(0), st.stride(1),
                                   num_warps=warps)
    return y, s, yt, st


def same(a, b) -> bool:
    return all(torch.equal(u.view(torch.uint8) if u.dtype == torch.float8_e4m3fn else u,
                           v.view(torch.uint8) if v.dtype == torch.float8_e4m3fn else v) for u, v in zip(a, b, strict=True))


def timed_gbps(fn, nbytes, **extra) -> float:
    fn()
    return nbytes / time_fn(fn, **{**TIMER, **extra}).median_ms / 1e6


def copy_gbps_of(nbytes) -> float:
    """A copy moving `nbytes` (read and write), eager: `copy_` of one dtype is a device memcpy, and replayed as a
    graph's memcpy node it ran at 2.1-4.1 TB/s by size alone (the recorded file's copy columns)."""
    return copy_gbps(torch.device("cuda"), nbytes // 2, 0.0, timer={**TIMER, "cuda_graph": False, "settle_ms": 50})


def shape_rows(m: int, k: int, big_copy: float) -> list[dict]:
    rows: list[dict] = []
    x = torch.randn(m, k, device="cuda").bfloat16()
    n = x.numel()
    weight_bytes = 4 * n + 4 * (m // 128) * (k // 128)
    act_one = qb.bytes_moved(x, (1, 128))  # read X, write Y and its scales
    act_fused = 4 * n + 8 * n // 128
    mx_bytes = qm.bytes_moved(x)
    one_bytes = qb.bytes_moved(x, (128, 128))
    copies = {b: copy_gbps_of(b) for b in sorted({weight_bytes, 2 * act_one, act_fused, mx_bytes, one_bytes})}

    def record(family, variant, fn, nbytes, ref=None):
        try:
            ok = None if ref is None else same(fn(), ref)
            gbps = timed_gbps(fn, nbytes)
            row = {"shape": [m, k], "family": family, "variant": variant, "bytes": nbytes, "gbps": gbps,
                   "pct_of_same_bytes_copy": 100 * gbps / copies[nbytes], "copy_gbps": copies[nbytes],
                   "pct_of_2gb_copy": 100 * gbps / big_copy, "time_us": nbytes / gbps / 1e3, "bit_exact": ok}
        except Exception as exc:  # noqa: BLE001 - a variant that fails to compile is recorded, the rest run
            row = {"shape": [m, k], "family": family, "variant": variant,
                   "error": f"{type(exc).__name__}: {exc}"[:300]}
        rows.append(row)
        if "error" in row:
            print(f"{m}x{k} {family:>10} {variant:>24}: {row['error']}", flush=True)
        else:
            print(f"{m}x{k} {family:>10} {variant:>24}: {row['time_us']:7.1f} µs {gbps:6.0f} GB/s "
                  f"{row['pct_of_same_bytes_copy']:5.1f}% of a same-bytes copy ({copies[nbytes]:.0f}), "
                  f"{row['pct_of_2gb_copy']:5.1f}% of 2 GB's, exact={ok}", flush=True)

    ref_w = qb.quantize_blockwise_both(x, weight=True)
    record("weight", "kernels/", lambda: qb.quantize_blockwise_both(x, weight=True), weight_bytes)
    for sm, sk, w in ((32, 32, 4), (32, 64, 4), (64, 32, 4), (32, 64, 8), (64, 64, 8), (16, 32, 4)):
        record("weight", f"passes m{sm} k{sk} w{w}", lambda sm=sm, sk=sk, w=w: weight_passes_call(x, sm, sk, w),
               weight_bytes, ref_w)
        record("weight", f"passes rows m{sm} k{sk} w{w}",
               lambda sm=sm, sk=sk, w=w: weight_passes_call(x, sm, sk, w, y_by_rows=True), weight_bytes, ref_w)
    ref_1 = qb.quantize_blockwise(x, (128, 128))
    record("weight 1", "kernels/", lambda: qb.quantize_blockwise(x, (128, 128)), one_bytes)
    for sm, w in ((16, 4), (32, 4), (32, 8), (64, 8)):
        record("weight 1", f"passes m{sm} w{w}",
               lambda sm=sm, w=w: weight_passes_call(x, sm, 32, w, transpose=False, y_by_rows=True), one_bytes, ref_1)
    for w in (4, 8, 16):
        record("weight", f"tma w{w}", lambda w=w: weight_tma_call(x, w), weight_bytes, ref_w)
    ref_a = qb.quantize_blockwise_both(x)
    record("activation", "kernels/ two passes", lambda: qb.quantize_blockwise_both(x), 2 * act_one)
    record("activation", "kernels/ two passes, 4n counted", lambda: qb.quantize_blockwise_both(x), act_fused)
    for bk, w in ((64, 4), (64, 8), (128, 8), (128, 16)):
        record("activation", f"along-m tma bk{bk} w{w}", lambda bk=bk, w=w: along_m_tma_call(x, bk, w),
               2 * act_one, ref_a)
    for w in (8, 16):
        record("activation", f"fused tma w{w}", lambda w=w: both_tma_call(x, w), act_fused, ref_a)
    for sm, sk, w in ((16, 32, 4), (32, 32, 4), (32, 64, 4), (32, 64, 8), (64, 64, 8), (16, 16, 4)):
        record("activation", f"passes m{sm} k{sk} w{w}", lambda sm=sm, sk=sk, w=w: act_passes_call(x, sm, sk, w),
               act_fused, ref_a)
    ref_mx = qm.quantize_mx(x)
    for bm, bpp in ((16, 4), (32, 4), (64, 4), (16, 8), (32, 8), (8, 16), (64, 2)):
        record("mx", f"bm{bm} bpp{bpp}", lambda bm=bm, bpp=bpp: qm.quantize_mx(x, bm, bpp), mx_bytes, ref_mx)
    return rows


def main(out_path: str) -> None:
    big_copy = copy_gbps_of(2 * 1024**3)
    print(f"copy of 2 GB: {big_copy:.0f} GB/s", flush=True)
    rows = []
    for m, k in SHAPES:
        rows += shape_rows(m, k, big_copy)
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "triton": triton.__version__, "copy_2gb_gbps": big_copy,
                   "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
