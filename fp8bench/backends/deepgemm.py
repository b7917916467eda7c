"""`deepgemm`: DeepSeek's DeepGEMM (`deep-gemm` package): blockwise FP8 GEMM, 1x128 activation scales x
128x128 weight scales applied inside the K loop, JIT-compiled CUDA for Hopper.

gemm workload, e4m3/blockwise, fprop and dgrad (A·Bᵀ with B 128x128-scaled; wgrad's operands are both
1x128-scaled, which `gemm_fp8_fp8_bf16_nt` does not take). Operands are cast by fp8bench's Triton blockwise
quantizer, as in the `triton` backend, so the two GEMMs are compared on identical FP8 inputs.
"""

from __future__ import annotations

import torch

from fp8bench.backends.base import Backend, GemmOp, package_probe
from fp8bench.core.hardware import Rule
from fp8bench.core.types import Format, GemmRole, Scaling


class DeepGemmBackend(Backend):
    name = "deepgemm"
    rules = (
        Rule(frozenset({"e4m3"}), frozenset({"blockwise"}), (9, 0), None, False,
            "DeepGEMM: sm_90a wgmma kernels, Hopper only"),
    )
    workloads = frozenset({"gemm"})

    def available(self):
        if not torch.cuda.is_available():
            return False, "DeepGEMM JIT-compiles sm_90a CUDA kernels: it needs a Hopper GPU; this device is a CPU"
        return package_probe("deep_gemm", "deep-gemm")

    def supports(self, workload, recipe, device):
        ok, why = super().supports(workload, recipe, device)
        if ok and recipe.format is not Format.BF16 and (recipe.format, recipe.scaling) != (Format.E4M3, Scaling.BLOCKWISE):
            return False, "DeepGEMM's dense GEMM is E4M3 with 1x128 x 128x128 block scales: format=e4m3 scaling=blockwise"
        return ok, why

    def supports_shape(self, workload, shape, recipe):
        if recipe.format is not Format.BF16 and shape.get("role") == GemmRole.WGRAD.value:
            return False, "gemm_fp8_fp8_bf16_nt takes a 128x128-scaled B operand; wgrad's operands are both 1x128"
        return True, ""

    def gemm(self, a, b, role, recipe):
        import deep_gemm
        from fp8bench_kernels.quantize_blockwise import quantize_blockwise

        a16, b16 = a.bfloat16().contiguous(), b.bfloat16().contiguous()
        if recipe.format is Format.BF16:
            return GemmOp(with_quant=lambda: a16 @ b16.t(), kernel_only=lambda: a16 @ b16.t())
        out = torch.empty(a16.shape[0], b16.shape[0], device=a16.device, dtype=torch.bfloat16)
        pow2 = recipe.scaling_cfg.pow2_scales

        def run(qa, sa, qb, sb):
            deep_gemm.gemm_fp8_fp8_bf16_nt((qa, sa), (qb, sb), out)
            return out

        def with_quant():
            return run(*quantize_blockwise(a16, (1, 128), pow2), *quantize_blockwise(b16, (128, 128), pow2))

        qa, sa = quantize_blockwise(a16, (1, 128), pow2)
        qb, sb = quantize_blockwise(b16, (128, 128), pow2)
        # DeepGEMM wants the LHS scales column-major and TMA-aligned: prepare them once for kernel-only timing
        sa_t = deep_gemm.get_col_major_tma_aligned_tensor(sa)
        return GemmOp(with_quant=with_quant, kernel_only=lambda: run(qa, sa_t, qb, sb))
