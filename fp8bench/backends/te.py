"""`te`: Transformer Engine modules under `te.autocast(recipe=...)`.

Recipes: DelayedScaling (E4M3 or HYBRID; amax history length/algorithm and margin from `scaling.*`),
Float8CurrentScaling, Float8BlockScaling, MXFP8BlockScaling, NVFP4BlockScaling. Where TE refuses a recipe on
this GPU, TE's own reason is recorded.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from fp8bench.backends.base import (
    Backend,
    Knobs,
    QuantizeOp,
    Recipe,
    TrainSetup,
    capture_autocast,
    graphs_train_verdict,
    graphs_verdict,
    import_probe,
    module_op,
    swap_block_linears,
)
from fp8bench.backends.te_reference import (
    block_from_te,
    layernorm_mlp_kwargs,
    load_te_layer,
    load_te_mlp,
    mlp_from_te,
    transformer_layer_kwargs,
)
from fp8bench.core.hardware import FP8, TENSORWISE, Rule
from fp8bench.core.types import Format, Scaling
from fp8bench.models.block import LlamaBlock, LlamaMLP


def te_recipe(recipe: Recipe):
    """The TE recipe object for (format, scaling), or None for BF16."""
    from transformer_engine.common import recipe as R

    fmt = R.Format.HYBRID if recipe.format is Format.HYBRID else R.Format.E4M3
    sc = recipe.scaling_cfg
    if recipe.format is Format.BF16:
        return None
    if recipe.scaling is Scaling.DELAYED:
        return R.DelayedScaling(fp8_format=fmt, amax_history_len=sc.amax_history_len,
                                amax_compute_algo=sc.amax_compute_algo, margin=sc.margin)
    if recipe.scaling is Scaling.CURRENT:
        return R.Float8CurrentScaling(fp8_format=fmt)
    if recipe.scaling is Scaling.BLOCKWISE:
        return R.Float8BlockScaling(fp8_format=fmt)
    if recipe.scaling is Scaling.MX:
        return R.MXFP8BlockScaling()
    if recipe.scaling is Scaling.NVFP4:
        return R.NVFP4BlockScaling()
    raise ValueError(f"Transformer Engine has no {recipe.format.value}/{recipe.scaling.value} recipe")


def autocast(recipe: Recipe) -> contextlib.AbstractContextManager:
    import transformer_engine.pytorch as te

    r = te_recipe(recipe)
    if r is None:
        return contextlib.nullcontext()
    if hasattr(te, "autocast"):  # TE >= 2.8
        return te.autocast(enabled=True, recipe=r)
    return te.fp8_autocast(enabled=True, fp8_recipe=r)


def te_reason(recipe: Recipe) -> tuple[bool, str]:
    """TE's own availability verdict for the recipe's scaling family on this GPU."""
    import transformer_engine.pytorch as te

    probe = {Scaling.MX: "is_mxfp8_available", Scaling.NVFP4: "is_nvfp4_available",
             Scaling.BLOCKWISE: "is_fp8_block_scaling_available"}.get(recipe.scaling, "is_fp8_available")
    fn = getattr(te, probe, None)
    if fn is None:
        return True, ""
    ok, reason = fn(return_reason=True)
    return bool(ok), f"Transformer Engine: {reason}" if not ok else ""


def te_runs(recipe: Recipe, framework: str) -> tuple[bool, str]:
    """Can Transformer Engine run `recipe` here for a framework that drives it (Lightning, Accelerate)? TE's
    installation first, then its own verdict for the recipe."""
    ok, why = TEBackend().available()
    return te_reason(recipe) if ok else (False, f"{framework} needs Transformer Engine: {why}")


@dataclass(frozen=True, kw_only=True)
class TEKnobs(Knobs):
    cuda_graph: bool = False
    """train: each step's forward and backward replayed from CUDA graphs that TE's `make_graphed_callables`
    captures once (both twins alike), as Transformer Engine's users graph a launch-bound model."""


TE_SCALING_KNOBS = {Scaling.DELAYED: frozenset({"amax_history_len", "amax_compute_algo", "margin"})}
"""What TE's recipes take of `scaling.*`: DelayedScaling its amax history, algorithm and margin;
Float8CurrentScaling and Float8BlockScaling none (block scales are powers of two by TE's own default)."""


class TEBackend(Backend):
    name = "te"
    knobs = TEKnobs
    order = 2
    path = "per linear (te.Linear)"
    memory_modelled = True
    strategies = frozenset({"ddp"})
    rules = (
        Rule(FP8, TENSORWISE, (8, 9), None, False, "TE DelayedScaling / Float8CurrentScaling: sm_89+"),
        Rule(FP8, frozenset({"blockwise"}), (9, 0), (12, 9), False,
            "TE Float8BlockScaling: sm_90 and CUDA >= 12.9"),
        Rule(frozenset({"mxfp8"}), frozenset({"mx"}), (10, 0), None, False, "TE MXFP8BlockScaling: sm_100+"),
        Rule(frozenset({"nvfp4"}), frozenset({"nvfp4"}), (10, 0), None, False, "TE NVFP4BlockScaling: sm_100+"),
    )
    workloads = frozenset({"quantize", "linear", "mlp", "layer", "train"})

    def available(self):
        if not torch.cuda.is_available():
            return False, "Transformer Engine needs a CUDA GPU; this device is a CPU"
        return import_probe("transformer_engine.pytorch", "gpu")

    def effective_recipe(self, recipe):
        if recipe.scaling is Scaling.BLOCKWISE:  # Float8BlockScaling's QParams default to power-of-two scales
            import dataclasses

            return dataclasses.replace(recipe, scaling_cfg=dataclasses.replace(recipe.scaling_cfg, pow2_scales=True))
        return recipe

    rope_workloads = frozenset({"layer"})
    """Workloads that run TE's TransformerLayer, which needs TE's rotary embedding to compute a Llama block."""

    def scaling_knobs(self, scaling):
        return TE_SCALING_KNOBS.get(scaling, frozenset())

    def supports(self, workload, recipe, device):
        ok, why = super().supports(workload, recipe, device)
        return graphs_verdict(workload, recipe.knobs, device) if ok else (ok, why)

    def supports_train(self, train, recipe, device):
        ok, why = graphs_train_verdict(train, recipe.knobs)
        return super().supports_train(train, recipe, device) if ok else (ok, why)

    def probe(self, workload, recipe):
        if workload in self.rope_workloads and rope_class() is None:
            return False, ("this Transformer Engine exposes no RotaryPositionEmbedding: its TransformerLayer would "
                           "run without rotary embeddings, unlike the Llama block it stands for")
        return (True, "") if recipe.format is Format.BF16 else te_reason(recipe)

    def quantize(self, x, recipe, is_weight):
        """TE's own cast kernels, producing what its Hopper GEMMs consume: per-tensor scaling (current:
        amax then cast; delayed: cast with the stored scale, amax recorded) writes the E4M3 copy and its
        transpose; blockwise writes the row-wise 1x128 (activations) or 128x128 (weights) copy, like
        fp8bench's triton kernels, so GB/s compare the same work."""
        import transformer_engine.pytorch as te
        import transformer_engine_torch as tex

        x = x.bfloat16().contiguous()
        fp8 = tex.DType.kFloat8E4M3
        element = x.numel() * x.element_size()
        if recipe.scaling is Scaling.CURRENT:
            q = te.Float8CurrentScalingQuantizer(fp8, x.device, rowwise=True, columnwise=True)
            nbytes = 2 * element + 2 * x.numel()  # read twice (amax, cast), write the copy and its transpose
        elif recipe.scaling is Scaling.DELAYED:
            scale = torch.full((1,), 448.0 / float(x.abs().amax()), device=x.device)
            q = te.Float8Quantizer(scale, torch.zeros(1, device=x.device), fp8, rowwise=True, columnwise=True)
            nbytes = element + 2 * x.numel()
        elif recipe.scaling is Scaling.BLOCKWISE:
            dim = 2 if is_weight else 1
            q = te.Float8BlockQuantizer(fp8, rowwise=True, columnwise=False, block_scaling_dim=dim,
                                        force_pow_2_scales=True)
            rows, cols = x.shape
            n_scales = (-(-rows // 128) if is_weight else rows) * -(-cols // 128)
            nbytes = element + x.numel() + 4 * n_scales
        else:
            raise ValueError(f"no Transformer Engine cast for {recipe.format.value}/{recipe.scaling.value} here")
        return QuantizeOp(run=lambda: q(x), dequantized=lambda: q(x).dequantize().float(), bytes_moved=nbytes)

    def linear(self, x, w, dy, recipe):
        import transformer_engine.pytorch as te

        out_f, in_f = w.shape
        lin = te.Linear(in_f, out_f, bias=False, params_dtype=torch.bfloat16, device=w.device)
        with torch.no_grad():
            lin.weight.copy_(w)

        def forward(inp):
            with autocast(recipe):
                return lin(inp)

        return module_op([lin.weight], forward, x.bfloat16(), dy.bfloat16(), weight=lin.weight)

    def prepare_training(self, model, recipe):
        """Each block linear becomes a te.Linear with the same weights (also for BF16: the baseline then
        pays TE's module overheads too). TE's DelayedScaling cannot run under torch.compile, so no compile.
        With `backend.cuda_graph` (conf/backend/te-graphed.yaml) the steps replay CUDA graphs that TE's
        `make_graphed_callables` captures, as Transformer Engine's users graph a launch-bound model."""
        import transformer_engine.pytorch as te

        def to_te(lin: torch.nn.Linear) -> torch.nn.Module:
            out = te.Linear(lin.in_features, lin.out_features, bias=False, params_dtype=lin.weight.dtype,
                            device=lin.weight.device)
            with torch.no_grad():
                out.weight.copy_(lin.weight)
            return out

        swap_block_linears(model, to_te)
        capture = None
        if recipe.knobs.cuda_graph:
            def capture(module, sample, mixed):
                """TE's make_graphed_callables, which captures its modules' quantization state with them (called
                outside te.autocast, as TE's examples do; its replays run inside it, `forward_context`)."""
                r = te_recipe(recipe)
                with capture_autocast(sample, mixed):
                    return te.make_graphed_callables(module, (sample,), enabled=r is not None, recipe=r)
        return TrainSetup(model, forward_context=lambda: autocast(recipe), capture=capture)

    def layer(self, model, x, dy, recipe):
        import transformer_engine.pytorch as te

        # First, while the generator is where the other backends draw from: the weights their LlamaBlock gets
        # from the case's seed (te_reference says why TE runs on them too).
        weights = LlamaBlock(model, device=x.device, rope="half")
        layer = te.TransformerLayer(**transformer_layer_kwargs(model, torch.bfloat16), device=x.device)
        load_te_layer(layer, weights, model)
        del weights
        rope = rope_table(model.head_dim, x.shape[1], x.device)

        def forward(inp):
            with autocast(recipe):
                return layer(inp, rotary_pos_emb=rope)

        # The reference is our FP32 LlamaBlock with this layer's weights (te_reference), built only when asked,
        # after timing and memory, and freed at once: scoring TE's FP8 layer against TE's own BF16 run would
        # hide any mismatch both share. Its output is both the check against TE's BF16 layer and the reference
        # the FP8 output is scored against.
        def reference_check():
            block = block_from_te(layer.state_dict(), model)
            with torch.no_grad():
                return layer(x, rotary_pos_emb=rope).float(), block(x.float())

        op = module_op(list(layer.parameters()), forward, x, dy, notes={"rope": True})
        op.reference_check = reference_check
        return op

    def mlp(self, model, x, dy, recipe):
        """te.LayerNormMLP (RMSNorm fused with fc1's input cast, SwiGLU fused with fc2's), on the weights the
        other backends' LlamaMLP draws from the case's seed, scored against our FP32 LlamaMLP carrying them."""
        import transformer_engine.pytorch as te

        weights = LlamaMLP(model, device=x.device)
        mlp = te.LayerNormMLP(**layernorm_mlp_kwargs(model, torch.bfloat16), device=x.device)
        load_te_mlp(mlp, weights)
        del weights

        def forward(inp):
            with autocast(recipe):
                return mlp(inp)

        def reference_check():
            reference = mlp_from_te(mlp.state_dict(), model)
            with torch.no_grad():
                return mlp(x).float(), reference(x.float())

        op = module_op(list(mlp.parameters()), forward, x, dy)
        op.reference_check = reference_check
        return op


def rope_class():
    """TE's RotaryPositionEmbedding where this TE exposes it (its module moved between releases), else None."""
    try:
        from transformer_engine.pytorch.attention.rope import RotaryPositionEmbedding
    except ImportError:
        try:
            from transformer_engine.pytorch.attention import RotaryPositionEmbedding
        except ImportError:
            return None
    return RotaryPositionEmbedding


def rope_table(head_dim: int, seq: int, device):
    """TE's rotary embedding table for `seq` positions (as Megatron passes it); the planner skips TE layers
    where TE has none (supports), so a layer never runs without it."""
    return rope_class()(head_dim)(max_seq_len=seq).to(device)
