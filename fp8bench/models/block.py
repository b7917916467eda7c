"""A plain-torch Llama-style transformer block (RMSNorm, RoPE, grouped-query attention, SwiGLU).

Used by the `layer` workload for the BF16 / torchao / emulator rows, beside TE's TransformerLayer. Its linears
are ordinary `nn.Linear`s so a backend can swap them (torchao's convert_to_float8_training, the emulator's
fake-quant linear).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from fp8bench.config.schema import ModelConfig


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5, device=None, dtype=None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, device=device, dtype=dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_cache(seq: int, head_dim: int, device, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / base ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, device=device, dtype=torch.float32), inv)
    return angles.cos(), angles.sin()


ROPE_STYLES = ("interleaved", "half")


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str = "interleaved") -> torch.Tensor:
    """x: (batch, heads, seq, head_dim); rotate pairs of coordinates by the position angle. "interleaved"
    pairs (even, odd) coordinates; "half" pairs coordinate i with i + head_dim/2 (rotate-half, as Transformer
    Engine, Megatron and Hugging Face Llama do). Either is RoPE; they differ by a fixed permutation of the
    q/k projection's output features, so a model's weights fit one of them only."""
    if style == "interleaved":
        x1, x2 = x.float()[..., 0::2], x.float()[..., 1::2]
        out = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)
    elif style == "half":
        x1, x2 = x.float().chunk(2, dim=-1)
        out = torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
    else:
        raise ValueError(f"rope style {style!r}: expected one of {ROPE_STYLES}")
    return out.to(x.dtype)


class LlamaBlock(nn.Module):
    """Pre-norm decoder block: x + attn(norm(x)); x + mlp(norm(x)). Input (batch, seq, hidden)."""

    def __init__(self, model: ModelConfig, device=None, dtype=torch.bfloat16, rope: str = "interleaved") -> None:
        super().__init__()
        if rope not in ROPE_STYLES:
            raise ValueError(f"rope style {rope!r}: expected one of {ROPE_STYLES}")
        self.rope = rope
        self.heads, self.kv_heads, self.head_dim = model.heads, model.kv_heads, model.head_dim
        kv = model.kv_heads * model.head_dim
        kw = dict(bias=False, device=device, dtype=dtype)
        self.attn_norm = RMSNorm(model.hidden, device=device, dtype=dtype)
        self.qkv = nn.Linear(model.hidden, model.hidden + 2 * kv, **kw)
        self.o = nn.Linear(model.hidden, model.hidden, **kw)
        self.mlp_norm = RMSNorm(model.hidden, device=device, dtype=dtype)
        self.gated = model.mlp == "swiglu"
        self.gelu_approximate = "none"  # "tanh" where a block stands in for TE's GELU, which is the tanh form
        self.gate_up = nn.Linear(model.hidden, (2 if self.gated else 1) * model.ffn, **kw)
        self.down = nn.Linear(model.ffn, model.hidden, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(
            [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim], dim=-1)
        q = q.view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope_cache(s, self.head_dim, x.device)
        q, k = apply_rope(q, cos, sin, self.rope), apply_rope(k, cos, sin, self.rope)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads)
        x = x + self.o(attn.transpose(1, 2).reshape(b, s, h))
        return x + mlp_forward(self, x)


def mlp_forward(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """down(act(gate_up(mlp_norm(x)))) of a module holding those three (a LlamaBlock or a LlamaMLP)."""
    up = m.gate_up(m.mlp_norm(x))
    if m.gated:
        gate, up = up.chunk(2, dim=-1)
        act = F.silu(gate) * up
    else:
        act = F.gelu(up, approximate=m.gelu_approximate)
    return m.down(act)


class LlamaMLP(nn.Module):
    """The MLP half of a LlamaBlock without its residual: RMSNorm, the fused gate/up linear, SwiGLU (or GELU),
    the down linear. What Transformer Engine's `LayerNormMLP` computes (the `mlp` workload), with the same
    parameter names as the block's, so weights drawn from one seed match across backends."""

    def __init__(self, model: ModelConfig, device=None, dtype=torch.bfloat16) -> None:
        super().__init__()
        kw = dict(bias=False, device=device, dtype=dtype)
        self.mlp_norm = RMSNorm(model.hidden, device=device, dtype=dtype)
        self.gated = model.mlp == "swiglu"
        self.gelu_approximate = "none"
        self.gate_up = nn.Linear(model.hidden, (2 if self.gated else 1) * model.ffn, **kw)
        self.down = nn.Linear(model.ffn, model.hidden, **kw)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return mlp_forward(self, x)


def block_flops(model: ModelConfig, batch: int, seq: int) -> float:
    """Forward+backward FLOPs of one block: 3x (2·tokens·params of the linears + causal attention matmuls)."""
    tokens = batch * seq
    linear = sum(i * o for i, o in (model.linear_dims(n) for n in ("qkv", "o", "gate_up", "down")))
    attn = 2 * 2 * batch * seq * seq * model.hidden / 2  # QK^T and PV, causal half
    return 3.0 * (2.0 * tokens * linear + attn)


def mlp_flops(model: ModelConfig, batch: int, seq: int) -> float:
    """Forward+backward FLOPs of one LlamaMLP: 3x 2·tokens·params of its two linears."""
    linear = sum(i * o for i, o in (model.linear_dims(n) for n in ("gate_up", "down")))
    return 3.0 * 2.0 * batch * seq * linear


def swap_linears(block: nn.Module, make: callable) -> nn.Module:
    """Replace each nn.Linear child of `block` by make(linear) (same weights, another implementation)."""
    for name, child in list(block.named_children()):
        if isinstance(child, nn.Linear):
            setattr(block, name, make(child))
    return block
