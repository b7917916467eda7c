"""The weight-gradient GEMM of DeepSeek-V3's blockwise recipe: C[M, N] = (A ⊙ sa) · (B ⊙ sb)ᵀ in BF16 where both
A [M, K] and B [N, K] are E4M3 with 1x128 scales along K (sa [M, K/128], sb [N, K/128], inverse scales).

In a linear's backward, dW = dYᵀ · X sums over tokens: A is dYᵀ [out, tokens] and B is Xᵀ [in, tokens], each
quantized in groups of 128 tokens (what `quantize_blockwise_both` writes as its transposed copy). fprop and dgrad
multiply a 1x128 operand by a 128x128 one, whose scale is one number per 128 output columns
(`gemm_blockwise`); here B's scale differs per output column, so each K group's product is scaled by the outer
product sa ⊗ sb and promoted to the FP32 accumulator (DeepSeek-V3's promotion; there is no fast-accumulation
variant). Operands come in by TMA (out-of-range tiles zero-filled, so a partial last group of tokens needs no
mask); scales are read with per-row pointer loads, M-major and N-major (stride 1 along the rows) reading
coalesced.

`gemm_blockwise_wgrad_reference`: dequantize both operands to FP32 and multiply.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ._launch import Launcher, cdiv
from ._tune import steady_do_bench, tuning_configs
from .gemm_blockwise import GROUP, _tile, check_operands


def _set_block_shapes(nargs: dict) -> None:
    nargs["a_desc"].block_shape = [nargs["BLOCK_M"], GROUP]
    nargs["b_desc"].block_shape = [nargs["BLOCK_N"], GROUP]
    nargs["c_desc"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_N"]]


def _config(bm: int, bn: int, warps: int, stages: int) -> triton.Config:
    return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "GROUP_M": 8}, num_warps=warps, num_stages=stages,
                         pre_hook=_set_block_shapes)


CONFIGS = [_config(*c) for c in [(128, 128, 8, 3), (64, 128, 4, 4), (128, 64, 4, 4), (64, 64, 4, 5)]]
"""Tiles whose FP32 accumulator and scale tile fit the registers without spills, compiled for sm_90
(tests/kernels/test_sm90.py; 128x128 on 4 warps spills, so it is not here)."""
INTERPRETER_CONFIG = _config(32, 64, 4, 1)


@triton.jit
def _gemm_wgrad_kernel(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, M, N, K, n_kgroups, sa_sm, sa_sk, sb_sn, sb_sk,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    BLOCK_K: tl.constexpr = 128
    off_m, off_n = _tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rm = off_m + tl.arange(0, BLOCK_M)
    rn = off_n + tl.arange(0, BLOCK_N)
    # rows and columns past the edge read scale 1: their zero-filled products are never stored
    sa_rows = sa_ptr + rm * sa_sm
    sb_rows = sb_ptr + rn * sb_sn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kg in range(0, n_kgroups):
        a = a_desc.load([off_m, kg * BLOCK_K])
        b = b_desc.load([off_n, kg * BLOCK_K])
        sa = tl.load(sa_rows + kg * sa_sk, mask=rm < M, other=1.0)
        sb = tl.load(sb_rows + kg * sb_sk, mask=rn < N, other=1.0)
        acc += tl.dot(a, tl.trans(b)) * (sa[:, None] * sb[None, :])
    c_desc.store([off_m, off_n], acc.to(tl.bfloat16))


_AUTOTUNED = triton.autotune(configs=tuning_configs(CONFIGS, interpreter=INTERPRETER_CONFIG), key=["M", "N", "K"],
                             do_bench=steady_do_bench)(_gemm_wgrad_kernel)


_launch_autotuned = Launcher(_AUTOTUNED)


def gemm_blockwise_wgrad(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor,
                         config: triton.Config | None = None) -> torch.Tensor:
    """BF16 [M, N] from E4M3 A [M, K] and B [N, K], both with 1x128 inverse scales along K (any strides; M- and
    N-major read coalesced). `config` runs one of CONFIGS instead of the autotuner's pick."""
    m, n, n_kgroups = check_operands(a, sa, b, sb, b_rows=1)
    k = a.shape[1]
    c = torch.empty((m, n), device=a.device, dtype=torch.bfloat16)
    dummy = [1, 1]  # box sizes are set per config (_set_block_shapes)
    a_desc, b_desc, c_desc = (TensorDescriptor.from_tensor(t, dummy) for t in (a, b, c))

    def grid(meta):
        return (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),)
    args = (a_desc, b_desc, c_desc, sa, sb, m, n, k, n_kgroups, sa.stride(0), sa.stride(1), sb.stride(0), sb.stride(1))
    if config is None:
        _launch_autotuned(grid, *args)
    else:
        _set_block_shapes({"a_desc": a_desc, "b_desc": b_desc, "c_desc": c_desc, **config.kwargs})
        _gemm_wgrad_kernel[grid](*args, **config.kwargs, num_warps=config.num_warps, num_stages=config.num_stages)
    return c


def gemm_blockwise_wgrad_reference(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    k = a.shape[1]
    a32 = a.float() * sa.repeat_interleave(GROUP, dim=1)[:, :k]
    b32 = b.float() * sb.repeat_interleave(GROUP, dim=1)[:, :k]
    return a32 @ b32.t()


def compile_sm90(config: triton.Config):
    """Compile the kernel for sm_90 without a GPU (Triton's compiler; tests/kernels/test_sm90.py runs ptxas on it)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    bm, bn = config.kwargs["BLOCK_M"], config.kwargs["BLOCK_N"]
    signature = {"a_desc": f"tensordesc<fp8e4nv[{bm}, {GROUP}]>", "b_desc": f"tensordesc<fp8e4nv[{bn}, {GROUP}]>",
                 "c_desc": f"tensordesc<bf16[{bm}, {bn}]>", "sa_ptr": "*fp32", "sb_ptr": "*fp32", "M": "i32",
                 "N": "i32", "K": "i32", "n_kgroups": "i32", "sa_sm": "i32", "sa_sk": "i32", "sb_sn": "i32",
                 "sb_sk": "i32", "BLOCK_M": "constexpr", "BLOCK_N": "constexpr", "GROUP_M": "constexpr"}
    constants = {"BLOCK_M": bm, "BLOCK_N": bn, "GROUP_M": config.kwargs["GROUP_M"]}
    return triton.compile(ASTSource(_gemm_wgrad_kernel, signature, constants), target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": config.num_warps, "num_stages": config.num_stages})
