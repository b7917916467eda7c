"""The Gluon blockwise GEMM's structure with the scales taken out: its ceiling, for gemm_variant_probe.py --gluon.

Same producer warp (`_loader`, which also stages A's scales, here all ones and never read), ring, mbarriers,
128x256 tiles of two 128-wide halves and epilogue as kernels/gemm_blockwise_gluon.py, but the math warpgroups
only accumulate, in one of these ways:
- IN_FLIGHT = 0: each K group's wgmmas are waited for before the next group's are issued, as the scaled kernel
  must (it reads the accumulator every group). The gap between this and the unscaled Triton kernel is what
  that structure costs; the gap between this and the scaled kernel is what the scaling costs.
- IN_FLIGHT = 1: the next group's wgmmas are issued while the last group's run, the stage released once they
  are done (what Triton's pipeliner does for an unscaled GEMM): the ceiling if the per-group wait were gone.
- MULTIPLY (with IN_FLIGHT = 0): each group first multiplies both accumulators by a per-row factor (1.0, a
  kernel argument, so not folded), as rescale does with its scale ratio, but with no scale loaded from
  memory: what the CUDA-core step alone costs.
- SIDE = 1 or 2 (with IN_FLIGHT = 0): 64 or 128 multiplies per thread per group like MULTIPLY's, but on a tile
  of registers that no wgmma reads or writes. ptxas issues them between the warpgroup's own wgmmas, which
  they do not wait for (Triton 3.6, sm_90 SASS): whether FP32 work costs the tensor cores as such, or only
  where it stands between wgmmas.
- PINGPONG (with IN_FLIGHT = 0): the math warpgroups take turns issuing their wgmmas, as the scaled kernel's
  have since e8337d4 (without it they run free): whether the turns lift these ceilings as they lift promote.
"""

from __future__ import annotations

import torch
import triton
from fp8bench_kernels.gemm_blockwise import _tile
from fp8bench_kernels.gemm_blockwise_gluon import (
    BLOCK_K,
    GROUP,
    SCALES_LAYOUT,
    TensorDescriptor,
    _descriptor,
    _invalidate,
    _loader,
    _my_turn,
    _n_tiles,
    _ring_barriers,
    _settled,
    _store_rows,
    _your_turn,
)
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait


@gluon.jit
def _accumulating_consumer(a_smem, b_smem, c_smem, ready, empty, c_desc, M, N, n_kgroups, factor, WG: gl.constexpr,
                           BLOCK_M: gl.constexpr, SUB_N: gl.constexpr, GROUP_M: gl.constexpr,
                           STAGES: gl.constexpr, IN_FLIGHT: gl.constexpr, MULTIPLY: gl.constexpr,
                           SIDE: gl.constexpr, PINGPONG: gl.constexpr):
    ROWS: gl.constexpr = BLOCK_M // 2
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, SUB_N, 32])
    zero = gl.zeros((ROWS, SUB_N), gl.float32, mma)
    per_row = gl.expand_dims(gl.zeros([ROWS], gl.float32, gl.SliceLayout(1, mma)) + factor, 1)
    step = 0
    if WG == 1:
        _your_turn(WG, PINGPONG)
    for tile_id in range(gl.program_id(0), _n_tiles(M, N, BLOCK_M, 2 * SUB_N), gl.num_programs(0)):
        off_m, off_n = _tile(tile_id, M, N, BLOCK_M, 2 * SUB_N, GROUP_M)
        acc0 = zero
        acc1 = zero
        side = zero + per_row  # SIDE's tile: registers no wgmma reads or writes
        for kg in range(n_kgroups):
            stage = step % STAGES
            mbarrier.wait(ready.index(stage), (step // STAGES) & 1)
            a = a_smem.index(stage).slice(WG * ROWS, ROWS)
            if MULTIPLY:
                acc0 = acc0 * per_row
                acc1 = acc1 * per_row
            if SIDE > 0:  # as many multiplies on the side tile instead (ptxas moves them amid the wgmmas)
                for _ in gl.static_range(SIDE):
                    side = side * per_row
                side = _settled(side)
            _my_turn(WG, PINGPONG)
            acc0 = warpgroup_mma(a, b_smem.index(2 * stage).permute((1, 0)), acc0, use_acc=kg > 0, is_async=True)
            acc1 = warpgroup_mma(a, b_smem.index(2 * stage + 1).permute((1, 0)), acc1, use_acc=kg > 0,
                                 is_async=True)
            _your_turn(WG, PINGPONG)
            if IN_FLIGHT:  # this group's two wgmmas stay in flight; the last group's are done: free its stage
                acc0, acc1 = warpgroup_mma_wait(num_outstanding=2, deps=(acc0, acc1))
                if kg > 0:
                    mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES))
            else:
                acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
                mbarrier.arrive(empty.index(stage))
            step += 1
        if IN_FLIGHT:
            acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
            mbarrier.arrive(empty.index((step + STAGES - 1) % STAGES))
        if SIDE > 0:  # keeps the side tile live; factor - 1 is 0 at run time, which the compiler cannot know
            acc0 = acc0 + side * (factor - 1.0)
        _store_rows(c_smem, c_desc, acc0, acc1, off_m, off_n, N, WG, ROWS, SUB_N, 2)
    if WG == 0:
        _my_turn(WG, PINGPONG)
    tma.store_wait(pendings=0)


@gluon.jit
def _kernel(a_desc, b_desc, c_desc, sa_desc, M, N, n_kgroups, factor, BLOCK_M: gl.constexpr, SUB_N: gl.constexpr,
            GROUP_M: gl.constexpr, STAGES: gl.constexpr, IN_FLIGHT: gl.constexpr, MULTIPLY: gl.constexpr,
            SIDE: gl.constexpr, PINGPONG: gl.constexpr):
    a_smem = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, GROUP], a_desc.layout)
    sa_smem = gl.allocate_shared_memory(sa_desc.dtype, [STAGES, 1, BLOCK_M], sa_desc.layout)  # loaded, unread
    b_smem = gl.allocate_shared_memory(b_desc.dtype, [2 * STAGES, SUB_N, GROUP], b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [4, BLOCK_M // 2, SUB_N], c_desc.layout)
    ready, empty = _ring_barriers(STAGES)
    M = gl.to_tensor(M)
    N = gl.to_tensor(N)
    n_kgroups = gl.to_tensor(n_kgroups)
    factor = gl.to_tensor(factor)
    gl.warp_specialize([
        (_accumulating_consumer, (a_smem, b_smem, c_smem, ready, empty, c_desc, M, N, n_kgroups, factor, 0, BLOCK_M,
                                  SUB_N, GROUP_M, STAGES, IN_FLIGHT, MULTIPLY, SIDE, PINGPONG)),
        (_accumulating_consumer, (a_smem, b_smem, c_smem, ready, empty, c_desc, M, N, n_kgroups, factor, 1, BLOCK_M,
                                  SUB_N, GROUP_M, STAGES, IN_FLIGHT, MULTIPLY, SIDE, PINGPONG)),
        (_loader, (a_desc, b_desc, sa_desc, a_smem, b_smem, sa_smem, ready, empty, M, N, n_kgroups, BLOCK_M, SUB_N,
                   2, GROUP_M, STAGES)),
    ], [4, 1], [232, 40])
    _invalidate(ready, empty, STAGES)


def unscaled_gluon_gemm(a: torch.Tensor, b: torch.Tensor, in_flight: int, stages: int = 3,
                        persistent: bool = True, multiply: bool = False, side: int = 0,
                        turns: bool = False) -> torch.Tensor:
    """A · Bᵀ of E4M3 operands (no scales) through the Gluon kernel's structure on 128x256 tiles; `side`
    (0-2, with in_flight 0): 64 · side multiplies per thread per group on the side tile; `turns` (with
    in_flight 0): the math warpgroups take turns issuing their wgmmas, as the scaled kernel's do."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), device=a.device, dtype=torch.bfloat16)
    tiles = triton.cdiv(m, 128) * triton.cdiv(n, 256)
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count
    ones = torch.ones((triton.cdiv(k, BLOCK_K), triton.cdiv(m, 4) * 4), device=a.device)  # scales for the producer
    _kernel[(min(tiles, sms) if persistent else tiles,)](
        _descriptor(a, (128, BLOCK_K)), _descriptor(b, (128, BLOCK_K)), _descriptor(c, (64, 128)),
        TensorDescriptor.from_tensor(ones[:, :m], [1, 128], SCALES_LAYOUT), m, n,
        triton.cdiv(k, BLOCK_K), 1.0, BLOCK_M=128, SUB_N=128, GROUP_M=8, STAGES=stages, IN_FLIGHT=in_flight,
        MULTIPLY=multiply and not in_flight, SIDE=0 if in_flight else side,
        PINGPONG=turns and not in_flight, num_warps=4)
    return c
