"""Tensor-core work of a chosen length that touches no memory in its loop: the filler behind fp8bench's
test-only `slowdown` knob (fp8bench.core.measure).

Why not an idle wait (`torch.cuda._sleep`): under a board power limit the clocks rise while the GPU idles, so
the work around the wait runs faster and part of the injected delay disappears: on a power-capped GPU an idle
wait moves the median by only part of its length (docs/regression.md). A filler that keeps every SM's tensor cores
busy draws power more like the GEMMs it extends; not exactly, so fp8bench.core.measure sizes it by feedback.

Each program loads one BLOCK x BLOCK FP16 tile once and accumulates `iters` products of it with itself in
FP32; the accumulator is loop-carried and stored, so the compiler cannot drop the loop. Its duration grows
linearly with `iters` (one 128³ MMA per program and iteration).

`tensor_core_load_reference` is the same contract in plain torch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 128


@triton.jit
def _tensor_core_load_kernel(a_ptr, out_ptr, iters, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tile = offs[:, None] * BLOCK + offs[None, :]
    a = tl.load(a_ptr + tile)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for _ in range(iters):
        acc = tl.dot(a, a, acc)
    tl.store(out_ptr + tl.program_id(0) * BLOCK * BLOCK + tile, acc)


def make_operand(device: torch.device | str, block: int = BLOCK) -> torch.Tensor:
    """A small FP16 tile whose repeated products stay far from overflow (entries ~1e-2)."""
    g = torch.Generator().manual_seed(0)
    return (torch.rand(block, block, generator=g) / block).half().to(device)


def tensor_core_load(a: torch.Tensor, iters: int, programs: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """Run `programs` copies (one per SM is enough to occupy the chip) of `iters` MMAs of `a`; returns their
    FP32 accumulators, `programs` x BLOCK x BLOCK. `a` is FP16, BLOCK x BLOCK: the same tensor-core rate as
    BF16, and Triton's interpreter multiplies BF16 dots wrongly."""
    block = a.shape[0]
    if a.shape != (block, block) or a.dtype != torch.float16:
        raise ValueError(f"a must be a square FP16 tile, got {tuple(a.shape)} {a.dtype}")
    if out is None:
        out = torch.empty(programs, block, block, dtype=torch.float32, device=a.device)
    _tensor_core_load_kernel[(programs,)](a, out, iters, BLOCK=block)
    return out


def tensor_core_load_reference(a: torch.Tensor, iters: int, programs: int) -> torch.Tensor:
    product = a.float() @ a.float()
    return (product * iters).expand(programs, *product.shape).contiguous()
