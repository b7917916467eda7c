"""Current (tensorwise) scaling of a 2-D BF16 tensor to E4M3, plus the transposed E4M3 copy that Hopper's
TN-only FP8 GEMMs need for the backward pass.

Two passes over the data, the fewest the math allows (every element's cast needs the whole tensor's amax), and
two launches, nothing else on the GPU between them:
1. `_amax_kernel`: a grid-stride loop reduces tiles to max|x| in registers; each program writes its own
   partial max (no atomic, so nothing to zero first: a `torch.zeros` was a third launch);
2. `_cast_transpose_kernel`: each program reduces the partials to the amax (a few KB, from L2), computes
   scale = 448 / max(amax, 1e-12) in float32 the way torch evaluates it (reciprocal, then multiply; fp8bench's
   emulator and torchao do the same), loads one tile once, scales it, rounds to E4M3 (ties to even, saturating)
   and stores it twice, row-major (Y) and column-major (Yᵀ). Program 0 also writes the inverse scale. Bytes
   moved: read X twice (2 x 2 bytes/element), write Y and Yᵀ (2 x 1 byte).

Both launch through `Launcher.launch` with a cast key (`_launch.cast_key`). Before, the generic per-argument key,
the zeroing and four allocations cost 53 µs of host time a call on the f5e8879 H200 box
(`results/h200-recipe-blockwise/recipe_bench_host_f5e8879.json`), more than the kernels take at 32 MB, and at
7a1f962 (the same code) the eager 32 MB call ran at half the speed of its CUDA-graph replay
(`results/h200-recipe-blockwise/recipe_bench_casts_7a1f962.json`: 1654 against 3054 GB/s).

`quantize_current_reference` is the same contract in plain torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._fp8 import AMAX_EPS, E4M3_MAX, e4m3_scale, exact_rcp, scale_to_e4m3
from ._launch import Launcher, cast_key, cdiv, sm_count
from ._tune import steady_do_bench, tuning_configs

AMAX_TILE = (64, 128)
"""The amax pass's tile (4 warps): on the H200 any tile from 32x128 to 128x128 reads at the same speed."""


@triton.jit
def _amax_kernel(x_ptr, partial_ptr, M, N, stride_m, stride_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # a grid-stride loop over tiles: each program keeps its running max in registers and writes it once
    tiles_n = tl.cdiv(N, BLOCK_N)
    n_tiles = tl.cdiv(M, BLOCK_M) * tiles_n
    best = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
        rows = (t // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = (t % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_n, mask=mask, other=0.0)
        best = tl.maximum(best, tl.abs(x.to(tl.float32)))
    tl.store(partial_ptr + tl.program_id(0), tl.max(tl.max(best, axis=1), axis=0))


CAST_CONFIGS = tuning_configs(
    [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w)
     for bm, bn, w in [(64, 128, 4), (128, 64, 4), (32, 256, 4), (64, 256, 8), (128, 128, 8), (64, 64, 4),
                       (128, 128, 4)]],
    interpreter=triton.Config({"BLOCK_M": 64, "BLOCK_N": 128}, num_warps=4))


@triton.autotune(configs=CAST_CONFIGS, key=["M", "N", "n_partials", "TRANSPOSE"], do_bench=steady_do_bench)
@triton.jit
def _cast_transpose_kernel(x_ptr, y_ptr, yt_ptr, partial_ptr, inv_scale_ptr, M, N, stride_m, stride_n, n_partials,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PARTIALS: tl.constexpr,
                           TRANSPOSE: tl.constexpr):
    # every program derives the scale from the amax pass's partials itself: no scalar kernels between the passes
    p = tl.arange(0, PARTIALS)
    amax = tl.max(tl.load(partial_ptr + p, mask=p < n_partials, other=0.0), axis=0)
    scale = e4m3_scale(amax)
    if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
        tl.store(inv_scale_ptr, exact_rcp(scale))
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_n, mask=mask, other=0.0)
    q = scale_to_e4m3(x.to(tl.float32), scale)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], q, mask=mask)
    if TRANSPOSE:
        tl.store(yt_ptr + cols[:, None] * M + rows[None, :], tl.trans(q), mask=tl.trans(mask))


_launch_amax, _launch_cast = Launcher(_amax_kernel), Launcher(_cast_transpose_kernel)


def quantize_current(x: torch.Tensor, transpose: bool = True,
                     amax_programs: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(Y [M, N] E4M3, Yᵀ [N, M] E4M3 contiguous or None, inverse scale: float32 scalar tensor).
    `amax_programs`: the amax pass's grid (default: 4 per SM); the cast's tile is autotuned per shape."""
    if x.dim() != 2:
        raise ValueError(f"quantize_current takes a 2-D tensor, got shape {tuple(x.shape)}")
    m, n = x.shape
    tiles = cdiv(m, AMAX_TILE[0]) * cdiv(n, AMAX_TILE[1])
    programs = max(1, min(tiles, amax_programs or 4 * sm_count(x.device)))
    partials = torch.empty(programs, device=x.device, dtype=torch.float32)
    args = (x, partials, m, n, x.stride(0), x.stride(1))
    _launch_amax.launch(cast_key(x, args[2:]), (programs,), args,
                        {"BLOCK_M": AMAX_TILE[0], "BLOCK_N": AMAX_TILE[1], "num_warps": 4})
    inv_scale = torch.empty((), device=x.device, dtype=torch.float32)
    y = torch.empty((m, n), device=x.device, dtype=torch.float8_e4m3fn)
    yt = torch.empty((n, m), device=x.device, dtype=torch.float8_e4m3fn) if transpose else y
    args = (x, y, yt, partials, inv_scale, m, n, x.stride(0), x.stride(1), programs)
    _launch_cast.launch(cast_key(x, args[5:], transpose),
                        lambda meta: (cdiv(m, meta["BLOCK_M"]), cdiv(n, meta["BLOCK_N"])), args,
                        {"PARTIALS": triton.next_power_of_2(programs), "TRANSPOSE": transpose})
    return y, (yt if transpose else None), inv_scale


def quantize_current_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scale = E4M3_MAX / torch.clamp(x.float().abs().amax(), min=AMAX_EPS)
    y = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return y, y.t().contiguous(), scale.reciprocal()


def bytes_moved(x: torch.Tensor) -> int:
    """What the algorithm must move: read X for the amax and again for the cast, write Y and Yᵀ."""
    return 2 * x.numel() * x.element_size() + 2 * x.numel()
