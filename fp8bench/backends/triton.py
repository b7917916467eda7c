"""`triton`: fp8bench's own kernels (`kernels/`, imported as `fp8bench_kernels`).

- quantize: e4m3/current (amax, then cast + transposed copy), e4m3/blockwise (1x128 activations, 128x128
  weights; `scaling.pow2_scales`), mxfp8/mx (32-element blocks, E8M0 exponents);
- gemm: e4m3/blockwise fprop and dgrad (1x128 A x 128x128 B, scales inside the K loop; the DeepSeek-V3
  recipe): on Hopper the warp-specialized Gluon kernel (`gemm_blockwise_gluon`), elsewhere the Triton one
  (`gemm_blockwise`). Each group's product is promoted to FP32 (DeepSeek-V3) unless `backend.fast_accum`
  (conf/backend/triton-fastaccum.yaml) lets the sum stay in the tensor core's accumulation (rescale), as
  cuBLAS's fast accumulation does: faster, less accurate.
A case without a kernel is recorded `skipped` with that reason, never run under another name.
"""

from __future__ import annotations

import torch

from fp8bench.backends.base import Backend, GemmOp, QuantizeOp, import_probe
from fp8bench.core.hardware import FP8, Rule
from fp8bench.core.types import Format, GemmRole, Scaling

KERNELS = {
    ("quantize", Format.E4M3, Scaling.CURRENT), ("quantize", Format.E4M3, Scaling.BLOCKWISE),
    ("quantize", Format.MXFP8, Scaling.MX), ("gemm", Format.E4M3, Scaling.BLOCKWISE),
}


class TritonBackend(Backend):
    name = "triton"
    rules = (
        Rule(FP8, frozenset({"current", "blockwise"}), (9, 0), None, False,
            "fp8bench_kernels use Hopper FP8 tensor cores (sm_90+)"),
        Rule(frozenset({"mxfp8"}), frozenset({"mx"}), (9, 0), None, False,
            "fp8bench_kernels MX quantizer (numerics on Hopper)"),
    )
    workloads = frozenset({"gemm", "quantize"})

    def available(self):
        if not torch.cuda.is_available() and not _interpreting():
            return False, "triton kernels need a CUDA GPU (or TRITON_INTERPRET=1 for correctness only)"
        ok, why = import_probe("triton", "gpu")
        if not ok:
            return ok, why
        try:  # kernels/ is importable only as installed (a package_dir mapping): say so, not fail per case
            import fp8bench_kernels  # noqa: F401
        except ImportError as exc:
            return False, (f"fp8bench_kernels does not import ({exc}); install the project "
                           "(pip install -e . maps kernels/ to fp8bench_kernels)")
        return True, ""

    def supports(self, workload, recipe, device):
        ok, why = super().supports(workload, recipe, device)
        if not ok or recipe.format is Format.BF16:
            return ok, why
        if (workload, recipe.format, recipe.scaling) not in KERNELS:
            have = sorted(f"{w} {f.value}/{s.value}" for w, f, s in KERNELS)
            return False, f"fp8bench_kernels has no {workload} kernel for {recipe.format.value}/{recipe.scaling.value}; it has {have}"
        return True, ""

    def supports_shape(self, workload, shape, recipe):
        if workload == "gemm" and recipe.format is not Format.BF16 and shape.get("role") == GemmRole.WGRAD.value:
            return False, ("fp8bench_kernels' blockwise GEMM takes 1x128 x 128x128 scaled operands (fprop, dgrad); "
                           "wgrad's are 1x128 x 1x128")
        return True, ""

    def quantize(self, x, recipe, is_weight):
        x = x.bfloat16().contiguous()
        if recipe.scaling is Scaling.CURRENT:
            from fp8bench_kernels.quantize_current import bytes_moved, quantize_current

            def deq():
                y, _, inv = quantize_current(x)
                return y.float() * inv
            return QuantizeOp(run=lambda: quantize_current(x), dequantized=deq, bytes_moved=bytes_moved(x))
        if recipe.scaling is Scaling.BLOCKWISE:
            from fp8bench_kernels.quantize_blockwise import bytes_moved, quantize_blockwise

            block = (128, 128) if is_weight else (1, 128)
            pow2 = recipe.scaling_cfg.pow2_scales

            def deq():
                y, s = quantize_blockwise(x, block, pow2)
                return y.float() * _expand(s, block, x.shape)
            return QuantizeOp(run=lambda: quantize_blockwise(x, block, pow2), dequantized=deq,
                              bytes_moved=bytes_moved(x, block))
        if recipe.scaling is Scaling.MX:
            from fp8bench_kernels.quantize_mx import bytes_moved, dequantize_mx, quantize_mx

            return QuantizeOp(run=lambda: quantize_mx(x), dequantized=lambda: dequantize_mx(*quantize_mx(x)),
                              bytes_moved=bytes_moved(x))
        raise ValueError(f"no triton quantize kernel for {recipe.scaling.value}")

    def gemm(self, a, b, role, recipe):
        """C = A·Bᵀ with A's 1x128 and B's 128x128 blockwise scales (fprop: activations x weights; dgrad:
        gradients x transposed weights). wgrad has 1x128 scales on both operands: not this kernel."""
        from fp8bench_kernels.quantize_blockwise import quantize_blockwise

        if recipe.format is Format.BF16:
            a16, b16 = a.bfloat16(), b.bfloat16()
            return GemmOp(with_quant=lambda: a16 @ b16.t(), kernel_only=lambda: a16 @ b16.t())
        if role is GemmRole.WGRAD:
            raise ValueError("the blockwise kernel takes 1x128 x 128x128 operands; wgrad's are 1x128 x 1x128")
        pow2 = recipe.scaling_cfg.pow2_scales
        kernel, gemm = _blockwise_gemm(a.device, recipe.backend_cfg.fast_accum)
        a16, b16 = a.bfloat16().contiguous(), b.bfloat16().contiguous()

        def with_quant():  # A's scales written M-major, the layout both GEMM kernels read them in
            qa, sa = quantize_blockwise(a16, (1, 128), pow2, m_major_scales=True)
            qb, sb = quantize_blockwise(b16, (128, 128), pow2)
            return gemm(qa, sa, qb, sb)
        qa, sa = quantize_blockwise(a16, (1, 128), pow2, m_major_scales=True)
        qb, sb = quantize_blockwise(b16, (128, 128), pow2)
        return GemmOp(with_quant=with_quant, kernel_only=lambda: gemm(qa, sa, qb, sb), ran={"gemm_kernel": kernel})


def _blockwise_gemm(device: torch.device, fast_accum: bool):
    """(name, GEMM) for this device, taking A's scales M-major (`quantize_blockwise(m_major_scales=True)`): the
    Gluon kernel's producer TMA-loads them so, and the Triton kernel reads them in one coalesced load. Which
    of the two ran is recorded with the case (`gemm_kernel`)."""
    try:
        from fp8bench_kernels.gemm_blockwise_gluon import gemm_blockwise_gluon, runs_on
    except ImportError:  # a Triton without Gluon
        runs_on = None
    if runs_on is not None and runs_on(device):
        return "gluon", lambda qa, sa, qb, sb: gemm_blockwise_gluon(qa, sa, qb, sb, fast_accum=fast_accum)
    from fp8bench_kernels.gemm_blockwise import gemm_blockwise

    return "triton", lambda qa, sa, qb, sb: gemm_blockwise(qa, sa, qb, sb, fast_accum=fast_accum)


def _expand(scales: torch.Tensor, block: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    rows, cols = block
    return scales.repeat_interleave(rows, dim=0).repeat_interleave(cols, dim=1)[: shape[0], : shape[1]]


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"
