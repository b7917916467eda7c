"""`coat`: COAT (NVlabs, ICLR 2025; the `fp8-coat` package): FP8 linears and FP8 optimizer states.

Each block linear becomes COAT's `FP8Linear` (per-tensor E4M3 activations and weights, E5M2 output
gradients, quantize+transpose fused in COAT's Triton kernels: format=hybrid scaling=current), and the
optimizer is COAT's `CoatAdamW`, whose first and second moments are E4M3 with per-128 group scales and
dynamic range expansion (its CUDA extension `qoptim_cuda`, built from the sources the wheel ships).
The embedding and output head stay in high precision, as in the `te` and `torchao` backends.
"""

from __future__ import annotations

import torch

from fp8bench.backends.base import Backend, TrainSetup, package_probe, swap_block_linears
from fp8bench.core.hardware import Rule
from fp8bench.core.types import Format, Scaling


class CoatBackend(Backend):
    name = "coat"
    rules = (
        Rule(frozenset({"hybrid"}), frozenset({"current"}), (8, 9), None, False,
            "COAT FP8Linear (Triton) and CoatAdamW (CUDA): FP8 tensor cores, sm_89+"),
    )
    workloads = frozenset({"train"})

    def scaling_knobs(self, scaling):
        return frozenset()  # COAT's FP8Linear takes no scale options

    def available(self):
        if not torch.cuda.is_available():
            return False, "COAT's Triton and CUDA kernels need a CUDA GPU; this device is a CPU"
        for module in ("coat.activation.real_quantization.fp8linear", "coat.optimizer.fp8_adamw"):
            ok, why = package_probe(module, "fp8-coat")
            if not ok:
                return False, why
        return True, ""

    def supports(self, workload, recipe, device):
        ok, why = super().supports(workload, recipe, device)
        if ok and recipe.format is not Format.BF16 and (recipe.format, recipe.scaling) != (Format.HYBRID, Scaling.CURRENT):
            return False, ("COAT's FP8Linear quantizes per tensor from the current tensor, E4M3 forward and E5M2 "
                           "gradients: format=hybrid scaling=current")
        return ok, why

    def prepare_training(self, model, recipe):
        if recipe.format is Format.BF16:
            return TrainSetup(model)
        from coat.activation.real_quantization.fp8linear import FP8Linear
        from coat.optimizer.fp8_adamw import CoatAdamW
        from coat.utils._fp8_quantization_config import QuantizationConfig

        def to_coat(lin: torch.nn.Linear) -> torch.nn.Module:
            out = FP8Linear(lin.in_features, lin.out_features, bias=False, device=lin.weight.device)
            with torch.no_grad():
                out.weight.copy_(lin.weight)
            return out

        swap_block_linears(model, to_coat)

        def make_optimizer(groups, lr, betas, eps):
            return CoatAdamW(groups, lr=lr, betas=betas, eps=eps, qargs=QuantizationConfig())

        return TrainSetup(model, make_optimizer=make_optimizer)
