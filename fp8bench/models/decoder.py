"""The `train` workload's model: a Llama-style decoder (token embedding, `LlamaBlock`s with RMSNorm, RoPE,
grouped-query attention and SwiGLU, final RMSNorm, output head), sized by a model preset.

Backends replace the blocks' linears only; the embedding and the output head stay in high precision, as every
FP8 recipe (TE, torchao, Megatron) leaves them.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from fp8bench.config.schema import ModelConfig
from fp8bench.models.block import LlamaBlock, RMSNorm, block_flops


class LlamaDecoder(nn.Module):
    def __init__(self, model: ModelConfig, vocab: int, device=None, dtype=torch.float32) -> None:
        super().__init__()
        self.config = model  # the preset's dimensions, for a backend that rebuilds whole blocks (te-layer)
        self.embed = nn.Embedding(vocab, model.hidden, device=device, dtype=dtype)
        self.blocks = nn.ModuleList(LlamaBlock(model, device=device, dtype=dtype) for _ in range(model.layers))
        self.norm = RMSNorm(model.hidden, device=device, dtype=dtype)
        self.head = nn.Linear(model.hidden, vocab, bias=False, device=device, dtype=dtype)
        self._init(model.layers)

    def _init(self, layers: int) -> None:
        """GPT-2 initialisation: N(0, 0.02), residual output projections scaled by 1/sqrt(2·layers)."""
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            std = 0.02 / math.sqrt(2 * layers) if name.endswith(("o.weight", "down.weight")) else 0.02
            nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in FP32 (nats per token)."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def model_flops(model: ModelConfig, vocab: int, batch: int, seq: int) -> float:
    """Forward+backward FLOPs of one training step: the blocks plus the output head (embedding lookups are
    not matmuls)."""
    return model.layers * block_flops(model, batch, seq) + 3.0 * 2.0 * batch * seq * model.hidden * vocab
