"""The exact emulator: quantize→dequantize in plain torch (fp8bench.core.numerics.fake_quant), then a float32
matmul, for any format on any device. The reference every real backend's numerics are checked against; the
`emulated` adapter runs it as a backend, and workloads call it for their cross-checks without depending on
any adapter."""

from __future__ import annotations

import torch

from fp8bench.backends.base import Recipe
from fp8bench.core.numerics import fake_quant
from fp8bench.core.types import GemmRole


def emulated_gemm(a: torch.Tensor, b: torch.Tensor, role: GemmRole, recipe: Recipe,
                  rows: int | None = None) -> torch.Tensor:
    """fake_quant(A) · fake_quant(B)ᵀ in float32 (TN layout: both operands have K last).

    `rows` keeps only the first rows of the result (A is still quantized whole: its scales see every row)."""
    opt_a, opt_b = recipe.role_options(role)
    aq = fake_quant(a, recipe.format, recipe.scaling, opt_a)
    return (aq if rows is None else aq[:rows]) @ fake_quant(b, recipe.format, recipe.scaling, opt_b).t()


class EmulatedLinearFn(torch.autograd.Function):
    """Y = X Wᵀ with every GEMM operand fake-quantized in the layout of its own GEMM (K last)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, recipe: Recipe) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, w)
        ctx.recipe = recipe
        return emulated_gemm(x, w, GemmRole.FPROP, recipe)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # type: ignore[override]
        x, w = ctx.saved_tensors
        dx = emulated_gemm(dy, w.t(), GemmRole.DGRAD, ctx.recipe)
        dw = emulated_gemm(dy.t(), x.t(), GemmRole.WGRAD, ctx.recipe)
        return dx, dw, None
