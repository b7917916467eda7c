"""`triton`: fp8bench's own kernels (`kernels/`, imported as `fp8bench_kernels`).

- quantize: e4m3/current (amax, then cast + transposed copy), e4m3/blockwise (1x128 activations, 128x128
  weights; `scaling.pow2_scales`), mxfp8/mx (32-element blocks, E8M0 exponents);
- gemm: e4m3/blockwise fprop and dgrad (1x128 A x 128x128 B, scales inside the K loop; the DeepSeek-V3
  recipe): on Hopper the warp-specialized Gluon kernel (`gemm_blockwise_gluon`), elsewhere the Triton one
  (`gemm_blockwise`). Each group's product is promoted to FP32 (DeepSeek-V3) unless `backend.fast_accum`
  (conf/backend/triton-fastaccum.yaml) lets the sum stay in the tensor core's accumulation (rescale), as
  cuBLAS's fast accumulation does: faster, less accurate. wgrad (1x128 x 1x128, both along tokens),
  promoted to FP32 always: on Hopper the Gluon kernel with column scales (`gemm_blockwise_gluon_wgrad`),
  elsewhere `gemm_blockwise_wgrad`. `backend.triton_gemms` (conf/backend/triton-nogluon.yaml) runs the Triton
  kernels on Hopper too.
- linear, mlp, layer, train: e4m3/blockwise, DeepSeek-V3's recipe on these kernels alone (`BlockwiseLinearFn`):
  each activation and gradient read once by `quantize_blockwise_both` into the two layouts its GEMMs need, the
  weight once into its 128x128 blocks and their transpose, the three GEMMs in FP8.
`backend.compile` (conf/backend/triton-compiled.yaml) compiles the mlp, layer and train modules of both twins
with torch.compile, our linears left out of the graphs (`LinearOutsideCompile`): the recipe in a block whose
norms, RoPE, SwiGLU and residuals are fused, as Transformer Engine's TransformerLayer fuses its own.
`backend.cuda_graph` (conf/backend/triton-graphed.yaml) trains both twins with each step's forward and backward
replayed from CUDA graphs captured once (`TrainSetup.capture`): at a small model's shapes each of the
recipe's kernels runs for microseconds behind tens of microseconds of Python launch path, so the eager step
waits on the host; replayed, the step is its kernels' GPU time, as a launch-bound user would run it.
Which GEMM kernels ran is recorded with the case: `gemm_kernel` and `wgrad_kernel` with every FP8 linear, mlp,
layer and train case (`kernels`), the one role's `gemm_kernel` with a gemm case. A case without a kernel is
recorded `skipped` with that reason, never run under another name.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8bench.backends.base import (
    Backend,
    GemmOp,
    Knobs,
    LinearOutsideCompile,
    QuantizeOp,
    RecipeLinear,
    TrainSetup,
    capture_module,
    compile_blocks,
    compile_module,
    graphs_train_verdict,
    graphs_verdict,
    import_probe,
    module_op,
    swap_block_linears,
)
from fp8bench.core.hardware import FP8, Rule
from fp8bench.core.types import Format, GemmRole, Scaling

RECIPE_WORKLOADS = ("linear", "mlp", "layer", "train")
"""Workloads that run the whole blockwise recipe (BlockwiseLinearFn) rather than one kernel."""
COMPILED_WORKLOADS = frozenset({"mlp", "layer", "train"})
"""What `backend.compile` changes: the code around the linears, which a lone linear or kernel does not have."""
KERNELS = {
    ("quantize", Format.E4M3, Scaling.CURRENT), ("quantize", Format.E4M3, Scaling.BLOCKWISE),
    ("quantize", Format.MXFP8, Scaling.MX), ("gemm", Format.E4M3, Scaling.BLOCKWISE),
    *((w, Format.E4M3, Scaling.BLOCKWISE) for w in RECIPE_WORKLOADS),
}


class BlockwiseLinearFn(torch.autograd.Function):
    """Y = X Wᵀ in DeepSeek-V3's blockwise FP8 on fp8bench's kernels: X and dY in 1x128 groups (along the
    features for fprop and dgrad, along the tokens for wgrad), W in 128x128 blocks. Each tensor is read once
    for both its layouts (`quantize_blockwise_both`); backward keeps only FP8 copies of X and W."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, w: torch.Tensor, recipe) -> torch.Tensor:  # type: ignore[override]
        from fp8bench_kernels.quantize_blockwise import quantize_blockwise_both

        pow2 = recipe.scaling_cfg.pow2_scales
        qx, sx, qxt, sxt = quantize_blockwise_both(x.contiguous(), pow2_scales=pow2)
        qw, sw, qwt, swt = quantize_blockwise_both(w.contiguous(), weight=True, pow2_scales=pow2)
        _, gemm = _blockwise_gemm(x.device, recipe.knobs, fast_accum=False)
        ctx.save_for_backward(qxt, sxt, qwt, swt)
        ctx.pow2, ctx.w_dtype, ctx.knobs = pow2, w.dtype, recipe.knobs
        return gemm(qx, sx, qw, sw)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):  # type: ignore[override]
        from fp8bench_kernels.quantize_blockwise import quantize_blockwise_both

        qxt, sxt, qwt, swt = ctx.saved_tensors
        qdy, sdy, qdyt, sdyt = quantize_blockwise_both(dy.contiguous(), pow2_scales=ctx.pow2)
        _, gemm = _blockwise_gemm(dy.device, ctx.knobs, fast_accum=False)
        _, wgrad = _wgrad_gemm(dy.device, ctx.knobs)
        dx = gemm(qdy, sdy, qwt, swt)  # [tokens, in]: dY (1x128 along out) x Wᵀ's 128x128 blocks
        dw = wgrad(qdyt, sdyt, qxt, sxt)  # [out, in]: summed over tokens in 1x128 groups
        return dx, dw.to(ctx.w_dtype), None


@dataclass(frozen=True, kw_only=True)
class TritonKnobs(Knobs):
    fast_accum: bool = False
    """gemm: the blockwise GEMM's sum stays in the tensor core's accumulation (rescale) instead of DeepSeek-V3's
    promotion of each 128-deep K group to FP32."""
    triton_gemms: bool = False
    """Run the blockwise GEMMs (fprop, dgrad, wgrad) on the Triton kernels even on sm_90, where the
    warp-specialized Gluon ones run by default: the two kernel generations side by side."""
    compile: bool = False
    """mlp, layer, train: compile both twins' modules around the recipe's linears (`LinearOutsideCompile`)."""
    cuda_graph: bool = False
    """train: each step's forward and backward captured once as CUDA graphs and replayed (both twins alike)."""


class TritonBackend(Backend):
    name = "triton"
    knobs = TritonKnobs
    order = 4
    rules = (
        Rule(FP8, frozenset({"current", "blockwise"}), (9, 0), None, False,
            "fp8bench_kernels use Hopper FP8 tensor cores (sm_90+)"),
        Rule(frozenset({"mxfp8"}), frozenset({"mx"}), (9, 0), None, False,
            "fp8bench_kernels MX quantizer (numerics on Hopper)"),
    )
    workloads = frozenset({"gemm", "quantize", *RECIPE_WORKLOADS})
    linear_fn = BlockwiseLinearFn

    def available(self):
        if not torch.cuda.is_available() and not _interpreting():
            return False, "triton kernels need a CUDA GPU (or TRITON_INTERPRET=1 for correctness only)"
        ok, why = import_probe("triton", "gpu")
        if not ok:
            return ok, why
        try:  # kernels/ is importable only as installed (a package_dir mapping): say so, not fail per case
            import fp8bench_kernels  # noqa: F401
        except ImportError as exc:
            return False, (f"fp8bench_kernels does not import ({exc}); install the project "
                           "(pip install -e . maps kernels/ to fp8bench_kernels)")
        return True, ""

    def supports(self, workload, recipe, device):
        ok, why = super().supports(workload, recipe, device)
        if ok and recipe.knobs.compile and workload not in COMPILED_WORKLOADS:  # BF16 twins too
            return False, (f"backend.compile compiles what lies between a block's linears (norms, RoPE, SwiGLU, "
                           f"residuals), around the recipe's own kernels: it applies to {sorted(COMPILED_WORKLOADS)}, "
                           f"and a {workload} case would be the uncompiled one under another name")
        if ok:  # BF16 twins too
            ok, why = graphs_verdict(workload, recipe.knobs, device, compiled=recipe.knobs.compile)
        if ok and workload in RECIPE_WORKLOADS and recipe.knobs.fast_accum:  # BF16 twins too: nothing to pair
            return False, ("the blockwise recipe's wgrad GEMM always promotes to FP32 (DeepSeek-V3): a linear "
                           "under backend.fast_accum would mix the two numerics; run the fast-accumulation "
                           "fprop/dgrad GEMMs in the gemm workload")
        if not ok or recipe.format is Format.BF16:
            return ok, why
        if (workload, recipe.format, recipe.scaling) not in KERNELS:
            have = sorted(f"{w} {f.value}/{s.value}" for w, f, s in KERNELS)
            return False, f"fp8bench_kernels has no {workload} kernel for {recipe.format.value}/{recipe.scaling.value}; it has {have}"
        return True, ""

    def supports_train(self, train, recipe, device):
        ok, why = graphs_train_verdict(train, recipe.knobs)
        return super().supports_train(train, recipe, device) if ok else (ok, why)

    def supports_shape(self, workload, shape, recipe):
        if (workload == "gemm" and recipe.knobs.fast_accum and recipe.format is not Format.BF16
                and shape.get("role") == GemmRole.WGRAD.value):
            return False, "the wgrad kernel always promotes to FP32 (DeepSeek-V3); it has no fast-accumulation variant"
        if recipe.format is Format.BF16:
            return True, ""
        # the GEMMs' TMA loads need 16-byte aligned rows: every K (the tokens are wgrad's) a multiple of 16
        if workload == "gemm":
            dims = {"k": (shape.get("k", 0), 16), "n": (shape.get("n", 0), 8)}
        elif workload == "linear":
            dims = {d: (shape.get(d, 0), 16) for d in ("tokens", "in", "out")}
        elif workload in RECIPE_WORKLOADS:
            dims = {"batch x seq": (shape.get("batch", 0) * shape.get("seq", 0), 16), "hidden": (shape.get("hidden", 0), 16)}
        else:
            return True, ""
        ragged = [f"{d}={v} (not a multiple of {m})" for d, (v, m) in dims.items() if v % m]
        if ragged:
            return False, f"the blockwise GEMMs' TMA loads need 16-byte aligned rows: {', '.join(ragged)}"
        return True, ""

    def quantize(self, x, recipe, is_weight):
        x = x.bfloat16().contiguous()
        if recipe.scaling is Scaling.CURRENT:
            from fp8bench_kernels.quantize_current import bytes_moved, quantize_current

            def deq():
                y, _, inv = quantize_current(x)
                return y.float() * inv
            return QuantizeOp(run=lambda: quantize_current(x), dequantized=deq, bytes_moved=bytes_moved(x))
        if recipe.scaling is Scaling.BLOCKWISE:
            from fp8bench_kernels.quantize_blockwise import bytes_moved, quantize_blockwise

            block = (128, 128) if is_weight else (1, 128)
            pow2 = recipe.scaling_cfg.pow2_scales

            def deq():
                y, s = quantize_blockwise(x, block, pow2)
                return y.float() * _expand(s, block, x.shape)
            return QuantizeOp(run=lambda: quantize_blockwise(x, block, pow2), dequantized=deq,
                              bytes_moved=bytes_moved(x, block))
        if recipe.scaling is Scaling.MX:
            from fp8bench_kernels.quantize_mx import bytes_moved, dequantize_mx, quantize_mx

            return QuantizeOp(run=lambda: quantize_mx(x), dequantized=lambda: dequantize_mx(*quantize_mx(x)),
                              bytes_moved=bytes_moved(x))
        raise ValueError(f"no triton quantize kernel for {recipe.scaling.value}")

    def gemm(self, a, b, role, recipe):
        """C = A·Bᵀ: fprop (activations x weights) and dgrad (gradients x transposed weights) with A's 1x128 and
        B's 128x128 blockwise scales; wgrad (gradients x activations, both transposed) with 1x128 scales along
        the tokens on both."""
        from fp8bench_kernels.quantize_blockwise import quantize_blockwise

        if recipe.format is Format.BF16:
            a16, b16 = a.bfloat16(), b.bfloat16()
            return GemmOp(with_quant=lambda: a16 @ b16.t(), kernel_only=lambda: a16 @ b16.t())
        pow2 = recipe.scaling_cfg.pow2_scales
        b_block = (1, 128) if role is GemmRole.WGRAD else (128, 128)
        if role is GemmRole.WGRAD:
            kernel, gemm = _wgrad_gemm(a.device, recipe.knobs)
        else:
            kernel, gemm = _blockwise_gemm(a.device, recipe.knobs, recipe.knobs.fast_accum)
        a16, b16 = a.bfloat16().contiguous(), b.bfloat16().contiguous()

        def quantized():  # 1x128 scales written M-major, the layout the GEMM kernels read them in
            qa, sa = quantize_blockwise(a16, (1, 128), pow2, m_major_scales=True)
            qb, sb = quantize_blockwise(b16, b_block, pow2, m_major_scales=b_block == (1, 128))
            return qa, sa, qb, sb
        operands = quantized()
        return GemmOp(with_quant=lambda: gemm(*quantized()), kernel_only=lambda: gemm(*operands),
                      ran={"gemm_kernel": kernel})

    def linear(self, x, w, dy, recipe):
        w = w.bfloat16().detach().requires_grad_(True)
        if recipe.format is Format.BF16:
            return module_op([w], lambda inp: inp @ w.t(), x.bfloat16(), dy.bfloat16(), weight=w)
        return module_op([w], lambda inp: BlockwiseLinearFn.apply(inp, w, recipe), x.bfloat16(), dy.bfloat16(),
                         weight=w)

    def module(self, reference, x, dy, recipe):
        """As every RecipeLinear backend's (`Backend.module`); with `backend.compile` both twins are compiled
        whole (torch.compile, inductor): the BF16 one with its linears inside the graph, ours with each linear
        left out of it (`LinearOutsideCompile`: dynamo cannot trace the kernels' launcher, and the casts are
        fused into them already), so both get the same fused norms, RoPE, SwiGLU and residuals."""
        if not recipe.knobs.compile:
            return super().module(reference, x, dy, recipe)
        return super().module(reference, x, dy, recipe, linear=LinearOutsideCompile,
                              wrap=lambda m: compile_module(m, dynamic=False))

    def prepare_training(self, model, recipe):
        """The blocks' linears on BlockwiseLinearFn; with `backend.compile` each block compiled around them
        (regional compilation, as `module`), the BF16 twin's blocks compiled whole; with `backend.cuda_graph`
        the loop captures the model's steps as CUDA graphs, both twins alike."""
        if recipe.format is not Format.BF16:
            linear = LinearOutsideCompile if recipe.knobs.compile else RecipeLinear
            swap_block_linears(model, lambda lin: linear(lin, self.linear_fn, recipe))
        if recipe.knobs.compile:
            compile_blocks(model, dynamic=False)
        return TrainSetup(model, capture=capture_module if recipe.knobs.cuda_graph else None)

    def kernels(self, workload, recipe, device):
        if workload not in RECIPE_WORKLOADS or recipe.format is Format.BF16:
            return {}
        return {"gemm_kernel": _blockwise_gemm(device, recipe.knobs, fast_accum=False)[0],
                "wgrad_kernel": _wgrad_gemm(device, recipe.knobs)[0]}


def _gluon_runs_on(device: torch.device, knobs) -> bool:
    if knobs.triton_gemms:
        return False
    try:
        from fp8bench_kernels.gemm_blockwise_gluon import runs_on
    except ImportError:  # a Triton without Gluon
        return False
    return runs_on(device)


def _blockwise_gemm(device: torch.device, knobs, fast_accum: bool):
    """(name, fprop/dgrad GEMM) for this device, taking A's scales M-major
    (`quantize_blockwise(m_major_scales=True)`): the Gluon kernel's producer TMA-loads them so, and the Triton
    kernel reads them in one coalesced load. Which of the two ran is recorded with the case (`gemm_kernel`).
    `fast_accum` is the caller's: the recipe's linear always promotes, as its wgrad does (DeepSeek-V3)."""
    if _gluon_runs_on(device, knobs):
        from fp8bench_kernels.gemm_blockwise_gluon import gemm_blockwise_gluon

        return "gluon", lambda qa, sa, qb, sb: gemm_blockwise_gluon(qa, sa, qb, sb, fast_accum=fast_accum)
    from fp8bench_kernels.gemm_blockwise import gemm_blockwise

    return "triton", lambda qa, sa, qb, sb: gemm_blockwise(qa, sa, qb, sb, fast_accum=fast_accum)


def _wgrad_gemm(device: torch.device, knobs):
    """(name, weight-gradient GEMM) for this device: both operands with 1x128 scales along the tokens
    (`wgrad_kernel` in the record)."""
    if _gluon_runs_on(device, knobs):
        from fp8bench_kernels.gemm_blockwise_gluon import gemm_blockwise_gluon_wgrad

        return "gluon-wgrad", gemm_blockwise_gluon_wgrad
    from fp8bench_kernels.gemm_blockwise_wgrad import gemm_blockwise_wgrad

    return "triton-wgrad", gemm_blockwise_wgrad


def _expand(scales: torch.Tensor, block: tuple[int, int], shape: torch.Size) -> torch.Tensor:
    rows, cols = block
    return scales.repeat_interleave(rows, dim=0).repeat_interleave(cols, dim=1)[: shape[0], : shape[1]]


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"
