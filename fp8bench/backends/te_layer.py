"""`te-layer`: the decoder trained as Megatron-Core users run Transformer Engine, each block one
`te.TransformerLayer` (RMSNorm fused into the QKV and MLP casts, TE's fused attention, the SwiGLU MLP as one
`LayerNormMLP`), under the same `te.autocast` recipes as `te`.

`te` swaps only the blocks' linears for `te.Linear` (norms, RoPE, attention and activations stay torch's); this
adapter swaps whole blocks, so the two side by side say what TE's fusions are worth in a training step. The
layers start from the weights the decoder drew from the case's seed (fp8bench.backends.te_reference maps them),
as every other backend's blocks do. TE rotates with the rotate-half RoPE; the decoder's own blocks pair
interleaved coordinates: both are RoPE, on a fixed permutation of the q/k features, so the two models train
alike but not bit for bit alike.
"""

from __future__ import annotations

import torch
from torch import nn

from fp8bench.backends.base import Knobs, TrainSetup
from fp8bench.backends.te import TEBackend, autocast, rope_table
from fp8bench.backends.te_reference import load_te_layer, transformer_layer_kwargs


class TELayerBlock(nn.Module):
    """A te.TransformerLayer where a LlamaBlock stood: called with the residual stream alone, it passes TE's
    rotary table for the sequence (built once, on the first call, for that length)."""

    def __init__(self, layer: nn.Module, head_dim: int) -> None:
        super().__init__()
        self.layer, self.head_dim = layer, head_dim
        self._rope: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._rope is None or self._rope.shape[0] < x.shape[1]:
            self._rope = rope_table(self.head_dim, x.shape[1], x.device)
        return self.layer(x, rotary_pos_emb=self._rope)


class TELayerBackend(TEBackend):
    name = "te-layer"
    quantizes_as = TEBackend.name
    """Its blocks' TE modules fuse the RMSNorm into the casts of the QKV and MLP inputs and run TE's attention in
    BF16; their linears quantize inputs, weights and gradients with the same recipe as te.Linear."""
    path = "per block (te.TransformerLayer)"
    memory_modelled = False
    workloads = frozenset({"train"})
    rope_workloads = frozenset({"train"})
    knobs = Knobs
    order = 100
    """No graphs: each block is one TE module, trained eagerly as Megatron-Core trains it."""
    strategies = frozenset()

    def prepare_training(self, model, recipe):
        """Each LlamaBlock becomes a te.TransformerLayer carrying its weights, in the blocks' dtype (the master
        weights' precision: FP32 under torch.autocast, or BF16). No torch.compile: TE's DelayedScaling cannot
        run under it, and Megatron-Core runs TE's layers without it."""
        import transformer_engine.pytorch as te

        cfg = model.config
        for i, block in enumerate(model.blocks):
            dtype = block.qkv.weight.dtype
            layer = te.TransformerLayer(**transformer_layer_kwargs(cfg, dtype), device=block.qkv.weight.device)
            load_te_layer(layer, block, cfg)
            model.blocks[i] = TELayerBlock(layer, cfg.head_dim)
        return TrainSetup(model, forward_context=lambda: autocast(recipe))
