"""The reference TE's TransformerLayer is scored against (fp8bench.backends.te_reference), on the CPU.

TE itself needs a GPU: here a block is written into TE's parameter layout by an encoder that follows TE's
documented layout loop by loop, and the reference rebuilt from it must compute the same block. Planted
mismatches (the layout or a convention TE does not use) must fall below REFERENCE_MIN_DB, so that the check
recorded with every TE layer case (`reference_sqnr_db`) would flag them. tests/test_gpu.py holds the reference
to TE's real BF16 layer on the GPU.
"""

from __future__ import annotations

import pytest
import torch

from fp8bench.backends.base import MLP_REFERENCE_MIN_DB, REFERENCE_MIN_DB, reference_agreement
from fp8bench.backends.te_reference import (
    TE_LAYER_WEIGHTS,
    TE_MLP_WEIGHTS,
    block_from_te,
    mlp_from_te,
    qkv_from_te,
    te_state_from_block,
)
from fp8bench.config.schema import ModelConfig
from fp8bench.models.block import LlamaBlock, LlamaMLP, apply_rope, rope_cache

GQA = ModelConfig(name="gqa-test", hidden=128, ffn=256, heads=8, kv_heads=2, layers=1, vocab=64, seq=32)
WIDE = ModelConfig(name="wide-test", hidden=1024, ffn=2816, heads=16, kv_heads=4, layers=1, vocab=64, seq=1024)
"""Wide and long enough that the residual stream dilutes a mismatch as at Llama size (RoPE by pairs: ~41 dB)."""


def seeded_block(model: ModelConfig, rope: str = "half") -> LlamaBlock:
    """A block initialised as the `layer` workload initialises every backend's (TE's layer included)."""
    torch.manual_seed(0)
    block = LlamaBlock(model, dtype=torch.float32, rope=rope)
    with torch.no_grad():
        block.attn_norm.weight.uniform_(0.8, 1.2)  # not all ones, so a swapped norm would show
        block.mlp_norm.weight.uniform_(0.5, 0.7)
    return block


def te_state(block: LlamaBlock, model: ModelConfig, interleave_groups: bool = True,
             swap_gate_up: bool = False) -> dict[str, torch.Tensor]:
    """`block`'s weights under TE's parameter names; the fused QKV rows ordered group by group, each group's
    query heads, then its key head, then its value head, as TE's MultiheadAttention splits them."""
    d, per_group = model.head_dim, model.heads // model.kv_heads
    q, k, v = block.qkv.weight.split([model.heads * d, model.kv_heads * d, model.kv_heads * d])
    if interleave_groups:
        rows = []
        for g in range(model.kv_heads):
            for j in range(per_group):
                head = g * per_group + j
                rows.append(q[head * d:(head + 1) * d])
            rows.append(k[g * d:(g + 1) * d])
            rows.append(v[g * d:(g + 1) * d])
        fused = torch.cat(rows)
    else:
        fused = torch.cat((q, k, v))
    gate_up = block.gate_up.weight
    if swap_gate_up:
        gate, up = gate_up.chunk(2)
        gate_up = torch.cat((up, gate))
    ours = {"attn_norm.weight": block.attn_norm.weight, "qkv.weight": fused, "o.weight": block.o.weight,
            "mlp_norm.weight": block.mlp_norm.weight, "gate_up.weight": gate_up, "down.weight": block.down.weight}
    return {TE_LAYER_WEIGHTS[name]: w.detach().clone() for name, w in ours.items()}


def x_input(model: ModelConfig) -> torch.Tensor:
    return torch.randn(2, model.seq, model.hidden, generator=torch.Generator().manual_seed(1))


def test_half_rope_is_te_rotate_half():
    """TE: t * cos(f) + rotate_half(t) * sin(f), f = cat(freqs, freqs), rotate_half(t) = cat(-t2, t1)."""
    x = torch.randn(1, 2, 16, 8)
    cos, sin = rope_cache(16, 8, "cpu")
    freqs = torch.atan2(torch.cat((sin, sin), -1), torch.cat((cos, cos), -1))  # the angles, as TE lays them out
    t1, t2 = x.chunk(2, dim=-1)
    expected = x * freqs.cos() + torch.cat((-t2, t1), dim=-1) * freqs.sin()
    torch.testing.assert_close(apply_rope(x, cos, sin, "half"), expected)
    assert not torch.allclose(apply_rope(x, cos, sin, "interleaved"), expected, atol=1e-3)
    with pytest.raises(ValueError, match="half"):
        apply_rope(x, cos, sin, "spiral")


def test_te_layout_both_ways():
    block = seeded_block(GQA)
    fused = te_state(block, GQA)[TE_LAYER_WEIGHTS["qkv.weight"]]
    mapped = te_state_from_block(block, GQA)
    assert mapped.keys() == te_state(block, GQA).keys()
    for name, w in te_state(block, GQA).items():
        assert torch.equal(mapped[name], w), name  # the module's encoder is the test's loop-by-loop one
    assert not torch.equal(fused, block.qkv.weight)  # the layouts differ for GQA...
    assert torch.equal(qkv_from_te(fused, GQA), block.qkv.weight)  # ...and the mapping undoes it
    with pytest.raises(ValueError, match="rows"):
        qkv_from_te(fused[:-1], GQA)


@pytest.mark.parametrize("model", [GQA, WIDE, ModelConfig(name="mha", hidden=64, ffn=96, heads=4, kv_heads=4, layers=1,
                                                           vocab=64, seq=16)], ids=["gqa", "wide", "mha"])
@pytest.mark.slow
def test_reference_computes_the_te_block(model):
    block = seeded_block(model)
    reference = block_from_te(te_state(block, model), model)
    x = x_input(model)
    with torch.no_grad():
        torch.testing.assert_close(reference(x), block(x), rtol=0, atol=0)
        # The same block run in BF16 (as TE's BF16 layer runs, with the same BF16 weights the reference is
        # built from) passes the check: the floor sits below what BF16 rounding leaves (about 52 dB).
        bf16 = block.bfloat16()
        reference = block_from_te(te_state(bf16, model), model)
        agreement = reference_agreement(bf16(x.bfloat16()), reference(x))
    assert REFERENCE_MIN_DB < agreement < 80, agreement


@pytest.mark.parametrize("model", [GQA, WIDE], ids=["toy", "wide"])
@pytest.mark.parametrize("plant", ["qkv not group-interleaved", "interleaved rope", "gate and up swapped"])
@pytest.mark.slow
def test_planted_reference_mismatch_fails_the_check(plant, model):
    te_block = seeded_block(model, rope="interleaved" if plant == "interleaved rope" else "half")
    state = te_state(te_block, model, interleave_groups=plant != "qkv not group-interleaved",
                     swap_gate_up=plant == "gate and up swapped")
    reference = block_from_te(state, model)
    x = x_input(model)
    with torch.no_grad():
        agreement = reference_agreement(te_block(x), reference(x))
    assert agreement < REFERENCE_MIN_DB, (plant, agreement)


def test_missing_te_weight_is_named():
    state = te_state(seeded_block(GQA), GQA)
    del state["layernorm_mlp.fc2_weight"]
    with pytest.raises(KeyError, match="fc2_weight"):
        block_from_te(state, GQA)


LLAMA2_7B_MLP = ModelConfig(name="llama2-7b-mlp", hidden=4096, ffn=11008, heads=32, kv_heads=32, layers=1, vocab=64,
                            seq=128)


@pytest.mark.slow
@pytest.mark.parametrize("model", [GQA, LLAMA2_7B_MLP], ids=["toy", "llama2-7b"])
def test_the_mlp_reference_computes_te_layernorm_mlp_and_bf16_clears_its_floor(model):
    """te.LayerNormMLP's weights are the TransformerLayer's `layernorm_mlp.*` (fc1 = [gate; up]): the reference
    rebuilt from them computes our MLP exactly in FP32. In BF16, with no residual stream, rounding leaves
    46.6 dB at Llama-2-7B width: above MLP_REFERENCE_MIN_DB, below the layer's REFERENCE_MIN_DB."""
    torch.manual_seed(0)
    ours = LlamaMLP(model, dtype=torch.float32)
    with torch.no_grad():
        ours.mlp_norm.weight.uniform_(0.5, 0.7)
    state = {TE_MLP_WEIGHTS[name]: p.detach().clone() for name, p in ours.named_parameters()}
    assert set(state) == {"layer_norm_weight", "fc1_weight", "fc2_weight"}
    reference = mlp_from_te(state, model)
    x = torch.randn(1, model.seq, model.hidden, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(reference(x), ours(x), rtol=0, atol=0)
        bf16 = ours.bfloat16()
        agreement = reference_agreement(bf16(x.bfloat16()), mlp_from_te(
            {TE_MLP_WEIGHTS[n]: p for n, p in bf16.named_parameters()}, model)(x))
        gate, up = state["fc1_weight"].chunk(2)
        swapped = mlp_from_te(state | {"fc1_weight": torch.cat((up, gate))}, model)
        wrong = reference_agreement(ours.float()(x), swapped(x))
    assert MLP_REFERENCE_MIN_DB < agreement < REFERENCE_MIN_DB + 10, agreement
    if model is LLAMA2_7B_MLP:
        assert agreement < REFERENCE_MIN_DB, agreement  # why the MLP has a floor of its own
    assert wrong < 10 < MLP_REFERENCE_MIN_DB, wrong  # gate and up swapped: the check flags it
    with pytest.raises(KeyError, match="fc2_weight"):
        mlp_from_te({k: v for k, v in state.items() if k != "fc2_weight"}, model)
