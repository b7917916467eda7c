"""`lightning-te`: PyTorch Lightning's `TransformerEnginePrecision` plugin, as Lightning users turn FP8 on.

The plugin replaces every `nn.Linear` whose dimensions suit FP8 (the output head included, unlike fp8bench's
`te` backend, which keeps the head in high precision) with `te.Linear`, and runs the step under
`te.fp8_autocast(recipe)` inside a BF16 `torch.autocast` fallback. Weights stay FP32 (`weights_dtype`), as in
the `te` backend's runs, so the two differ only by what Lightning adds. Any TE recipe object passes through
the plugin, so every recipe TE runs here runs here too. The BF16 baseline is Lightning's `bf16-mixed`.
The training loop is Lightning's own (fp8bench.workloads.train.frameworks).
"""

from __future__ import annotations

import torch

from fp8bench.backends.base import Backend, Recipe, import_probe, load_te_first
from fp8bench.core.hardware import FP8, TENSORWISE, Rule
from fp8bench.core.types import Format


class LightningTEBackend(Backend):
    name = "lightning-te"
    rules = (
        Rule(FP8, TENSORWISE, (8, 9), None, False, "Lightning TransformerEnginePrecision: TE, sm_89+"),
        Rule(FP8, frozenset({"blockwise"}), (9, 0), (12, 9), False,
            "Lightning TransformerEnginePrecision with TE Float8BlockScaling: sm_90 and CUDA >= 12.9"),
    )
    workloads = frozenset({"train"})
    loop = "lightning"
    unsupported_train = ("ckpt_every", "loss_scale", "dynamic_loss_scale")
    """Lightning checkpoints and scales losses its own way, not fp8bench's."""

    def available(self):
        load_te_first()
        return import_probe("lightning.pytorch", "integrations")

    def supports(self, workload, recipe, device):
        ok, why = super().supports(workload, recipe, device)
        if ok and recipe.format is not Format.BF16 and device.type != "cuda":
            return False, "Lightning's TransformerEnginePrecision needs Transformer Engine, which needs a CUDA GPU"
        return ok, why

    def probe(self, workload, recipe):
        if recipe.format is Format.BF16:
            return True, ""
        from fp8bench.backends.te import te_runs

        return te_runs(recipe, "Lightning's TransformerEnginePrecision")

    def scaling_knobs(self, scaling):
        from fp8bench.backends.te import TE_SCALING_KNOBS

        return TE_SCALING_KNOBS.get(scaling, frozenset())

    def effective_recipe(self, recipe):
        from fp8bench.backends.te import TEBackend

        return TEBackend().effective_recipe(recipe)

    def direct(self, knobs):
        from fp8bench.backends.te import TEBackend

        return TEBackend.name, TEBackend.knobs()

    def precision(self, recipe: Recipe, mixed: bool):
        """The Trainer's precision: the TE plugin (`plugins=`) for an FP8 recipe, Lightning's BF16 autocast
        (`precision=`) otherwise. `mixed`: FP32 master weights; else the weights themselves are BF16."""
        if recipe.format is Format.BF16:
            return "bf16-mixed" if mixed else "bf16-true"
        from lightning.pytorch.plugins import TransformerEnginePrecision

        from fp8bench.backends.te import te_recipe

        return TransformerEnginePrecision(weights_dtype=torch.float32 if mixed else torch.bfloat16,
                                          recipe=te_recipe(recipe), replace_layers=True,
                                          fallback_compute_dtype=torch.bfloat16)
