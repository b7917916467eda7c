"""Hydra configs → validated dataclasses → planned cases."""

import dataclasses

import pytest

from fp8bench import backends
from fp8bench.config.compose import expand, group_options, load
from fp8bench.config.schema import ConfigError, ModelConfig
from fp8bench.core.hardware import DeviceInfo
from fp8bench.run.plan import plan


def test_default_point_composes_into_frozen_dataclasses():
    cfg = load([]).config
    assert cfg.workload.name == "gemm" and cfg.model.name == "tiny" and cfg.format.name == "e4m3"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.seed = 3  # type: ignore[misc]


def test_model_presets_have_their_published_dimensions():
    llama2 = load(["model=llama2-7b"]).config.model
    assert (llama2.hidden, llama2.ffn, llama2.heads, llama2.kv_heads, llama2.layers) == (4096, 11008, 32, 32, 32)
    llama3 = load(["model=llama3-70b"]).config.model
    assert (llama3.hidden, llama3.ffn, llama3.kv_heads, llama3.layers, llama3.vocab) == (8192, 28672, 8, 80, 128256)
    assert llama3.linear_dims("qkv") == (8192, 8192 + 2 * 8 * 128)  # GQA: 8 kv heads of 128
    assert set(group_options("model")) >= {"tiny", "gpt-125m", "llama-350m", "llama-1b", "llama2-7b",
                                           "llama3-8b", "llama3-70b"}


@pytest.mark.slow
def test_quick_sweep_plans_enough_cases_with_reasons():
    points, dropped = expand(["sweep=quick"])
    cases = plan(points, DeviceInfo("cpu", "test cpu", None, None))
    assert len(cases) >= 40 and dropped > 0
    assert len({c.config.model.name for c in cases}) >= 3
    assert len({c.config.format.name for c in cases}) >= 4
    assert len({c.config.scaling.name for c in cases}) >= 4
    skipped = [c for c in cases if not c.runnable]
    assert skipped and all(c.reason for c in skipped)
    assert len({c.case_id for c in cases}) == len(cases)


@pytest.mark.slow
def test_capability_reasons_on_hopper_name_the_compute_capability():
    points, _ = expand(["sweep=quick", "backend=torch", "workload=gemm", "model=tiny"])
    h200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), "13.0")
    by_id = {c.label: c for c in plan(points, h200)}  # the quick preset's settings give its ids a hash
    mx = by_id["gemm.tiny.fprop_qkv.mxfp8.mx.torch"]
    assert not mx.runnable and "no MX/NVFP4 path" in mx.reason  # torch has none on any GPU
    ok, why = backends.capability("te", "mxfp8", "mx", h200)  # TE has one, on Blackwell
    assert not ok and "needs compute capability 10.0; this device is 9.0" in why
    assert by_id["gemm.tiny.fprop_qkv.e4m3.blockwise.torch"].runnable


@pytest.mark.slow
def test_user_override_replaces_a_sweep_axis():
    points, _ = expand(["sweep=quick", "model=gpt-125m"])
    assert {p.model.name for p in points} == {"gpt-125m"}
    assert all(p.workload.tokens == 16 for p in points)


def test_impossible_single_point_is_an_error():
    with pytest.raises(ConfigError, match=r"scaling='current' is impossible with format='nvfp4'"):
        expand(["format=nvfp4"])


def test_schema_rejects_inconsistent_model():
    with pytest.raises(ConfigError, match="model.heads"):
        ModelConfig(name="x", hidden=100, ffn=10, heads=3, kv_heads=1, layers=1, vocab=1, seq=1)


def test_explicit_gemm_shapes():
    points, _ = expand(["workload.shapes=[[256,512,128]]", "workload.linears=[qkv]", "workload.roles=[fprop]"])
    cases = plan(points, DeviceInfo("cpu", "cpu", None, None))
    assert [c.shape_name for c in cases] == ["fprop_qkv", "256x512x128"]


def test_sweep_presets_override_the_primary_config():
    quick = load(["sweep=quick"]).config
    assert (quick.measure.iters, quick.measure.max_time_s, quick.workload.tokens) == (5, 0.1, 16)
    assert load(["sweep=asv-hopper-gemm"]).config.device == "cuda"
    assert load(["sweep=quick", "measure.iters=7"]).config.measure.iters == 7  # the command line still wins
