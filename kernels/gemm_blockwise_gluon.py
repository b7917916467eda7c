"""The blockwise-scaled FP8 GEMM of `gemm_blockwise`, written in Gluon for Hopper (sm_90): same operands, same
scales, same result, with the tensor-core work and the per-group scaling overlapped by warp specialization.

Why a second kernel: in the Triton kernel every K group's scaling waits for that group's tensor-core product
(`wgmma.wait_group 0`), and all warps meet at CTA-wide barriers around each TMA refill, so the tensor cores idle
while the CUDA cores scale, and the same tiles without scales run far faster (docs/kernels.md). Keeping one
wgmma in flight while the same warpgroup scales
another accumulator does not work either: ptxas then serializes every wgmma of the kernel (C7514), since it
cannot tell that `wait_group 1` retired the accumulator being read.

So the overlap is between warpgroups, as in DeepGEMM: a producer warp TMA-loads each (tile, K group) into a
STAGES-deep ring (A's and B's tiles and the 1x128 scales of A's rows, read M-major: `m_major`), and two math
warpgroups, rows 0-63 and 64-127 of the tile, each wait for a stage (`ready` mbarrier), run their wgmmas, wait
for them, release the stage (`empty` mbarrier, one arrival per warpgroup) and scale. Registers move to the math
warpgroups (setmaxnreg: 40 for the producer). The grid is persistent when it is smaller than the tile count:
each program walks tiles in grouped order, and the producer runs ahead into the next tile while the math
warpgroups store the last one.

The math warpgroups take turns issuing wgmmas (`pingpong`, two named barriers, as FlashAttention-3 orders its
softmax and GEMM warpgroups): each issues its next wgmmas only after the other has issued its own, so its
products queue behind the other's and it scales while those run. Run free, our reading (not shown directly) is
that the two fall into step, since each SM sub-partition's tensor core takes both warpgroups' wgmmas as they
come: both products finish together and both warpgroups scale while the tensor cores idle. Taking turns runs
faster than running free, in sweeps and per GHz of SM clock alike (docs/kernels.md), and the result is
bit-identical either way.

A tile is HALVES (1 or 2) column halves of SUB_N (64 or 128), so B's 128x128 scale is one scalar per half and
group. Scaling, as in `gemm_blockwise` (`PROMOTE`):
- promote (DeepSeek-V3): each group's product goes to a fresh scratch tile that is scaled and added to an FP32
  sum on the CUDA cores, every 128 of K, one half after the other through the same scratch. A sum per half
  plus the scratch: 128x256 tiles, or 128x128 (one 128-wide half, DeepGEMM's tile, or two 64-wide ones).
- rescale: each half keeps its accumulator in units of the current group's scale s = sa·sb, so a step is
  `acc = wgmma(a, b, acc · s_prev/s)` and s is applied once at the end: one FP32 tile per half (128x256 tiles).
  The sum then stays in the tensor core's accumulation, whose precision on Hopper is below FP32 (DeepSeek-V3
  reports ~14 bits): the numerics of cuBLAS's fast-accumulation mode rather than DeepSeek-V3's promotion
  (docs/kernels.md compares both against FP64).

A's scales are staged with the tiles rather than loaded by each math warpgroup from global memory a group ahead:
it gives promote more TFLOPS per GHz of SM clock, which is what counts where every FP8 GEMM runs at the board's
power cap (docs/kernels.md).
Promote on 128x256 tiles needs 192 registers per thread for its two sums and the scratch, which the math
warpgroups have (setmaxnreg 232; ptxas reports the kernel's 168, the cap of 12 warps, but allocates each region
to its setmaxnreg). It spills, and runs far slower, unless `_settled` stops an LLVM reordering that keeps two
scratch tiles live.

Triton's interpreter does not run Gluon: CI compiles the kernel for sm_90 and checks that ptxas serializes no
wgmma and spills nothing; `pytest -m gpu` checks its results on a Hopper GPU.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ._launch import Launcher, cdiv, current_device, sm_count
from .gemm_blockwise import GROUP as BLOCK_K
from .gemm_blockwise import _tile, check_operands, m_major

GROUP = gl.constexpr(BLOCK_K)  # K per scale group (one TMA box, one scaling step), readable inside the kernels

# Triton 3.6 names the TMA copies async_copy_global_to_shared / async_copy_shared_to_global; later releases
# renamed them async_load / async_store, same arguments: either works here.
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_tma_store = tma.async_store if hasattr(tma, "async_store") else tma.async_copy_shared_to_global


@gluon.jit
def _load_step(a_desc, b_desc, sa_desc, sb_desc, a_smem, b_smem, sa_smem, sb_smem, ready, empty, step, total, M, N,
               n_kgroups, BLOCK_M: gl.constexpr, SUB_N: gl.constexpr, HALVES: gl.constexpr, GROUP_M: gl.constexpr,
               STAGES: gl.constexpr, COL_SCALES: gl.constexpr):
    """TMA-load this program's `step`-th (tile, K group) into ring stage step % STAGES once both math warpgroups
    have released it (nothing past `total`): A's and B's tiles, the 1x128 scales of A's rows and (COL_SCALES,
    the weight gradient) those of B's rows, the tile's columns."""
    stage = step % STAGES
    pred = step < total
    # a fresh barrier counts as released once (parity 1), so the first lap does not wait
    mbarrier.wait(empty.index(stage), ((step // STAGES) & 1) ^ 1, pred=pred)
    off_m, off_n = _tile(gl.program_id(0) + (step // n_kgroups) * gl.num_programs(0), M, N, BLOCK_M,
                         HALVES * SUB_N, GROUP_M)
    k = (step % n_kgroups) * GROUP
    bar = ready.index(stage)
    nbytes: gl.constexpr = a_desc.block_type.nbytes + HALVES * b_desc.block_type.nbytes + sa_desc.block_type.nbytes
    if COL_SCALES:
        mbarrier.expect(bar, nbytes + sb_desc.block_type.nbytes, pred=pred)
        _tma_load(sb_desc, [step % n_kgroups, off_n], bar, sb_smem.index(stage), pred=pred)
    else:
        mbarrier.expect(bar, nbytes, pred=pred)
    _tma_load(a_desc, [off_m, k], bar, a_smem.index(stage), pred=pred)
    _tma_load(sa_desc, [step % n_kgroups, off_m], bar, sa_smem.index(stage), pred=pred)
    _tma_load(b_desc, [off_n, k], bar, b_smem.index(HALVES * stage), pred=pred)
    if HALVES == 2:
        _tma_load(b_desc, [off_n + SUB_N, k], bar, b_smem.index(2 * stage + 1), pred=pred)


@gluon.jit
def _n_tiles(M, N, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    return gl.cdiv(M, BLOCK_M) * gl.cdiv(N, BLOCK_N)


@gluon.jit
def _steps(M, N, n_kgroups, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr):
    """How many (tile, K group) steps this program runs: its tiles are pid, pid + programs, ..."""
    return gl.cdiv(_n_tiles(M, N, BLOCK_M, BLOCK_N) - gl.program_id(0), gl.num_programs(0)) * n_kgroups


@gluon.jit
def _loader(a_desc, b_desc, sa_desc, sb_desc, a_smem, b_smem, sa_smem, sb_smem, ready, empty, M, N, n_kgroups,
            BLOCK_M: gl.constexpr, SUB_N: gl.constexpr, HALVES: gl.constexpr, GROUP_M: gl.constexpr,
            STAGES: gl.constexpr, COL_SCALES: gl.constexpr):
    """Producer warp: every load of the program, in order, as stages free up."""
    total = _steps(M, N, n_kgroups, BLOCK_M, HALVES * SUB_N)
    for step in range(total):
        _load_step(a_desc, b_desc, sa_desc, sb_desc, a_smem, b_smem, sa_smem, sb_smem, ready, empty, step, total, M,
                   N, n_kgroups, BLOCK_M, SUB_N, HALVES, GROUP_M, STAGES, COL_SCALES)


@gluon.jit
def _weight_scales(sb_ptr, off_n, kg, n_kgroups, N, SUB_N: gl.constexpr):
    """B's 128x128 scales of both halves for one K group (a half past N reads 1: it is never stored)."""
    sb0 = gl.load(sb_ptr + (off_n // GROUP) * n_kgroups + kg)
    sb1 = gl.load(sb_ptr + ((off_n + SUB_N) // GROUP) * n_kgroups + kg, mask=off_n + SUB_N < N, other=1.0)
    return sb0, sb1


@gluon.jit
def _scaled(t, rows, cols, COL_SCALES: gl.constexpr):
    """t times its rows' scales and (COL_SCALES) its columns' too: the outer product sa ⊗ sb of the weight
    gradient, applied as two broadcasts rather than a tile of scales held in registers."""
    t = t * gl.expand_dims(rows, 1)
    if COL_SCALES:
        t = t * gl.expand_dims(cols, 0)
    return t


@gluon.jit
def _settled(x):
    """x, computed before the next side-effecting instruction (the next wgmma)."""
    return gl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=False, pack=1)


@gluon.jit
def _named_barrier(ASM: gl.constexpr):
    """One named-barrier instruction (`bar.sync` / `bar.arrive` on the ping-pong barriers), kept in place."""
    gl.inline_asm_elementwise(ASM + " mov.b32 $0, 0;", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _my_turn(WG: gl.constexpr, PINGPONG: gl.constexpr):
    """With PINGPONG, wait until the other math warpgroup has issued its last wgmmas: named barrier 8 + WG, where
    this warpgroup's 128 threads sync and the other's 128 arrive. (Triton's warp specialization numbers its
    partitions' barriers from 0; 8 and 9 are clear of them.)"""
    if PINGPONG:
        if WG == 0:
            _named_barrier("bar.sync 8, 256;")
        else:
            _named_barrier("bar.sync 9, 256;")


@gluon.jit
def _your_turn(WG: gl.constexpr, PINGPONG: gl.constexpr):
    """With PINGPONG: this warpgroup's wgmmas are issued; the other's may follow them into the tensor cores."""
    if PINGPONG:
        if WG == 0:
            _named_barrier("bar.arrive 9, 256;")
        else:
            _named_barrier("bar.arrive 8, 256;")


@gluon.jit
def _consumer(a_smem, b_smem, sa_smem, sb_smem, c_smem, ready, empty, c_desc, sb_ptr, M, N, n_kgroups,
              WG: gl.constexpr, BLOCK_M: gl.constexpr, SUB_N: gl.constexpr, HALVES: gl.constexpr,
              GROUP_M: gl.constexpr, STAGES: gl.constexpr, PROMOTE: gl.constexpr, PINGPONG: gl.constexpr,
              COL_SCALES: gl.constexpr):
    """One math warpgroup: rows [WG·64, WG·64 + 64) of each tile, every column half. Each K group's wgmmas are
    waited for at once (ptxas serializes every wgmma of a kernel that reads an accumulator while another wgmma
    is in flight); the overlap of scaling and tensor-core work comes from the other warpgroup, whose wgmmas
    (PINGPONG) are issued between this one's. B's scales: one per half and group, read from `sb_ptr`
    (128x128 blocks), or with COL_SCALES one per column and group, staged in `sb_smem` (1x128 groups along K:
    the weight gradient; promote only)."""
    ROWS: gl.constexpr = BLOCK_M // 2
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, SUB_N, 32])
    row_scales: gl.constexpr = gl.SliceLayout(1, mma)
    col_scales: gl.constexpr = gl.SliceLayout(0, mma)
    zero = gl.zeros((ROWS, SUB_N), gl.float32, mma)
    n_tiles = _n_tiles(M, N, BLOCK_M, HALVES * SUB_N)
    step = 0
    if WG == 1:
        _your_turn(WG, PINGPONG)  # the first wgmmas are warpgroup 0's
    for tile_id in range(gl.program_id(0), n_tiles, gl.num_programs(0)):
        off_m, off_n = _tile(tile_id, M, N, BLOCK_M, HALVES * SUB_N, GROUP_M)
        acc0 = zero
        acc1 = zero
        t = zero  # promote's scratch tile
        if not COL_SCALES:
            sb0, sb1 = _weight_scales(sb_ptr, off_n, 0, n_kgroups, N, SUB_N)
        # rescale's previous-group scales: their own tensors, not aliases of s0/s1 (Triton's frontend would
        # then not carry them through the loop), and any value does for the first group, which ignores acc
        prev0 = gl.full([ROWS], 1.0, gl.float32, row_scales)
        prev1 = gl.full([ROWS], 1.0, gl.float32, row_scales)
        for kg in range(n_kgroups):
            if not COL_SCALES:
                # the next group's weight scales now: their latency hides behind this group's wait and MMAs
                nxt0, nxt1 = _weight_scales(sb_ptr, off_n, gl.minimum(kg + 1, n_kgroups - 1), n_kgroups, N, SUB_N)
            stage = step % STAGES
            mbarrier.wait(ready.index(stage), (step // STAGES) & 1)
            a = a_smem.index(stage).slice(WG * ROWS, ROWS)
            b0 = b_smem.index(HALVES * stage).permute((1, 0))
            b1 = b_smem.index(HALVES * stage + HALVES - 1).permute((1, 0))  # (HALVES == 2 only)
            # this warpgroup's rows of A's scales, which the producer staged with the tiles (rows past M read 0:
            # their A rows are zero-filled and never stored)
            sa_rows = sa_smem.index(stage).reshape([BLOCK_M]).slice(WG * ROWS, ROWS)
            if PROMOTE:  # DeepSeek-V3: each group's product from zero, scaled and summed in FP32
                # one half at a time through one scratch tile (the wgmma's own input, ignored with
                # use_acc=False): two FP32 sums and a scratch instead of two of each
                _my_turn(WG, PINGPONG)
                t = warpgroup_mma(a, b0, t, use_acc=False, is_async=True)
                _your_turn(WG, PINGPONG)
                sa = sa_rows.load(row_scales)  # read while the wgmmas run, before the stage is released
                if COL_SCALES:  # this tile's columns of B's scales, staged like A's
                    cols = sb_smem.index(stage).reshape([HALVES * SUB_N])
                    c0 = cols.slice(0, SUB_N).load(col_scales)
                    c1 = cols.slice((HALVES - 1) * SUB_N, SUB_N).load(col_scales)
                    s0 = sa
                    s1 = sa
                else:
                    s0 = sa * sb0
                    s1 = sa * sb1
                    c0 = s0  # unused
                    c1 = s1
                t = warpgroup_mma_wait(num_outstanding=0, deps=(t,))
                if HALVES == 2:
                    acc0 = acc0 + _scaled(t, s0, c0, COL_SCALES)
                    if SUB_N == 128:  # else LLVM sums after the next wgmma: 64 more registers, spilled
                        acc0 = _settled(acc0)
                    _my_turn(WG, PINGPONG)
                    t = warpgroup_mma(a, b1, t, use_acc=False, is_async=True)
                    _your_turn(WG, PINGPONG)
                    t = warpgroup_mma_wait(num_outstanding=0, deps=(t,))
                    mbarrier.arrive(empty.index(stage))
                    acc1 = acc1 + _scaled(t, s1, c1, COL_SCALES)
                else:
                    mbarrier.arrive(empty.index(stage))
                    acc0 = acc0 + _scaled(t, s0, c0, COL_SCALES)
            else:  # rescale: the accumulator in this group's units, s applied after the loop
                sa = sa_rows.load(row_scales)
                s0 = sa * sb0
                s1 = sa * sb1
                # both halves scaled before either wgmma: ptxas makes a wgmma wait for any later read of an
                # accumulator register
                first = kg == 0
                acc0 = acc0 * gl.expand_dims(prev0 / s0, 1)
                if HALVES == 2:
                    acc1 = acc1 * gl.expand_dims(prev1 / s1, 1)
                    _my_turn(WG, PINGPONG)
                    acc0 = warpgroup_mma(a, b0, acc0, use_acc=not first, is_async=True)
                    acc1 = warpgroup_mma(a, b1, acc1, use_acc=not first, is_async=True)
                    _your_turn(WG, PINGPONG)
                    acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
                else:
                    _my_turn(WG, PINGPONG)
                    acc0 = warpgroup_mma(a, b0, acc0, use_acc=not first, is_async=True)
                    _your_turn(WG, PINGPONG)
                    acc0 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0,))
                mbarrier.arrive(empty.index(stage))
                prev0 = s0
                prev1 = s1
            if not COL_SCALES:
                sb0 = nxt0
                sb1 = nxt1
            step += 1
        if not PROMOTE:
            acc0 = acc0 * gl.expand_dims(prev0, 1)
            acc1 = acc1 * gl.expand_dims(prev1, 1)
        _store_rows(c_smem, c_desc, acc0, acc1, off_m, off_n, N, WG, ROWS, SUB_N, HALVES)
    if WG == 0:
        _my_turn(WG, PINGPONG)  # warpgroup 1's last arrival, so no named barrier is left half-way
    tma.store_wait(pendings=0)


@gluon.jit
def _store_rows(c_smem, c_desc, acc0, acc1, off_m, off_n, N, WG: gl.constexpr, ROWS: gl.constexpr,
                SUB_N: gl.constexpr, HALVES: gl.constexpr):
    """Math warpgroup WG's rows of a C tile, each half through its own BF16 buffer and a TMA store (a half
    past N is not stored). Waits first for this warpgroup's previous stores to have read those buffers."""
    tma.store_wait(pendings=0)
    c_smem.index(HALVES * WG).store(acc0.to(c_desc.dtype))
    if HALVES == 2:
        c_smem.index(2 * WG + 1).store(acc1.to(c_desc.dtype))
    fence_async_shared()
    _tma_store(c_desc, [off_m + WG * ROWS, off_n], c_smem.index(HALVES * WG))
    if HALVES == 2:
        if off_n + SUB_N < N:
            _tma_store(c_desc, [off_m + WG * ROWS, off_n + SUB_N], c_smem.index(2 * WG + 1))


@gluon.jit
def _ring_barriers(STAGES: gl.constexpr):
    """The ring's mbarriers, one pair per stage: `ready` (the producer's TMA bytes complete it) and `empty`
    (both math warpgroups release the stage)."""
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        mbarrier.init(ready.index(s), count=1)
        mbarrier.init(empty.index(s), count=2)
    return ready, empty


@gluon.jit
def _invalidate(ready, empty, STAGES: gl.constexpr):
    for s in gl.static_range(STAGES):
        mbarrier.invalidate(ready.index(s))
        mbarrier.invalidate(empty.index(s))


@gluon.jit
def _gemm_kernel(a_desc, b_desc, c_desc, sa_desc, sb, M, N, n_kgroups,
                 BLOCK_M: gl.constexpr, SUB_N: gl.constexpr, HALVES: gl.constexpr, GROUP_M: gl.constexpr,
                 STAGES: gl.constexpr, PROMOTE: gl.constexpr, PINGPONG: gl.constexpr, CONSUMER_REGS: gl.constexpr,
                 COL_SCALES: gl.constexpr = False):
    """`sb`: B's 128x128 scales, a pointer (fprop, dgrad); with COL_SCALES (the weight gradient, promote only)
    a descriptor of B's 1x128 scales along K, their [K/128, N] view (`m_major`), TMA-loaded with each stage as
    A's are."""
    a_smem = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, GROUP], a_desc.layout)
    b_smem = gl.allocate_shared_memory(b_desc.dtype, [HALVES * STAGES, SUB_N, GROUP], b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [2 * HALVES, BLOCK_M // 2, SUB_N], c_desc.layout)
    sa_smem = gl.allocate_shared_memory(sa_desc.dtype, [STAGES, 1, BLOCK_M], sa_desc.layout)
    ready, empty = _ring_barriers(STAGES)
    # worker partitions take IR values only: integer arguments equal to 1 arrive as constexprs (Triton's
    # specialization, e.g. n_kgroups of K = 128), so the scalars go in as tensors
    M = gl.to_tensor(M)
    N = gl.to_tensor(N)
    n_kgroups = gl.to_tensor(n_kgroups)
    # what the partitions do not read stands in for what this kernel does not have: A's descriptor and buffer
    # for B's column scales, M for B's scale pointer
    if COL_SCALES:
        sb_smem = gl.allocate_shared_memory(sb.dtype, [STAGES, 1, HALVES * SUB_N], sb.layout)
        sb_desc = sb
        sb_ptr = M
    else:
        sb_smem = sa_smem
        sb_desc = sa_desc
        sb_ptr = sb
    # a producer warp loads; registers move from it to the math warpgroups (setmaxnreg). Loading from the first
    # math warpgroup instead (8 warps, no reallocation) is slower (docs/kernels.md).
    gl.warp_specialize([
        (_consumer, (a_smem, b_smem, sa_smem, sb_smem, c_smem, ready, empty, c_desc, sb_ptr, M, N, n_kgroups, 0,
                     BLOCK_M, SUB_N, HALVES, GROUP_M, STAGES, PROMOTE, PINGPONG, COL_SCALES)),
        (_consumer, (a_smem, b_smem, sa_smem, sb_smem, c_smem, ready, empty, c_desc, sb_ptr, M, N, n_kgroups, 1,
                     BLOCK_M, SUB_N, HALVES, GROUP_M, STAGES, PROMOTE, PINGPONG, COL_SCALES)),
        (_loader, (a_desc, b_desc, sa_desc, sb_desc, a_smem, b_smem, sa_smem, sb_smem, ready, empty, M, N, n_kgroups,
                   BLOCK_M, SUB_N, HALVES, GROUP_M, STAGES, COL_SCALES)),
    ], [4, 1], [CONSUMER_REGS, 40])
    _invalidate(ready, empty, STAGES)


class Config(NamedTuple):
    """One tuning point: the tile is BLOCK_M x (HALVES · SUB_N); ring depth; scaling."""
    block_m: int
    sub_n: int
    halves: int
    stages: int
    promote: bool
    consumer_regs: int = 232
    """setmaxnreg of the second math warpgroup (the first gets what the producer warp leaves)"""
    pingpong: bool = True
    """the math warpgroups take turns issuing wgmmas (named barriers), so one scales while the other's run;
    False: they run free, tied only by the ring's mbarriers (the form the turns are compared against)"""
    col_scales: bool = False
    """the weight gradient's (`gemm_blockwise_gluon_wgrad`): B's scales per column, 1x128 along K (promote only)"""

    @property
    def block_n(self) -> int:
        return self.halves * self.sub_n

    def smem_bytes(self) -> int:
        scales = 4 * (self.block_m + (self.block_n if self.col_scales else 0))  # FP32, per row (and column)
        ring = self.stages * ((self.block_m + self.block_n) * BLOCK_K + scales)  # E4M3 A, B and the scales
        return ring + self.block_m * self.block_n * 2 + 16 * self.stages  # + the BF16 C tile, mbarriers


SMEM_LIMIT = 232448
"""Shared memory one block may use on Hopper (227 KiB)."""

CONFIGS = (Config(128, 128, 2, 3, False), Config(128, 128, 1, 5, False), Config(128, 128, 2, 3, True),
           Config(128, 128, 1, 4, True), Config(128, 128, 1, 5, True), Config(128, 64, 2, 4, True))
"""Rescale on 128x256 tiles (per math warpgroup two 64x128 halves: 128 accumulator registers per thread) and
128x128 (5 stages: with A's scales staged, a sixth no longer fits); promote on 128x256 tiles (two 64-register
sums and one 64-register scratch per thread) and on 128x128, as one 128-wide half (DeepGEMM's tile) or two
64-wide ones. These are the configs timed on a Hopper GPU (docs/kernels.md); the per-shape tuner picks among
them."""

CANDIDATES: tuple[Config, ...] = ()
"""Configs that compile cleanly for sm_90 (CI checks them as it checks CONFIGS) but have not been timed on a GPU
yet, so the tuner leaves them out: `scripts/kernel_bench.py` times them next to CONFIGS. Empty once every
config has been timed (docs/kernels.md: how the last candidates, the math warpgroups' turns, fared)."""

WGRAD_CONFIGS = (Config(128, 128, 1, 4, True, col_scales=True), Config(128, 128, 1, 5, True, col_scales=True),
                 Config(128, 64, 2, 4, True, col_scales=True))
"""The weight gradient's kernel on CONFIGS' promote tiles of 128x128 (rescale cannot fold a scale per column into
its accumulator; on 128x256 the column scales take promote's two sums and scratch past the registers, and it
spills). They compile cleanly for sm_90 (CI checks them as it checks CONFIGS), match the dequantized product and
run faster than the Triton `gemm_blockwise_wgrad` at Llama-2-7B's weight gradients (docs/kernels.md), and the
`triton` backend runs them for wgrad on sm_90."""


@functools.cache
def _smem_layout(block: tuple[int, int], fp8: bool):
    return gl.NVMMASharedLayout.get_default_for(list(block), gl.float8e4nv if fp8 else gl.bfloat16)


class _Address:
    """What Triton reads of a host-side descriptor's base: its dtype (to specialize) and `data_ptr()` (to encode
    the TMA descriptor at launch). A cached descriptor built on it keeps no tensor alive."""

    __slots__ = ("address", "dtype")

    def __init__(self, address: int, dtype: torch.dtype) -> None:
        self.address, self.dtype = address, dtype

    def data_ptr(self) -> int:
        return self.address


DESCRIPTORS_KEPT = 4096
"""Descriptors kept by address: a gpt-125m training step's GEMMs use some six hundred (48 linears, three GEMMs,
four or five operands each), and a cache smaller than one step's set misses on every step."""


@functools.lru_cache(maxsize=DESCRIPTORS_KEPT)
def _cached_descriptor(address: int, dtype: torch.dtype, shape: tuple, strides: tuple, block: tuple,
                       layout) -> TensorDescriptor:
    layout = layout or _smem_layout(block, dtype == torch.float8_e4m3fn)
    return TensorDescriptor(_Address(address, dtype), list(shape), list(strides), list(block), layout)


def _descriptor(t: torch.Tensor, block: tuple[int, int], layout=None) -> TensorDescriptor:
    """`TensorDescriptor.from_tensor(t, block, layout)` (by default NVMMA's layout for t's dtype), kept by
    address, shape and strides: building and validating four descriptors is a large share of a call's host
    time, and a training step's GEMMs meet the same addresses step after step (the caching allocator's
    blocks). Each descriptor is validated once, when built (alignment included: the address is its key)."""
    return _cached_descriptor(t.data_ptr(), t.dtype, t.shape, t.stride(), block, layout)


SCALES_LAYOUT = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2)
"""A's scales in shared memory: one unswizzled row of BLOCK_M floats per stage, read back as a vector."""


@functools.cache
def runs_on(device: torch.device) -> bool:
    """This kernel is Hopper's (sm_90): wgmma and setmaxnreg exist there only. Asked on each linear's forward
    and backward (the `triton` backend's kernel choice): answered once per device."""
    return device.type == "cuda" and torch.cuda.get_device_capability(device) == (9, 0)


_launch_gemm = Launcher(_gemm_kernel)


def _launch(a, sa_t, b, sb, c, config: Config, persistent: bool, n_kgroups: int) -> None:
    """One launch of `config`; `sb` is B's 128x128 scales, or with `config.col_scales` the [K/128, N] view of
    its 1x128 ones."""
    m, n = c.shape
    tiles = cdiv(m, config.block_m) * cdiv(n, config.block_n)
    if config.col_scales:
        sb_arg, sb_aligned = _descriptor(sb, (1, config.block_n), SCALES_LAYOUT), True  # built: aligned
    else:
        sb_arg, sb_aligned = sb, sb.data_ptr() % 16 == 0
    args = (_descriptor(a, (config.block_m, BLOCK_K)), _descriptor(b, (config.sub_n, BLOCK_K)),
            _descriptor(c, (config.block_m // 2, config.sub_n)), _descriptor(sa_t, (1, config.block_m), SCALES_LAYOUT),
            sb_arg, m, n, n_kgroups)
    # all Triton specializes this kernel on: the operands' dtypes and the config fix the descriptors' dtypes,
    # blocks and layouts (their bases are 16-byte aligned, or building them failed); sb's alignment; the ints
    key = (current_device(), a.dtype, b.dtype, sa_t.dtype, sb.dtype, config, persistent, sb_aligned, m, n, n_kgroups)
    _launch_gemm.launch(
        key, (min(tiles, sm_count(a.device)) if persistent else tiles,), args,
        dict(BLOCK_M=config.block_m, SUB_N=config.sub_n, GROUP_M=8, STAGES=config.stages, HALVES=config.halves,
             PROMOTE=config.promote, PINGPONG=config.pingpong, CONSUMER_REGS=config.consumer_regs,
             COL_SCALES=config.col_scales, num_warps=4))


_picked: dict[tuple, tuple[Config, bool]] = {}
TUNING_ROUNDS = 3


def _pick(key: tuple, configs, run) -> tuple[Config, bool]:
    """The fastest (config, persistent) of `configs` × both grid kinds for `key`, timed once per key through
    `run(config, persistent)`, as Triton's autotuner would: rounds over all options, each option's best time
    (on a power-capped GPU one timing of the same kernel moves with the clock by as much as the top configs
    differ)."""
    if key not in _picked:
        from ._tune import steady_do_bench

        options = [(cfg, pers) for cfg in configs for pers in (True, False)]
        best = dict.fromkeys(options, float("inf"))
        for _ in range(TUNING_ROUNDS):
            for o in options:
                best[o] = min(best[o], steady_do_bench(lambda o=o: run(*o)))
        _picked[key] = min(options, key=best.__getitem__)
    return _picked[key]


def gemm_blockwise_gluon(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
                         config: Config | None = None, persistent: bool = True,
                         fast_accum: bool = False) -> torch.Tensor:
    """`gemm_blockwise` on Hopper through this kernel. `config` (with `persistent`: at most one program per SM,
    else one per tile) runs one tuning point; without it the fastest of the configs of one numerics, promote or
    (`fast_accum`) rescale, and grid is picked once per shape and scale layout (`_pick`)."""
    m, n, n_kgroups = check_operands(a, sa, b, sb)
    if config is not None and config.col_scales:
        raise ValueError(f"{config} is the weight gradient's (col_scales): see gemm_blockwise_gluon_wgrad")
    sa_t = m_major(sa).t()  # the [K/128, M] view the producer's TMA reads
    sb = sb.contiguous()
    c = torch.empty((m, n), device=a.device, dtype=torch.bfloat16)
    if config is None:
        config, persistent = _pick((m, n, a.shape[1], fast_accum, sa.stride(), a.device),
                                   [cfg for cfg in CONFIGS if cfg.promote != fast_accum],
                                   lambda cfg, pers: _launch(a, sa_t, b, sb, c, cfg, pers, n_kgroups))
    _launch(a, sa_t, b, sb, c, config, persistent, n_kgroups)
    return c


def gemm_blockwise_gluon_wgrad(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
                               config: Config | None = None, persistent: bool = True) -> torch.Tensor:
    """`gemm_blockwise_wgrad` (both operands with 1x128 scales along K) on Hopper through this kernel with
    column scales. Without `config`, the fastest of WGRAD_CONFIGS and grid kinds is picked once per shape."""
    m, n, n_kgroups = check_operands(a, sa, b, sb, b_rows=1)
    if config is not None and not (config.col_scales and config.promote):  # (128x256 compiles, with spills)
        raise ValueError(f"{config} is not a weight-gradient config (col_scales and promote): see WGRAD_CONFIGS")
    sa_t, sb_t = m_major(sa).t(), m_major(sb).t()  # the [K/128, rows] views the producer's TMA reads
    c = torch.empty((m, n), device=a.device, dtype=torch.bfloat16)
    if config is None:
        config, persistent = _pick(("wgrad", m, n, a.shape[1], sa.stride(), sb.stride(), a.device), WGRAD_CONFIGS,
                                   lambda cfg, pers: _launch(a, sa_t, b, sb_t, c, cfg, pers, n_kgroups))
    _launch(a, sa_t, b, sb_t, c, config, persistent, n_kgroups)
    return c


def compile_sm90(config: Config):
    """Compile the kernel for sm_90 without a GPU (Triton's own compiler and ptxas): CI checks the PTX's
    structure with it, since Gluon cannot run under the interpreter."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    def desc(dtype: str, block: list[int], gl_dtype) -> str:
        layout = gl.NVMMASharedLayout.get_default_for(block, gl_dtype)
        return f"tensordesc<{dtype}[{block[0]}, {block[1]}],{layout!r}>"
    signature = {"a_desc": desc("fp8e4nv", [config.block_m, 128], gl.float8e4nv),
                 "b_desc": desc("fp8e4nv", [config.sub_n, 128], gl.float8e4nv),
                 "c_desc": desc("bf16", [config.block_m // 2, config.sub_n], gl.bfloat16),
                 "sa_desc": f"tensordesc<fp32[1, {config.block_m}],{SCALES_LAYOUT!r}>",
                 "sb": f"tensordesc<fp32[1, {config.block_n}],{SCALES_LAYOUT!r}>" if config.col_scales else "*fp32",
                 "M": "i32", "N": "i32", "n_kgroups": "i32"}
    constants = {"BLOCK_M": config.block_m, "SUB_N": config.sub_n, "GROUP_M": 8, "STAGES": config.stages,
                 "HALVES": config.halves, "PROMOTE": config.promote, "PINGPONG": config.pingpong,
                 "CONSUMER_REGS": config.consumer_regs, "COL_SCALES": config.col_scales}
    signature.update(dict.fromkeys(constants, "constexpr"))
    return triton.compile(GluonASTSource(_gemm_kernel, signature, constants), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4})
