"""FP8 GEMM with DeepSeek-V3 blockwise scales: C[M, N] = (A ⊙ sa) · (B ⊙ sb)ᵀ in BF16, where A [M, K] E4M3 has
1x128 scales sa [M, K/128] and B [N, K] E4M3 has 128x128 scales sb [N/128, K/128] (inverse scales, as
`quantize_blockwise` writes them).

The K loop steps 128 columns (one scale group) at a time, with operands brought in by TMA (host tensor
descriptors; out-of-range tiles are zero-filled, so no masks). Scales are applied inside the loop, two ways
(`PROMOTE`), which differ in accuracy, so the autotuner only picks among one of them (`configs_for`):
- promote (DeepSeek-V3; the default): each group's tensor-core product goes to a fresh FP32 tile, which is
  scaled and added to the FP32 accumulator on the CUDA cores. It holds two FP32 tiles in registers.
- rescale (`fast_accum=True`): the accumulator is kept in the units of the current group's scales, so each
  step is one `dot(a, b, acc * (s_prev / s))` into the same registers and the scales are applied once after
  the loop. Half the registers, but the sum stays in the tensor core's accumulation, which on Hopper keeps
  fewer bits than FP32 (DeepSeek-V3 reports ~14): like cuBLAS's fast accumulation. Against the exact product
  its error grows with K past promote's, which is the BF16 output's rounding (docs/kernels.md).
Tiles are BLOCK_M x (NSUB x 128): each 128-column sub-tile has its own accumulator, so B's scale is a scalar
per sub-tile and step. A's scales read fastest M-major (`m_major`); `PREFETCH` loads each group's scales one step
ahead, and `PERSISTENT` runs one program per SM over the tiles.
Every config is tested against the dequantized reference. This kernel stays below cuBLAS blockwise while the
same tiles without scales in the K loop match cuBLAS tensorwise: the gap is the per-group scaling, which waits
on each group's tensor-core product (`wgmma.wait_group 0`; docs/kernels.md has the figures).
`gemm_blockwise_gluon.py` overlaps the two across warpgroups and is what the `triton` backend runs on Hopper;
this kernel serves other GPUs and Triton's interpreter. `WS` (off in every autotuned config) puts Triton's warp
specialization on the K loop, which made the kernel slower than its best plain config, and some of its tiles
fail to compile or return NaN (docs/kernels.md).

`gemm_blockwise_reference`: dequantize both operands to FP32 and multiply.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ._launch import Launcher, cdiv, sm_count
from ._layout import m_major_empty
from ._tune import INTERPRETING, steady_do_bench, tuning_configs

GROUP = 128


def _set_block_shapes(nargs: dict) -> None:
    """TMA descriptors carry their box size, which is the autotuned tile: set it per config."""
    bm = nargs["BLOCK_M"]
    nargs["a_desc"].block_shape = [bm, GROUP]
    nargs["b_desc"].block_shape = [GROUP, GROUP]
    nargs["c_desc"].block_shape = [bm, GROUP]


def _configs() -> list[triton.Config]:
    """Every variant (promote/rescale, tile, warps, stages, prefetch, persistent); under the interpreter,
    small-M tiles of each variant (tests run each by name; the interpreter's autotuner takes the first)."""
    if INTERPRETING:
        grid = [(p, 32, n, 4, 1, pre, pers) for p in (True, False) for n in (1, 2)
                for pre, pers in ((False, False), (True, True))]
    else:
        plain = [(True, 128, 1, 8, 3), (True, 128, 1, 8, 4), (True, 64, 1, 4, 4), (True, 128, 2, 8, 3),
                 (True, 64, 2, 4, 4), (True, 64, 1, 4, 3), (True, 64, 1, 4, 5), (True, 64, 1, 4, 6),
                 (False, 128, 1, 4, 4), (False, 128, 1, 8, 4), (False, 128, 2, 8, 3), (False, 128, 2, 8, 4),
                 (False, 64, 2, 4, 4), (False, 256, 1, 8, 3)]
        # the four fastest configs of the variant probe at 8192³ (docs/kernels.md)
        probed = [(False, 128, 2, 8, 3, True, True), (False, 128, 2, 8, 3, False, True),
                  (True, 128, 1, 8, 4, True, False), (True, 128, 1, 8, 4, False, True)]
        grid = [(*c, False, False) for c in plain] + probed
    return [triton.Config({"BLOCK_M": bm, "NSUB": n, "GROUP_M": 4 if INTERPRETING else 8, "PROMOTE": p,
                           "PREFETCH": pre, "PERSISTENT": pers},
                          num_warps=w, num_stages=st, pre_hook=_set_block_shapes)
            for p, bm, n, w, st, pre, pers in grid]


CONFIGS = _configs()


@triton.jit
def _scale_step(acc, a, b, sa, sb, s_prev, PROMOTE: tl.constexpr):
    """One 128-deep K group into one 128-wide accumulator; `s` = this group's per-row scale sa·sb."""
    s = sa * sb
    if PROMOTE:
        acc += tl.dot(a, tl.trans(b)) * s[:, None]
    else:
        acc = tl.dot(a, tl.trans(b), acc * (s_prev / s)[:, None])
    return acc, s


@triton.jit
def _tile(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(row, column) offsets of a tile in grouped order: tiles that share A rows run together (L2 reuse)."""
    grid_m, grid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    first_m = (tile_id // width) * GROUP_M
    group_m = tl.minimum(grid_m - first_m, GROUP_M)
    return (first_m + (tile_id % width) % group_m) * BLOCK_M, ((tile_id % width) // group_m) * BLOCK_N


@triton.jit
def _gemm_tile(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, M, N, n_kgroups, sa_sm, sa_sk, off_m, off_n,
               BLOCK_M: tl.constexpr, NSUB: tl.constexpr, PROMOTE: tl.constexpr, PREFETCH: tl.constexpr,
               WS: tl.constexpr):
    # The tile is NSUB sub-tiles of 128 columns, each with its own accumulator: B's 128x128 scale is then one
    # scalar per sub-tile and K group (a per-row multiply, not a per-element scale tile), and with two
    # sub-tiles the second's tensor-core work can run while the first's scaling waits.
    BLOCK_K: tl.constexpr = 128
    SUB_N: tl.constexpr = 128
    rm = off_m + tl.arange(0, BLOCK_M)
    row_ok = rm < M
    # rows and sub-tiles past the edge read scale 1 (their products are zero-filled and never stored)
    sa_rows = sa_ptr + rm * sa_sm
    sb0_ptr = sb_ptr + (off_n // SUB_N) * n_kgroups
    sb1_ptr = sb0_ptr + n_kgroups
    has_sub1 = off_n + SUB_N < N
    acc0 = tl.zeros((BLOCK_M, SUB_N), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, SUB_N), dtype=tl.float32)
    s0 = tl.full((BLOCK_M,), 1.0, tl.float32)
    s1 = tl.full((BLOCK_M,), 1.0, tl.float32)
    sa_next = tl.load(sa_rows, mask=row_ok, other=1.0)
    sb0_next = tl.load(sb0_ptr)
    sb1_next = tl.load(sb1_ptr, mask=has_sub1, other=1.0)
    for kg in tl.range(0, n_kgroups, warp_specialize=WS):
        a = a_desc.load([off_m, kg * BLOCK_K])
        if PREFETCH:
            # Triton pipelines the TMA operand loads, not these pointer loads: load the next group's scales
            # now, so their latency hides behind this group's tensor-core work.
            sa, sb0, sb1 = sa_next, sb0_next, sb1_next
            nxt = tl.minimum(kg + 1, n_kgroups - 1)  # the last group reloads its own scales, unused
            sa_next = tl.load(sa_rows + nxt * sa_sk, mask=row_ok, other=1.0)
            sb0_next = tl.load(sb0_ptr + nxt)
            sb1_next = tl.load(sb1_ptr + nxt, mask=has_sub1, other=1.0)
        else:
            sa = tl.load(sa_rows + kg * sa_sk, mask=row_ok, other=1.0)
            sb0 = tl.load(sb0_ptr + kg)
            sb1 = tl.load(sb1_ptr + kg, mask=has_sub1, other=1.0)
        acc0, s0 = _scale_step(acc0, a, b_desc.load([off_n, kg * BLOCK_K]), sa, sb0, s0, PROMOTE)
        if NSUB == 2:
            acc1, s1 = _scale_step(acc1, a, b_desc.load([off_n + SUB_N, kg * BLOCK_K]), sa, sb1, s1, PROMOTE)
    if not PROMOTE:  # the accumulators are in units of the last group's scales
        acc0 = acc0 * s0[:, None]
        acc1 = acc1 * s1[:, None]
    c_desc.store([off_m, off_n], acc0.to(tl.bfloat16))
    if NSUB == 2:
        c_desc.store([off_m, off_n + SUB_N], acc1.to(tl.bfloat16))


@triton.jit
def _gemm_kernel(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, M, N, K, n_kgroups, sa_sm, sa_sk,
                 BLOCK_M: tl.constexpr, NSUB: tl.constexpr, GROUP_M: tl.constexpr, PROMOTE: tl.constexpr,
                 NUM_SMS: tl.constexpr, PREFETCH: tl.constexpr = False, PERSISTENT: tl.constexpr = False,
                 WS: tl.constexpr = False):
    BLOCK_N: tl.constexpr = NSUB * 128
    if PERSISTENT:  # one program per SM walks the tiles
        for tile_id in range(tl.program_id(0), tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N), NUM_SMS):
            off_m, off_n = _tile(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            _gemm_tile(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, M, N, n_kgroups, sa_sm, sa_sk, off_m, off_n,
                       BLOCK_M, NSUB, PROMOTE, PREFETCH, WS)
    else:
        off_m, off_n = _tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        _gemm_tile(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, M, N, n_kgroups, sa_sm, sa_sk, off_m, off_n,
                   BLOCK_M, NSUB, PROMOTE, PREFETCH, WS)


def configs_for(fast_accum: bool) -> list[triton.Config]:
    """The configs of one numerics: promote (DeepSeek-V3's FP32 promotion) by default, rescale (the sum stays in
    the tensor core's accumulation, like cuBLAS's fast accumulation) only when asked for. The two differ in
    accuracy, so speed never picks between them."""
    return [c for c in CONFIGS if c.kwargs["PROMOTE"] != fast_accum]


_AUTOTUNED = {fast: triton.autotune(configs=tuning_configs(configs_for(fast), interpreter=configs_for(fast)[0]),
                                    key=["M", "N", "K"], do_bench=steady_do_bench)(_gemm_kernel)
              for fast in (False, True)}
_LAUNCH_AUTOTUNED = {fast: Launcher(kernel) for fast, kernel in _AUTOTUNED.items()}


def m_major(sa: torch.Tensor) -> torch.Tensor:
    """1x128 scales [M, K/128] laid out M-major (`m_major_empty`: a [K/128, M] buffer with 16-byte aligned rows,
    viewed [M, K/128]): one K group's scales of a tile's rows are then one coalesced load, or one TMA box
    (DeepGEMM asks for this layout). Free if already so, as `quantize_blockwise(m_major_scales=True)` writes
    them; else one copy."""
    m, groups = sa.shape
    if sa.stride(0) == 1 and sa.stride(1) % 4 == 0 and sa.data_ptr() % 16 == 0:
        return sa
    return m_major_empty(m, groups, sa.device).copy_(sa)


def check_operands(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
                   b_rows: int = GROUP) -> tuple[int, int, int]:
    """(M, N, K groups) of a blockwise GEMM's operands, or ValueError naming what does not fit. B's scales are
    128x128 blocks (`b_rows` 128: fprop, dgrad) or 1x128 groups (`b_rows` 1: wgrad)."""
    m, k = a.shape
    n, kb = b.shape
    if k != kb or not a.is_contiguous() or not b.is_contiguous():
        raise ValueError(f"A {tuple(a.shape)} and B {tuple(b.shape)} must share K and be contiguous row-major")
    if k % 16 or n % 8:
        raise ValueError(f"TMA needs 16-byte aligned rows: K={k} must be a multiple of 16 and N={n} of 8")
    n_kgroups = cdiv(k, GROUP)
    if sa.shape != (m, n_kgroups) or sb.shape != (cdiv(n, b_rows), n_kgroups):
        raise ValueError(f"scales {tuple(sa.shape)} / {tuple(sb.shape)} do not match the 1x128 / {b_rows}x128 layout "
                         f"({m}, {n_kgroups}) / ({cdiv(n, b_rows)}, {n_kgroups})")
    return m, n, n_kgroups


def gemm_blockwise(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
                   config: triton.Config | None = None, fast_accum: bool = False) -> torch.Tensor:
    """BF16 [M, N] from E4M3 A [M, K] (1x128 inverse scales sa) and E4M3 B [N, K] (128x128 inverse scales sb).
    sa may be row-major, as `quantize_blockwise` writes it, or M-major (`m_major`), which reads faster.
    `config` runs one of `CONFIGS` instead of the autotuner's pick among `configs_for(fast_accum)` (tests,
    per-variant benchmarks)."""
    m, n, n_kgroups = check_operands(a, sa, b, sb)
    k = a.shape[1]
    c = torch.empty((m, n), device=a.device, dtype=torch.bfloat16)
    dummy = [1, 1]  # box sizes are set per autotuned config (_set_block_shapes)
    a_desc = TensorDescriptor.from_tensor(a, dummy)
    b_desc = TensorDescriptor.from_tensor(b, dummy)
    c_desc = TensorDescriptor.from_tensor(c, dummy)
    sms = sm_count(a.device)

    def grid(meta):
        tiles = cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["NSUB"] * GROUP)
        return (min(tiles, sms) if meta.get("PERSISTENT") else tiles,)
    args = (a_desc, b_desc, c_desc, sa, sb.contiguous(), m, n, k, n_kgroups, sa.stride(0), sa.stride(1))
    if config is None:
        _LAUNCH_AUTOTUNED[fast_accum](grid, *args, NUM_SMS=sms)
    else:
        _set_block_shapes({"a_desc": a_desc, "b_desc": b_desc, "c_desc": c_desc, **config.kwargs})
        _gemm_kernel[grid](*args, **config.kwargs, NUM_SMS=sms, num_warps=config.num_warps,
                              num_stages=config.num_stages)
    return c


def gemm_blockwise_reference(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    m, k = a.shape
    n = b.shape[0]
    a32 = a.float() * sa.repeat_interleave(GROUP, dim=1)[:, :k]
    b32 = b.float() * sb.repeat_interleave(GROUP, dim=0).repeat_interleave(GROUP, dim=1)[:n, :k]
    return a32 @ b32.t()
