"""The `triton` backend on these kernels (fp8bench.backends.triton): the quantize and gemm workloads, the
blockwise linear against the emulator and the kernels it records, a block eager and compiled, and what the
planner runs or refuses."""

import importlib

import pytest
import torch
from kernel_cases import CUDA, DEV, data

from fp8bench.core.numerics import fake_quant, sqnr_db


@pytest.mark.slow
def test_triton_backend_serves_the_kernels_to_the_quantize_and_gemm_workloads(k):
    from fp8bench.backends import get_backend, make_recipe
    from fp8bench.backends.emulator import emulated_gemm
    from fp8bench.core.types import GemmRole

    def recipe(fmt, sc):
        return make_recipe("triton", fmt, sc)

    be = get_backend("triton")
    x = data(128, 384)
    for fmt, sc, weight in [("e4m3", "current", False), ("e4m3", "blockwise", True), ("mxfp8", "mx", False)]:
        r = recipe(fmt, sc)
        deq = be.quantize(x, r, weight).dequantized()
        assert torch.equal(deq, fake_quant(x, fmt, sc, r.options(is_weight=weight))), (fmt, sc)
    r = recipe("e4m3", "blockwise")
    a, b = data(128, 256, 3, spread=False), data(256, 256, 4, spread=False)
    op = be.gemm(a, b, GemmRole.FPROP, r)
    out = op.with_quant().float()
    assert sqnr_db(emulated_gemm(a, b, GemmRole.FPROP, r), out) > 40.0
    # which GEMM kernel served is recorded with the case, never hidden under its id (Gluon needs a Hopper GPU)
    hopper = CUDA and torch.cuda.get_device_capability() == (9, 0)
    assert op.ran == {"gemm_kernel": "gluon" if hopper else "triton"}
    # wgrad: gradients x activations, both transposed, 1x128 along the tokens (K) on both operands
    op = be.gemm(a, b, GemmRole.WGRAD, r)
    assert op.ran == {"gemm_kernel": "gluon-wgrad" if hopper else "triton-wgrad"}
    assert sqnr_db(emulated_gemm(a, b, GemmRole.WGRAD, r), op.with_quant().float()) > 40.0
    # backend.triton_gemms: the Triton kernels on Hopper too, each role recorded so (off Hopper they are the default)
    nogluon = make_recipe("triton", "e4m3", "blockwise", triton_gemms=True)
    for role, kernel in [(GemmRole.FPROP, "triton"), (GemmRole.WGRAD, "triton-wgrad")] if hopper else []:
        op = be.gemm(a, b, role, nogluon)
        assert op.ran == {"gemm_kernel": kernel}
        assert sqnr_db(emulated_gemm(a, b, role, nogluon), op.with_quant().float()) > 40.0
    fast = make_recipe("triton", "e4m3", "blockwise", fast_accum=True)
    ok, why = be.supports_shape("gemm", {"role": "wgrad"}, fast)
    assert not ok and "promotes" in why
    assert be.supports_shape("gemm", {"role": "wgrad"}, r) == (True, "")


LINEARS = ([pytest.param(8192, 4096, 11008, marks=pytest.mark.gpu), pytest.param(8208, 4112, 2064, marks=pytest.mark.gpu)]
           if CUDA else [(256, 384, 256), (208, 256, 144)])
"""On the GPU too, one shape of partial 128-groups in every dimension (the TMA zero-fill, the casts' masks)."""


@pytest.mark.slow
@pytest.mark.parametrize("triton_gemms", [False, True] if CUDA else [False], ids=lambda t: "triton" if t else "auto")
@pytest.mark.parametrize("tokens,d_in,d_out", LINEARS)
def test_blockwise_linear_forward_and_both_gradients_agree_with_the_emulator(k, tokens, d_in, d_out, triton_gemms):
    """The triton backend's linear (BlockwiseLinearFn: fprop, dgrad and wgrad GEMMs in FP8 on fp8bench's kernels,
    on Hopper the Gluon ones and, with `triton_gemms`, the Triton ones) against the emulator's blockwise
    fake-quant of the same recipe: each of Y, dX and dW agrees to BF16's output rounding (> 45 dB), while the
    recipe itself is FP8-accurate against the exact product (< 35 dB): the kernels compute the emulator's
    quantization, not merely something close to the exact answer. A wgrad grouped along the features instead
    of the tokens agrees with the emulator only to FP8's accuracy."""
    from fp8bench.backends import make_recipe
    from fp8bench.backends.emulator import EmulatedLinearFn
    from fp8bench.backends.triton import BlockwiseLinearFn

    r = make_recipe("triton", "e4m3", "blockwise", triton_gemms=triton_gemms)
    x, w, dy = data(tokens, d_in, 1, spread=False), data(d_out, d_in, 2, spread=False), data(tokens, d_out, 3, spread=False)

    def run(fn, dtype):
        xx, ww = x.to(dtype).detach().requires_grad_(True), w.to(dtype).detach().requires_grad_(True)
        y = fn.apply(xx, ww, r)
        y.backward(dy.to(y.dtype))
        return y.double(), xx.grad.double(), ww.grad.double()
    ours, emulated = run(BlockwiseLinearFn, torch.bfloat16), run(EmulatedLinearFn, torch.float32)
    xd, wd, dyd = x.double(), w.double(), dy.double()
    exact = (xd @ wd.t(), dyd @ wd, dyd.t() @ xd)
    for name, o, e, ex in zip(("y", "dx", "dw"), ours, emulated, exact, strict=True):
        assert sqnr_db(e, o) > 45.0, (name, sqnr_db(e, o))
        assert 20.0 < sqnr_db(ex, e) < 35.0, (name, sqnr_db(ex, e))
    # the same dW from dY and X grouped along their features (fprop's and dgrad's layout) instead of the tokens
    a, sa = k.quantize_blockwise.quantize_blockwise(dy, (1, 128))
    b, sb = k.quantize_blockwise.quantize_blockwise(x, (1, 128))
    along_features = (a.float() * sa.repeat_interleave(128, 1)[:, :d_out]).t().double() @ (
        b.float() * sb.repeat_interleave(128, 1)[:, :d_in]).double()
    assert sqnr_db(emulated[2], along_features) < 40.0


@pytest.mark.skipif(CUDA, reason="stands the Triton kernels in for the Gluon ones: a CPU test of the choice")
@pytest.mark.parametrize("triton_gemms", [False, True], ids=["auto", "triton"])
def test_the_kernels_a_blockwise_linear_calls_are_the_ones_it_records(k, monkeypatch, triton_gemms):
    """On a device where Gluon runs (here a stand-in: runs_on() says yes and each Gluon GEMM is a spy calling the
    Triton kernel), the linear's forward and backward call the Gluon fprop/dgrad and wgrad GEMMs, or with
    `triton_gemms` the Triton ones, and `kernels()` names exactly the ones called."""
    from fp8bench.backends import get_backend, make_recipe
    from fp8bench.backends.triton import BlockwiseLinearFn

    g = importlib.import_module("fp8bench_kernels.gemm_blockwise_gluon")
    calls: list[str] = []

    def spy(name, kernel):
        def called(*args, **kwargs):
            calls.append(name)
            return kernel(*args, **kwargs)
        return called
    monkeypatch.setattr(g, "runs_on", lambda device: True)
    monkeypatch.setattr(g, "gemm_blockwise_gluon", spy("gluon", k.gemm_blockwise.gemm_blockwise))
    monkeypatch.setattr(g, "gemm_blockwise_gluon_wgrad", spy("gluon-wgrad", k.gemm_blockwise_wgrad.gemm_blockwise_wgrad))
    for mod, name, label in [(k.gemm_blockwise, "gemm_blockwise", "triton"),
                             (k.gemm_blockwise_wgrad, "gemm_blockwise_wgrad", "triton-wgrad")]:
        monkeypatch.setattr(mod, name, spy(label, getattr(mod, name)))
    r = make_recipe("triton", "e4m3", "blockwise", triton_gemms=triton_gemms)
    x = data(128, 256, 1, spread=False).requires_grad_(True)
    w = data(128, 256, 2, spread=False).requires_grad_(True)
    BlockwiseLinearFn.apply(x, w, r).backward(data(128, 128, 3, spread=False))
    picked = get_backend("triton").kernels("linear", r, torch.device(DEV))
    assert calls == [picked["gemm_kernel"], picked["gemm_kernel"], picked["wgrad_kernel"]]  # fprop, dgrad, wgrad
    assert picked == ({"gemm_kernel": "triton", "wgrad_kernel": "triton-wgrad"} if triton_gemms
                      else {"gemm_kernel": "gluon", "wgrad_kernel": "gluon-wgrad"})


@pytest.mark.slow
def test_the_triton_recipe_runs_a_block_and_is_planned_where_its_kernels_run(k):
    """Under the interpreter: the tiny model's block with every linear on BlockwiseLinearFn, forward and backward,
    scored like the layer workload (against the same block in BF16), every weight
    given a gradient. On an H200 the planner runs linear, mlp, layer and train cases of E4M3 blockwise and
    refuses what the kernels do not do, each with its reason."""
    from fp8bench.backends import get_backend
    from fp8bench.config.compose import expand
    from fp8bench.core.hardware import DeviceInfo
    from fp8bench.run.plan import plan

    h200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), "13.0")
    [point], _ = expand(["model=tiny", "workload=layer", "backend=triton", "format=e4m3", "scaling=blockwise"])
    [case] = plan([point], h200, add_twins=False)
    x = data(64, 128, 1, spread=False).reshape(1, 64, 128)
    dy = data(64, 128, 2, spread=False).reshape(1, 64, 128) * 1e-2
    torch.manual_seed(0)
    op = get_backend("triton").layer(point.model, x, dy, case.recipe)
    y, dx, _ = op.outputs()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in op.params)
    y_ref, dx_ref, _ = op.reference_outputs()
    # the residual stream dilutes the linears' FP8 error in the block's output (~41 dB): FP8 ran, and ran right
    assert 20.0 < sqnr_db(y_ref.double(), y.double()) < 60.0 and 20.0 < sqnr_db(dx_ref.double(), dx.double()) < 60.0
    assert not torch.equal(y, y_ref)
    for workload in ("linear", "mlp", "layer", "train"):
        points, _ = expand([f"workload={workload}", "model=llama2-7b", "backend=triton,triton-fastaccum",
                            "format=e4m3,hybrid", "scaling=blockwise"], multirun=True)
        cases = plan(points, h200)
        runnable = {c.case_id for c in cases if c.runnable and not c.added}
        assert runnable and all(cid.endswith(".e4m3.blockwise.triton") for cid in runnable), (workload, runnable)
        reasons = {c.reason for c in cases if not c.runnable}
        assert any("hybrid/blockwise" in r for r in reasons) and any("fast_accum" in r for r in reasons), reasons


@pytest.mark.slow
def test_the_compiled_triton_block_runs_our_linears_outside_its_graphs(k, monkeypatch):
    """`backend=triton-compiled`: the block compiled by torch.compile (inductor), each linear left out of its
    graphs (graph breaks at LinearOutsideCompile, dynamo never tracing the kernels' launcher) and the block in
    fewer graphs than two per linear (942f7cf's form, a break inside the shared `RecipeLinear.forward`, compiled
    that frame once per linear width: 12 graphs here); its output and input gradient agreeing with the
    uncompiled recipe's block to BF16 rounding, every parameter's gradient to FP8's accuracy, and FP8 against
    the BF16 block. The
    BF16 twin compiled whole, in one graph. A lone linear or kernel has nothing around it to compile: skipped,
    naming the knob, in BF16 too."""
    import torch._inductor.config
    from torch._dynamo.utils import counters

    from fp8bench.backends import get_backend
    from fp8bench.config.compose import expand
    from fp8bench.core.hardware import DeviceInfo
    from fp8bench.run.plan import plan

    # inductor compiles in a pool of one process per core by default: on CI's two cores that can starve the
    # pytest worker beside it, whose asv test times a planted 50% slowdown (in a fresh-clone CI run at 4e35995
    # it read a median 0.88x, most likely with this test compiling beside it)
    monkeypatch.setattr(torch._inductor.config, "compile_threads", 1)
    h200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), "13.0")
    x = data(64, 128, 1, spread=False).reshape(1, 64, 128)
    dy = data(64, 128, 2, spread=False).reshape(1, 64, 128) * 1e-2
    outputs, grads, graphs, ops = {}, {}, {}, {}
    runs = [("triton", "e4m3", "blockwise"), ("triton-compiled", "e4m3", "blockwise"), ("triton-compiled", "bf16", "none")]
    for backend, fmt, scaling in runs:
        [point], _ = expand(["model=tiny", "workload=layer", f"backend={backend}", f"format={fmt}", f"scaling={scaling}"])
        [case] = plan([point], h200, add_twins=False)
        assert case.runnable, case.reason
        counters.clear()
        torch.manual_seed(0)
        op = ops[backend, fmt] = get_backend("triton").layer(point.model, x, dy, case.recipe)
        outputs[backend, fmt] = op.outputs()
        grads[backend, fmt] = [p.grad.clone() for p in op.params]
        breaks = sum(n for reason, n in counters["graph_break"].items() if "LinearOutsideCompile" in reason)
        graphs[backend, fmt] = (breaks, counters["stats"]["unique_graphs"])
    linears = sum(p.dim() == 2 for p in ops["triton-compiled", "e4m3"].params)
    assert linears == 4  # qkv, o, gate_up, down
    assert graphs["triton", "e4m3"] == (0, 0)
    breaks, unique = graphs["triton-compiled", "e4m3"]
    assert breaks >= linears and 0 < unique < 2 * linears, graphs
    assert graphs["triton-compiled", "bf16"] == (0, 1), graphs
    eager, compiled = ("triton", "e4m3"), ("triton-compiled", "e4m3")
    for a, b in zip(outputs[eager][:2], outputs[compiled][:2], strict=True):
        assert sqnr_db(a.double(), b.double()) > 40.0  # the same recipe, the neighbours fused
    # each weight's gradient sums over tokens what came back through the FP8 gradient casts, where fused
    # neighbours' last-bit differences can move a value across an E4M3 step: agreement at FP8's accuracy
    agreement = [sqnr_db(a.double(), b.double()) for a, b in zip(grads[eager], grads[compiled], strict=True)]
    assert len(agreement) == len(ops[compiled].params) and min(agreement) > 25.0, agreement
    y_ref, _, _ = ops[compiled].reference_outputs()
    y = outputs[compiled][0]
    assert 20.0 < sqnr_db(y_ref.double(), y.double()) < 60.0 and not torch.equal(y, y_ref)
    assert sqnr_db(outputs["triton-compiled", "bf16"][0].double(), y_ref.double()) > 40.0  # the twin: BF16 itself
    for workload, formats in (("linear", "e4m3,bf16"), ("gemm", "e4m3,bf16"), ("quantize", "e4m3")):
        points, _ = expand([f"workload={workload}", "model=llama2-7b", "backend=triton-compiled",
                            f"format={formats}", "scaling=blockwise,none"], multirun=True)
        cases = plan(points, h200)
        assert {c.recipe.format.value for c in cases} == set(formats.split(",")), workload
        assert all(not c.runnable and "backend.compile" in c.reason for c in cases), workload


def test_graphed_training_is_planned_for_one_process_train_cases_and_refused_elsewhere_with_the_knob_named(k):
    """`backend=triton-graphed` (backend.cuda_graph): both twins of a one-process train case are planned under
    their own variant; every other workload, a multi-process run, backend.compile beside it, and a device
    without CUDA are skipped with a reason naming what to change. (The capture itself runs on the GPU:
    tests/test_gpu.py.)"""
    from fp8bench.config.compose import expand
    from fp8bench.core.hardware import DeviceInfo, detect_device
    from fp8bench.run.plan import plan

    h200 = DeviceInfo("cuda", "NVIDIA H200", (9, 0), "13.0")
    train = ["workload=train", "model=tiny", "backend=triton-graphed", "format=bf16,e4m3", "scaling=none,blockwise"]
    cases = plan(expand(train, multirun=True)[0], h200)
    assert len(cases) >= 2 and all(c.runnable for c in cases), [(c.case_id, c.reason) for c in cases]
    assert all(c.case_id.endswith(".triton+cuda_graph") for c in cases), [c.case_id for c in cases]
    assert {c.recipe.format.value for c in cases} == {"bf16", "e4m3"}
    refused = {
        "workload.train.nproc=1": (),  # control: the base point is runnable
        "workload.train.nproc=2": ("nproc=1",),
        "backend.compile=true": ("backend.compile", "choose one"),
    }
    for override, named in refused.items():
        cases = plan(expand([*train, override], multirun=True)[0], h200)
        assert all(c.runnable != bool(named) for c in cases), (override, [(c.case_id, c.reason) for c in cases])
        assert all(all(n in c.reason for n in named) for c in cases), (override, [c.reason for c in cases])
    for workload in ("linear", "mlp", "layer", "gemm"):
        cases = plan(expand([f"workload={workload}", "model=llama2-7b", "backend=triton-graphed", "format=bf16,e4m3",
                             "scaling=none,blockwise"], multirun=True)[0], h200)
        assert cases and all(not c.runnable and "backend.cuda_graph" in c.reason for c in cases), workload
    here = detect_device()
    if not here.is_cuda:  # CI: the interpreter runs the kernels, and no graph can be captured
        cases = plan(expand([*train, "device=cpu"], multirun=True)[0], here)
        assert all(not c.runnable and "CUDA device" in c.reason for c in cases), [c.reason for c in cases]


def test_shapes_the_blockwise_gemms_cannot_load_are_skipped_with_the_dimension_named():
    """TMA needs 16-byte aligned rows: a ragged dimension of a case is a skip that names it, not a crash mid-run."""
    from fp8bench.backends import get_backend, make_recipe

    be = get_backend("triton")
    r = make_recipe("triton", "e4m3", "blockwise")
    for workload, shape, named in [("gemm", {"m": 100, "n": 256, "k": 200, "role": "wgrad"}, "k=200"),
                                   ("gemm", {"m": 128, "n": 100, "k": 256, "role": "fprop"}, "n=100"),
                                   ("linear", {"tokens": 8200, "in": 4096, "out": 4096}, "tokens=8200"),
                                   ("layer", {"batch": 1, "seq": 1000, "hidden": 4096}, "batch x seq=1000"),
                                   ("train", {"batch": 3, "seq": 333, "steps": 10}, "batch x seq=999")]:
        ok, why = be.supports_shape(workload, shape, r)
        assert not ok and named in why, (workload, why)
    assert be.supports_shape("train", {"batch": 2, "seq": 4096}, r) == (True, "")
    assert be.supports_shape("layer", {"batch": 1, "seq": 1000, "hidden": 4096},
                             make_recipe("triton", "bf16", "none")) == (True, "")
