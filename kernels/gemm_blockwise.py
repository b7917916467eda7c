"""FP8 GEMM with DeepSeek-V3 blockwise scales: C[M, N] = (A ⊙ sa) · (B ⊙ sb)ᵀ in BF16, where A [M, K] E4M3 has
1x128 scales sa [M, K/128] and B [N, K] E4M3 has 128x128 scales sb [N/128, K/128] (inverse scales, as
`quantize_blockwise` writes them).

The K loop steps 128 columns (one scale group) at a time, with operands brought in by TMA (host tensor
descriptors; out-of-range tiles are zero-filled, so no masks). Scales are applied inside the loop with FP32
accumulation, two ways (`PROMOTE`):
- promote (DeepSeek-V3's wording): each group's tensor-core product goes to a fresh FP32 tile, which is scaled
  by its scales and added to the accumulator. Exact to FP32, but it holds two FP32 tiles in registers.
- rescale: the accumulator is kept in the units of the current group's scales, so each step is one
  `dot(a, b, acc * (s_prev / s))` into the same registers, and the scales are applied once after the loop.
  Half the registers, at the price of one FP32 rounding per step (~2^-24 relative, a thousand times below
  E4M3's own step).
Tiles are BLOCK_M x (NSUB x 128): each 128-column sub-tile has its own accumulator, so B's scale is a scalar
per sub-tile and step.
The autotuner picks the tile, warps, stages and variant per shape; both variants are tested against the
dequantized reference. `WS` (off in every autotuned config) puts Triton's warp specialization on the K loop:
with Triton 3.6 on the H200 it was slower than the best plain config (867 vs 922 TFLOPS at 8192³), several
tiles failed to compile and 64x256 returned NaN (scripts/gemm_ws_probe.py, results/h200-kernels/).

`gemm_blockwise_reference`: dequantize both operands to FP32 and multiply.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ._tune import INTERPRETING, steady_do_bench, tuning_configs

GROUP = 128


def _set_block_shapes(nargs: dict) -> None:
    """TMA descriptors carry their box size, which is the autotuned tile: set it per config."""
    bm = nargs["BLOCK_M"]
    nargs["a_desc"].block_shape = [bm, GROUP]
    nargs["b_desc"].block_shape = [GROUP, GROUP]
    nargs["c_desc"].block_shape = [bm, GROUP]


def _configs() -> list[triton.Config]:
    """Every variant (promote/rescale, tile, warps, stages); under the interpreter, small-M tiles of each
    variant (tests run each by name; the interpreter's autotuner takes the first)."""
    if INTERPRETING:
        grid = [(p, 32, n, 4, 1) for p in (True, False) for n in (1, 2)]
    else:
        grid = [(True, 128, 1, 8, 3), (True, 128, 1, 8, 4), (True, 64, 1, 4, 4), (True, 128, 2, 8, 3),
                (True, 64, 2, 4, 4), (True, 64, 1, 4, 3), (True, 64, 1, 4, 5), (True, 64, 1, 4, 6),
                (False, 128, 1, 4, 4), (False, 128, 1, 8, 4), (False, 128, 2, 8, 3), (False, 128, 2, 8, 4),
                (False, 64, 2, 4, 4), (False, 256, 1, 8, 3)]
    return [triton.Config({"BLOCK_M": bm, "NSUB": n, "GROUP_M": 4 if INTERPRETING else 8, "PROMOTE": p},
                          num_warps=w, num_stages=st, pre_hook=_set_block_shapes) for p, bm, n, w, st in grid]


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


@triton.autotune(configs=tuning_configs(CONFIGS, interpreter=CONFIGS[0]), key=["M", "N", "K"],
                 do_bench=steady_do_bench)
@triton.jit
def _gemm_kernel(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, M, N, K, n_kgroups,
                 BLOCK_M: tl.constexpr, NSUB: tl.constexpr, GROUP_M: tl.constexpr, PROMOTE: tl.constexpr,
                 WS: tl.constexpr = False):
    # The tile is NSUB sub-tiles of 128 columns, each with its own accumulator: B's 128x128 scale is then one
    # scalar per sub-tile and K group (a per-row multiply, not a per-element scale tile), and with two
    # sub-tiles the second's tensor-core work can run while the first's scaling waits.
    BLOCK_K: tl.constexpr = 128
    SUB_N: tl.constexpr = 128
    pid = tl.program_id(0)
    grid_m, grid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, NSUB * SUB_N)
    # grouped ordering: programs that share A rows run together (L2 reuse)
    width = GROUP_M * grid_n
    first_m = (pid // width) * GROUP_M
    group_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % group_m
    pid_n = (pid % width) // group_m
    off_m, off_n = pid_m * BLOCK_M, pid_n * NSUB * SUB_N
    rm = off_m + tl.arange(0, BLOCK_M)
    # rows and sub-tiles past the edge read scale 1 (their products are zero-filled and never stored)
    sa_rows = sa_ptr + rm * n_kgroups
    sb0_ptr = sb_ptr + (off_n // SUB_N) * n_kgroups
    sb1_ptr = sb0_ptr + n_kgroups
    has_sub1 = off_n + SUB_N < N
    acc0 = tl.zeros((BLOCK_M, SUB_N), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, SUB_N), dtype=tl.float32)
    s0 = tl.full((BLOCK_M,), 1.0, tl.float32)
    s1 = tl.full((BLOCK_M,), 1.0, tl.float32)
    for kg in tl.range(0, n_kgroups, warp_specialize=WS):
        a = a_desc.load([off_m, kg * BLOCK_K])
        sa = tl.load(sa_rows + kg, mask=rm < M, other=1.0)
        acc0, s0 = _scale_step(acc0, a, b_desc.load([off_n, kg * BLOCK_K]), sa, tl.load(sb0_ptr + kg), s0,
                               PROMOTE)
        if NSUB == 2:
            sb1 = tl.load(sb1_ptr + kg, mask=has_sub1, other=1.0)
            acc1, s1 = _scale_step(acc1, a, b_desc.load([off_n + SUB_N, kg * BLOCK_K]), sa, sb1, s1, PROMOTE)
    if not PROMOTE:  # the accumulators are in units of the last group's scales
        acc0 = acc0 * s0[:, None]
        acc1 = acc1 * s1[:, None]
    c_desc.store([off_m, off_n], acc0.to(tl.bfloat16))
    if NSUB == 2:
        c_desc.store([off_m, off_n + SUB_N], acc1.to(tl.bfloat16))


def gemm_blockwise(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
                   config: triton.Config | None = None) -> torch.Tensor:
    """BF16 [M, N] from E4M3 A [M, K] (1x128 inverse scales sa) and E4M3 B [N, K] (128x128 inverse scales sb).
    `config` runs one of `CONFIGS` instead of the autotuner's pick (tests, per-variant benchmarks)."""
    m, k = a.shape
    n, kb = b.shape
    if k != kb or not a.is_contiguous() or not b.is_contiguous():
        raise ValueError(f"A {tuple(a.shape)} and B {tuple(b.shape)} must share K and be contiguous row-major")
    if k % 16 or n % 8:
        raise ValueError(f"TMA needs 16-byte aligned rows: K={k} must be a multiple of 16 and N={n} of 8")
    n_kgroups = triton.cdiv(k, GROUP)
    if sa.shape != (m, n_kgroups) or sb.shape != (triton.cdiv(n, GROUP), n_kgroups):
        raise ValueError(f"scales {tuple(sa.shape)} / {tuple(sb.shape)} do not match the 1x128 / 128x128 layout "
                         f"({m}, {n_kgroups}) / ({triton.cdiv(n, GROUP)}, {n_kgroups})")
    c = torch.empty((m, n), device=a.device, dtype=torch.bfloat16)
    dummy = [1, 1]  # box sizes are set per autotuned config (_set_block_shapes)
    a_desc = TensorDescriptor.from_tensor(a, dummy)
    b_desc = TensorDescriptor.from_tensor(b, dummy)
    c_desc = TensorDescriptor.from_tensor(c, dummy)
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["NSUB"] * GROUP),)  # noqa: E731
    args = (a_desc, b_desc, c_desc, sa.contiguous(), sb.contiguous(), m, n, k, n_kgroups)
    if config is None:
        _gemm_kernel[grid](*args)
    else:
        _set_block_shapes({"a_desc": a_desc, "b_desc": b_desc, "c_desc": c_desc, **config.kwargs})
        _gemm_kernel.fn[grid](*args, **config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)
    return c


def gemm_blockwise_reference(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    m, k = a.shape
    n = b.shape[0]
    a32 = a.float() * sa.repeat_interleave(GROUP, dim=1)[:, :k]
    b32 = b.float() * sb.repeat_interleave(GROUP, dim=0).repeat_interleave(GROUP, dim=1)[:n, :k]
    return a32 @ b32.t()
