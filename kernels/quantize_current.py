"""Current (tensorwise) scaling of a 2-D BF16 tensor to E4M3, plus the transposed E4M3 copy that Hopper's
TN-only FP8 GEMMs need for the backward pass.

Two passes over the data, the fewest the math allows (every element's cast needs the whole tensor's amax):
1. `_amax_kernel`: each program reduces one [BLOCK_M, BLOCK_N] tile to max|x| and atomically maxes it into a
   single float32;
2. `_cast_transpose_kernel`: each program loads one tile once, scales it, rounds to E4M3 (ties to even,
   saturating) and stores it twice, row-major (Y) and column-major (Yᵀ).
Between them, one scalar op computes scale = 448 / max(amax, 1e-12) in float32, exactly as torchao, TE and
fp8bench's emulator do. Bytes moved: read X twice (2 x 2 bytes/element), write Y and Yᵀ (2 x 1 byte).

`quantize_current_reference` is the same contract in plain torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._fp8 import AMAX_EPS, E4M3_MAX, round_to_e4m3


@triton.jit
def _amax_kernel(x_ptr, amax_ptr, M, N, stride_m, stride_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_n, mask=mask, other=0.0)
    tl.atomic_max(amax_ptr, tl.max(tl.max(tl.abs(x.to(tl.float32)), axis=1), axis=0))


@triton.jit
def _cast_transpose_kernel(x_ptr, y_ptr, yt_ptr, scale_ptr, M, N, stride_m, stride_n,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_m + cols[None, :] * stride_n, mask=mask, other=0.0)
    scale = tl.load(scale_ptr)
    q = round_to_e4m3(tl.minimum(tl.maximum(x.to(tl.float32) * scale, -E4M3_MAX), E4M3_MAX)).to(tl.float8e4nv)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], q, mask=mask)
    tl.store(yt_ptr + cols[:, None] * M + rows[None, :], tl.trans(q), mask=tl.trans(mask))


def quantize_current(x: torch.Tensor, block_m: int = 64, block_n: int = 128,
                     transpose: bool = True) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(Y [M, N] E4M3, Yᵀ [N, M] E4M3 contiguous or None, inverse scale: float32 scalar tensor)."""
    if x.dim() != 2:
        raise ValueError(f"quantize_current takes a 2-D tensor, got shape {tuple(x.shape)}")
    m, n = x.shape
    amax = torch.zeros((), device=x.device, dtype=torch.float32)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _amax_kernel[grid](x, amax, m, n, x.stride(0), x.stride(1), BLOCK_M=block_m, BLOCK_N=block_n)
    scale = E4M3_MAX / torch.clamp(amax, min=AMAX_EPS)
    y = torch.empty((m, n), device=x.device, dtype=torch.float8_e4m3fn)
    yt = torch.empty((n, m), device=x.device, dtype=torch.float8_e4m3fn)
    _cast_transpose_kernel[grid](x, y, yt, scale, m, n, x.stride(0), x.stride(1), BLOCK_M=block_m, BLOCK_N=block_n)
    return y, (yt if transpose else None), scale.reciprocal()


def quantize_current_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scale = E4M3_MAX / torch.clamp(x.float().abs().amax(), min=AMAX_EPS)
    y = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
    return y, y.t().contiguous(), scale.reciprocal()


def bytes_moved(x: torch.Tensor) -> int:
    """What the algorithm must move: read X for the amax and again for the cast, write Y and Yᵀ."""
    return 2 * x.numel() * x.element_size() + 2 * x.numel()
