"""FP8 GEMM with DeepSeek-V3 blockwise scales: C[M, N] = (A ⊙ sa) · (B ⊙ sb)ᵀ in BF16, where A [M, K] E4M3 has
1x128 scales sa [M, K/128] and B [N, K] E4M3 has 128x128 scales sb [N/128, K/128] (inverse scales, as
`quantize_blockwise` writes them).

The K loop steps 128 columns at a time: each step's tensor-core product (FP32 accumulate) is multiplied by its
row scales and block scale and added to an FP32 accumulator, so the scales are applied inside the loop with no
precision lost across blocks (the "promotion" DeepSeek-V3 describes). BLOCK_N is at most 128 so each tile of
B has one scale per step. Autotuned over Hopper-friendly tiles, warps and pipeline stages.

`gemm_blockwise_reference`: dequantize both operands to FP32 and multiply.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

GROUP = 128


def _configs() -> list[triton.Config]:
    if os.environ.get("TRITON_INTERPRET") == "1":  # the interpreter runs one config; tuning means nothing there
        return [triton.Config({"BLOCK_M": 32, "BLOCK_N": 32, "GROUP_M": 4}, num_warps=4, num_stages=1)]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "GROUP_M": 8}, num_warps=w, num_stages=s)
            for bm, bn, w, s in [(128, 128, 8, 4), (128, 128, 4, 4), (128, 128, 8, 3), (64, 128, 4, 4),
                                 (128, 64, 4, 4), (256, 128, 8, 3), (128, 128, 8, 5)]]


@triton.autotune(configs=_configs(), key=["M", "N", "K"])
@triton.jit
def _gemm_kernel(a_ptr, b_ptr, c_ptr, sa_ptr, sb_ptr, M, N, K, stride_am, stride_bn, stride_cm, n_kgroups,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr, BLOCK_K: tl.constexpr):
    pid = tl.program_id(0)
    grid_m, grid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    # grouped ordering: programs that share A rows run together (L2 reuse)
    width = GROUP_M * grid_n
    first_m = (pid // width) * GROUP_M
    group_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % group_m
    pid_n = (pid % width) // group_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :]
    b_ptrs = b_ptr + rn[:, None] * stride_bn + rk[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kg in range(0, n_kgroups):
        kmask = rk[None, :] < K - kg * BLOCK_K
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & kmask, other=0.0)
        b = tl.load(b_ptrs, mask=(rn[:, None] < N) & kmask, other=0.0)
        sa = tl.load(sa_ptr + rm * n_kgroups + kg, mask=rm < M, other=0.0)
        sb = tl.load(sb_ptr + (pid_n * BLOCK_N // 128) * n_kgroups + kg)
        acc += tl.dot(a, tl.trans(b)) * (sa[:, None] * sb)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    c_ptrs = c_ptr + rm[:, None] * stride_cm + rn[None, :]
    tl.store(c_ptrs, acc.to(tl.bfloat16), mask=(rm[:, None] < M) & (rn[None, :] < N))


def gemm_blockwise(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    """BF16 [M, N] from E4M3 A [M, K] (1x128 inverse scales sa) and E4M3 B [N, K] (128x128 inverse scales sb)."""
    m, k = a.shape
    n, kb = b.shape
    if k != kb or a.stride(1) != 1 or b.stride(1) != 1:
        raise ValueError(f"A {tuple(a.shape)} and B {tuple(b.shape)} must share K and be row-major (K contiguous)")
    n_kgroups = triton.cdiv(k, GROUP)
    if sa.shape != (m, n_kgroups) or sb.shape != (triton.cdiv(n, GROUP), n_kgroups):
        raise ValueError(f"scales {tuple(sa.shape)} / {tuple(sb.shape)} do not match the 1x128 / 128x128 layout "
                         f"({m}, {n_kgroups}) / ({triton.cdiv(n, GROUP)}, {n_kgroups})")
    c = torch.empty((m, n), device=a.device, dtype=torch.bfloat16)
    grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
    _gemm_kernel[grid](a, b, c, sa.contiguous(), sb.contiguous(), m, n, k, a.stride(0), b.stride(0), c.stride(0),
                       n_kgroups, BLOCK_K=GROUP)
    return c


def gemm_blockwise_reference(a: torch.Tensor, sa: torch.Tensor, b: torch.Tensor, sb: torch.Tensor) -> torch.Tensor:
    m, k = a.shape
    n = b.shape[0]
    a32 = a.float() * sa.repeat_interleave(GROUP, dim=1)[:, :k]
    b32 = b.float() * sb.repeat_interleave(GROUP, dim=0).repeat_interleave(GROUP, dim=1)[:n, :k]
    return a32 @ b32.t()
