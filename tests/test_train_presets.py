"""The whole-step training presets (depth, sequence length, torchtitan's setting) and the te-layer path on a
CPU: what they declare, that every point is a case of its own, and that they run at toy size."""

import pytest

from fp8bench.backends import get_backend
from fp8bench.config.compose import expand, load
from fp8bench.core.hardware import DeviceInfo, detect_device
from fp8bench.run.plan import plan
from fp8bench.run.runner import execute

H200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), "13.0")


@pytest.mark.slow
def test_the_depth_preset_holds_1_4_and_32_layers_of_llama2_7b_in_bf16_with_both_te_paths():
    cfg = load(["sweep=hopper-train-depth"]).config
    assert (cfg.workload.batch, cfg.workload.seq, cfg.workload.train.master_weights) == (2, 4096, "bf16")
    points, _ = expand(["sweep=hopper-train-depth"], multirun=True)
    assert sorted({(p.model.name, p.model.layers) for p in points}) == [
        ("llama2-7b", 32), ("llama2-7b-1l", 1), ("llama2-7b-4l", 4)]
    assert {p.model.hidden for p in points} == {4096} and {p.model.ffn for p in points} == {11008}
    cases = plan(points, H200)
    assert len({c.case_id for c in cases}) == len(cases)
    assert {c.config.backend_name for c in cases} == {"te", "te-layer", "torchao"}
    # one case id per depth and path: the per-linear and per-block TE runs of one recipe are told apart
    ids = {c.label for c in cases}
    for model in ("llama2-7b-1l", "llama2-7b-4l", "llama2-7b"):
        assert f"train.{model}.b2s4096n20.seed0.hybrid.delayed.te" in ids
        assert f"train.{model}.b2s4096n20.seed0.hybrid.delayed.te-layer" in ids


@pytest.mark.slow
def test_the_sequence_and_torchtitan_presets():
    points, _ = expand(["sweep=hopper-train-seq"], multirun=True)
    assert {p.workload.seq for p in points} == {1024, 2048, 8192} and {p.model.layers for p in points} == {4}
    assert {c.shape_name for c in plan(points, H200)} == {f"b2s{s}n20.seed0" for s in (1024, 2048, 8192)}
    points, _ = expand(["sweep=hopper-train-torchtitan"], multirun=True)
    assert {(p.model.name, p.model.layers, p.model.kv_heads, p.model.ffn) for p in points} == {
        ("llama3-8b-8l", 8, 8, 14336), ("llama3-8b-16l", 16, 8, 14336)}
    assert {p.backend["compile"] for p in points} == {True}


def test_te_layer_is_planned_as_a_training_backend_and_says_why_it_cannot_run_here():
    [point], _ = expand(["workload=train", "model=tiny", "backend=te-layer", "format=hybrid", "scaling=delayed",
                         "workload.train.fp8_seeds=1"])
    [case] = plan([point])
    assert case.label.endswith(".hybrid.delayed.te-layer")
    if not detect_device().is_cuda:
        assert not case.runnable and "Transformer Engine" in case.reason
    ok, why = get_backend("te-layer").supports("layer", case.recipe, H200.torch_device)
    assert not ok and "does not implement workload 'layer'" in why


@pytest.mark.slow
@pytest.mark.parametrize("preset,axis", [("hopper-train-depth", "model=tiny"),
                                         ("hopper-train-seq", "workload.seq=16,32"),
                                         ("hopper-train-torchtitan", "model=tiny")])
def test_the_whole_step_presets_run_at_toy_size_on_cpu(tmp_path, preset, axis):
    """Each preset's own settings (BF16 parameters, steps, warm-up, its sweep axes) at the tiny model's size
    (the sequence preset still sweeps its length), under the emulator and torch's CPU path: every case
    trains and records its steps."""
    model = [] if axis.startswith("model") else ["model=tiny"]
    points, _ = expand([f"sweep={preset}", "device=cpu", *model, axis, "backend=emulated", "format=bf16,e4m3",
                        "scaling=none,current", "workload.train.steps=8", "measure.warmup=2",
                        *(["workload.seq=32"] if preset != "hopper-train-seq" else []),
                        f"results_dir={tmp_path}"], multirun=True)
    assert {p.workload.train.master_weights for p in points} == {"bf16"}
    records = execute(plan(points), tmp_path / "r", "r", detect_device(), progress=False)
    assert {r.format for r in records} == {"bf16", "e4m3"}
    if preset == "hopper-train-seq":
        assert {r.shape["seq"] for r in records} == {16, 32}
    for rec in records:
        assert rec.status == "ok", rec.reason
        assert len(rec.samples["time_ms"]) == 8 - 2 and len(rec.samples["loss"]) == 8


@pytest.mark.slow
def test_the_two_gpu_llama3_8b_preset_is_torchtitans_setting_and_says_why_not_here():
    points, _ = expand(["sweep=h200x2-llama3-8b-fsdp2"], multirun=True)
    assert {(p.model.name, p.model.layers, p.workload.train.nproc, p.workload.train.strategy) for p in points} == {
        ("llama3-8b", 32, 2, "fsdp2")}
    cases = plan(points, H200)
    ids = {c.label for c in cases}
    assert "train.llama3-8b.b2s4096n20.seed0.fsdp2x2.bf16.none.torchao+compile" in ids
    assert "train.llama3-8b.b2s4096n20.seed0.fsdp2x2fp8ag.hybrid.current.torchao+compile" in ids
    if not detect_device().is_cuda:  # here every point names what it lacks
        assert all(not c.runnable and c.reason for c in cases)


@pytest.mark.slow
def test_the_two_gpu_preset_runs_its_bf16_baseline_with_gloo_at_toy_size(tmp_path):
    """The preset's own distributed settings (FSDP2 over 2 ranks, FP32 master weights) at the tiny model's size
    on two CPU processes: what a two-GPU host runs at full size, minus FP8 (gloo has no FP8 GEMMs)."""
    points, _ = expand(["sweep=h200x2-llama3-8b-fsdp2", "device=cpu", "model=tiny", "backend=torch", "format=bf16",
                        "scaling=none", "workload.train.fp8_all_gather=false", "workload.seq=32",
                        "workload.train.steps=6", "workload.train.eval_every=6", "measure.warmup=2",
                        f"results_dir={tmp_path}"])
    [rec] = execute(plan(points), tmp_path / "r", "r", detect_device(), progress=False)
    assert rec.status == "ok", rec.reason
    assert rec.label.endswith(".fsdp2x2.bf16.none.torch")
    assert rec.shape["nproc"] == 2 and len(rec.samples["loss"]) == 6 and rec.metric("tokens_per_s") > 0


def test_te_layer_hands_each_block_its_dimensions_and_weights():
    """What te-layer gives te.TransformerLayer for each decoder block, checked on a CPU (TE needs a GPU: the
    built layers are checked against the decoder they replace on the H200, tests/test_gpu.py): the model's
    dimensions with grouped-query heads, SwiGLU, RMSNorm, causal attention over (batch, seq, hidden), a fused
    QKV weight, no bias or dropout; every weight of the block under a TE parameter name, in TE's layout."""
    import torch

    from fp8bench.backends.te_reference import TE_LAYER_WEIGHTS, te_state_from_block, transformer_layer_kwargs
    from fp8bench.models.decoder import LlamaDecoder

    [point], _ = expand(["model=llama3-8b", "model.layers=2", "model.hidden=256", "model.ffn=512", "model.heads=8",
                         "model.kv_heads=2"])
    m = point.model
    kw = transformer_layer_kwargs(m, torch.bfloat16)
    assert (kw["hidden_size"], kw["ffn_hidden_size"], kw["num_attention_heads"], kw["num_gqa_groups"]) == (256, 512, 8, 2)
    assert (kw["normalization"], kw["activation"], kw["self_attn_mask_type"], kw["attn_input_format"]) == (
        "RMSNorm", "swiglu", "causal", "bshd")
    assert kw["fuse_qkv_params"] and not kw["bias"] and kw["hidden_dropout"] == kw["attention_dropout"] == 0.0
    assert kw["params_dtype"] is torch.bfloat16
    decoder = LlamaDecoder(m, 256)
    assert decoder.config is m  # what te-layer reads the dimensions from
    state = te_state_from_block(decoder.blocks[0], m)
    assert set(state) == set(TE_LAYER_WEIGHTS.values())
    assert state["self_attention.layernorm_qkv.weight"].shape == (2 * (4 + 2) * 32, 256)  # groups x (q/group + k + v)
    assert state["layernorm_mlp.fc1_weight"].shape == (2 * 512, 256)  # [gate; up]
