"""Transformer Engine's `TransformerLayer` on the same weights as our `LlamaBlock`, and the reference it is
judged against: that LlamaBlock in FP32, carrying the TE layer's own weights and TE's conventions.

The `layer` workload scores an FP8 layer by SQNR against a reference with the same weights. The other
backends run a LlamaBlock initialised from the case's seed; TE's layer gets those weights too
(`te_state_from_block`), since the SQNR of a layer output depends on its weights' gains (how large the
block's update is against the residual stream) and figures from two initialisations do not compare. Scoring
TE's FP8 layer against the same TE layer run without FP8 would measure TE against itself, hiding any
mismatch both share, and no check would say whether the reference computes the block it claims to. An
independent reference does, and `reference_agreement` (fp8bench.backends.base, the contract of every
`reference_check`) is that check: TE's BF16 layer against it must agree well above FP8's SQNR
(REFERENCE_MIN_DB), or a layer's FP8 SQNR measures the reference, not the recipe.

TE's conventions (transformer_engine/pytorch/attention/multi_head_attention.py, rope.py, ops/basic/swiglu.py):

- the fused QKV weight of `self_attention.layernorm_qkv` is interleaved per GQA group: its rows are
  [group, (queries per group + 2), head_dim], the group's query heads first, then its key, then its value;
  query head i attends with group i // (heads / groups), as grouped-query attention in torch does;
- rotary embedding rotates coordinate i with i + head_dim/2 ("half"), base 10000;
- `layernorm_mlp.fc1_weight` is [gate; up]: SwiGLU applies SiLU to the first half;
- its GELU (models with a GELU MLP) is the tanh approximation;
- RMSNorm weights are used as is (the layer is built without zero-centred gamma), softmax scale 1/sqrt(d).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from fp8bench.config.schema import ModelConfig
from fp8bench.models.block import LlamaBlock, LlamaMLP

TE_LAYER_WEIGHTS = {
    "attn_norm.weight": "self_attention.layernorm_qkv.layer_norm_weight",
    "qkv.weight": "self_attention.layernorm_qkv.weight",
    "o.weight": "self_attention.proj.weight",
    "mlp_norm.weight": "layernorm_mlp.layer_norm_weight",
    "gate_up.weight": "layernorm_mlp.fc1_weight",
    "down.weight": "layernorm_mlp.fc2_weight",
}
"""Our LlamaBlock's parameter name -> the TE TransformerLayer's (built with fuse_qkv_params=True)."""

TE_MLP_WEIGHTS = {ours: te.removeprefix("layernorm_mlp.") for ours, te in TE_LAYER_WEIGHTS.items()
                  if te.startswith("layernorm_mlp.")}
"""Our LlamaMLP's parameter name -> te.LayerNormMLP's (the same module inside the TransformerLayer)."""


def transformer_layer_kwargs(model: ModelConfig, dtype: torch.dtype) -> dict:
    """te.TransformerLayer's arguments for one block of `model`: what the `layer` workload builds too, no
    dropout (the decoder has none), causal self-attention over (batch, seq, hidden) inputs."""
    return dict(
        hidden_size=model.hidden, ffn_hidden_size=model.ffn, num_attention_heads=model.heads,
        num_gqa_groups=model.kv_heads, layernorm_epsilon=1e-5, hidden_dropout=0.0, attention_dropout=0.0,
        self_attn_mask_type="causal", normalization="RMSNorm",
        activation="swiglu" if model.mlp == "swiglu" else "gelu", bias=False, params_dtype=dtype,
        attn_input_format="bshd", fuse_qkv_params=True)


def layernorm_mlp_kwargs(model: ModelConfig, dtype: torch.dtype) -> dict:
    """te.LayerNormMLP's arguments for the MLP of one block of `model`: the TransformerLayer's own."""
    layer = transformer_layer_kwargs(model, dtype)
    return dict(hidden_size=model.hidden, ffn_hidden_size=model.ffn, eps=layer["layernorm_epsilon"],
                normalization=layer["normalization"], activation=layer["activation"], bias=False, params_dtype=dtype)


def qkv_from_te(fused: torch.Tensor, model: ModelConfig) -> torch.Tensor:
    """TE's group-interleaved fused QKV weight -> ours: [all query heads; all key heads; all value heads]."""
    groups, per_group, d = model.kv_heads, model.heads // model.kv_heads, model.head_dim
    if fused.shape[0] != groups * (per_group + 2) * d:
        raise ValueError(f"fused QKV weight has {fused.shape[0]} rows; {model.name} needs "
                         f"{groups} groups x ({per_group} + 2) heads x {d}")
    g = fused.reshape(groups, per_group + 2, d, fused.shape[-1])
    q = g[:, :per_group].reshape(groups * per_group * d, -1)
    k = g[:, per_group].reshape(groups * d, -1)
    v = g[:, per_group + 1].reshape(groups * d, -1)
    return torch.cat((q, k, v))


def qkv_to_te(qkv: torch.Tensor, model: ModelConfig) -> torch.Tensor:
    """Our QKV weight [all query heads; all key heads; all value heads] -> TE's group-interleaved layout."""
    groups, per_group, d = model.kv_heads, model.heads // model.kv_heads, model.head_dim
    q, k, v = qkv.split([model.heads * d, groups * d, groups * d])
    g = torch.cat((q.reshape(groups, per_group, d, -1), k.reshape(groups, 1, d, -1), v.reshape(groups, 1, d, -1)),
                  dim=1)
    return g.reshape(qkv.shape)


def te_state_from_block(block: LlamaBlock, model: ModelConfig) -> dict[str, torch.Tensor]:
    """`block`'s weights under the TE layer's parameter names and layout (what block_from_te reads back)."""
    ours = {name: p.detach() for name, p in block.named_parameters()}
    ours["qkv.weight"] = qkv_to_te(ours["qkv.weight"], model)
    return {te: ours[name] for name, te in TE_LAYER_WEIGHTS.items()}


def _copy_into(module: torch.nn.Module, weights: Mapping[str, torch.Tensor], what: str) -> None:
    """Copy `weights` (TE parameter name -> tensor) into `module`; every name must be one of its parameters,
    of the same shape."""
    params = dict(module.named_parameters())
    with torch.no_grad():
        for name, w in weights.items():
            if name not in params or params[name].shape != w.shape:
                raise KeyError(f"{what} has no parameter {name} of shape {tuple(w.shape)}")
            params[name].copy_(w)


def _reference_from_te(meta_module: torch.nn.Module, mapping: Mapping[str, str], state: Mapping[str, torch.Tensor],
                       what: str, dtype: torch.dtype, convert=lambda weights: weights) -> torch.nn.Module:
    """`meta_module` (ours, built on the meta device) given the weights `mapping` names in a TE module's
    `state`, in `dtype` on the weights' device (`convert` maps TE's layouts to ours), GELU in TE's tanh form,
    frozen: the reference that TE module is scored against."""
    missing = [te for te in mapping.values() if te not in state]
    if missing:
        raise KeyError(f"not a {what} state: missing {missing}")
    device = state[next(iter(mapping.values()))].device
    weights = convert({ours: state[te].detach().to(dtype) for ours, te in mapping.items()})
    meta_module.load_state_dict({k: v.to(device) for k, v in weights.items()}, assign=True)
    meta_module.gelu_approximate = "tanh"
    return meta_module.requires_grad_(False)


def load_te_layer(layer: torch.nn.Module, block: LlamaBlock, model: ModelConfig) -> None:
    """Copy `block`'s weights into the TE layer; every weight the mapping names must exist there."""
    _copy_into(layer, te_state_from_block(block, model), "TE layer")


def block_from_te(state: Mapping[str, torch.Tensor], model: ModelConfig,
                  dtype: torch.dtype = torch.float32) -> LlamaBlock:
    """A LlamaBlock (rotate-half RoPE, `dtype`) computing what the TE layer whose state_dict is `state`
    computes, on the weights' device."""
    with torch.device("meta"):
        block = LlamaBlock(model, dtype=dtype, rope="half")
    return _reference_from_te(block, TE_LAYER_WEIGHTS, state,
                              "TE TransformerLayer (fuse_qkv_params=True, RMSNorm, no bias)", dtype,
                              lambda w: w | {"qkv.weight": qkv_from_te(w["qkv.weight"], model)})


def load_te_mlp(mlp: torch.nn.Module, ours: LlamaMLP) -> None:
    """Copy our LlamaMLP's weights into a te.LayerNormMLP (same layout: fc1 is [gate; up])."""
    _copy_into(mlp, {TE_MLP_WEIGHTS[name]: w for name, w in ours.named_parameters()}, "te.LayerNormMLP")


def mlp_from_te(state: Mapping[str, torch.Tensor], model: ModelConfig, dtype: torch.dtype = torch.float32) -> LlamaMLP:
    """A LlamaMLP (`dtype`, GELU in TE's tanh form) computing what the te.LayerNormMLP whose state_dict is
    `state` computes, on the weights' device."""
    with torch.device("meta"):
        mlp = LlamaMLP(model, dtype=dtype)
    return _reference_from_te(mlp, TE_MLP_WEIGHTS, state, "te.LayerNormMLP (RMSNorm, no bias)", dtype)
