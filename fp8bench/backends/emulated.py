"""`emulated`: the exact emulator (fp8bench.backends.emulator) run as a backend: quantize→dequantize in plain
torch, then a float32 matmul. Any format, any device.

It is the numerics reference the real backends are checked against, not a speed measurement: its cases
record time_ms (what emulation costs) but no TFLOPS or speedup.
"""

from __future__ import annotations

import torch

from fp8bench.backends.base import (
    Backend,
    DelayedScalingLinear,
    GemmOp,
    QuantizeOp,
    RecipeLinear,
    TrainSetup,
    module_op,
    one_step_delayed,
    swap_block_linears,
)
from fp8bench.backends.emulator import EmulatedLinearFn, emulated_gemm
from fp8bench.core.numerics import fake_quant
from fp8bench.core.types import Format, Scaling


class _DelayedScalingLinearFn(torch.autograd.Function):
    """Y = X Wᵀ under DelayedScaling, cast as TE casts: X and W once in forward (their FP8 copies serve
    fprop and, transposed, wgrad and dgrad), dY once in backward, each with its own amax history."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor,  # type: ignore[override]
                lin: DelayedScalingLinear) -> torch.Tensor:
        xq, wq = lin.x_scale(x), lin.w_scale(w)
        ctx.save_for_backward(xq, wq)
        ctx.dy_scale = lin.dy_scale
        return xq @ wq.t()

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # type: ignore[override]
        xq, wq = ctx.saved_tensors
        dyq = ctx.dy_scale(dy)
        return dyq @ wq, dyq.t() @ xq, None


class EmulatedBackend(Backend):
    name = "emulated"
    timed = False
    reference = True
    workloads = frozenset({"gemm", "quantize", "linear", "mlp", "layer", "train"})

    def capability(self, fmt, scaling, device):
        return True, "the emulator runs every format on any device"

    def supports(self, workload, recipe, device):
        ok, why = super().supports(workload, recipe, device)
        return one_step_delayed(self.name, workload, recipe) if ok else (ok, why)

    def gemm(self, a, b, role, recipe):
        opt_a, opt_b = recipe.role_options(role)
        aq = fake_quant(a, recipe.format, recipe.scaling, opt_a)
        bq = fake_quant(b, recipe.format, recipe.scaling, opt_b)
        return GemmOp(with_quant=lambda: emulated_gemm(a, b, role, recipe), kernel_only=lambda: aq @ bq.t(),
                      real_kernel=False)

    def quantize(self, x, recipe, is_weight):
        opt = recipe.options(is_weight=is_weight)
        out_bytes = x.numel() * recipe.format.bits // 8
        return QuantizeOp(run=lambda: fake_quant(x, recipe.format, recipe.scaling, opt),
                          dequantized=lambda: fake_quant(x, recipe.format, recipe.scaling, opt),
                          bytes_moved=x.numel() * x.element_size() + out_bytes)

    def linear(self, x, w, dy, recipe):
        w = w.float().detach().requires_grad_(True)
        return module_op([w], lambda inp: EmulatedLinearFn.apply(inp, w, recipe), x.float(), dy.float(), weight=w)

    module_dtype = torch.float32
    linear_fn = EmulatedLinearFn

    def prepare_training(self, model, recipe):
        if recipe.scaling is Scaling.DELAYED:
            swap_block_linears(model, lambda lin: DelayedScalingLinear(lin, _DelayedScalingLinearFn, recipe))
        elif recipe.format is not Format.BF16:
            swap_block_linears(model, lambda lin: RecipeLinear(lin, EmulatedLinearFn, recipe))
        return TrainSetup(model)
