"""`torchao`: torchao float8 training (`Float8Linear` via `convert_to_float8_training`).

Recipes, labelled by what they really do (torchao 0.18 Float8LinearConfig.from_recipe_name):
- tensorwise: E4M3 activations/weights and E5M2 gradients, dynamic tensorwise scales → format=hybrid
  scaling=current;
- rowwise: E4M3 everywhere, per-row scales rounded to powers of two → format=e4m3 scaling=rowwise;
- rowwise_with_gw_hp: rowwise, weight-gradient GEMM in high precision → rowwise + `backend.gw_hp=true`.
torchao is built to run under torch.compile (`backend.compile=true`); eager shows what compile buys.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from fp8bench.backends.base import (
    Backend,
    Knobs,
    Recipe,
    TrainSetup,
    compile_blocks,
    compile_module,
    cpu_scaled_mm_path,
    import_probe,
    module_op,
)
from fp8bench.core.hardware import Rule
from fp8bench.core.types import Format, Scaling


def recipe_name(recipe: Recipe) -> str | None:
    if recipe.format is Format.HYBRID and recipe.scaling is Scaling.CURRENT:
        return "tensorwise"
    if recipe.format is Format.E4M3 and recipe.scaling is Scaling.ROWWISE:
        return "rowwise_with_gw_hp" if recipe.knobs.gw_hp else "rowwise"
    return None


@dataclass(frozen=True, kw_only=True)
class TorchaoKnobs(Knobs):
    compile: bool = False
    """Wrap the module (train: each block) in torch.compile, as torchao float8 is meant to run on a GPU."""
    gw_hp: bool = False
    """rowwise: keep the weight-gradient GEMM in high precision (recipe rowwise_with_gw_hp)."""
    cpu_onednn: bool = False
    """CPU: let oneDNN run FP8 _scaled_mm. Without FP8 hardware its path is a slow reference."""


TORCHAO_SCALING_KNOBS = {Scaling.ROWWISE: frozenset({"pow2_scales"})}
"""torchao's recipes take none of `scaling.*` (its tensorwise scales are the current amax's, unrounded); its
rowwise scales are powers of two whatever is asked (`effective_recipe`)."""


class TorchaoBackend(Backend):
    name = "torchao"
    knobs = TorchaoKnobs
    order = 3
    strategies = frozenset({"fsdp2"})
    rules = (
        Rule(frozenset({"hybrid"}), frozenset({"current"}), (8, 9), None, True,
            "torchao float8 'tensorwise' recipe (E4M3 forward, E5M2 gradients); Float8Linear also runs on CPU"),
        Rule(frozenset({"e4m3"}), frozenset({"rowwise"}), (8, 9), None, True,
            "torchao float8 'rowwise' recipes (E4M3, power-of-two row scales); Float8Linear also runs on CPU"),
    )
    workloads = frozenset({"linear", "mlp", "layer", "train"})

    def available(self):
        return import_probe("torchao.float8", "gpu")

    def supports(self, workload, recipe, device):
        ok, why = super().supports(workload, recipe, device)
        if not ok:
            return ok, why
        if recipe.format is not Format.BF16 and recipe_name(recipe) is None:
            return False, (f"torchao float8 has no {recipe.format.value}/{recipe.scaling.value} recipe; it offers "
                           "hybrid/current (tensorwise), e4m3/rowwise (rowwise, rowwise_with_gw_hp)")
        if recipe.knobs.gw_hp and recipe.scaling is not Scaling.ROWWISE:
            return False, "backend.gw_hp applies to the rowwise recipe only"
        return True, ""

    def scaling_knobs(self, scaling):
        return TORCHAO_SCALING_KNOBS.get(scaling, frozenset())

    def supports_train(self, train, recipe, device):
        ok, why = super().supports_train(dataclasses.replace(train, fp8_all_gather=False), recipe, device)
        if ok and train.fp8_all_gather and not (train.strategy == "fsdp2" and train.nproc > 1
                                                and (recipe.format, recipe.scaling) == (Format.HYBRID, Scaling.CURRENT)):
            return False, "fp8_all_gather is torchao tensorwise float8 (hybrid/current) under FSDP2 with nproc > 1"
        return ok, why

    def effective_recipe(self, recipe):
        if recipe.scaling is Scaling.ROWWISE:  # torchao's rowwise recipes round scales to powers of two
            return dataclasses.replace(recipe, scaling_cfg=dataclasses.replace(recipe.scaling_cfg, pow2_scales=True))
        return recipe

    def linear(self, x, w, dy, recipe):
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        out_f, in_f = w.shape
        module = torch.nn.Sequential(torch.nn.Linear(in_f, out_f, bias=False, device=w.device, dtype=torch.bfloat16))
        with torch.no_grad():
            module[0].weight.copy_(w)
        name = recipe_name(recipe)
        if recipe.format is not Format.BF16:
            convert_to_float8_training(module, config=Float8LinearConfig.from_recipe_name(name))
            if type(module[0]).__name__ != "Float8Linear":  # never measure BF16 under an FP8 label
                raise RuntimeError(f"torchao did not convert the linear to Float8Linear (got {type(module[0]).__name__})")
        run = compile_module(module) if recipe.knobs.compile else module
        return module_op([module[0].weight], run, x.bfloat16(), dy.bfloat16(), weight=module[0].weight,
                         notes={"recipe": name or "bf16"}, context=lambda: cpu_scaled_mm_path(recipe, x.device))

    def module(self, reference, x, dy, recipe):
        import copy

        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        compile_ = compile_module if recipe.knobs.compile else (lambda m: m)
        if recipe.format is Format.BF16:
            return module_op(list(reference.parameters()), compile_(reference), x, dy)
        module = copy.deepcopy(reference)
        convert_to_float8_training(module, config=Float8LinearConfig.from_recipe_name(recipe_name(recipe)))
        converted = [type(m).__name__ for m in module.children() if "Linear" in type(m).__name__]
        if any(name != "Float8Linear" for name in converted):  # never measure BF16 under an FP8 label
            raise RuntimeError(f"torchao left linears unconverted: {converted}")
        return module_op(list(module.parameters()), compile_(module), x, dy, reference_forward=reference,
                         notes={"recipe": recipe_name(recipe)}, context=lambda: cpu_scaled_mm_path(recipe, x.device))

    def prepare_training(self, model, recipe, fp8_all_gather: bool = False):
        """convert_to_float8_training on the blocks (the output head stays high precision);
        `backend.compile` compiles each block, as torchao float8 is meant to run. `fp8_all_gather`: the
        weights are to be sharded by FSDP2 and all-gathered already in FP8 (tensorwise only)."""
        import dataclasses

        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        if recipe.format is not Format.BF16:
            config = Float8LinearConfig.from_recipe_name(recipe_name(recipe))
            if fp8_all_gather:
                config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
            convert_to_float8_training(model.blocks, config=config)
            kinds = {type(m).__name__ for b in model.blocks for m in b.children() if "Linear" in type(m).__name__}
            if kinds != {"Float8Linear"}:  # never measure BF16 under an FP8 label
                raise RuntimeError(f"torchao left block linears unconverted: {sorted(kinds)}")
        if recipe.knobs.compile:
            compile_blocks(model)
        device = next(model.parameters()).device
        return TrainSetup(model, step_context=lambda: cpu_scaled_mm_path(recipe, device))
