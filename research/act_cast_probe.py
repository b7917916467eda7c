"""Can an activation's two-layout cast (1x128 groups along K into Y, along M into Yᵀ) run in one launch, and faster?

At 7a1f962 `quantize_blockwise_both(x)` is two kernels, each reading X from HBM: the 1x128 cast (Y) and the
along-M cast (Yᵀ). On the H200 (`results/h200-recipe-blockwise/recipe_bench_casts_7a1f962.json`) the pair ran at
72-75% of a copy of the same bytes at 32 and 64 MB, eager. Earlier single-read forms (one 128x128 tile's row chunks
then its column chunks, or the whole tile through TMA: `research/cast_variant_probe.py`) were slower than the pair.

Variants, each checked bit for bit against `kernels/` and timed as `scripts/recipe_bench.py` times the cast line
(eager, the L2 flushed before each call; the same call replayed from a CUDA graph beside it):
- "kernels/": the two launches; "row alone" and "along-m alone" are its two halves, the second at several tiles.
- "interleaved": one launch whose programs are the two kernels' programs, ordered 128x128 tile by tile (the
  row programs of a tile, then its along-M programs), so a tile's second read comes while its first is in L2.
- "along-m k-first": the along-M cast with X's tile addressed [BLOCK_K, 128], so its reduction is along the
  tile's second axis and its store to Yᵀ needs no transpose in the program.
- "rows both": one program per 128x128 tile; row chunks [SUB_M, 128] give Y and its scales and a running
  column max; X again (from L2) in the same row chunks gives Yᵀ through a transposed store, so no reduction
  crosses warps in the second pass.
- the weight cast (128x128 both) at chunk configs beyond the two `kernels/` offers.

Each time is given with both byte counts of an activation's cast: 6n+scales (X read once per layout, as the
recorded cast line counts it at 7a1f962) and 4n+scales (X read once: what the algorithm must move).

The two weight forms ran at 9d358f8 and d1d4a3c as two kernels, the K-first and K-fast-grid along-M forms at
5b7e0e6 and d1d4a3c as two more; since then each pair is one kernel's flags (`weight_variant`,
`along_m_variant`), the same code (bit for bit under the interpreter, the same shared-memory instructions
compiled for sm_90).

Usage on the GPU box: python3 research/act_cast_probe.py OUT.json [--activation-only] (the second: the
interleaved, row-chunk and K-first forms with one along-M and the two-kernel reference; no weight configs)
[--transposes] (only: the along-M and weight casts with their transposing exchange done on BF16 values before
quantizing, and the along-M cast without it) [--grid-order] (only: the along-M and weight casts with the grid's
first axis along K) [--gluon] (only: the Gluon two-layout casts, one tile per program and pipelined)
[--act-variants] (only: the Gluon activation cast beside its scale variants and register caps)

Anywhere, the Markdown table of an `--act-variants` file: python3 research/act_cast_probe.py --markdown OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent))  # research/: cast_variant_probe beside it
from cast_variant_probe import same  # noqa: E402
from fp8bench_kernels import quantize_blockwise as qb
from fp8bench_kernels import quantize_blockwise_gluon as qg
from fp8bench_kernels._fp8 import block_scale, e4m3_scale, exact_rcp, scale_to_e4m3
from fp8bench_kernels._launch import cdiv
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy

from fp8bench.core.measure import time_fn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from recipe_bench import CAST_TIMER, same_bytes_copy_gbps  # noqa: E402 - the cast line's timer and its copy

SHAPES = [(4096, 4096), (8192, 4096), (8192, 8192), (8192, 14336)]


@triton.jit
def act_interleaved(x_ptr, y_ptr, s_ptr, yt_ptr, st_ptr, M, K, stride_m, stride_k, s_sm, s_sg, st_sk, st_sm,
                    n_tiles_k, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    # program -> (128x128 tile, part): parts 0..ROW_PARTS-1 are row programs [BLOCK_M, 128] of the tile (Y), the
    # rest along-M programs [128, BLOCK_K] (Yᵀ)
    ROW_PARTS: tl.constexpr = 128 // BLOCK_M
    PARTS: tl.constexpr = ROW_PARTS + 128 // BLOCK_K
    pid = tl.program_id(0)
    tile, part = pid // PARTS, pid % PARTS
    tm, tk = tile // n_tiles_k, tile % n_tiles_k
    # (each branch names its own values: compiled Triton merges a name bound in both branches of an `if`, which
    # needs one type, and the two tiles differ in shape)
    if part < ROW_PARTS:
        r_rows = tm * 128 + part * BLOCK_M + tl.arange(0, BLOCK_M)
        r_cols = tk * 128 + tl.arange(0, 128)
        r_mask = (r_rows[:, None] < M) & (r_cols[None, :] < K)
        r_x = tl.load(x_ptr + r_rows[:, None] * stride_m + r_cols[None, :] * stride_k, mask=r_mask,
                      other=0.0).to(tl.float32)
        r_scale = e4m3_scale(tl.max(tl.abs(r_x), axis=1))
        tl.store(y_ptr + r_rows[:, None] * K + r_cols[None, :], scale_to_e4m3(r_x, r_scale[:, None]), mask=r_mask)
        tl.store(s_ptr + r_rows * s_sm + tk * s_sg, exact_rcp(r_scale), mask=r_rows < M)
    else:
        c_rows = tm * 128 + tl.arange(0, 128)
        c_cols = tk * 128 + (part - ROW_PARTS) * BLOCK_K + tl.arange(0, BLOCK_K)
        c_mask = (c_rows[:, None] < M) & (c_cols[None, :] < K)
        c_x = tl.load(x_ptr + c_rows[:, None] * stride_m + c_cols[None, :] * stride_k, mask=c_mask,
                      other=0.0).to(tl.float32)
        c_scale = e4m3_scale(tl.max(tl.abs(c_x), axis=0))
        tl.store(yt_ptr + c_cols[:, None] * M + c_rows[None, :], tl.trans(scale_to_e4m3(c_x, c_scale[None, :])),
                 mask=tl.trans(c_mask))
        tl.store(st_ptr + c_cols * st_sk + tm * st_sm, exact_rcp(c_scale), mask=c_cols < K)


@triton.jit
def along_m_variant(x_ptr, yt_ptr, st_ptr, M, K, stride_m, stride_k, st_sk, st_sm, BLOCK_K: tl.constexpr,
                    K_FIRST: tl.constexpr, K_FAST_GRID: tl.constexpr):
    # kernels/'s along-M cast, with X's tile addressed as [BLOCK_K, 128] (K_FIRST: the group's reduction runs
    # along the second axis and the store to Yᵀ [K, M] needs no transpose in the program), or with the grid's
    # first axis along K (K_FAST_GRID: programs launched together take neighbouring column blocks of one 128-row
    # band, long runs of each row, not one column block of neighbouring bands)
    if K_FAST_GRID:
        pk, pm = tl.program_id(0), tl.program_id(1)
    else:
        pm, pk = tl.program_id(0), tl.program_id(1)
    rows = pm * 128 + tl.arange(0, 128)
    cols = pk * BLOCK_K + tl.arange(0, BLOCK_K)
    if K_FIRST:
        kmask = (cols[:, None] < K) & (rows[None, :] < M)
        xk = tl.load(x_ptr + cols[:, None] * stride_k + rows[None, :] * stride_m, mask=kmask, other=0.0).to(tl.float32)
        scale = e4m3_scale(tl.max(tl.abs(xk), axis=1))
        tl.store(yt_ptr + cols[:, None] * M + rows[None, :], scale_to_e4m3(xk, scale[:, None]), mask=kmask)
    else:
        mask = (rows[:, None] < M) & (cols[None, :] < K)
        x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_k, mask=mask, other=0.0).to(tl.float32)
        scale = e4m3_scale(tl.max(tl.abs(x), axis=0))
        tl.store(yt_ptr + cols[:, None] * M + rows[None, :], tl.trans(scale_to_e4m3(x, scale[None, :])),
                 mask=tl.trans(mask))
    tl.store(st_ptr + cols * st_sk + pm * st_sm, exact_rcp(scale), mask=cols < K)


@triton.jit
def act_rows_both(x_ptr, y_ptr, s_ptr, yt_ptr, st_ptr, M, K, stride_m, stride_k, s_sm, s_sg, st_sk, st_sm,
                  SUB_M: tl.constexpr):
    pm, pk = tl.program_id(0), tl.program_id(1)
    cols = pk * 128 + tl.arange(0, 128)
    colmax = tl.zeros((SUB_M, 128), dtype=tl.float32)
    for r in tl.range(0, 128, SUB_M):
        rows = pm * 128 + r + tl.arange(0, SUB_M)
        mask = (rows[:, None] < M) & (cols[None, :] < K)
        x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_k, mask=mask, other=0.0).to(tl.float32)
        a = tl.abs(x)
        colmax = tl.maximum(colmax, a)
        scale = e4m3_scale(tl.max(a, axis=1))
        tl.store(y_ptr + rows[:, None] * K + cols[None, :], scale_to_e4m3(x, scale[:, None]), mask=mask)
        tl.store(s_ptr + rows * s_sm + pk * s_sg, exact_rcp(scale), mask=rows < M)
    col_scale = e4m3_scale(tl.max(colmax, axis=0))
    tl.store(st_ptr + cols * st_sk + pm * st_sm, exact_rcp(col_scale), mask=cols < K)
    for r in tl.range(0, 128, SUB_M):
        rows = pm * 128 + r + tl.arange(0, SUB_M)
        mask = (rows[:, None] < M) & (cols[None, :] < K)
        x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_k, mask=mask, other=0.0).to(tl.float32)
        tl.store(yt_ptr + cols[:, None] * M + rows[None, :], tl.trans(scale_to_e4m3(x, col_scale[None, :])), mask=tl.trans(mask))


@triton.jit
def along_m_pre(x_ptr, yt_ptr, st_ptr, M, K, stride_m, stride_k, st_sk, st_sm, BLOCK_K: tl.constexpr,
                MODE: tl.constexpr):
    # the along-M cast with X's tile transposed before it is quantized (MODE 1: as BF16; 2: as float32; 3: as
    # BF16, the amax taken from X as loaded), so the program's shared-memory exchange can move 2- or 4-byte
    # elements instead of E4M3 bytes (compiled for sm_90, 1 and 2 are the kernels/ kernel: Triton sinks the
    # exchange to the E4M3 values, one ld.shared.b8 per element; 3 keeps it on BF16 through ldmatrix.trans);
    # MODE 0 stores without transposing (a wrong Yᵀ: how long the cast takes without its exchange)
    pm, pk = tl.program_id(0), tl.program_id(1)
    rows = pm * 128 + tl.arange(0, 128)
    cols = pk * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_k, mask=mask, other=0.0)
    if MODE == 0:
        xf = x.to(tl.float32)
        scale = e4m3_scale(tl.max(tl.abs(xf), axis=0))
        tl.store(yt_ptr + rows[:, None] * K + cols[None, :], scale_to_e4m3(xf, scale[None, :]), mask=mask)
    elif MODE == 3:
        # the amax from X as loaded, the quantization from its BF16 transpose: X is used in both layouts, so the
        # exchange stays on BF16 (ldmatrix.trans) instead of sinking to the E4M3 bytes
        scale = e4m3_scale(tl.max(tl.abs(x.to(tl.float32)), axis=0))
        xt = tl.trans(x).to(tl.float32)
        tl.store(yt_ptr + cols[:, None] * M + rows[None, :], scale_to_e4m3(xt, scale[:, None]), mask=tl.trans(mask))
    else:
        if MODE == 1:
            xt = tl.trans(x).to(tl.float32)
        else:
            xt = tl.trans(x.to(tl.float32))
        scale = e4m3_scale(tl.max(tl.abs(xt), axis=1))
        tl.store(yt_ptr + cols[:, None] * M + rows[None, :], scale_to_e4m3(xt, scale[:, None]), mask=tl.trans(mask))
    tl.store(st_ptr + cols * st_sk + pm * st_sm, exact_rcp(scale), mask=cols < K)


@triton.jit
def weight_variant(x_ptr, y_ptr, yt_ptr, s_ptr, M, K, stride_m, stride_k, n_groups, SUB_M: tl.constexpr,
                   SUB_K: tl.constexpr, K_FAST: tl.constexpr, BF16_EXCHANGE: tl.constexpr):
    # kernels/'s weight cast, with the grid's first axis along K (K_FAST: programs launched together take
    # neighbouring column blocks of one 128-row band) or each column chunk transposed as BF16 before its Yᵀ is
    # quantized (BF16_EXCHANGE)
    if K_FAST:
        pk, pm = tl.program_id(0), tl.program_id(1)
    else:
        pm, pk = tl.program_id(0), tl.program_id(1)
    scale = e4m3_scale(qb.block_amax_by_rows(x_ptr, pm, pk, M, K, stride_m, stride_k, SUB_M))
    if BF16_EXCHANGE:
        rows = pm * 128 + tl.arange(0, 128)
        for c in tl.range(0, 128, SUB_K):
            chunk = pk * 128 + c + tl.arange(0, SUB_K)
            mask = (rows[:, None] < M) & (chunk[None, :] < K)
            x = tl.load(x_ptr + rows[:, None] * stride_m + chunk[None, :] * stride_k, mask=mask, other=0.0)
            tl.store(y_ptr + rows[:, None] * K + chunk[None, :], scale_to_e4m3(x.to(tl.float32), scale), mask=mask)
            tl.store(yt_ptr + chunk[:, None] * M + rows[None, :], scale_to_e4m3(tl.trans(x).to(tl.float32), scale),
                     mask=tl.trans(mask))
    else:
        qb.store_block_both(x_ptr, y_ptr, yt_ptr, pm, pk, scale, M, K, stride_m, stride_k, SUB_K)
    tl.store(s_ptr + pm * n_groups + pk, exact_rcp(scale))


@triton.jit
def act_tile_both(x_ptr, y_ptr, s_ptr, yt_ptr, st_ptr, M, K, stride_m, stride_k, s_sm, s_sg, st_sk, st_sm):
    # one 128x128 tile read once, both layouts from registers: Y from X as loaded, Yᵀ from X's BF16 transpose
    # (used in both layouts, X's exchange stays on BF16: ldmatrix.trans)
    pm, pk = tl.program_id(0), tl.program_id(1)
    rows = pm * 128 + tl.arange(0, 128)
    cols = pk * 128 + tl.arange(0, 128)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_k, mask=mask, other=0.0)
    xf = x.to(tl.float32)
    scale = e4m3_scale(tl.max(tl.abs(xf), axis=1))
    tl.store(y_ptr + rows[:, None] * K + cols[None, :], scale_to_e4m3(xf, scale[:, None]), mask=mask)
    tl.store(s_ptr + rows * s_sm + pk * s_sg, exact_rcp(scale), mask=rows < M)
    xt = tl.trans(x).to(tl.float32)
    t_scale = e4m3_scale(tl.max(tl.abs(xt), axis=1))
    tl.store(yt_ptr + cols[:, None] * M + rows[None, :], scale_to_e4m3(xt, t_scale[:, None]), mask=tl.trans(mask))
    tl.store(st_ptr + cols * st_sk + pm * st_sm, exact_rcp(t_scale), mask=cols < K)


def weight_variant_call(x, sub_m, sub_k, warps, k_fast=False, bf16_exchange=False):
    m, k = x.shape
    y = torch.empty((m, k), device=x.device, dtype=torch.float8_e4m3fn)
    yt = torch.empty((k, m), device=x.device, dtype=torch.float8_e4m3fn)
    s = torch.empty((cdiv(m, 128), cdiv(k, 128)), device=x.device, dtype=torch.float32)
    grid = (cdiv(k, 128), cdiv(m, 128)) if k_fast else (cdiv(m, 128), cdiv(k, 128))
    weight_variant[grid](x, y, yt, s, m, k, x.stride(0), x.stride(1), cdiv(k, 128), SUB_M=sub_m, SUB_K=sub_k,
                         K_FAST=k_fast, BF16_EXCHANGE=bf16_exchange, num_warps=warps)
    return y, s, yt, s.t().contiguous()


def tile_both_call(x, warps):
    m, k = x.shape
    y, s, yt, st = _act_outputs(x)
    act_tile_both[(cdiv(m, 128), cdiv(k, 128))](
        x, y, s, yt, st, m, k, x.stride(0), x.stride(1), s.stride(0), s.stride(1), st.stride(0), st.stride(1),
        num_warps=warps)
    return y, s, yt, st


def along_m_pre_call(x, block_k, warps, mode):
    m, k = x.shape
    yt = torch.empty((k, m), device=x.device, dtype=torch.float8_e4m3fn)
    st = qb.m_major_empty(k, cdiv(m, 128), x.device)
    along_m_pre[(cdiv(m, 128), cdiv(k, block_k))](x, yt, st, m, k, x.stride(0), x.stride(1), st.stride(0),
                                                  st.stride(1), BLOCK_K=block_k, MODE=mode, num_warps=warps)
    return yt, st


def _act_outputs(x):
    m, k = x.shape
    y = torch.empty((m, k), device=x.device, dtype=torch.float8_e4m3fn)
    yt = torch.empty((k, m), device=x.device, dtype=torch.float8_e4m3fn)
    s = qb.m_major_empty(m, cdiv(k, 128), x.device)
    st = qb.m_major_empty(k, cdiv(m, 128), x.device)
    return y, s, yt, st


def interleaved_call(x, block_m, block_k, warps):
    m, k = x.shape
    y, s, yt, st = _act_outputs(x)
    tiles = cdiv(m, 128) * cdiv(k, 128)
    act_interleaved[(tiles * (128 // block_m + 128 // block_k),)](
        x, y, s, yt, st, m, k, x.stride(0), x.stride(1), s.stride(0), s.stride(1), st.stride(0), st.stride(1),
        cdiv(k, 128), BLOCK_M=block_m, BLOCK_K=block_k, num_warps=warps)
    return y, s, yt, st


def rows_both_call(x, sub_m, warps):
    m, k = x.shape
    y, s, yt, st = _act_outputs(x)
    act_rows_both[(cdiv(m, 128), cdiv(k, 128))](
        x, y, s, yt, st, m, k, x.stride(0), x.stride(1), s.stride(0), s.stride(1), st.stride(0), st.stride(1),
        SUB_M=sub_m, num_warps=warps)
    return y, s, yt, st


def along_m_call(x, block_k, warps):
    m, k = x.shape
    yt = torch.empty((k, m), device=x.device, dtype=torch.float8_e4m3fn)
    st = qb.m_major_empty(k, cdiv(m, 128), x.device)
    qb._quantize_along_m_kernel.fn[(cdiv(m, 128), cdiv(k, block_k))](
        x, yt, st, m, k, x.stride(0), x.stride(1), st.stride(0), st.stride(1), GROUP_M=128, BLOCK_K=block_k,
        POW2=False, num_warps=warps)
    return yt, st


def along_m_variant_call(x, block_k, warps, k_first=False, k_fast_grid=False):
    m, k = x.shape
    yt = torch.empty((k, m), device=x.device, dtype=torch.float8_e4m3fn)
    st = qb.m_major_empty(k, cdiv(m, 128), x.device)
    grid = (cdiv(k, block_k), cdiv(m, 128)) if k_fast_grid else (cdiv(m, 128), cdiv(k, block_k))
    along_m_variant[grid](x, yt, st, m, k, x.stride(0), x.stride(1), st.stride(0), st.stride(1), BLOCK_K=block_k,
                          K_FIRST=k_first, K_FAST_GRID=k_fast_grid, num_warps=warps)
    return yt, st


def weight_call(x, sub_m, sub_k, warps):
    m, k = x.shape
    y = torch.empty((m, k), device=x.device, dtype=torch.float8_e4m3fn)
    yt = torch.empty((k, m), device=x.device, dtype=torch.float8_e4m3fn)
    s = torch.empty((cdiv(m, 128), cdiv(k, 128)), device=x.device, dtype=torch.float32)
    qb._quantize_128x128_both_kernel.fn[(cdiv(m, 128), cdiv(k, 128))](
        x, y, yt, s, m, k, x.stride(0), x.stride(1), cdiv(k, 128), SUB_M=sub_m, SUB_K=sub_k, POW2=False,
        num_warps=warps)
    return y, s, yt, s.t().contiguous()


def _along_m_and_weight(m: int, k: int):
    """X, the bytes of the along-M cast alone and of the weight cast, their kernels/ outputs, and the along-M
    kernels/ case every comparison starts from."""
    x = torch.randn(m, k, device="cuda").bfloat16()
    n = x.numel()
    along_one = 3 * n + 4 * cdiv(m, 128) * k
    weight = 4 * n + 4 * cdiv(m, 128) * cdiv(k, 128)
    ref_a = qb.quantize_blockwise_both(x)[2:]
    ref_w = qb.quantize_blockwise_both(x, weight=True)
    return x, along_one, weight, ref_a, ref_w, [("along-m kernels/ k64 w4", lambda: along_m_call(x, 64, 4), along_one,
                                                 ref_a)]


def grid_order_rows(m: int, k: int) -> list[dict]:
    """The along-M and weight casts with the grid's first axis along K, beside kernels/'s (along M)."""
    x, along_one, weight, ref_a, ref_w, cases = _along_m_and_weight(m, k)
    for bk, w in ((32, 2), (32, 4), (64, 4), (64, 8)):
        cases.append((f"along-m k-fast grid k{bk} w{w}",
                      lambda bk=bk, w=w: along_m_variant_call(x, bk, w, k_fast_grid=True), along_one, ref_a))
    cases.append(("weight kernels/ m64 k64 w8", lambda: weight_call(x, 64, 64, 8), weight, ref_w))
    for sm, sk, w in ((64, 64, 8), (32, 64, 8), (64, 64, 4)):
        cases.append((f"weight k-fast grid m{sm} k{sk} w{w}",
                      lambda sm=sm, sk=sk, w=w: weight_variant_call(x, sm, sk, w, k_fast=True), weight, ref_w))
    return _timed_cases(m, k, "grid order", cases)


def _record(rows: list, copies: dict, m: int, k: int, family: str, variant: str, fn, counts: tuple, ref=None):
    """Time one form (checked bit for bit against `ref` first, when given) eager and replayed from a graph, each
    as % of a same-bytes copy for every byte count in `counts`; a form that fails is recorded with its error."""
    try:
        ok = None if ref is None else same(fn(), ref)
        eager = time_fn(fn, **CAST_TIMER).median_ms
        graph = time_fn(fn, cuda_graph=True, **CAST_TIMER).median_ms
        row = {"shape": [m, k], "family": family, "variant": variant, "eager_us": 1e3 * eager,
               "graph_us": 1e3 * graph, "bit_exact": ok,
               "pct_of_same_bytes_copy": {str(b): 100 * (b / eager / 1e6) / copies[b] for b in counts},
               "graph_pct_of_same_bytes_copy": {str(b): 100 * (b / graph / 1e6) / copies[b] for b in counts}}
        pcts = ", ".join(f"{p:5.1f}% ({int(b) / (m * k):.2f}n)" for b, p in row["pct_of_same_bytes_copy"].items())
        print(f"{m}x{k} {family:>10} {variant:>40}: eager {row['eager_us']:6.1f} µs graph {row['graph_us']:6.1f} µs; "
              f"eager {pcts} of a same-bytes copy; exact={ok}", flush=True)
    except Exception as exc:  # noqa: BLE001 - a variant that fails to compile is recorded, the rest run
        row = {"shape": [m, k], "family": family, "variant": variant, "error": f"{type(exc).__name__}: {exc}"[:300]}
        print(f"{m}x{k} {family:>10} {variant:>40}: {row['error']}", flush=True)
    rows.append(row)


def _copies(*counts: int) -> dict[int, float]:
    return {b: same_bytes_copy_gbps(b) for b in sorted(set(counts))}


def _timed_cases(m: int, k: int, family: str, cases: list) -> list[dict]:
    copies, rows = _copies(*(c[2] for c in cases)), []
    for name, fn, nbytes, ref in cases:
        _record(rows, copies, m, k, family, name, fn, (nbytes,), ref)
    return rows


def transpose_rows(m: int, k: int) -> list[dict]:
    """The along-M cast with its exchange on BF16, and without it; the weight cast with its chunks transposed as
    BF16 before Yᵀ is quantized."""
    x, along_one, weight, ref_a, ref_w, cases = _along_m_and_weight(m, k)
    for mode, name in ((0, "no exchange (wrong Yᵀ)"), (3, "bf16 exchange")):
        for bk, w in ((32, 4), (64, 4), (64, 8)):
            cases.append((f"along-m {name} k{bk} w{w}", lambda bk=bk, w=w, mode=mode: along_m_pre_call(x, bk, w, mode),
                          along_one, ref_a if mode else None))
    act_4n = qg.bytes_moved(x, weight=False)  # X read once, Y and Yᵀ written, both scale tensors
    ref_both = qb.quantize_blockwise_both(x)
    cases.append(("activation kernels/ (4n counted)", lambda: qb.quantize_blockwise_both(x), act_4n, None))
    for w in (8, 16):
        cases.append((f"activation tile both w{w} (4n)", lambda w=w: tile_both_call(x, w), act_4n, ref_both))
    cases.append(("weight kernels/ m64 k64 w8", lambda: weight_call(x, 64, 64, 8), weight, ref_w))
    for sm, sk, w in ((64, 64, 8), (32, 64, 8), (64, 32, 4), (64, 64, 4)):
        cases.append((f"weight bf16 exchange m{sm} k{sk} w{w}",
                      lambda sm=sm, sk=sk, w=w: weight_variant_call(x, sm, sk, w, bf16_exchange=True), weight, ref_w))
    return _timed_cases(m, k, "transpose", cases)


def shape_rows(m: int, k: int, everything: bool) -> list[dict]:
    rows: list[dict] = []
    x = torch.randn(m, k, device="cuda").bfloat16()
    n = x.numel()
    act_6n = 2 * qb.bytes_moved(x, (1, 128))
    act_4n = qg.bytes_moved(x, weight=False)
    weight = 4 * n + 4 * cdiv(m, 128) * cdiv(k, 128)
    row_one = qb.bytes_moved(x, (1, 128))
    along_one = 3 * n + 4 * cdiv(m, 128) * k
    copies = _copies(act_6n, act_4n, weight, row_one, along_one)

    def record(family, variant, fn, counts, ref=None):
        _record(rows, copies, m, k, family, variant, fn, counts, ref)

    ref_a = qb.quantize_blockwise_both(x)
    record("activation", "kernels/", lambda: qb.quantize_blockwise_both(x), (act_6n, act_4n))
    record("activation", "row alone", lambda: qb.quantize_blockwise(x, (1, 128), m_major_scales=True), (row_one,),
           ref_a[:2])
    for bk, w in ((16, 2), (16, 4), (32, 2), (32, 4), (32, 8), (64, 4), (64, 8), (128, 8)) if everything else ((64, 4),):
        record("activation", f"along-m alone k{bk} w{w}", lambda bk=bk, w=w: along_m_call(x, bk, w), (along_one,),
               ref_a[2:])
    for bk, w in ((16, 2), (32, 2), (32, 4), (64, 4), (64, 8)):
        record("activation", f"along-m k-first k{bk} w{w}",
               lambda bk=bk, w=w: along_m_variant_call(x, bk, w, k_first=True), (along_one,), ref_a[2:])
    for bm, bk, w in ((16, 32, 4), (32, 32, 4), (32, 64, 4), (64, 64, 8), (64, 32, 8), (32, 64, 8), (16, 16, 4)):
        record("activation", f"interleaved m{bm} k{bk} w{w}", lambda bm=bm, bk=bk, w=w: interleaved_call(x, bm, bk, w),
               (act_6n, act_4n), ref_a)
    for sm, w in ((16, 4), (32, 4), (32, 8), (64, 8)) if everything else ((32, 4), (32, 2), (64, 4)):
        record("activation", f"rows both m{sm} w{w}", lambda sm=sm, w=w: rows_both_call(x, sm, w), (act_6n, act_4n),
               ref_a)
    if not everything:
        return rows
    ref_w = qb.quantize_blockwise_both(x, weight=True)
    record("weight", "kernels/", lambda: qb.quantize_blockwise_both(x, weight=True), (weight,))
    for sm, sk, w in ((64, 64, 8), (32, 64, 8), (64, 32, 8), (128, 64, 8), (64, 64, 16), (32, 32, 8), (64, 128, 8)):
        record("weight", f"m{sm} k{sk} w{w}", lambda sm=sm, sk=sk, w=w: weight_call(x, sm, sk, w), (weight,), ref_w)
    return rows


# the copy ring, row-major: a warp's 16-byte accesses cover whole 128-byte rows, so no swizzle is needed
RING = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))
RING4 = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[3, 2, 1, 0]))


@gluon.jit
def _copy_tile_async(buf, x_ptr, tile, n_tiles_k, M, K, stride_m, valid, WEIGHT: gl.constexpr):
    """Start copying tile `tile` of X into shared-memory buffer `buf`, each thread the elements it will read back
    (ALONG_K for a weight, [kw, mw, r, c] ACT_ALONG_K for an activation), so no barrier is needed between the
    copy and the read; nothing when not `valid`."""
    if WEIGHT:
        rows, cols, mask = qg._tile_index(tile // n_tiles_k, tile % n_tiles_k, M, K, qg.ALONG_K)
        ptrs = x_ptr + rows[:, None] * stride_m + cols[None, :]
    else:
        rows, cols, mask = qg._tile_index4(tile // n_tiles_k, tile % n_tiles_k, M, K, qg.ACT_ALONG_K)
        ptrs = x_ptr + rows * stride_m + cols
    async_copy.async_copy_global_to_shared(buf, ptrs, mask=mask & valid)


@gluon.jit
def _cast_both_pipelined_kernel(x_ptr, y_ptr, s_ptr, yt_ptr, st_ptr, M, K, stride_m, s_sm, s_sg, st_sk, st_sm,
                                n_tiles_k, n_tiles, WEIGHT: gl.constexpr, POW2: gl.constexpr,
                                STAGES: gl.constexpr):
    """The same casts with a persistent grid: each program walks tiles pid, pid + programs, ..., its next
    STAGES - 1 tiles in flight from HBM into a shared-memory ring (cp.async) while it casts the current one."""
    pid = gl.program_id(0)
    programs = gl.num_programs(0)
    if WEIGHT:
        ring = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [STAGES, qg._TILE, qg._TILE], RING)
    else:
        ring = gl.allocate_shared_memory(x_ptr.dtype.element_ty, [STAGES, 2, 4, 32, 64], RING4)
    mine = gl.cdiv(n_tiles - pid, programs)
    for s in gl.static_range(STAGES - 1):
        _copy_tile_async(ring.index(s), x_ptr, pid + s * programs, n_tiles_k, M, K, stride_m, s < mine, WEIGHT)
        async_copy.commit_group()
    for i in range(mine):
        ahead = i + STAGES - 1
        _copy_tile_async(ring.index(ahead % STAGES), x_ptr, pid + ahead * programs, n_tiles_k, M, K, stride_m,
                         ahead < mine, WEIGHT)
        async_copy.commit_group()
        async_copy.wait_group(STAGES - 1)  # tile i has landed (each thread waits for its own copies)
        tile = pid + i * programs
        if WEIGHT:
            qg._weight_tile(ring.index(i % STAGES).load(qg.ALONG_K), tile // n_tiles_k, tile % n_tiles_k, y_ptr,
                            s_ptr, yt_ptr, st_ptr, M, K, s_sm, s_sg, st_sk, st_sm, POW2)
        else:
            qg._activation_tile(ring.index(i % STAGES).load(qg.ACT_ALONG_K), tile // n_tiles_k, tile % n_tiles_k,
                                y_ptr, s_ptr, yt_ptr, st_ptr, M, K, s_sm, s_sg, st_sk, st_sm, POW2)


def gluon_call(x, weight: bool, stages: int = 0, programs: int = 0, **options):
    """kernels/quantize_blockwise_gluon.py's kernel launched through Triton with launch `options` (maxnreg): one
    tile per program, or (`stages`) the pipelined kernel above on `programs` persistent programs."""
    m, k = x.shape
    args = qg.kernel_args(x, weight)
    if stages:
        tiles_k, tiles = cdiv(k, 128), cdiv(m, 128) * cdiv(k, 128)
        _cast_both_pipelined_kernel[(min(programs, tiles),)](*args, tiles_k, tiles, WEIGHT=weight, POW2=False,
                                                                STAGES=stages, num_warps=qg.WARPS, **options)
    else:
        qg._cast_both_kernel[(cdiv(m, 128), cdiv(k, 128))](*args, WEIGHT=weight, POW2=False, num_warps=qg.WARPS,
                                                           **options)
    return args[1:5]


GLUON_FORMS = [  # (name, kwargs of gluon_call with programs in SMs)
    ("gluon maxnreg=128", {"maxnreg": 128}),
    ("gluon maxnreg=80", {"maxnreg": 80}),  # 3 programs of 8 warps per SM (registers are granted 8 at a time)
    ("gluon pipelined s2 1/SM", {"stages": 2, "programs": 1}),
    ("gluon pipelined s3 1/SM", {"stages": 3, "programs": 1}),
    ("gluon pipelined s2 2/SM maxnreg=128", {"stages": 2, "programs": 2, "maxnreg": 128}),
    ("gluon pipelined s3 2/SM maxnreg=128", {"stages": 3, "programs": 2, "maxnreg": 128}),
]


def gluon_rows(m: int, k: int) -> list[dict]:
    """The Gluon two-layout casts (one read of each tile, Yᵀ from the same registers) beside kernels/'s: one tile
    per program, and pipelined (persistent, the next tiles copied into shared memory while one is cast)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    x = torch.randn(m, k, device="cuda").bfloat16()
    n = x.numel()
    act_6n = 2 * qb.bytes_moved(x, (1, 128))
    act_4n = qg.bytes_moved(x, weight=False)
    weight = 4 * n + 4 * cdiv(m, 128) * cdiv(k, 128)
    ref_a, ref_w = qb.quantize_blockwise_both(x), qb.quantize_blockwise_both(x, weight=True)
    # "kernels/" is quantize_blockwise_both as committed: the two Triton kernels until 84e0e41, the Gluon kernel since
    cases = [("activation", "kernels/", lambda: qb.quantize_blockwise_both(x), (act_6n, act_4n), None),
             ("weight", "kernels/", lambda: qb.quantize_blockwise_both(x, weight=True), (weight,), None)]
    for name, form in GLUON_FORMS:
        form = {**form, "programs": form.get("programs", 0) * sms}
        cases.append(("activation", name, lambda f=form: gluon_call(x, False, **f), (act_6n, act_4n), ref_a))
        cases.append(("weight", name, lambda f=form: gluon_call(x, True, **f), (weight,), ref_w))
    copies, rows = _copies(*(b for case in cases for b in case[3])), []
    for family, name, fn, counts, ref in cases:
        _record(rows, copies, m, k, family, name, fn, counts, ref)
    return rows


EXACTNESS_INPUTS = (((1000, 1200), torch.bfloat16), ((200, 136), torch.bfloat16), ((384, 640), torch.float32),
                    ((1000, 1200), torch.float32))
"""Ragged shapes (a tile past M and K; a row not a multiple of 16) from BF16 and FP32, for the bit-exact checks."""


def gluon_exactness() -> list[dict]:
    """Every Gluon form bit for bit against kernels/ on ragged shapes and FP32 input (no timing)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for (m, k), dtype in EXACTNESS_INPUTS:
        x = (torch.randn(m, k, device="cuda") * 3).to(dtype)
        for weight in (False, True):
            ref = qb.quantize_blockwise_both(x, weight=weight)
            for name, form in [("gluon", {})] + GLUON_FORMS:
                form = {**form, "programs": form.get("programs", 0) * sms}
                try:
                    ok = same(gluon_call(x, weight, **form), ref)
                except Exception as exc:  # noqa: BLE001 - a form that fails to compile is recorded, the rest run
                    ok = f"{type(exc).__name__}: {exc}"[:200]
                rows.append({"shape": [m, k], "dtype": str(dtype), "weight": weight, "variant": name, "bit_exact": ok})
                print(f"exactness {m}x{k} {dtype} weight={weight} {name}: {ok}", flush=True)
    return rows


# The [128, 128] tile's owners of a row's and a column's scale in the Gluon activation cast from 86cbc28 until the
# [kw, mw, r, c] form: a row's amax (sliced from ALONG_K) moved to one lane per row (the warp bit along K a copy),
# a column's (sliced from ALONG_M) to two columns per thread, each through Triton's layout conversions
ROW_OWNED_2D = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[], lane_bases=[[1], [2], [4], [8], [16]], warp_bases=[[0], [32], [64]], block_bases=[], shape=[128]))
COL_OWNED_2D = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[4]], lane_bases=[[8], [16], [32], [1], [2]], warp_bases=[[64], [0], [0]], block_bases=[],
    shape=[128]))


@gluon.jit
def _store_inverses(ptr, stride, offset, scale, index, tile, limit, OWNED: gl.constexpr, BY_OWNER: gl.constexpr):
    """1 / `scale` of a tile's rows or columns (`index`, the scale's own layout) at ptr + index * stride + offset,
    under `limit`: computed where the scale is (every thread holding a copy), or (BY_OWNER) after moving it to the
    OWNED layout, one division per owner."""
    if BY_OWNER:
        owned = tile * qg._TILE + gl.arange(0, qg._TILE, layout=OWNED)
        gl.store(ptr + owned * stride + offset, exact_rcp(gl.convert_layout(scale, OWNED)), mask=owned < limit)
    else:
        gl.store(ptr + index * stride + offset, exact_rcp(scale), mask=index < limit)


@gluon.jit
def _owned_scale(amax, tile, ptr, stride, offset, limit, OWNED: gl.constexpr, BACK: gl.constexpr):
    """MODE 3's step: `amax` moved to its OWNED layout, its scale and inverse made there, the inverse stored, the
    scale moved BACK to where the tile's elements are."""
    scale = block_scale(gl.convert_layout(amax, OWNED), False)
    _store_inverses(ptr, stride, offset, scale, None, tile, limit, OWNED, True)  # already OWNED: no conversion
    return gl.convert_layout(scale, BACK)


@gluon.jit
def _act_variant_kernel(x_ptr, y_ptr, s_ptr, yt_ptr, st_ptr, M, K, stride_m, s_sm, s_sg, st_sk, st_sm,
                        MODE: gl.constexpr):
    """The Gluon activation cast on a [128, 128] tile with its scales computed otherwise (`MODE`): 0, in every
    thread that holds a copy of a row's or column's amax (32 divisions per thread, the kernel until 86cbc28); 1,
    the scale so, its inverse by the owning thread (19 divisions, two layout conversions instead of four); 2, no
    amax at all: scale 1 (wrong Y and Yᵀ, timed only: the cast without its reductions, the floor they sit on);
    3, scale and inverse by the owning thread (6 divisions, four layout conversions: kernels/ from 86cbc28 until
    the [kw, mw, r, c] tile)."""
    pm = gl.program_id(0)
    pk = gl.program_id(1)
    rows, cols, mask = qg._tile_index(pm, pk, M, K, qg.ALONG_K)
    t_rows, t_cols, t_mask = qg._tile_index(pm, pk, M, K, qg.ALONG_M)
    xf = gl.load(x_ptr + rows[:, None] * stride_m + cols[None, :], mask=mask, other=0.0).to(gl.float32)
    t_ptrs = yt_ptr + t_cols[None, :] * M + t_rows[:, None]
    if MODE == 2:
        gl.store(y_ptr + rows[:, None] * K + cols[None, :], scale_to_e4m3(xf, 1.0), mask=mask)
        gl.store(t_ptrs, scale_to_e4m3(gl.convert_layout(xf, qg.ALONG_M), 1.0), mask=t_mask)
    elif MODE == 3:
        row_scale = _owned_scale(gl.max(gl.abs(xf), axis=1), pm, s_ptr, s_sm, pk * s_sg, M, ROW_OWNED_2D,
                                 gl.SliceLayout(1, qg.ALONG_K))
        gl.store(y_ptr + rows[:, None] * K + cols[None, :], scale_to_e4m3(xf, row_scale[:, None]), mask=mask)
        xt = gl.convert_layout(xf, qg.ALONG_M)
        col_scale = _owned_scale(gl.max(gl.abs(xt), axis=0), pk, st_ptr, st_sk, pm * st_sm, K, COL_OWNED_2D,
                                 gl.SliceLayout(0, qg.ALONG_M))
        gl.store(t_ptrs, scale_to_e4m3(xt, col_scale[None, :]), mask=t_mask)
    else:
        row_scale = block_scale(gl.max(gl.abs(xf), axis=1), False)
        gl.store(y_ptr + rows[:, None] * K + cols[None, :], scale_to_e4m3(xf, row_scale[:, None]), mask=mask)
        _store_inverses(s_ptr, s_sm, pk * s_sg, row_scale, rows, pm, M, ROW_OWNED_2D, MODE == 1)
        xt = gl.convert_layout(xf, qg.ALONG_M)
        col_scale = block_scale(gl.max(gl.abs(xt), axis=0), False)
        gl.store(t_ptrs, scale_to_e4m3(xt, col_scale[None, :]), mask=t_mask)
        _store_inverses(st_ptr, st_sk, pm * st_sm, col_scale, t_cols, pk, K, COL_OWNED_2D, MODE == 1)


ACT_VARIANTS = [  # (name, MODE or None for kernels/'s kernel through Triton, launch options)
    ("kernels/ via triton", None, {"maxnreg": 128}),
    ("kernels/ maxnreg=112", None, {"maxnreg": 112}),
    ("owned 2-D (86cbc28)", 3, {"maxnreg": 128}),
    ("replicated (until 86cbc28)", 0, {"maxnreg": 128}),
    ("inverse owned", 1, {"maxnreg": 128}),
    ("no amax (wrong scales)", 2, {"maxnreg": 128}),
]


def act_variant_call(x, mode, **options):
    """`_act_variant_kernel` at MODE, or (None) kernels/'s activation cast through Triton (`gluon_call`)."""
    if mode is None:
        return gluon_call(x, False, **options)
    m, k = x.shape
    args = qg.kernel_args(x, False)
    _act_variant_kernel[(cdiv(m, 128), cdiv(k, 128))](*args, MODE=mode, num_warps=qg.WARPS, **options)
    return args[1:5]


def act_variant_exactness() -> list[dict]:
    """Every activation variant but the one without amax, bit for bit against kernels/, on the first three
    `EXACTNESS_INPUTS` (as recorded at 47785cf)."""
    rows = []
    for (m, k), dtype in EXACTNESS_INPUTS[:3]:
        x = (torch.randn(m, k, device="cuda") * 3).to(dtype)
        for name, mode, options in ACT_VARIANTS[:-1]:
            ok = same(act_variant_call(x, mode, **options), qb.quantize_blockwise_both(x))
            rows.append({"shape": [m, k], "dtype": str(dtype), "variant": name, "bit_exact": ok})
            print(f"exactness {m}x{k} {dtype} {name}: {ok}", flush=True)
    return rows


def act_variant_rows(m: int, k: int) -> list[dict]:
    """The activation's Gluon cast beside its scale variants and register caps (`ACT_VARIANTS`)."""
    x = torch.randn(m, k, device="cuda").bfloat16()
    act_4n = qg.bytes_moved(x, weight=False)  # X read once, Y and Yᵀ written, both scale tensors
    ref = qb.quantize_blockwise_both(x)
    cases = [("kernels/", lambda: qb.quantize_blockwise_both(x), None)]
    for name, mode, options in ACT_VARIANTS:
        cases.append((name, lambda mo=mode, o=options: act_variant_call(x, mo, **o), None if mode == 2 else ref))
    copies, rows = _copies(act_4n), []
    for name, fn, r in cases:
        _record(rows, copies, m, k, "activation", name, fn, (act_4n,), r)
    return rows


def main(out_path: str, everything: bool = True, transposes: bool = False, grid_order: bool = False,
         gluon: bool = False, act_variants: bool = False) -> None:
    rows = gluon_exactness() if gluon else act_variant_exactness() if act_variants else []
    for m, k in SHAPES + ([(8192, 11008)] if act_variants else []):
        if act_variants:
            rows += act_variant_rows(m, k)
        elif gluon:
            rows += gluon_rows(m, k)
        elif grid_order:
            rows += grid_order_rows(m, k)
        else:
            rows += transpose_rows(m, k) if transposes else shape_rows(m, k, everything)
        torch.cuda.empty_cache()
    with open(out_path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": rows}, f, indent=1)


def markdown(recorded: dict) -> str:
    """The table of an `--act-variants` file: each variant's eager time and % of a same-bytes copy per shape, and
    its bit-exactness on the ragged shapes."""
    # the activation's rows only: a --gluon file also times the weight under the same variant names
    timed = [r for r in recorded["rows"] if r.get("family") == "activation" and "eager_us" in r]
    shapes = sorted({tuple(r["shape"]) for r in timed}, key=lambda mk: mk[0] * mk[1])
    variants = list(dict.fromkeys(r["variant"] for r in timed))
    cell = {(r["variant"], tuple(r["shape"])): r for r in timed}
    exact = {}
    for r in recorded["rows"]:
        if "family" not in r and not r.get("weight"):
            exact.setdefault(r["variant"], []).append(r["bit_exact"])
    head = " | ".join(f"{m}×{k} ({2 * m * k / 2**20:.0f} MB)" for m, k in shapes)
    out = [f"| activation two-layout cast (eager µs; % of a same-bytes copy) | {head} | bit-exact |",
           "|---|" + "---|" * (len(shapes) + 1)]
    for v in variants:
        cells = []
        for mk in shapes:
            r = cell.get((v, mk))
            cells.append(f"{r['eager_us']:.1f}; {next(iter(r['pct_of_same_bytes_copy'].values())):.1f}%" if r else "")
        ok = exact.get(v)
        verdict = "—" if ok is None else f"{sum(x is True for x in ok)} of {len(ok)}"
        out.append(f"| {v} | " + " | ".join(cells) + f" | {verdict} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    if sys.argv[1:2] == ["--markdown"]:
        print(markdown(json.loads(Path(sys.argv[2]).read_text())), end="")
        sys.exit(0)
    flags = sys.argv[2:]
    main(sys.argv[1], "--activation-only" not in flags, "--transposes" in flags, "--grid-order" in flags,
         "--gluon" in flags, "--act-variants" in flags)
