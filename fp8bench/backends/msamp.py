"""`msamp`: Microsoft's MS-AMP through Accelerate (`MSAMPRecipeKwargs(opt_level="O2")`: FP8 weights and
weight gradients, FP8 first-moment optimizer state), trained by Accelerate's loop like the `accelerate`
backend. MS-AMP is not published on the package registry (it is installed from its git repository), so
where it is missing the probe says so and the cases are recorded skipped.
"""

from __future__ import annotations

import contextlib

from fp8bench.backends.accelerate import AccelerateBackend, reset_accelerate_state
from fp8bench.backends.base import Backend, Knobs, package_probe
from fp8bench.core.hardware import Rule
from fp8bench.core.types import Format, Scaling


class MsampBackend(AccelerateBackend):
    name = "msamp"
    knobs = Knobs
    """None: MS-AMP's O2 recipe is what it runs (Accelerate's own knobs are not passed to it)."""
    rules = (
        Rule(frozenset({"hybrid"}), frozenset({"delayed"}), (8, 9), None, False,
            "MS-AMP O2 through Accelerate: FP8 tensor cores, sm_89+"),
    )

    def available(self):
        ok, why = package_probe("msamp", "ms-amp", hint="MS-AMP is not on the package registry (pip finds no "
                                "'ms-amp' or 'msamp'); it installs from its git repository")
        return super().available() if ok else (False, why)

    def supports(self, workload, recipe, device):
        ok, why = Backend.supports(self, workload, recipe, device)  # not Accelerate's TE/torchao limits
        if ok and recipe.format is not Format.BF16 and (recipe.format, recipe.scaling) != (Format.HYBRID, Scaling.DELAYED):
            return False, "MS-AMP O2 scales E4M3 weights and E5M2 gradients per tensor from amax history: hybrid/delayed"
        return ok, why

    def probe(self, workload, recipe):
        return True, ""

    def direct(self, knobs):
        return None  # MS-AMP runs its own FP8, not a backend fp8bench runs directly

    def scaling_knobs(self, scaling):
        return frozenset()  # MS-AMP keeps its own amax history and margin

    def effective_recipe(self, recipe):
        return recipe  # not Accelerate's TE or torchao numerics: it has no `fp8_backend` to pick them by

    def accelerator(self, recipe, device):
        if recipe.format is Format.BF16:
            return super().accelerator(recipe, device)
        from accelerate import Accelerator
        from accelerate.utils import MSAMPRecipeKwargs

        reset_accelerate_state()
        return Accelerator(mixed_precision="fp8", kwargs_handlers=[MSAMPRecipeKwargs(opt_level="O2")])

    def step_context(self, recipe, device):
        return contextlib.nullcontext()
