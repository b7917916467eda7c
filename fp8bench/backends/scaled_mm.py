"""`torch`: FP8 GEMMs through `torch._scaled_mm` (tensorwise, rowwise) and `torch.nn.functional.scaled_mm`
(DeepSeek-style blockwise); casts in eager torch, the way a user without TE or torchao writes them.

On CUDA these are cuBLASLt kernels. On CPU torch implements `_scaled_mm` too: through oneDNN (whose FP8
path is a slow reference on CPUs without FP8 units, so it is opt-in: `backend.cpu_onednn=true`) or through
its own fallback.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8bench.backends.base import (
    Backend,
    DelayedScalingLinear,
    GemmOp,
    Knobs,
    QuantizeOp,
    Recipe,
    RecipeLinear,
    TrainSetup,
    cpu_scaled_mm_path,
    module_op,
    one_step_delayed,
    swap_block_linears,
)
from fp8bench.core.hardware import FP8, TENSORWISE, Rule
from fp8bench.core.numerics import ACT_BLOCK, WEIGHT_BLOCK, QuantOptions, amax_to_scale
from fp8bench.core.types import Format, GemmRole, Scaling

# Operand layouts F.scaled_mm accepts for blockwise scales on sm_90 (torch's own OpInfo samples in
# torch/testing/_internal/common_methods_invocations.py): 1x128 scales are (M, K/128) stored K-block-major
# (a transposed contiguous (K/128, M)); 128x128 scales are (N/128, K/128 padded to 4) transposed.


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def cublas_blockwise_scales(inv: torch.Tensor, is_weight: bool) -> torch.Tensor:
    """Blockwise inverse scales [rows / block, K/128] in the layout F.scaled_mm asks for (above)."""
    if is_weight:
        padded = torch.zeros(inv.shape[0], _round_up(inv.shape[1], 4), device=inv.device, dtype=torch.float32)
        padded[:, : inv.shape[1]] = inv
        return padded.t()
    return inv.t().contiguous().t()


class Quantized:
    """An FP8 operand and its dequantization scale in the layout the GEMM call wants."""

    def __init__(self, data: torch.Tensor, inv_scale: torch.Tensor, block: tuple[int, int] | None = None) -> None:
        self.data = data
        self.inv_scale = inv_scale
        self.block = block
        """(rows, cols) of a blockwise scale, None for tensorwise/rowwise."""

    def dequantize(self) -> torch.Tensor:
        if self.block is None:
            return self.data.float() * self.inv_scale
        rows, cols = self.block
        m, k = self.data.shape
        s = self.inv_scale.t()[:, : k // cols] if rows > 1 else self.inv_scale
        tiles = self.data.float().reshape(m // rows, rows, k // cols, cols)
        return (tiles * s.reshape(m // rows, 1, k // cols, 1)).reshape(m, k)


def quantize_operand(x: torch.Tensor, recipe: Recipe, opt: QuantOptions,
                     scale: torch.Tensor | None = None) -> Quantized:
    """Eager-torch cast of one GEMM operand (K last), with the same scale math as fp8bench.core.numerics. `scale`:
    a tensorwise scale from earlier steps (delayed scaling in training, `DelayedScale.take`); without it the
    scale comes from this tensor's amax."""
    element = recipe.format.element(opt.is_grad)
    dtype = element.spec.torch_dtype
    # cuBLASLt FP8 GEMMs are TN only: each operand must be K-major, so a transposed view (dgrad's Wᵀ,
    # wgrad's Xᵀ) costs a real transposed copy here, as it does in every FP8 training recipe on Hopper.
    xf = x.contiguous().float()
    if recipe.scaling in (Scaling.CURRENT, Scaling.DELAYED):
        if scale is None:
            scale = amax_to_scale(xf.abs().amax(), element, opt.pow2_scale, opt.margin)
        inv = scale.reciprocal()
    elif recipe.scaling is Scaling.ROWWISE:
        scale = amax_to_scale(xf.abs().amax(dim=-1, keepdim=True), element, opt.pow2_scale)
        inv = scale.reciprocal()
    elif recipe.scaling is Scaling.BLOCKWISE:
        rows, cols = WEIGHT_BLOCK if opt.is_weight else ACT_BLOCK
        m, k = xf.shape
        if m % rows or k % cols:
            raise ValueError(f"blockwise scaled_mm needs dims divisible by the block: {m=} {k=} block={rows}x{cols}")
        tiles = xf.reshape(m // rows, rows, k // cols, cols)
        scale = amax_to_scale(tiles.abs().amax(dim=(1, 3), keepdim=True), element, opt.pow2_scale)
        data = (tiles * scale).clamp(-element.max, element.max).to(dtype).reshape(m, k)
        inv = cublas_blockwise_scales(scale.reshape(m // rows, k // cols).reciprocal(), opt.is_weight)
        return Quantized(data, inv, (rows, cols))
    else:
        raise ValueError(f"backend 'torch' has no {recipe.format.value}/{recipe.scaling.value} cast")
    data = (xf * scale).clamp(-element.max, element.max).to(dtype)
    return Quantized(data, inv)


def scaled_gemm(qa: Quantized, qb: Quantized, recipe: Recipe, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """A · Bᵀ on quantized operands: B's data is (N, K) row-major, passed as the column-major (K, N)."""
    fast = recipe.knobs.fast_accum and qa.data.is_cuda
    with cpu_scaled_mm_path(recipe, qa.data.device):
        if recipe.scaling is Scaling.BLOCKWISE:
            import torch.nn.functional as F

            def kind(q: Quantized):
                return F.ScalingType.BlockWise128x128 if q.block == WEIGHT_BLOCK else F.ScalingType.BlockWise1x128
            return F.scaled_mm(qa.data, qb.data.t(), qa.inv_scale, kind(qa), qb.inv_scale, kind(qb),
                               output_dtype=out_dtype, use_fast_accum=fast)
        sb = qb.inv_scale.t() if qb.inv_scale.dim() == 2 else qb.inv_scale
        return torch._scaled_mm(qa.data, qb.data.t(), scale_a=qa.inv_scale, scale_b=sb, out_dtype=out_dtype,
                                use_fast_accum=fast)


def fp8_gemm(a: torch.Tensor, b: torch.Tensor, role: GemmRole, recipe: Recipe) -> torch.Tensor:
    opt_a, opt_b = recipe.role_options(role)
    return scaled_gemm(quantize_operand(a, recipe, opt_a), quantize_operand(b, recipe, opt_b), recipe)


class _ScaledMMLinearFn(torch.autograd.Function):
    """Y = X Wᵀ with all three GEMMs in FP8 through scaled_mm; casts in eager torch."""

    @staticmethod
    def forward(ctx, x, w, recipe):  # type: ignore[override]
        ctx.save_for_backward(x, w)
        ctx.recipe = recipe
        return fp8_gemm(x, w, GemmRole.FPROP, recipe)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, w = ctx.saved_tensors
        dx = fp8_gemm(dy, w.t(), GemmRole.DGRAD, ctx.recipe)
        dw = fp8_gemm(dy.t().contiguous(), x.t().contiguous(), GemmRole.WGRAD, ctx.recipe)
        return dx, dw, None


class _DelayedScalingLinearFn(torch.autograd.Function):
    """Y = X Wᵀ under delayed scaling, three FP8 GEMMs through scaled_mm: X and W take their histories'
    scales in forward, dY its own in backward; the transposed copies the TN-only GEMMs need (Wᵀ for dgrad, Xᵀ
    and dYᵀ for wgrad) are cast with the same scales, as TE's transposed FP8 copies are."""

    @staticmethod
    def forward(ctx, x, w, lin: DelayedScalingLinear):  # type: ignore[override]
        sx, sw = lin.x_scale.take(x), lin.w_scale.take(w)
        ctx.save_for_backward(x, w, sx, sw)
        ctx.lin = lin
        opt_x, opt_w = lin.recipe.role_options(GemmRole.FPROP)
        return scaled_gemm(quantize_operand(x, lin.recipe, opt_x, sx), quantize_operand(w, lin.recipe, opt_w, sw),
                           lin.recipe)

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, w, sx, sw = ctx.saved_tensors
        recipe = ctx.lin.recipe
        sdy = ctx.lin.dy_scale.take(dy)
        dg_dy, dg_w = recipe.role_options(GemmRole.DGRAD)
        dx = scaled_gemm(quantize_operand(dy, recipe, dg_dy, sdy), quantize_operand(w.t(), recipe, dg_w, sw), recipe)
        wg_dy, wg_x = recipe.role_options(GemmRole.WGRAD)
        dw = scaled_gemm(quantize_operand(dy.t(), recipe, wg_dy, sdy), quantize_operand(x.t(), recipe, wg_x, sx),
                         recipe)
        return dx, dw, None


@dataclass(frozen=True, kw_only=True)
class TorchKnobs(Knobs):
    fast_accum: bool = False
    """FP8 GEMMs with cuBLASLt's fast accumulation (CUDA only)."""
    cpu_onednn: bool = False
    """CPU: let oneDNN run FP8 _scaled_mm. Without FP8 hardware its path is a slow reference."""


class ScaledMMBackend(Backend):
    name = "torch"
    knobs = TorchKnobs
    order = 1
    eager_casts = True
    strategies = frozenset({"fsdp2", "ddp"})
    rules = (
        Rule(frozenset({"hybrid"}), frozenset({"blockwise"}), None, None, False,
            "F.scaled_mm blockwise takes E4M3 operands only: torch 2.11 on an H200 rejected E5M2 gradients "
            "('Invalid scaling configuration'); use e4m3", unsupported=True),
        Rule(FP8, TENSORWISE | {"rowwise"}, (8, 9), None, True,
            "torch._scaled_mm: cuBLASLt FP8 needs sm_89+; on CPU torch implements it (oneDNN or fallback)"),
        Rule(frozenset({"e4m3"}), frozenset({"blockwise"}), (9, 0), (12, 9), False,
            "F.scaled_mm BlockWise1x128/128x128 runs on cuBLASLt for sm_90 with CUDA >= 12.9 only"),
        Rule(frozenset({"mxfp8", "nvfp4"}), frozenset({"mx", "nvfp4"}), None, None, False,
            "the torch backend has no MX/NVFP4 path (its casts and _scaled_mm calls are tensorwise, rowwise and "
            "blockwise only): on Blackwell measure them through te; the emulator covers their numerics",
            unsupported=True),
    )
    workloads = frozenset({"gemm", "quantize", "linear", "mlp", "layer", "train"})

    linear_fn = _ScaledMMLinearFn

    def supports(self, workload, recipe, device):
        ok, why = super().supports(workload, recipe, device)
        if not ok:
            return ok, why
        if recipe.knobs.fast_accum and device.type != "cuda":
            return False, "backend.fast_accum is a cuBLASLt option; this device is a CPU"
        return one_step_delayed(self.name, workload, recipe)

    def supports_train(self, train, recipe, device):
        ok, why = super().supports_train(train, recipe, device)
        if ok and train.nproc > 1 and recipe.format is not Format.BF16:
            return False, "distributed torch-backend runs are the BF16 baseline; FP8 runs through torchao or te"
        return ok, why

    def gemm(self, a, b, role, recipe):
        if recipe.format is Format.BF16:
            a16, b16 = a.bfloat16(), b.bfloat16()
            return GemmOp(with_quant=lambda: a16 @ b16.t(), kernel_only=lambda: a16 @ b16.t())
        opt_a, opt_b = recipe.role_options(role)
        qa, qb = quantize_operand(a, recipe, opt_a), quantize_operand(b, recipe, opt_b)
        return GemmOp(with_quant=lambda: fp8_gemm(a, b, role, recipe), kernel_only=lambda: scaled_gemm(qa, qb, recipe))

    def quantize(self, x, recipe, is_weight):
        opt = recipe.options(is_weight=is_weight)
        q = quantize_operand(x, recipe, opt)
        scale_bytes = q.inv_scale.numel() * 4
        return QuantizeOp(run=lambda: quantize_operand(x, recipe, opt),
                          dequantized=lambda: quantize_operand(x, recipe, opt).dequantize(),
                          bytes_moved=x.numel() * x.element_size() + x.numel() + scale_bytes)

    def linear(self, x, w, dy, recipe):
        w = w.bfloat16().detach().requires_grad_(True)
        if recipe.format is Format.BF16:
            def forward(inp):
                return inp @ w.t()
        else:
            def forward(inp):
                return _ScaledMMLinearFn.apply(inp, w, recipe)
        return module_op([w], forward, x.bfloat16(), dy.bfloat16(), weight=w)

    def prepare_training(self, model, recipe):
        if recipe.scaling is Scaling.DELAYED:
            swap_block_linears(model, lambda lin: DelayedScalingLinear(lin, _DelayedScalingLinearFn, recipe))
        elif recipe.format is not Format.BF16:
            swap_block_linears(model, lambda lin: RecipeLinear(lin, _ScaledMMLinearFn, recipe))
        device = next(model.parameters()).device
        return TrainSetup(model, step_context=lambda: cpu_scaled_mm_path(recipe, device))
