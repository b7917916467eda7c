"""What a Transformer Engine recipe is expected to save for backward, from the model's shapes alone, next to
what fp8bench's saved-tensor census measured (no torch, no duckdb).

The census (fp8bench.workloads.memory) splits the tensors saved for backward into FP8 storage and the rest.
Against the BF16 run of the same case, an FP8 recipe changes them in a few countable ways, per linear of
`tokens` rows, K inputs and N outputs:

- the weight is saved in FP8 in both layouts (row-wise for fprop, column-wise for Hopper's TN-only dgrad):
  2·K·N bytes;
- the input is saved in FP8 in as many layouts as the module keeps (INPUT_LAYOUTS): the column-wise copy that
  wgrad needs, and for the LayerNorm-fused linears (and the MLP's fc2 under block scaling) the row-wise one its
  fused cast produced too; the BF16 copy of the input is no longer saved, except the attention output that
  feeds TransformerLayer's projection (attention's backward keeps it; TE re-uses it);
- under torch.autocast with FP32 master weights, the BF16 weight cast a BF16 te.Linear saves is not saved;
- block scaling adds FP32 scales: one per 128 input elements per saved layout, one per 128x128 weight block
  per layout.

For TE's TransformerLayer the BF16 baseline itself is countable too (te_layer_bf16_saved), so the layer's
expectation needs no measurement at all; the training workload's BF16 baseline (fp8bench's own block under
autocast) is taken from its measured BF16 case, and the recipe's change is added to it.

Where the rules come from: read off the census of the Llama-2-7B TransformerLayer (results/h200-layer) and the
gpt-125m training runs (results/h200-train), then checked on the Llama-2-7B 4-layer training runs, which they
predict exactly (tests/test_memory_model.py). They describe TE 2.20 on Hopper; another TE version may save
differently, which is what the comparison is for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fp8bench.config.compose import conf_dir
from fp8bench.config.schema import ModelConfig

INPUT_LAYOUTS: dict[tuple[str, str], int] = {
    ("plain", "tensorwise"): 1, ("plain", "blockwise"): 1,
    ("ln_fused", "tensorwise"): 2, ("ln_fused", "blockwise"): 2,
    ("attn_proj", "tensorwise"): 0, ("attn_proj", "blockwise"): 0,
    ("mlp_fc2", "tensorwise"): 1, ("mlp_fc2", "blockwise"): 2,
}
"""FP8 copies of a linear's input saved for backward, by module kind and scaling family."""
WEIGHT_LAYOUTS = 2
BLOCK = 128
FP32 = 4
BF16 = 2


@dataclass(frozen=True)
class SavedLinear:
    tokens: int
    in_features: int
    out_features: int
    kind: str
    """plain (te.Linear), ln_fused (LayerNormLinear, LayerNormMLP's fc1), attn_proj, mlp_fc2."""


@dataclass(frozen=True)
class Expectation:
    saved_fp8: float
    """Bytes saved in FP8 storage."""
    saved_hp_change: float
    """Bytes of high-precision saved tensors the recipe adds (negative: removes) against BF16."""
    fp8_weights: float = 0.0
    """Of saved_fp8, the weights' copies (the rest is inputs)."""

    def explain(self) -> str:
        mib = 2**20
        return (f"FP8 saves {self.saved_fp8 / mib:.0f} MiB for backward (weights in both layouts "
                f"{self.fp8_weights / mib:.0f}, inputs {(self.saved_fp8 - self.fp8_weights) / mib:.0f}) and "
                f"{'drops' if self.saved_hp_change < 0 else 'adds'} {abs(self.saved_hp_change) / mib:.0f} MiB "
                "of high-precision saved tensors")


def model_preset(name: str) -> ModelConfig:
    """A model preset from conf/model/, without Hydra (the report reads it)."""
    import yaml

    path = conf_dir() / "model" / f"{name}.yaml"
    return ModelConfig(**yaml.safe_load(path.read_text()))


def train_linears(model: ModelConfig, tokens: int) -> list[SavedLinear]:
    """The block linears of fp8bench's decoder, each a te.Linear in the `te` backend."""
    return [SavedLinear(tokens, *model.linear_dims(name), "plain")
            for _ in range(model.layers) for name in ("qkv", "o", "gate_up", "down")]


def te_layer_linears(model: ModelConfig, tokens: int) -> list[SavedLinear]:
    """TE TransformerLayer (fused QKV): LayerNormLinear, the attention projection, LayerNormMLP's fc1 and fc2."""
    kinds = {"qkv": "ln_fused", "o": "attn_proj", "gate_up": "ln_fused", "down": "mlp_fc2"}
    return [SavedLinear(tokens, *model.linear_dims(name), kind) for name, kind in kinds.items()]


def te_layer_bf16_saved(model: ModelConfig, tokens: int) -> float:
    """Bytes TE's TransformerLayer saves for backward in BF16: both norms' inputs and outputs, Q, K and V, the
    attention output, fc1's output (the activation's input) and fc2's input. Small per-row statistics (norm
    rsigma, softmax log-sum-exp) are left out: a few bytes a row beside the activations' kilobytes."""
    qkv_out = model.linear_dims("qkv")[1]
    fc1_out = model.linear_dims("gate_up")[1]
    hidden = model.hidden
    return BF16 * tokens * (4 * hidden + qkv_out + hidden + fc1_out + model.ffn)


def fp8_change(linears: list[SavedLinear], scaling: str, bf16_weight_casts: bool) -> Expectation:
    """What an FP8 recipe of `scaling` saves instead of BF16 (module docstring). `bf16_weight_casts`: the BF16
    run saved autocast's BF16 copy of each FP32 master weight."""
    family = "blockwise" if scaling == "blockwise" else "tensorwise"
    fp8 = hp = weights = 0.0
    for lin in linears:
        k, n, t = lin.in_features, lin.out_features, lin.tokens
        copies = INPUT_LAYOUTS[(lin.kind, family)]
        weights += WEIGHT_LAYOUTS * k * n
        fp8 += copies * t * k + WEIGHT_LAYOUTS * k * n
        if lin.kind != "attn_proj":
            hp -= BF16 * t * k
        if bf16_weight_casts:
            hp -= BF16 * k * n
        if family == "blockwise":
            hp += FP32 * (copies * t * math.ceil(k / BLOCK)
                          + WEIGHT_LAYOUTS * math.ceil(n / BLOCK) * math.ceil(k / BLOCK))
    return Expectation(fp8, hp, weights)


def recipe_change(workload: str, model_name: str, shape: dict, scaling: str) -> Expectation | None:
    """The FP8 recipe's change against BF16 for a `te` layer or training case (None for other workloads)."""
    model = model_preset(model_name)
    tokens = shape["batch"] * shape["seq"]
    if workload == "layer":
        return fp8_change(te_layer_linears(model, tokens), scaling, bf16_weight_casts=False)
    if workload == "train":
        return fp8_change(train_linears(model, tokens), scaling, bf16_weight_casts=True)
    return None


def expected_saved(workload: str, model_name: str, shape: dict, scaling: str, fmt: str,
                   bf16_saved_hp: float | None) -> tuple[float, float] | None:
    """(FP8 bytes, high-precision bytes) a `te` case is expected to save, or None where the model does not
    apply. Layer cases need nothing measured; training cases start from their BF16 twin's census."""
    if workload == "layer":
        base = te_layer_bf16_saved(model_preset(model_name), shape["batch"] * shape["seq"])
    elif workload == "train" and bf16_saved_hp is not None:
        base = bf16_saved_hp  # fp8bench's block under autocast: its BF16 census, measured
    else:
        return None
    if fmt == "bf16":
        return 0.0, base
    change = recipe_change(workload, model_name, shape, scaling)
    return change.saved_fp8, base + change.saved_hp_change
