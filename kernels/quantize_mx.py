"""MXFP8 quantization (OCP Microscaling Formats v1.0): 32-element blocks along the last dimension, each with a
shared E8M0 scale X = 2**(floor(log2(amax)) - 8) (8 = E4M3's largest exponent), elements V / X rounded to
E4M3 with saturation. An all-zero block gets X = 1.

One pass: load, per-block amax, exponent from the float32 bits, scale by an exact power of two, round, store
the E4M3 elements [M, K] and the biased E8M0 exponents [M, K/32] (uint8, 127 = 2**0). On Hopper this is for
numerics (no MX tensor cores); on Blackwell it feeds the MX GEMMs. `quantize_mx_reference` is plain torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._fp8 import round_to_e4m3
from ._launch import Launcher, cdiv

MX_BLOCK = 32
E4M3_EMAX = 8


@triton.jit
def _quantize_mx_kernel(x_ptr, y_ptr, e_ptr, M, K, stride_m, stride_k, n_blocks,
               BLOCK_M: tl.constexpr, BLOCKS_PER_PROG: tl.constexpr, MXB: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    blocks = tl.program_id(1) * BLOCKS_PER_PROG + tl.arange(0, BLOCKS_PER_PROG)
    cols = blocks[:, None] * MXB + tl.arange(0, MXB)[None, :]                      # [B, 32]
    offs = rows[:, None, None] * stride_m + cols[None, :, :] * stride_k             # [BM, B, 32]
    mask = (rows[:, None, None] < M) & (cols[None, :, :] < K)
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    amax = tl.max(tl.abs(x), axis=2)                                                # [BM, B]
    # floor(log2(amax)) from the exponent field (amax is a float32 from BF16/FP32 data: normal or zero)
    exp = ((amax.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    shared = tl.minimum(tl.maximum(exp - 8, -127), 127)
    shared = tl.where(amax > 0, shared, 0)
    # 1 / X = 2**-shared, exact: built from bits (-shared is in [-127, 127]; 2**-127 is subnormal)
    neg = -shared
    inv = tl.where(neg >= -126, ((neg + 127) << 23).to(tl.float32, bitcast=True),
                   (tl.full(neg.shape, 1, tl.int32) << 22).to(tl.float32, bitcast=True))
    q = round_to_e4m3(x * inv[:, :, None])
    tl.store(y_ptr + rows[:, None, None] * K + cols[None, :, :], q.to(tl.float8e4nv), mask=mask)
    emask = (rows[:, None] < M) & (blocks[None, :] < n_blocks)
    tl.store(e_ptr + rows[:, None] * n_blocks + blocks[None, :], (shared + 127).to(tl.uint8), mask=emask)


_launch_mx = Launcher(_quantize_mx_kernel)


def quantize_mx(x: torch.Tensor, block_m: int = 8, blocks_per_prog: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """(elements [M, K] E4M3, E8M0 biased exponents [M, ceil(K/32)] uint8). Each program takes `block_m` rows of
    `blocks_per_prog` 32-element blocks: 8 x 16 (512 columns), the fastest tile of the cast-structure probe at
    every size it tried (docs/kernels.md)."""
    if x.dim() != 2:
        raise ValueError(f"quantize_mx takes a 2-D tensor, got shape {tuple(x.shape)}")
    m, k = x.shape
    n_blocks = cdiv(k, MX_BLOCK)
    y = torch.empty((m, k), device=x.device, dtype=torch.float8_e4m3fn)
    e = torch.empty((m, n_blocks), device=x.device, dtype=torch.uint8)
    grid = (cdiv(m, block_m), cdiv(n_blocks, blocks_per_prog))
    _launch_mx(grid, x, y, e, m, k, x.stride(0), x.stride(1), n_blocks, BLOCK_M=block_m,
               BLOCKS_PER_PROG=blocks_per_prog, MXB=MX_BLOCK)
    return y, e


def quantize_mx_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    xp = torch.nn.functional.pad(x.float(), (0, (-k) % MX_BLOCK))
    t = xp.reshape(m, -1, MX_BLOCK)
    amax = t.abs().amax(dim=2, keepdim=True)
    _, e = torch.frexp(amax)
    shared = torch.where(amax > 0, ((e - 1) - E4M3_EMAX).clamp(-127, 127), torch.zeros_like(e))
    y = (t * torch.pow(2.0, -shared.double()).float()).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    return y.reshape(m, -1)[:, :k].contiguous(), (shared + 127).to(torch.uint8).squeeze(2)


def dequantize_mx(y: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    scale = torch.pow(2.0, e.double() - 127).float().repeat_interleave(MX_BLOCK, dim=1)[:, : y.shape[1]]
    return y.float() * scale


def bytes_moved(x: torch.Tensor) -> int:
    """Read X once, write the E4M3 elements and one E8M0 byte per 32."""
    return x.numel() * x.element_size() + x.numel() + x.shape[0] * cdiv(x.shape[1], MX_BLOCK)
