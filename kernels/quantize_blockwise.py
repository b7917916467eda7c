"""Blockwise FP8 quantization in the DeepSeek-V3 layout: 1x128 groups (one scale per row per 128 columns:
activations and gradients) and 128x128 blocks (one scale per block: weights), E4M3 with float32 scales.

One pass: each program loads its groups once, reduces each to its amax, computes scale = 448 / max(amax, 1e-12)
(optionally rounded down to a power of two, TE Float8BlockScaling's default) and stores the E4M3 values and
the inverse scales (what the GEMM multiplies by). Bytes moved: read X once, write Y and the scales. (Both
layouts at once, `quantize_blockwise_both`, are one Gluon kernel on a GPU: `quantize_blockwise_gluon`; the
Triton kernels here serve them under the interpreter.)

Scale layouts (row-major float32): 1x128 -> [M, ceil(K/128)]; 128x128 -> [ceil(M/128), ceil(K/128)]. 1x128
scales can instead be written M-major (`m_major_scales`), as Hopper's blockwise GEMMs read them.
`quantize_blockwise_reference` is the same contract in plain torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import quantize_blockwise_gluon
from ._fp8 import AMAX_EPS, E4M3_MAX, block_scale, exact_rcp, scale_to_e4m3
from ._launch import Launcher, cast_key, cdiv
from ._layout import m_major_empty
from ._sm90 import compile_cast_sm90
from ._tune import INTERPRETING, steady_do_bench, tuning_configs

GROUP = 128


GROUP_CONFIGS = tuning_configs(  # 1x128: rows per program x 128-column groups per program
    [triton.Config({"BLOCK_M": bm, "GROUPS": g}, num_warps=w)
     for bm, g, w in [(64, 1, 8), (16, 1, 4), (32, 1, 4), (128, 1, 8), (32, 2, 4), (32, 4, 8), (16, 4, 4),
                      (64, 2, 8), (8, 8, 4), (16, 8, 8)]],
    interpreter=triton.Config({"BLOCK_M": 16, "GROUPS": 2}, num_warps=4))
BLOCK_CONFIGS = tuning_configs([triton.Config({"BLOCK_M": 128}, num_warps=w) for w in (4, 8, 16)],
                               interpreter=triton.Config({"BLOCK_M": 128}, num_warps=4))


@triton.autotune(configs=GROUP_CONFIGS, key=["M", "K", "POW2", "s_stride_m"], do_bench=steady_do_bench)
@triton.jit
def _quantize_1x128_kernel(x_ptr, y_ptr, s_ptr, M, K, stride_m, stride_k, n_groups, s_stride_m, s_stride_g,
                         BLOCK_M: tl.constexpr, GROUPS: tl.constexpr, GROUP_K: tl.constexpr, POW2: tl.constexpr):
    # each program: BLOCK_M rows x GROUPS consecutive 128-column groups, as a [BLOCK_M, GROUPS, 128] tile
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    groups = tl.program_id(1) * GROUPS + tl.arange(0, GROUPS)
    cols = groups[:, None] * GROUP_K + tl.arange(0, GROUP_K)[None, :]                  # [G, 128]
    mask = (rows[:, None, None] < M) & (cols[None, :, :] < K)
    x = tl.load(x_ptr + rows[:, None, None] * stride_m + cols[None, :, :] * stride_k, mask=mask,
                other=0.0).to(tl.float32)
    scale = block_scale(tl.max(tl.abs(x), axis=2), POW2)  # [BM, G]
    q = scale_to_e4m3(x, scale[:, :, None])
    tl.store(y_ptr + rows[:, None, None] * K + cols[None, :, :], q, mask=mask)
    smask = (rows[:, None] < M) & (groups[None, :] < n_groups)
    tl.store(s_ptr + rows[:, None] * s_stride_m + groups[None, :] * s_stride_g, exact_rcp(scale), mask=smask)


@triton.autotune(configs=BLOCK_CONFIGS, key=["M", "K", "POW2"], do_bench=steady_do_bench)
@triton.jit
def _quantize_128x128_kernel(x_ptr, y_ptr, s_ptr, M, K, stride_m, stride_k, n_groups,
                           BLOCK_M: tl.constexpr, POW2: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_k, mask=mask, other=0.0).to(tl.float32)
    scale = block_scale(tl.max(tl.max(tl.abs(x), axis=1), axis=0), POW2)
    tl.store(y_ptr + rows[:, None] * K + cols[None, :], scale_to_e4m3(x, scale), mask=mask)
    tl.store(s_ptr + tl.program_id(0) * n_groups + tl.program_id(1), exact_rcp(scale))


BOTH_LAYOUTS_CONFIGS = tuning_configs(  # the chunks of a 128x128 block: amax pass [SUB_M, 128], store pass [128, SUB_K]
    [triton.Config({"SUB_M": sm, "SUB_K": sk}, num_warps=8) for sm, sk in [(64, 64), (32, 64)]],
    interpreter=triton.Config({"SUB_M": 32, "SUB_K": 64}, num_warps=4))
"""The two fastest chunkings of the cast-structure probe (docs/kernels.md): 64x64 chunks at 8 warps take less
time than the whole block held in registers and stored with its transpose. At 4 warps the chunks spill."""


@triton.jit
def block_amax_by_rows(x_ptr, pm, pk, M, K, stride_m, stride_k, SUB_M: tl.constexpr):
    """max|x| over the 128x128 block (pm, pk) of X, read in row chunks [SUB_M, 128] with only a running max held
    (the first pass of the two-layout weight cast)."""
    cols = pk * 128 + tl.arange(0, 128)
    amax = tl.zeros((SUB_M, 128), dtype=tl.float32)
    for r in tl.range(0, 128, SUB_M):
        rows = pm * 128 + r + tl.arange(0, SUB_M)
        mask = (rows[:, None] < M) & (cols[None, :] < K)
        x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_k, mask=mask, other=0.0)
        amax = tl.maximum(amax, tl.abs(x.to(tl.float32)))
    return tl.max(tl.max(amax, axis=1), axis=0)


@triton.jit
def store_block_both(x_ptr, y_ptr, yt_ptr, pm, pk, scale, M, K, stride_m, stride_k, SUB_K: tl.constexpr):
    """The second pass of the two-layout weight cast: block (pm, pk) of X again (from L2), in column chunks
    [128, SUB_K], each quantized with the block's `scale` and stored as is into Y and transposed into Yᵀ."""
    rows = pm * 128 + tl.arange(0, 128)
    for c in tl.range(0, 128, SUB_K):
        chunk = pk * 128 + c + tl.arange(0, SUB_K)
        mask = (rows[:, None] < M) & (chunk[None, :] < K)
        x = tl.load(x_ptr + rows[:, None] * stride_m + chunk[None, :] * stride_k, mask=mask, other=0.0)
        q = scale_to_e4m3(x.to(tl.float32), scale)
        tl.store(y_ptr + rows[:, None] * K + chunk[None, :], q, mask=mask)
        tl.store(yt_ptr + chunk[:, None] * M + rows[None, :], tl.trans(q), mask=tl.trans(mask))


@triton.autotune(configs=BOTH_LAYOUTS_CONFIGS, key=["M", "K", "POW2"], do_bench=steady_do_bench)
@triton.jit
def _quantize_128x128_both_kernel(x_ptr, y_ptr, yt_ptr, s_ptr, M, K, stride_m, stride_k, n_groups,
                                  SUB_M: tl.constexpr, SUB_K: tl.constexpr, POW2: tl.constexpr):
    # a weight's 128x128 block into Y and Yᵀ [K, M] (the same block, so the same scale and values), in two
    # passes over it: its amax from row chunks (nothing kept but a running max), then X again, from L2, in
    # column chunks [128, SUB_K], each stored as is and transposed. The whole block in registers with its
    # transposed store takes longer (at 4 warps it spills).
    pm, pk = tl.program_id(0), tl.program_id(1)
    scale = block_scale(block_amax_by_rows(x_ptr, pm, pk, M, K, stride_m, stride_k, SUB_M), POW2)
    store_block_both(x_ptr, y_ptr, yt_ptr, pm, pk, scale, M, K, stride_m, stride_k, SUB_K)
    tl.store(s_ptr + pm * n_groups + pk, exact_rcp(scale))


ALONG_M_CONFIGS = tuning_configs([triton.Config({"BLOCK_K": bk}, num_warps=w) for bk, w in ((32, 4), (64, 4), (64, 8))],
                                 interpreter=triton.Config({"BLOCK_K": 32}, num_warps=4))


@triton.autotune(configs=ALONG_M_CONFIGS, key=["M", "K", "POW2"], do_bench=steady_do_bench)
@triton.jit
def _quantize_along_m_kernel(x_ptr, yt_ptr, st_ptr, M, K, stride_m, stride_k, st_sk, st_sm,
                           GROUP_M: tl.constexpr, BLOCK_K: tl.constexpr, POW2: tl.constexpr):
    # Yᵀ [K, M] in 1x128 groups along M: each program takes 128 rows x BLOCK_K columns of X, one group per
    # column, and writes them transposed (a whole 128x128 tile with both layouts in registers spilled on sm_90)
    rows = tl.program_id(0) * GROUP_M + tl.arange(0, GROUP_M)
    cols = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    mask = (rows[:, None] < M) & (cols[None, :] < K)
    x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_k, mask=mask, other=0.0).to(tl.float32)
    scale = block_scale(tl.max(tl.abs(x), axis=0), POW2)
    q = scale_to_e4m3(x, scale[None, :])
    tl.store(yt_ptr + cols[:, None] * M + rows[None, :], tl.trans(q), mask=tl.trans(mask))
    tl.store(st_ptr + cols * st_sk + tl.program_id(0) * st_sm, exact_rcp(scale), mask=cols < K)


_launch_1x128, _launch_128x128, _launch_128x128_both, _launch_along_m = map(
    Launcher, (_quantize_1x128_kernel, _quantize_128x128_kernel, _quantize_128x128_both_kernel,
               _quantize_along_m_kernel))


def quantize_blockwise(x: torch.Tensor, block: tuple[int, int] = (1, GROUP), pow2_scales: bool = False,
                       m_major_scales: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(Y [M, K] E4M3, inverse scales float32) for block (1, 128) or (128, 128); launch shape autotuned.
    `m_major_scales` (1x128 only): the scales [M, K/128] as a view of a [K/128, M] buffer whose rows are padded
    to 16 bytes, the layout Hopper's blockwise GEMMs read A's scales in (gemm_blockwise_gluon's TMA, DeepGEMM),
    written directly so that no transposing copy lands in the GEMM."""
    if x.dim() != 2:
        raise ValueError(f"quantize_blockwise takes a 2-D tensor, got shape {tuple(x.shape)}")
    if m_major_scales and block != (1, GROUP):
        raise ValueError(f"m_major_scales is for 1x128 scales, not block={block!r}")
    m, k = x.shape
    n_groups = cdiv(k, GROUP)
    y = torch.empty((m, k), device=x.device, dtype=torch.float8_e4m3fn)
    if block == (1, GROUP):
        if m_major_scales:
            s = m_major_empty(m, n_groups, x.device)
        else:
            s = torch.empty((m, n_groups), device=x.device, dtype=torch.float32)
        args = (x, y, s, m, k, x.stride(0), x.stride(1), n_groups, s.stride(0), s.stride(1))
        _launch_1x128.launch(cast_key(x, args[3:], pow2_scales),
                             lambda meta: (cdiv(m, meta["BLOCK_M"]), cdiv(n_groups, meta["GROUPS"])), args,
                             {"GROUP_K": GROUP, "POW2": pow2_scales})
    elif block == (GROUP, GROUP):
        s = _quantize_blocks(x, y, None, pow2_scales)
    else:
        raise ValueError(f"block={block!r} is not supported; choose (1, 128) or (128, 128)")
    return y, s


def _quantize_blocks(x: torch.Tensor, y: torch.Tensor, yt: torch.Tensor | None, pow2_scales: bool) -> torch.Tensor:
    """128x128 blocks of X into Y (and Yᵀ when given, in the same kernel); returns the block scales."""
    m, k = x.shape
    n_groups = cdiv(k, GROUP)
    s = torch.empty((cdiv(m, GROUP), n_groups), device=x.device, dtype=torch.float32)
    grid = (cdiv(m, GROUP), n_groups)
    if yt is None:
        args = (x, y, s, m, k, x.stride(0), x.stride(1), n_groups)
        _launch_128x128.launch(cast_key(x, args[3:], pow2_scales), grid, args, {"POW2": pow2_scales})
    else:
        args = (x, y, yt, s, m, k, x.stride(0), x.stride(1), n_groups)
        _launch_128x128_both.launch(cast_key(x, args[4:], pow2_scales), grid, args, {"POW2": pow2_scales})
    return s


def quantize_blockwise_both(x: torch.Tensor, weight: bool = False, pow2_scales: bool = False,
                            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """X [M, K] quantized for both GEMMs of a training step that use it: (Y [M, K], its scales, Yᵀ [K, M], its
    scales), each layout equal to `quantize_blockwise` of that layout, bit for bit. Activations and gradients
    (`weight=False`) get 1x128 groups along K in Y (fprop, dgrad) and along M in Yᵀ (wgrad sums over tokens),
    both scales M-major as the GEMMs read them. A weight gets 128x128 blocks, the same in either layout: Yᵀ is
    Y's FP8 values and block scales transposed (fprop and dgrad).

    On a GPU (X with unit stride along K) one Gluon kernel writes all four, reading each 128x128 tile of X from
    HBM once (`quantize_blockwise_gluon`). Elsewhere (Triton's interpreter) Triton kernels do: for activations
    the 1x128 cast and an along-M cast, X read once per layout; for a BF16 weight one kernel in two passes over
    each block; for an FP32 weight Y and then a transposing copy (compiled for sm_90, that kernel's transposed
    store has written a wrong Yᵀ from FP32 input: docs/kernels.md)."""
    if x.dim() != 2:
        raise ValueError(f"quantize_blockwise_both takes a 2-D tensor, got shape {tuple(x.shape)}")
    if x.is_cuda and x.stride(1) == 1 and not INTERPRETING:
        return quantize_blockwise_gluon.quantize_both(x, weight, pow2_scales)
    if weight:
        m, k = x.shape
        y = torch.empty((m, k), device=x.device, dtype=torch.float8_e4m3fn)
        if x.dtype != torch.bfloat16:
            # FP32 weights (a training step's master weights): Yᵀ is Y transposed (docstring)
            s = _quantize_blocks(x, y, None, pow2_scales)
            return y, s, y.t().contiguous(), s.t().contiguous()
        yt = torch.empty((k, m), device=x.device, dtype=torch.float8_e4m3fn)
        s = _quantize_blocks(x, y, yt, pow2_scales)
        return y, s, yt, s.t().contiguous()
    y, s = quantize_blockwise(x, (1, GROUP), pow2_scales, m_major_scales=True)
    m, k = x.shape
    yt = torch.empty((k, m), device=x.device, dtype=torch.float8_e4m3fn)
    st = m_major_empty(k, cdiv(m, GROUP), x.device)
    args = (x, yt, st, m, k, x.stride(0), x.stride(1), st.stride(0), st.stride(1))
    _launch_along_m.launch(cast_key(x, args[3:], pow2_scales), lambda meta: (cdiv(m, GROUP), cdiv(k, meta["BLOCK_K"])),
                           args, {"GROUP_M": GROUP, "POW2": pow2_scales})
    return y, s, yt, st


def quantize_blockwise_reference(x: torch.Tensor, block: tuple[int, int] = (1, GROUP),
                                 pow2_scales: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    br, bc = block
    pm, pk = (-m) % br, (-k) % bc
    xp = torch.nn.functional.pad(x.float(), (0, pk, 0, pm))
    t = xp.reshape(xp.shape[0] // br, br, xp.shape[1] // bc, bc)
    scale = E4M3_MAX / torch.clamp(t.abs().amax(dim=(1, 3), keepdim=True), min=AMAX_EPS)
    if pow2_scales:
        scale = (scale.view(torch.int32) & 0x7F800000).view(torch.float32)
    y = (t * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    y = y.reshape(xp.shape)[:m, :k].contiguous()
    return y, (1.0 / scale).reshape(t.shape[0], t.shape[2])


def bytes_moved(x: torch.Tensor, block: tuple[int, int] = (1, GROUP)) -> int:
    m, k = x.shape
    n_scales = m * cdiv(k, GROUP) if block == (1, GROUP) else cdiv(m, GROUP) * cdiv(k, GROUP)
    return x.numel() * x.element_size() + x.numel() + 4 * n_scales


def compile_along_m_sm90(block_k: int, num_warps: int):
    """The Yᵀ kernel of `quantize_blockwise_both` for activations and gradients (the interpreter's path)."""
    signature = {"x_ptr": "*bf16", "yt_ptr": "*fp8e4nv", "st_ptr": "*fp32",
                 **dict.fromkeys(("M", "K", "stride_m", "stride_k", "st_sk", "st_sm"), "i32")}
    return compile_cast_sm90(_quantize_along_m_kernel.fn, signature,
                             {"GROUP_M": GROUP, "BLOCK_K": block_k, "POW2": False, "stride_k": 1, "st_sk": 1}, num_warps)


def compile_blocks_both_sm90(config: triton.Config):
    """The weight kernel with its transposed store (`quantize_blockwise_both(weight=True)` from BF16 under the
    interpreter), one of `BOTH_LAYOUTS_CONFIGS`."""
    signature = {"x_ptr": "*bf16", "y_ptr": "*fp8e4nv", "yt_ptr": "*fp8e4nv", "s_ptr": "*fp32",
                 **dict.fromkeys(("M", "K", "stride_m", "stride_k", "n_groups"), "i32")}
    return compile_cast_sm90(_quantize_128x128_both_kernel.fn, signature,
                             {**config.kwargs, "POW2": False, "stride_k": 1}, config.num_warps)
