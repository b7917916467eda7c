"""`accelerate`: Hugging Face Accelerate with `mixed_precision="fp8"`, as Accelerate users turn FP8 on.

`backend.fp8_backend` picks the library Accelerate hands FP8 to:
- `te`: `TERecipeKwargs` → Accelerate converts every suitable `nn.Linear` (the output head included) to
  `te.Linear` and wraps the forward in `fp8_autocast(DelayedScaling(...))`. Accelerate builds DelayedScaling
  (or MXFP8BlockScaling) only, so Current and Block scaling are not reachable through it. FP8 is kept in
  evaluation too (`use_autocast_during_eval=True`), so validation losses compare with the `te` backend's.
- `torchao`: `AORecipeKwargs(config=Float8LinearConfig.from_recipe_name(...))` → torchao's
  `convert_to_float8_training` with Accelerate's default filter, which leaves the model's first and last
  linears (here the first block's first projection and the output head) in high precision.
`backend.compile` adds Accelerate's TorchDynamo plugin with regional compilation (each block compiled, as the
`torchao-compiled` preset does). The BF16 baseline is `mixed_precision="bf16"`. Master weights stay FP32.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from fp8bench.backends.base import Backend, Knobs, Recipe, cpu_scaled_mm_path, import_probe, load_te_first
from fp8bench.backends.te import TEBackend
from fp8bench.backends.torchao import TorchaoBackend, TorchaoKnobs
from fp8bench.core.hardware import FP8, Rule
from fp8bench.core.types import Format, Scaling


def reset_accelerate_state() -> None:
    """Accelerate keeps process-wide state (the first Accelerator's precision wins): cleared before each case."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


FP8_BACKENDS = (TEBackend.name, TorchaoBackend.name)
"""The backends whose libraries Accelerate hands FP8 to: TE (TERecipeKwargs) and torchao (AORecipeKwargs)."""


@dataclass(frozen=True, kw_only=True)
class AccelerateKnobs(Knobs):
    fp8_backend: str = TEBackend.name
    """The library Accelerate hands FP8 to, by the name of its backend here: `te` (TERecipeKwargs) or
    `torchao` (AORecipeKwargs)."""
    compile: bool = False
    """Accelerate's TorchDynamo plugin with regional compilation (each block compiled)."""
    cpu_onednn: bool = False
    """torchao on a CPU: let oneDNN run FP8 _scaled_mm."""
    gw_hp: bool = False
    """torchao rowwise: keep the weight-gradient GEMM in high precision (recipe rowwise_with_gw_hp)."""

    def __post_init__(self) -> None:
        if self.fp8_backend not in FP8_BACKENDS:
            raise ValueError(f"backend.fp8_backend={self.fp8_backend!r} is not valid; choose one of {list(FP8_BACKENDS)}")


class AccelerateBackend(Backend):
    name = "accelerate"
    knobs = AccelerateKnobs
    unsupported_train = ("loss_scale", "dynamic_loss_scale")
    """Accelerate's mixed precision owns the loss scaling."""
    rules = (
        Rule(FP8, frozenset({"delayed"}), (8, 9), None, False,
            "Accelerate TERecipeKwargs: TE DelayedScaling, sm_89+"),
        Rule(frozenset({"hybrid"}), frozenset({"current"}), (8, 9), None, True,
            "Accelerate AORecipeKwargs: torchao float8 'tensorwise' (runs on CPU too)"),
        Rule(frozenset({"e4m3"}), frozenset({"rowwise"}), (8, 9), None, True,
            "Accelerate AORecipeKwargs: torchao float8 'rowwise' (runs on CPU too)"),
    )
    workloads = frozenset({"train"})
    loop = "accelerate"

    def available(self):
        load_te_first()
        return import_probe("accelerate", "integrations")

    def supports(self, workload, recipe, device):
        ok, why = super().supports(workload, recipe, device)
        if not ok or recipe.format is Format.BF16:
            return ok, why
        if recipe.knobs.fp8_backend == TEBackend.name:
            if recipe.scaling is not Scaling.DELAYED:
                return False, (f"Accelerate's TERecipeKwargs builds TE's DelayedScaling (or MXFP8BlockScaling) only; "
                               f"{recipe.format.value}/{recipe.scaling.value} is not reachable through it")
            if device.type != "cuda":
                return False, "Accelerate's TE backend needs Transformer Engine, which needs a CUDA GPU"
            return True, ""
        return TorchaoBackend().supports(workload, recipe, device)

    def probe(self, workload, recipe):
        if recipe.format is Format.BF16:
            return True, ""
        if recipe.knobs.fp8_backend == TEBackend.name:
            from fp8bench.backends.te import te_runs

            return te_runs(recipe, "Accelerate's TE backend")
        ok, why = TorchaoBackend().available()
        return (True, "") if ok else (False, f"Accelerate's torchao backend needs torchao: {why}")

    def scaling_knobs(self, scaling):
        from fp8bench.backends.te import TE_SCALING_KNOBS
        from fp8bench.backends.torchao import TORCHAO_SCALING_KNOBS

        return (TE_SCALING_KNOBS | TORCHAO_SCALING_KNOBS).get(scaling, frozenset())

    def effective_recipe(self, recipe):
        inner = TEBackend() if recipe.knobs.fp8_backend == TEBackend.name else TorchaoBackend()
        return inner.effective_recipe(recipe)

    def direct(self, knobs):
        if knobs.fp8_backend == TEBackend.name:  # its other knobs are torchao's or compile, which TE does not run
            return None if knobs.set_knobs() else (TEBackend.name, TEBackend.knobs())
        return TorchaoBackend.name, TorchaoKnobs(compile=knobs.compile, cpu_onednn=knobs.cpu_onednn, gw_hp=knobs.gw_hp)

    def accelerator(self, recipe: Recipe, device):
        """A fresh Accelerator for this case (Accelerate keeps process-wide state: it is reset first, so one
        process can run cases of different precisions one after another)."""
        from accelerate import Accelerator

        reset_accelerate_state()
        kwargs: dict = {"cpu": device.type != "cuda"}
        if getattr(recipe.knobs, "compile", False):  # MS-AMP's BF16 twin has no knobs
            from accelerate.utils import TorchDynamoPlugin

            kwargs["dynamo_plugin"] = TorchDynamoPlugin(backend="inductor", use_regional_compilation=True)
        if recipe.format is Format.BF16:
            return Accelerator(mixed_precision="bf16", **kwargs)
        if recipe.knobs.fp8_backend == TEBackend.name:
            from accelerate.utils import TERecipeKwargs

            sc = recipe.scaling_cfg
            handler = TERecipeKwargs(fp8_format="HYBRID" if recipe.format is Format.HYBRID else "E4M3",
                                     amax_history_len=sc.amax_history_len, amax_compute_algo=sc.amax_compute_algo,
                                     margin=sc.margin, use_autocast_during_eval=True)
        else:
            from accelerate.utils import AORecipeKwargs
            from torchao.float8 import Float8LinearConfig

            from fp8bench.backends.torchao import recipe_name

            handler = AORecipeKwargs(config=Float8LinearConfig.from_recipe_name(recipe_name(recipe)))
        return Accelerator(mixed_precision="fp8", kwargs_handlers=[handler], **kwargs)

    def step_context(self, recipe: Recipe, device):
        """torchao's FP8 GEMMs on CPU take torch's own path unless oneDNN is asked for (base.cpu_scaled_mm_path)."""
        if recipe.knobs.fp8_backend == TorchaoBackend.name:
            return cpu_scaled_mm_path(recipe, device)
        return contextlib.nullcontext()
