"""Real CPU backends against the emulator: same quantized operands, so only accumulation and output rounding
may differ."""

import pytest
import torch

from fp8bench.backends import get_backend, make_recipe
from fp8bench.backends.emulator import emulated_gemm
from fp8bench.core.numerics import fake_quant, sqnr_db
from fp8bench.core.types import GemmRole


def recipe(fmt, sc, **backend):
    return make_recipe(backend.pop("name", "torch"), fmt, sc, **backend)


def operands(m=64, n=96, k=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).bfloat16(), torch.randn(n, k, generator=g).bfloat16()


@pytest.mark.parametrize("fmt,sc", [("e4m3", "current"), ("e4m3", "rowwise"), ("hybrid", "delayed")])
@pytest.mark.parametrize("role", list(GemmRole))
def test_torch_scaled_mm_on_cpu_matches_emulator(fmt, sc, role):
    a, b = operands()
    op = get_backend("torch").gemm(a, b, role, recipe(fmt, sc))
    out = op.with_quant().float()
    assert out.dtype == torch.float32 and out.shape == (64, 96)
    assert sqnr_db(emulated_gemm(a, b, role, recipe(fmt, sc)), out) > 45.0  # bf16 output rounding only
    assert torch.equal(op.kernel_only(), op.with_quant())


@pytest.mark.parametrize("name", ["emulated", "torch"])
@pytest.mark.slow
def test_delayed_training_casts_with_earlier_steps_scales(name):
    """TE's DelayedScaling, in the emulator and in eager torch + scaled_mm: the first step casts with scale 1
    (a 1e-6 gradient is below E5M2's smallest subnormal, so it is lost); once the histories hold this step's
    tensors, every cast is current scaling's, so the second identical step matches the current recipe's."""
    from fp8bench.backends import emulated, scaled_mm
    from fp8bench.backends.base import DelayedScalingLinear, RecipeLinear

    module = {"emulated": emulated, "torch": scaled_mm}[name]
    one_step_fn = {"emulated": emulated.EmulatedLinearFn, "torch": scaled_mm._ScaledMMLinearFn}[name]
    assert get_backend(name).supports("train", recipe("hybrid", "delayed", name=name), torch.device("cpu"))[0]
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 64, bias=False)
    x, dy = torch.randn(32, 256), torch.randn(32, 64) * 1e-6
    if name == "torch":  # its GEMMs take BF16 operands, as in training under autocast
        lin, x, dy = lin.bfloat16(), x.bfloat16(), dy.bfloat16()
    delayed = DelayedScalingLinear(lin, module._DelayedScalingLinearFn, recipe("hybrid", "delayed", name=name))
    current = RecipeLinear(lin, one_step_fn, recipe("hybrid", "current", name=name))

    def step(m):
        xi = x.clone().requires_grad_(True)
        lin.weight.grad = None
        y = m(xi)
        y.backward(dy.to(y.dtype))
        return y.detach().float(), xi.grad.float(), lin.weight.grad.float()

    y1, dx1, dw1 = step(delayed)
    assert dx1.abs().max() == 0 and dw1.abs().max() == 0
    want = step(current)
    assert not torch.equal(y1, want[0])  # scale 1 rounds X and W otherwise than 448/amax
    for got, ref in zip(step(delayed), want, strict=True):
        assert ref.abs().max() > 0
        torch.testing.assert_close(got, ref, rtol=1e-6, atol=0)


def test_onednn_and_fallback_paths_agree():
    a, b = operands(16, 32, 64)
    fast = get_backend("torch").gemm(a, b, GemmRole.FPROP, recipe("e4m3", "current")).with_quant()
    onednn = get_backend("torch").gemm(a, b, GemmRole.FPROP, recipe("e4m3", "current", cpu_onednn=True)).with_quant()
    assert sqnr_db(fast.float(), onednn.float()) > 45.0


@pytest.mark.parametrize("sc", ["current", "rowwise", "blockwise"])
def test_torch_cast_is_bit_exact_with_emulator(sc):
    x = torch.randn(256, 512).bfloat16()
    for is_weight in (False, True):
        r = recipe("e4m3", sc)
        op = get_backend("torch").quantize(x, r, is_weight)
        assert torch.equal(op.dequantized(), fake_quant(x, "e4m3", sc, r.options(is_weight=is_weight)))


@pytest.mark.slow
def test_torchao_rowwise_linear_matches_emulator_with_pow2_scales():
    pytest.importorskip("torchao")
    be = get_backend("torchao")
    x, w = operands(32, 64, 128)
    dy = torch.randn(32, 64).bfloat16()
    r = recipe("e4m3", "rowwise", name="torchao")
    y, dx, dw = be.linear(x, w, dy, r).outputs()
    emu, _, _ = get_backend("emulated").linear(x, w, dy, be.effective_recipe(r)).outputs()
    assert sqnr_db(emu, y) > 45.0


def test_torchao_has_no_e4m3_tensorwise_label():
    ok, why = get_backend("torchao").supports("linear", recipe("e4m3", "current", name="torchao"), torch.device("cpu"))
    assert not ok and "hybrid/current (tensorwise)" in why


def test_unavailable_backends_say_why():
    from fp8bench.cases import cases_of
    from fp8bench.config.compose import expand
    from fp8bench.core.hardware import detect_device
    from fp8bench.run.plan import verdict

    if not torch.cuda.is_available():
        ok, why = get_backend("te").available()
        assert not ok and "CUDA" in why
        ok, why = get_backend("triton").available()
        assert ok  # tests/conftest.py set TRITON_INTERPRET=1: the kernels run, for correctness only
        [point] = expand(["workload=gemm", "backend=triton", "format=e4m3", "scaling=blockwise"])[0]
        ok, why = verdict(cases_of(point)[0], detect_device())
        assert not ok and "CUDA GPU" in why  # ...but a sweep never times interpreted kernels


@pytest.mark.parametrize("workload,backend,fmt,sc", [
    ("layer", "torch", "e4m3", "current"), ("layer", "torchao", "hybrid", "current"),
    ("layer", "emulated", "nvfp4", "nvfp4"), ("layer", "torch", "bf16", "none"),
    ("mlp", "torchao", "e4m3", "rowwise"), ("mlp", "emulated", "hybrid", "blockwise")])
@pytest.mark.slow
def test_layer_and_mlp_workloads_on_cpu(tmp_path, workload, backend, fmt, sc):
    from fp8bench.config.compose import expand
    from fp8bench.core.hardware import detect_device
    from fp8bench.run.plan import plan
    from fp8bench.run.runner import execute

    if backend == "torchao":
        pytest.importorskip("torchao")
    points, _ = expand([f"workload={workload}", "model=tiny", "workload.batch=1", "workload.seq=64",
                        f"backend={backend}", f"format={fmt}", f"scaling={sc}", "measure.iters=3"])
    records = execute(plan(points), tmp_path, "t", detect_device(), progress=False)
    # an FP8 case is timed beside the BF16 twin the plan adds for it: both are recorded
    [rec] = [r for r in records if r.case_id.startswith(f"{workload}.tiny.b1s64.{fmt}.{sc}.{backend}")]
    if fmt != "bf16" and backend != "emulated":  # the emulator's cases are not timed: no twin to time them beside
        assert [r.case_id for r in records if r is not rec] == [rec.twin_id]
    assert rec.status == "ok", rec.reason
    assert rec.metric("time_ms") > 0
    if fmt != "bf16":  # the module's output under the recipe against the same module in high precision
        # the MLP alone has no residual stream to dilute the quantization error: FP8's own SQNR (~24 dB)
        assert (20.0 if workload == "layer" else 18.0) < rec.metric("sqnr_db") < (80.0 if workload == "layer" else 35.0)
    if backend == "emulated":  # its memory is not a kernel's: the emulator runs once, for its numerics
        assert rec.metric("mem_weights_bytes") is None and rec.metric("peak_mem_bytes") is None
        return
    # what the forward saved for backward: at least the module's input and one more activation (64 tokens)
    assert rec.metric("mem_saved_hp_bytes") + rec.metric("mem_saved_fp8_bytes") >= 2 * 64 * 128 * 2
    assert rec.metric("mem_weights_bytes") > 0


@pytest.mark.slow
def test_a_compiled_case_starts_from_fresh_dynamo_and_never_runs_eagerly_under_its_name():
    """Past dynamo's recompile limit (8 graphs of one function) a compiled module would run eagerly, silently,
    under its compiled case's name; after fresh_dynamo (what compile_module and compile_blocks call) dynamo
    raises there instead, and each case starts with the caches empty."""
    import torch._dynamo

    from fp8bench.backends.base import compile_module, fresh_dynamo

    def double(x):
        return x * 2

    compiled = torch.compile(double, backend="eager", dynamic=False)  # one graph per shape
    fresh_dynamo()
    for n in range(1, torch._dynamo.config.recompile_limit + 1):
        compiled(torch.ones(n))
    with pytest.raises(Exception, match="recompile"):
        compiled(torch.ones(99))
    for n in range(1, 3 * torch._dynamo.config.recompile_limit):  # a fresh start per "case": never the limit
        fresh_dynamo()
        compiled(torch.ones(n))
    torch._dynamo.config.fail_on_recompile_limit_hit = False
    wrapped = compile_module(torch.nn.Linear(4, 4))
    assert torch._dynamo.config.fail_on_recompile_limit_hit and isinstance(wrapped, torch._dynamo.eval_frame.OptimizedModule)
    fresh_dynamo()
