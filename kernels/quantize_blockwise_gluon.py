"""The two-layout blockwise casts (`quantize_blockwise_both`) in Gluon: each 128x128 tile of X read from HBM once,
written as Y and as Yᵀ with no shared-memory transpose.

Why: Triton transposes the E4M3 bytes of the along-M cast (an activation's Yᵀ) through shared memory one byte
per access, so that cast spends its time in shared-memory bank conflicts, far below the DRAM throughput of the
1x128 cast that reads the same bytes (Nsight Compute's counters: docs/kernels.md). The Triton weight cast reads
each block twice (the second time from L2) to keep its registers low.

Here the layout is chosen, not inferred. A program holds one 128x128 tile, 8 warps, each thread an 8x8 patch:
8 rows of 8 consecutive columns. `ALONG_K` numbers a thread's registers along K first, so X loads in 16-byte
vectors (8 lanes cover 128 bytes of a row) and Y stores 8 bytes per row; `ALONG_M` gives every element to the
same thread and lane, numbering the registers along M first, so Yᵀ [K, M] stores 8 bytes per column (4 lanes
cover a 32-byte sector). Converting between the two moves registers within each thread: no shared memory, no
barrier. Both scales come from the same registers: a row's max crosses 8 lanes and 2 warps, a column's 4 lanes
and 4 warps (1-3 KB of shared memory).

The activation kernel is bound by the instructions it issues, not by HBM: without its amax reductions it runs
much closer to a same-bytes copy (docs/kernels.md). So its tile is held as [kw, mw, r, c] = [2, 4, 32, 64] (`ACT_ALONG_K`,
`ACT_ALONG_M`: the same elements in the same threads, the warp bits given dimensions of their own). A row's and a
column's maxes then reduce within each warp (registers, then shuffles), and only the step across warps goes
through shared memory, written out: both sets of partial maxes in one exchange, read back so that one thread owns
each row (`ROW_OWNED`) and each column (`COL_OWNED`) and divides out its scale and inverse there, and the scales
back in one more: 3 barriers per thread, where Triton's own cross-warp reductions and layout conversions of the
[128, 128] tile take 13, and fewer instructions (docs/kernels.md counts them).

- activations and gradients (`WEIGHT=False`): 1x128 groups along K for Y (one scale per row) and along M for Yᵀ
  (one per column), both scale tensors M-major as the GEMMs read them;
- weights (`WEIGHT=True`): one scale per 128x128 block, the same for Y and Yᵀ; both the block scales and their
  transpose are written, so no transposing copy follows.

Triton's interpreter does not run Gluon: `quantize_blockwise_both` uses these kernels on a CUDA GPU and the
Triton kernels of `quantize_blockwise` elsewhere; the GPU tests check these bit for bit against the reference,
and CI compiles them for sm_90 and checks that nothing spills and no shared memory is used for the transpose.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ._fp8 import block_scale, exact_rcp, scale_to_e4m3
from ._launch import Launcher, cast_key, cdiv
from ._layout import m_major_empty
from ._sm90 import compile_cast_sm90

TILE = 128
WARPS = 8
_TILE = gl.constexpr(TILE)  # the same, readable inside the kernels

# one element per (register, lane, warp): a thread's 8x8 patch, lanes 8 along K x 4 along M, warps 2 x 4
_LANES = [[0, 8], [0, 16], [0, 32], [8, 0], [16, 0]]
_WARPS = [[0, 64], [32, 0], [64, 0]]
ALONG_K = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1], [0, 2], [0, 4], [1, 0], [2, 0], [4, 0]], lane_bases=_LANES, warp_bases=_WARPS,
    block_bases=[], shape=[TILE, TILE]))
ALONG_M = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[1, 0], [2, 0], [4, 0], [0, 1], [0, 2], [0, 4]], lane_bases=_LANES, warp_bases=_WARPS,
    block_bases=[], shape=[TILE, TILE]))

# An activation's tile as [kw, mw, r, c] = [2, 4, 32, 64]: row mw * 32 + r, column kw * 64 + c. The same
# elements in the same threads as ALONG_K and ALONG_M, with the two warp bits along M and the one along K given
# dimensions of their own, so that a reduction over r or c stays within a warp (register maxes, then shuffles) and
# the step across warps is written out: one shared-memory exchange for both amaxes, one for both scales.
_TILE4 = [2, 4, 32, 64]
_LANES4 = [[0, 0, 0, 8], [0, 0, 0, 16], [0, 0, 0, 32], [0, 0, 8, 0], [0, 0, 16, 0]]
_WARPS4 = [[1, 0, 0, 0], [0, 1, 0, 0], [0, 2, 0, 0]]
ACT_ALONG_K = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4], [0, 0, 1, 0], [0, 0, 2, 0], [0, 0, 4, 0]],
    lane_bases=_LANES4, warp_bases=_WARPS4, block_bases=[], shape=_TILE4))
ACT_ALONG_M = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 0, 1, 0], [0, 0, 2, 0], [0, 0, 4, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4]],
    lane_bases=_LANES4, warp_bases=_WARPS4, block_bases=[], shape=_TILE4))
# a warp's row maxes [kw, mw, r] read back with both kw halves of a row in one thread: one row per lane (the
# first warp bit a copy)
ROW_PARTS = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[1, 0, 0]], lane_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [0, 0, 16]],
    warp_bases=[[0, 0, 0], [0, 1, 0], [0, 2, 0]], block_bases=[], shape=[2, 4, 32]))
# a warp's column maxes [kw, mw, c] read back with the four mw partials of a column in one thread: one column per
# thread (the last warp bit a copy)
COL_PARTS = gl.constexpr(gl.DistributedLinearLayout(
    reg_bases=[[0, 1, 0], [0, 2, 0]], lane_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [0, 0, 8], [0, 0, 16]],
    warp_bases=[[0, 0, 32], [1, 0, 0], [0, 0, 0]], block_bases=[], shape=[2, 4, 64]))
ROW_OWNED = gl.constexpr(gl.SliceLayout(0, ROW_PARTS))  # [mw, r]: a row's scale in the thread that made it
COL_OWNED = gl.constexpr(gl.SliceLayout(1, COL_PARTS))  # [kw, c]
_ROW_SCALES = gl.constexpr(gl.SliceLayout(0, gl.SliceLayout(3, ACT_ALONG_K)))  # [mw, r] where Y's rows are
_COL_SCALES = gl.constexpr(gl.SliceLayout(1, gl.SliceLayout(2, ACT_ALONG_M)))  # [kw, c] where Yᵀ's columns are
_FLAT2 = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0]))
_FLAT3 = gl.constexpr(gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[2, 1, 0]))


@gluon.jit
def _tile_index(pm, pk, M, K, LAYOUT: gl.constexpr):
    rows = pm * _TILE + gl.arange(0, _TILE, layout=gl.SliceLayout(1, LAYOUT))
    cols = pk * _TILE + gl.arange(0, _TILE, layout=gl.SliceLayout(0, LAYOUT))
    return rows, cols, (rows[:, None] < M) & (cols[None, :] < K)


@gluon.jit
def _tile_index4(pm, pk, M, K, LAYOUT: gl.constexpr):
    """Tile (pm, pk)'s rows [1, 4, 32, 1], columns [2, 1, 1, 64] and mask in a [kw, mw, r, c] LAYOUT."""
    kw = gl.arange(0, 2, layout=gl.SliceLayout(1, gl.SliceLayout(2, gl.SliceLayout(3, LAYOUT))))
    mw = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, gl.SliceLayout(3, LAYOUT))))
    r = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(3, LAYOUT))))
    c = gl.arange(0, 64, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, LAYOUT))))
    rows = pm * _TILE + mw[None, :, None, None] * 32 + r[None, None, :, None]
    cols = pk * _TILE + kw[:, None, None, None] * 64 + c[None, None, None, :]
    return rows, cols, (rows < M) & (cols < K)


@gluon.jit
def _weight_tile(x, pm, pk, y_ptr, s_ptr, yt_ptr, st_ptr, M, K, s_sm, s_sg, st_sk, st_sm, POW2: gl.constexpr):
    """Tile (pm, pk) of X, held as `x` [128, 128] in ALONG_K, into Y, Yᵀ and their one 128x128 block scale."""
    rows, cols, mask = _tile_index(pm, pk, M, K, ALONG_K)
    t_rows, t_cols, t_mask = _tile_index(pm, pk, M, K, ALONG_M)
    xf = x.to(gl.float32)
    scale = block_scale(gl.max(gl.max(gl.abs(xf), axis=1), axis=0), POW2)
    gl.store(y_ptr + rows[:, None] * K + cols[None, :], scale_to_e4m3(xf, scale), mask=mask)
    # Yᵀ quantized again from X's registers renumbered, not from Y's E4M3 values renumbered
    gl.store(yt_ptr + t_cols[None, :] * M + t_rows[:, None], scale_to_e4m3(gl.convert_layout(xf, ALONG_M), scale),
             mask=t_mask)
    inverse = exact_rcp(scale)
    gl.store(s_ptr + pm * s_sm + pk * s_sg, inverse)
    gl.store(st_ptr + pk * st_sk + pm * st_sm, inverse)


@gluon.jit
def _activation_tile(x, pm, pk, y_ptr, s_ptr, yt_ptr, st_ptr, M, K, s_sm, s_sg, st_sk, st_sm, POW2: gl.constexpr):
    """Tile (pm, pk) of X, held as `x` [2, 4, 32, 64] in ACT_ALONG_K, into Y and Yᵀ with a scale per row and
    per column. Each warp reduces its part of every row and column it holds in registers and shuffles; the
    warps then swap those partial maxes through shared memory once, each row's and column's owning thread
    makes its scale and inverse (4 divisions per thread), and the scales go back once. Triton places the barriers:
    one between each exchange's stores and its loads, and one more before the second exchange's stores because
    they reuse the first's buffers; 3 in all, where Triton's own reductions and layout conversions took 13."""
    xf = x.to(gl.float32)
    xt = gl.convert_layout(xf, ACT_ALONG_M)  # the same registers renumbered
    row_parts = gl.allocate_shared_memory(gl.float32, [2, 4, 32], _FLAT3)
    col_parts = gl.allocate_shared_memory(gl.float32, [2, 4, 64], _FLAT3)
    row_parts.store(gl.max(gl.abs(xf), axis=3))
    col_parts.store(gl.max(gl.abs(xt), axis=2))
    row_scale = block_scale(gl.max(row_parts.load(ROW_PARTS), axis=0), POW2)
    col_scale = block_scale(gl.max(col_parts.load(COL_PARTS), axis=1), POW2)
    owned_rows = (pm * _TILE + gl.arange(0, 4, layout=gl.SliceLayout(1, ROW_OWNED))[:, None] * 32
                  + gl.arange(0, 32, layout=gl.SliceLayout(0, ROW_OWNED))[None, :])
    gl.store(s_ptr + owned_rows * s_sm + pk * s_sg, exact_rcp(row_scale), mask=owned_rows < M)
    owned_cols = (pk * _TILE + gl.arange(0, 2, layout=gl.SliceLayout(1, COL_OWNED))[:, None] * 64
                  + gl.arange(0, 64, layout=gl.SliceLayout(0, COL_OWNED))[None, :])
    gl.store(st_ptr + owned_cols * st_sk + pm * st_sm, exact_rcp(col_scale), mask=owned_cols < K)
    row_scales = gl.allocate_shared_memory(gl.float32, [4, 32], _FLAT2)
    col_scales = gl.allocate_shared_memory(gl.float32, [2, 64], _FLAT2)
    row_scales.store(row_scale)
    col_scales.store(col_scale)
    rs = row_scales.load(_ROW_SCALES)
    cs = col_scales.load(_COL_SCALES)
    rows, cols, mask = _tile_index4(pm, pk, M, K, ACT_ALONG_K)
    gl.store(y_ptr + rows * K + cols, scale_to_e4m3(xf, rs[None, :, :, None]), mask=mask)
    t_rows, t_cols, t_mask = _tile_index4(pm, pk, M, K, ACT_ALONG_M)
    gl.store(yt_ptr + t_cols * M + t_rows, scale_to_e4m3(xt, cs[:, None, None, :]), mask=t_mask)


@gluon.jit
def _cast_both_kernel(x_ptr, y_ptr, s_ptr, yt_ptr, st_ptr, M, K, stride_m, s_sm, s_sg, st_sk, st_sm,
                      WEIGHT: gl.constexpr, POW2: gl.constexpr):
    """One 128x128 tile (pm, pk) of X [M, K] (unit stride along K) into Y [M, K] and Yᵀ [K, M], E4M3.
    Scales (inverse, float32): s[row or block row, group] at s_sm, s_sg; st[column or block column, block row]
    at st_sk, st_sm."""
    pm = gl.program_id(0)
    pk = gl.program_id(1)
    if WEIGHT:
        rows, cols, mask = _tile_index(pm, pk, M, K, ALONG_K)
        x = gl.load(x_ptr + rows[:, None] * stride_m + cols[None, :], mask=mask, other=0.0)
        _weight_tile(x, pm, pk, y_ptr, s_ptr, yt_ptr, st_ptr, M, K, s_sm, s_sg, st_sk, st_sm, POW2)
    else:
        rows, cols, mask = _tile_index4(pm, pk, M, K, ACT_ALONG_K)
        x = gl.load(x_ptr + rows * stride_m + cols, mask=mask, other=0.0)
        _activation_tile(x, pm, pk, y_ptr, s_ptr, yt_ptr, st_ptr, M, K, s_sm, s_sg, st_sk, st_sm, POW2)


_launch_both = Launcher(_cast_both_kernel)

MAXNREG = 128
"""Registers per thread ptxas may use: at most 128 lets two 8-warp programs share an SM, where a kernel that
takes more runs one program per SM, much slower; given 128, ptxas uses what the kernels do not need for
scheduling. A cap of 80, which lets three programs share an SM, spills a little and runs slower
(docs/kernels.md)."""


def kernel_args(x: torch.Tensor, weight: bool) -> tuple:
    """The kernel's arguments for X up to its constexprs: X, fresh Y, s, Yᵀ, st (the scales laid out as
    `quantize_blockwise_both` returns them), the sizes and the strides."""
    m, k = x.shape
    y = torch.empty((m, k), device=x.device, dtype=torch.float8_e4m3fn)
    yt = torch.empty((k, m), device=x.device, dtype=torch.float8_e4m3fn)
    tiles_m, tiles_k = cdiv(m, TILE), cdiv(k, TILE)
    if weight:
        s = torch.empty((tiles_m, tiles_k), device=x.device, dtype=torch.float32)
        st = torch.empty((tiles_k, tiles_m), device=x.device, dtype=torch.float32)
    else:
        s, st = m_major_empty(m, tiles_k, x.device), m_major_empty(k, tiles_m, x.device)
    return x, y, s, yt, st, m, k, x.stride(0), s.stride(0), s.stride(1), st.stride(0), st.stride(1)


def quantize_both(x: torch.Tensor, weight: bool, pow2_scales: bool):
    """`quantize_blockwise_both`'s four tensors for X (2-D, CUDA, unit stride along K) in one launch."""
    args = kernel_args(x, weight)
    _launch_both.launch(cast_key(x, args[5:], weight, pow2_scales), (cdiv(args[5], TILE), cdiv(args[6], TILE)),
                        args, {"WEIGHT": weight, "POW2": pow2_scales, "num_warps": WARPS, "maxnreg": MAXNREG})
    return args[1:5]


def bytes_moved(x: torch.Tensor, weight: bool) -> int:
    """What `quantize_both` moves: X read once, Y and Yᵀ written (E4M3), both scale tensors written."""
    m, k = x.shape
    scales = 2 * cdiv(m, TILE) * cdiv(k, TILE) if weight else m * cdiv(k, TILE) + k * cdiv(m, TILE)
    return x.numel() * x.element_size() + 2 * x.numel() + 4 * scales


def compile_sm90(weight: bool, dtype: str = "bf16", **options):
    """The kernel compiled for sm_90 without a GPU, specialized as a launch specializes it (the scales' unit
    strides constexpr), for the ptxas check of tests/kernels/test_quantize_blockwise_gluon.py; `options` are compile options (maxnreg)."""
    signature = {"x_ptr": f"*{dtype}", "y_ptr": "*fp8e4nv", "s_ptr": "*fp32", "yt_ptr": "*fp8e4nv",
                 "st_ptr": "*fp32", **dict.fromkeys(("M", "K", "stride_m", "s_sm", "s_sg", "st_sk", "st_sm"), "i32")}
    ones = ("s_sg", "st_sm") if weight else ("s_sm", "st_sk")  # the unit strides a launch passes
    return compile_cast_sm90(_cast_both_kernel, signature, {"WEIGHT": weight, "POW2": False, **dict.fromkeys(ones, 1)},
                             WARPS, gluon=True, **options)
