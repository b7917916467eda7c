"""What every backend adapter offers, and the recipe it is asked to run.

An adapter is one module with one class; third-party imports happen inside its methods, so importing
fp8bench never needs TE, torchao or triton. No silent fallback, ever: an adapter that cannot run a case
says so through `available()`/`supports()` and the case is recorded `skipped` with that reason.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from fp8bench.config.schema import SCALING_KNOBS, ScalingConfig
from fp8bench.core.hardware import DeviceInfo, Rule, rule_verdict
from fp8bench.core.numerics import DelayedScale, QuantOptions, sqnr_db
from fp8bench.core.types import Format, GemmRole, Scaling


@dataclass(frozen=True, kw_only=True)
class Knobs:
    """A backend's own settings beyond format and scaling: each backend declares a frozen subclass, one field
    per knob with its type, default and docstring (`Backend.knobs`), and reads only that. A default means "the
    backend's usual path" (a false boolean: the option is off), so a knob another backend declares is
    honoured by every backend while it holds that default, and a case that sets it elsewhere is skipped."""

    def values(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def set_knobs(self) -> dict[str, object]:
        """The knobs that differ from their default: what the case asks of the backend beyond its usual path."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if getattr(self, f.name) != f.default}

    def variant(self) -> str:
        """The case id's readable suffix for the knobs set (`compile+cuda_graph`): a set boolean by its name,
        another value by itself; '' when every knob holds its default."""
        return variant_of_knobs(self.set_knobs())


def variant_of_knobs(set_knobs: dict[str, object]) -> str:
    """`Knobs.variant` of knobs set to other than their default, by name (those of another backend too)."""
    return "+".join(k if v is True else str(v) for k, v in set_knobs.items())


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """Format × scaling × backend knobs: everything an adapter needs to build a case."""

    format: Format
    scaling: Scaling
    scaling_cfg: ScalingConfig
    backend: str
    knobs: Knobs
    """The backend's own knobs (its `Knobs` subclass), typed and validated."""

    def options(self, *, is_grad: bool = False, is_weight: bool = False) -> QuantOptions:
        return QuantOptions(is_grad=is_grad, is_weight=is_weight, margin=self.scaling_cfg.margin,
                            amax_compute_algo=self.scaling_cfg.amax_compute_algo,
                            pow2_scale=self.scaling_cfg.pow2_scales)

    def role_options(self, role: GemmRole) -> tuple[QuantOptions, QuantOptions]:
        (ga, gb), (wa, wb) = role.operands_are_grad(), role.operands_are_weight()
        return self.options(is_grad=ga, is_weight=wa), self.options(is_grad=gb, is_weight=wb)


@dataclass
class GemmOp:
    """A prepared GEMM. `with_quant` is what training pays (casts + kernel); `kernel_only` runs on operands
    quantized once up front. `output()` returns the result as float32 for the numerics checks."""

    with_quant: Callable[[], torch.Tensor]
    kernel_only: Callable[[], torch.Tensor] | None = None
    real_kernel: bool = True
    """False for the emulator: its time is not a kernel's."""
    ran: dict = field(default_factory=dict)
    """Which kernel the backend chose for this device (recorded with the case: CaseOutput.ran)."""


@dataclass
class QuantizeOp:
    """A prepared cast: `run()` quantizes; `dequantized()` gives the float32 values it produced."""

    run: Callable[[], object]
    dequantized: Callable[[], torch.Tensor]
    bytes_moved: int
    """Bytes the algorithm must move: input read once, quantized output and scales written once."""


REFERENCE_MIN_DB = 48.0
"""A module's own BF16 output against its `reference_check` reference (for TE's layer, the FP32
LlamaBlock of fp8bench.backends.te_reference) must agree at least this well. Rounding the layer's output to BF16
alone caps the agreement near 52 dB (what a correct reference scores, on the H200 and in
tests/test_te_reference.py). The residual stream dilutes a wrong convention inside the block: at a
1024-wide, 1024-token shape RoPE by pairs instead of halves still scores about 41 dB, and about 45 dB at
Llama-3-8B width, more than an FP8 layer's SQNR, so a floor of 40 dB would let it through; the QKV layout and
the SwiGLU halves score lower. Below this floor the layer workload records no FP8 SQNR for the case."""


MLP_REFERENCE_MIN_DB = 40.0
"""The same floor for an MLP alone (the `mlp` workload: TE's LayerNormMLP against our FP32 LlamaMLP). With no
residual stream around it, BF16 rounding of the norm, fc1 and activation outputs caps the agreement lower: our
own BF16 LlamaMLP scores 46.6 dB against FP32 at Llama-2-7B width (tests/test_te_reference.py), while swapped
SwiGLU halves score 4.8 dB, far below FP8's 25-35 dB."""


def reference_agreement(module_out: torch.Tensor, reference_out: torch.Tensor) -> float:
    """SQNR (dB) of a module's own high-precision output against the reference's: how far the reference is
    from the module before any FP8."""
    return sqnr_db(reference_out.float(), module_out.float())


@dataclass
class LinearOp:
    """A prepared module: `step()` runs forward and backward once; `outputs()` gives (y, dx, dw) as float32
    (dw None for a whole layer); `reference_outputs()` the same module's BF16 outputs where it has them;
    `reference_check` where the reference is another implementation (TE's layer)."""

    step: Callable[[], object]
    outputs: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]]
    reference_outputs: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] | None = None
    reference_check: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None
    """(the module's own output without FP8, the reference's output) where the reference is not that module
    itself: their agreement bounds what an FP8 SQNR against the reference can mean, and the reference's output
    is what the FP8 output is scored against."""
    notes: dict = field(default_factory=dict)
    params: list = field(default_factory=list)
    """The module's parameters (what a memory breakdown counts as weights)."""
    probe: Callable[..., None] | None = None
    """probe(hooks=(pack, unpack), between=..., start=...): one step with saved-tensor hooks around the forward,
    `start()` once the last step's gradients are freed and `between()` after the forward, before the backward
    (fp8bench.workloads.memory.step_breakdown)."""
    compiled: bool = False
    """What runs is torch.compile's code (`is_compiled` of the forward): the record's `ran.compiled`."""


def module_op(params: list[torch.nn.Parameter], forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
              dy: torch.Tensor, reference_forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
              notes: dict | None = None, context: Callable[[], object] | None = None,
              weight: torch.Tensor | None = None) -> LinearOp:
    """fwd+bwd of `forward` on `x` with upstream gradient `dy`, clearing gradients each step; `context()`
    (if given) wraps forward and backward both. `outputs()` gives (y, dx, weight's gradient or None)."""
    x = x.detach().requires_grad_(True)
    state: dict = {}

    def run(fwd, hooks=None, between=None, start=None):
        x.grad = None
        for p in params:
            p.grad = None
        if start:
            start()
        with context() if context else contextlib.nullcontext():
            with torch.autograd.graph.saved_tensors_hooks(*hooks) if hooks else contextlib.nullcontext():
                y = fwd(x)
            if between:
                between()
            y.backward(dy)
        state["y"] = y.detach()

    def results(fwd):
        run(fwd)
        return state["y"].float(), x.grad.float(), None if weight is None else weight.grad.float()

    return LinearOp(step=lambda: run(forward), outputs=lambda: results(forward),
                    reference_outputs=(lambda: results(reference_forward)) if reference_forward else None,
                    notes=notes or {}, params=list(params),
                    probe=lambda hooks=None, between=None, start=None: run(forward, hooks, between, start),
                    compiled=is_compiled(forward))


def is_compiled(obj: object) -> bool:
    """Whether torch.compile runs `obj`: a module compiled whole, or one whose submodules were compiled in place
    (regional compilation, `compile_blocks`). Read from the objects, so a record states what ran."""
    from torch._dynamo.eval_frame import OptimizedModule

    if isinstance(obj, OptimizedModule):
        return True
    if isinstance(obj, torch.nn.Module):
        return any(isinstance(m, OptimizedModule) or getattr(m, "_compiled_call_impl", None) is not None
                   for m in obj.modules())
    return False


@dataclass
class TrainSetup:
    """A model made ready to train under a recipe: `forward_context()` wraps each forward pass (TE's
    autocast), `step_context()` the whole step, backward included (torch's CPU FP8 GEMM path)."""

    model: torch.nn.Module
    forward_context: Callable[[], object] = contextlib.nullcontext
    step_context: Callable[[], object] = contextlib.nullcontext
    make_optimizer: Callable[..., torch.optim.Optimizer] | None = None
    """make_optimizer(param_groups, lr=, betas=, eps=): the recipe's own AdamW (COAT's FP8-state one);
    None for torch's."""
    capture: Callable[[torch.nn.Module, torch.Tensor, bool], torch.nn.Module] | None = None
    """capture(model, sample_tokens, mixed): the model with its forward and backward captured as CUDA graphs
    and replayed on each call (`backend.cuda_graph`; `capture_module`, or TE's own), which fp8bench's
    one-process loop calls once before its first step, `mixed` when the forward runs under torch.autocast;
    None: every step runs eagerly."""


def capture_autocast(sample: torch.Tensor, mixed: bool) -> contextlib.AbstractContextManager:
    """The autocast a CUDA-graph capture of the train step runs under (torch's and TE's alike): BF16 under
    `mixed`, without its cast cache, as capture requires, so the BF16 copies of FP32 master weights are made
    inside the graph from the weights the optimizer updates in place."""
    return torch.autocast(sample.device.type, dtype=torch.bfloat16, enabled=mixed, cache_enabled=False)


def capture_module(model: torch.nn.Module, sample: torch.Tensor, mixed: bool) -> torch.nn.Module:
    """`model` with its forward and backward captured as CUDA graphs (torch.cuda.make_graphed_callables, on
    `sample`, a batch of input tokens shaped as every later one) and replayed on each later call: one autograd
    node whose forward replays the forward graph and whose backward replays the backward one, the parameters'
    gradients its outputs. The warm-up calls before the capture run eagerly (kernels compile and tune there);
    all of it under `capture_autocast`.

    The parameters' gradients a replay returns are the backward graph's own buffers, not copies (TE's capture
    clones them by default): right for fp8bench's loop, which sets every gradient to None after its optimizer
    step and runs one backward per step; accumulating gradients over several backwards would need copies."""
    with capture_autocast(sample, mixed):
        return torch.cuda.make_graphed_callables(model, (sample,))


class RecipeLinear(torch.nn.Module):
    """nn.Linear replacement whose forward and backward are one backend's autograd.Function
    `fn.apply(x_2d, weight, recipe)`: how the torch and emulated backends swap the linears of a block.
    Under torch.autocast the input is cast to the autocast dtype first, as an autocast nn.Linear (and TE)
    would: the FP8 cast then starts from the same BF16 activations."""

    def __init__(self, linear: torch.nn.Linear, fn: type[torch.autograd.Function], recipe: Recipe) -> None:
        super().__init__()
        self.weight = linear.weight
        self.fn = fn
        self.recipe = recipe

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        autocast = torch.is_autocast_enabled(x.device.type)
        if autocast:
            x = x.to(torch.get_autocast_dtype(x.device.type))
        y = self.gemms(x.reshape(-1, x.shape[-1]))
        if not autocast:  # BF16 master weights: the next layer takes what an nn.Linear would give it
            y = y.to(x.dtype)
        return y.reshape(*x.shape[:-1], y.shape[-1])

    def gemms(self, x2d: torch.Tensor) -> torch.Tensor:
        return self.fn.apply(x2d, self.weight, self.recipe)


class LinearOutsideCompile(RecipeLinear):
    """A RecipeLinear that torch.compile leaves to run eagerly: dynamo ends its graph at the linear's call,
    runs the linear (reshapes, autocast, the backend's autograd.Function) as it is, and resumes in the calling
    block's frame, compiling what lies between the linears (norms, RoPE, the attention's reshapes, SwiGLU,
    residuals) into graphs of their own, forward and backward. For a linear whose kernels dynamo cannot trace
    (fp8bench_kernels launch through their own launcher), and whose casts and GEMMs are fused by hand already:
    compiling around it gives its block the fused neighbours its BF16 twin gets from compiling the whole block.

    The whole forward stays outside, not only the GEMMs: a break inside it would have dynamo compile this one
    frame, which every linear of the block calls with its own widths, once per width, and from the second on
    for symbolic widths (dynamic shapes) unless told otherwise; compile with `dynamic=False` all the same."""

    @torch.compiler.disable
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x)


class DelayedScalingLinear(RecipeLinear):
    """A block linear trained under delayed scaling: its input, weight and output-gradient casts keep amax
    histories across steps (`numerics.DelayedScale`: history length, algorithm and margin from `scaling.*`),
    as each TE module does. `fn.apply(x, weight, self)` casts X and W once in forward and dY once in backward
    with the scales these give. One-step cases (linear, layer) keep RecipeLinear: there a history of that one
    tensor gives the scale its own amax gives."""

    def __init__(self, linear: torch.nn.Linear, fn: type[torch.autograd.Function], recipe: Recipe) -> None:
        super().__init__(linear, fn, recipe)
        sc = recipe.scaling_cfg

        def history(is_grad: bool) -> DelayedScale:
            return DelayedScale(recipe.format.element(is_grad), sc.amax_history_len, sc.amax_compute_algo,
                                sc.margin, sc.pow2_scales)
        self.x_scale, self.w_scale, self.dy_scale = history(False), history(False), history(True)

    def gemms(self, x2d: torch.Tensor) -> torch.Tensor:
        return self.fn.apply(x2d, self.weight, self)


class Backend:
    """Base of the adapters. Subclasses override what they support.

    An adapter is a subclass with a `name`, in a module of fp8bench.backends (found there by the registry,
    fp8bench.backends.names) or registered with fp8bench.backends.register; with a preset in conf/backend/
    it is a backend of every sweep. What it runs is declared here, once: `workloads`, and `rules`, the
    device capability of each format/scaling pair with its source, which plan, doctor and the report read."""

    name: str = ""
    workloads: frozenset[str] = frozenset()
    rules: tuple[Rule, ...] = ()
    """What runs on which device (fp8bench.core.hardware.Rule); a pair no rule names has no recipe."""
    knobs: type[Knobs] = Knobs
    """The backend's own settings (a `Knobs` subclass): `backend.<knob>=` overrides, read into it per case."""
    order: int = 100
    """Where the backend is listed (doctor, the report): lower first; equal orders alphabetically."""
    timed: bool = True
    """False for the emulator: its cases run once (their time is what emulation costs, not a kernel's)."""
    reference: bool = False
    """The numerics reference the other backends' kernels are checked against (the exact emulator)."""
    loop: str = "fp8bench"
    """Whose training loop runs its `train` cases: fp8bench's own (`prepare_training`), or a framework's
    (`lightning`, `accelerate`: fp8bench.workloads.train.frameworks), as users of that framework run it."""
    unsupported_train: tuple[str, ...] = ()
    """`workload.train.*` settings this backend's training loop runs without: a case that sets one to other than
    its default is skipped with the reason (a framework's loop checkpoints or scales losses its own way)."""
    strategies: frozenset[str] = frozenset()
    """Distributed training strategies (`workload.train.strategy` with nproc > 1) this backend runs."""
    quantizes_as: str = ""
    """Another backend whose linears quantize the same GEMM operands with the same recipe as this one's (TE's
    per-block path and te.Linear), so a recipe's loss behaviour is one fact for both
    (fp8bench.analysis.recommend); '' where there is none."""
    eager_casts: bool = False
    """Its FP8 casts are eager torch ops, op by op, not fused kernels: the roofline models their traffic as
    such (fp8bench.analysis.roofline)."""
    path: str = ""
    """How its training step runs a recipe, in words, where the report sets one library's paths side by side
    (TE per linear, per block); '' to show the backend's name."""
    memory_modelled: bool = False
    """fp8bench.analysis.memory_model models what its layer and train cases save for backward: the report sets
    the model beside what the case measured."""

    def direct(self, knobs: Knobs) -> tuple[str, Knobs] | None:
        """For a framework integration: the backend it hands FP8 to, with the knobs that run it the same way
        (the report sets the integration's training step beside that backend's: what the framework costs);
        None for a backend that is no integration, or has no such direct run."""
        return None

    def available(self) -> tuple[bool, str]:
        """Is the backend's software importable here? (ok, reason with the fix)."""
        return True, ""

    def probe(self, workload: str, recipe: Recipe) -> tuple[bool, str]:
        """The library's own verdict on this machine (e.g. Transformer Engine's `is_fp8_available`), asked only
        where the backend is installed; plans for a described device leave it out."""
        return True, ""

    def supports(self, workload: str, recipe: Recipe, device: torch.device) -> tuple[bool, str]:
        """Workload- and recipe-level limits beyond the device capability matrix, from the declaration alone (no
        import of the backend's library, no device needed): what the planner decides a case's runnability on."""
        if workload not in self.workloads:
            return False, f"backend {self.name!r} does not implement workload {workload!r} (it runs {sorted(self.workloads)})"
        return True, ""

    def supports_train(self, train, recipe: Recipe, device: torch.device) -> tuple[bool, str]:
        """Limits of this backend's training loop for a `train` case's settings (`workload.train`)."""
        defaults = type(train)()
        refused = [f"workload.train.{k}={getattr(train, k)!r}" for k in self.unsupported_train
                   if getattr(train, k) != getattr(defaults, k)]
        if refused:
            return False, (f"{self.name} trains in {self.loop}'s loop, which fp8bench runs without "
                           f"{', '.join(refused)}; unset them for this backend")
        if train.nproc > 1 and train.strategy not in self.strategies:
            return False, (f"{self.name} does not run distributed training with strategy={train.strategy!r}"
                           + (f" (it runs {sorted(self.strategies)})" if self.strategies else ""))
        if train.fp8_all_gather:
            return False, f"{self.name} has no FP8 all-gather (torchao float8 under FSDP2 has)"
        return True, ""

    def scaling_knobs(self, scaling: Scaling) -> frozenset[str]:
        """The `scaling.*` knobs this backend honours under `scaling` (by default, what the exact numerics
        read: fp8bench.config.schema.SCALING_KNOBS)."""
        return frozenset(SCALING_KNOBS.get(scaling.value, ()))

    def capability(self, fmt: str, scaling: str, device: DeviceInfo) -> tuple[bool, str]:
        """Can (fmt, scaling) run on `device` by this backend's rules? (ok, reason a user can act on)."""
        return rule_verdict(self.name, self.rules, fmt, scaling, device)

    def supports_shape(self, workload: str, shape: dict, recipe: Recipe) -> tuple[bool, str]:
        """Shape-level limits (e.g. a kernel for some GEMM roles only); checked per case by the planner."""
        return True, ""

    def effective_recipe(self, recipe: Recipe) -> Recipe:
        """The exact numerics this backend implements for `recipe` (what the emulator check must use),
        e.g. a library that silently rounds scales to powers of two says so here."""
        return recipe

    def gemm(self, a: torch.Tensor, b: torch.Tensor, role: GemmRole, recipe: Recipe) -> GemmOp:
        raise NotImplementedError(f"backend {self.name!r} has no gemm")

    def quantize(self, x: torch.Tensor, recipe: Recipe, is_weight: bool) -> QuantizeOp:
        raise NotImplementedError(f"backend {self.name!r} has no quantize")

    def linear(self, x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, recipe: Recipe) -> LinearOp:
        raise NotImplementedError(f"backend {self.name!r} has no linear")

    module_dtype: torch.dtype = torch.bfloat16
    """The dtype of the plain-torch modules `layer` and `mlp` build (the emulator computes in FP32)."""

    def layer(self, model, x: torch.Tensor, dy: torch.Tensor, recipe: Recipe) -> LinearOp:
        """One transformer block of `model` on x (batch, seq, hidden); see fp8bench.workloads.layer. By default
        our LlamaBlock with this backend's linears (`module`)."""
        from fp8bench.models.block import LlamaBlock

        return self.module(LlamaBlock(model, device=x.device, dtype=self.module_dtype), x, dy, recipe)

    def mlp(self, model, x: torch.Tensor, dy: torch.Tensor, recipe: Recipe) -> LinearOp:
        """The MLP half of a block (RMSNorm, gate/up, SwiGLU, down; no residual) on x; see
        fp8bench.workloads.mlp. By default our LlamaMLP with this backend's linears (`module`)."""
        from fp8bench.models.block import LlamaMLP

        return self.module(LlamaMLP(model, device=x.device, dtype=self.module_dtype), x, dy, recipe)

    linear_fn: type[torch.autograd.Function] | None = None
    """The autograd.Function `fn.apply(x_2d, weight, recipe)` that runs one linear under a recipe, for adapters
    whose blocks swap each nn.Linear for a RecipeLinear (`module`)."""

    def module(self, reference: torch.nn.Module, x: torch.Tensor, dy: torch.Tensor, recipe: Recipe, *,
               linear: type[RecipeLinear] = RecipeLinear,
               wrap: Callable[[torch.nn.Module], Callable] = lambda m: m) -> LinearOp:
        """fwd+bwd of `reference` (a plain-torch module drawn from the case's seed, in `module_dtype`) with its
        linears run by this backend under `recipe`: BF16 runs `reference` itself; FP8 a copy whose linears are
        `linear`(`linear_fn`), scored against `reference`. `wrap` is what runs each twin's module (torch.compile
        for an adapter that compiles both alike); the reference is scored unwrapped."""
        if self.linear_fn is None:
            raise NotImplementedError(f"backend {self.name!r} runs no transformer block or MLP")
        from fp8bench.models.block import swap_linears

        x, dy = x.to(self.module_dtype), dy.to(self.module_dtype)
        if recipe.format is Format.BF16:
            return module_op(list(reference.parameters()), wrap(reference), x, dy)
        module = swap_linears(copy.deepcopy(reference), lambda lin: linear(lin, self.linear_fn, recipe))
        return module_op(list(module.parameters()), wrap(module), x, dy, reference_forward=reference)

    def kernels(self, workload: str, recipe: Recipe, device: torch.device) -> dict:
        """Which kernels this backend picks for `workload` under `recipe` on `device`, where it chooses among
        several (recorded with the case's parameters: nothing chosen at run time hides under the case id)."""
        return {}

    def prepare_training(self, model: torch.nn.Module, recipe: Recipe) -> TrainSetup:
        """`model` (a LlamaDecoder) with the linears of its blocks run by this backend under `recipe`; the
        embedding and output head stay in high precision (fp8bench.workloads.train)."""
        raise NotImplementedError(f"backend {self.name!r} has no train")


ONE_STEP_WORKLOADS = frozenset({"gemm", "linear", "mlp", "layer"})


def one_step_delayed(backend: str, workload: str, recipe: Recipe) -> tuple[bool, str]:
    """Delayed scaling in a one-step case of a backend whose casts take the scale from the amax history
    (the emulator, torch): the history then holds this tensor alone, so the scale is current scaling's and
    the case would repeat scaling=current under another name. Skipped with that reason; TE's delayed recipe
    (its own cast kernels) and every backend's `train` cases measure delayed scaling for real."""
    if recipe.scaling is Scaling.DELAYED and workload in ONE_STEP_WORKLOADS:
        return False, (f"{backend} delayed scaling in a one-step {workload} case casts with this tensor's own "
                       "amax, the same case as scaling=current; delayed scaling is measured in `train` (and "
                       "by TE's recipe)")
    return True, ""


def graphs_verdict(workload: str, knobs: Knobs, device: torch.device, *, compiled: bool = False) -> tuple[bool, str]:
    """For a backend that declares `cuda_graph`: graphs capture a `train` step of fp8bench's one-process loop on
    a CUDA device, and are one way to run a step, compilation another."""
    if not getattr(knobs, "cuda_graph", False):
        return True, ""
    if workload != "train":
        return False, ("backend.cuda_graph captures the train workload's steps; the other workloads time CUDA-graph "
                       "replays with measure.cuda_graph=true (gemm)")
    if device.type != "cuda":
        return False, "backend.cuda_graph replays CUDA graphs: it needs a CUDA device"
    if compiled:
        return False, ("backend.cuda_graph and backend.compile are two ways to run a step (replayed graphs, or "
                       "inductor's code): choose one")
    return True, ""


def graphs_train_verdict(train, knobs: Knobs) -> tuple[bool, str]:
    if getattr(knobs, "cuda_graph", False) and train.nproc > 1:
        return False, ("backend.cuda_graph captures a step of fp8bench's own loop in one process; set "
                       "workload.train.nproc=1")
    return True, ""


def swap_block_linears(model: torch.nn.Module, make: Callable[[torch.nn.Linear], torch.nn.Module]) -> None:
    """Replace every nn.Linear inside model.blocks by make(linear) (same weights, another implementation)."""
    from fp8bench.models.block import swap_linears

    for block in model.blocks:
        swap_linears(block, make)


def fresh_dynamo() -> None:
    """Before a case compiles: dynamo's caches cleared, and dynamo told to raise, not run eagerly, past its
    recompile limit. The cases of a sweep run in one process, and the graphs earlier ones compiled (other
    shapes, BF16 and FP8 linears, training and validation) count against that limit, past which dynamo runs
    the module eagerly without a word, under the compiled case's name: on the H200 the torchao training cases
    at seq 8192 of a sweep over three lengths did (commit 8bbde37), and so, most likely, did the ninth
    compiled MLP of run mlp-b (abe5136). A case that still overflows the limit now fails with dynamo's reason.
    Modules already built and compiled (a BF16 twin timed beside its recipes) compile again in their warm-up."""
    torch._dynamo.reset()
    config = torch._dynamo.config
    if hasattr(config, "fail_on_recompile_limit_hit"):
        config.fail_on_recompile_limit_hit = True


def compile_module(module: torch.nn.Module, dynamic: bool | None = None) -> torch.nn.Module:
    """torch.compile of one case's whole module (a linear, an MLP, a block), after `fresh_dynamo`. `dynamic`
    as torch.compile takes it: the triton backend passes False, so that a frame met with several shapes is
    compiled once per shape, never for symbolic ones (see `LinearOutsideCompile`)."""
    fresh_dynamo()
    return torch.compile(module, dynamic=dynamic)


def compile_blocks(model: torch.nn.Module, dynamic: bool | None = None) -> None:
    """Regional compilation, after `fresh_dynamo`: each block compiled in place (identical blocks share one
    compiled graph); `dynamic` as in `compile_module`."""
    fresh_dynamo()
    for block in model.blocks:
        block.compile(dynamic=dynamic)


def cpu_scaled_mm_path(recipe: Recipe, device: torch.device):
    """On CPU, torch's _scaled_mm goes through oneDNN only when `backend.cpu_onednn` is set: without FP8
    units oneDNN's FP8 GEMM is a slow reference (~0.1 GFLOPS on 2 cores) and torch's own path is not."""
    if device.type == "cpu" and recipe.format is not Format.BF16:  # BF16 matmuls need oneDNN to be fast
        return torch.backends.mkldnn.flags(enabled=recipe.knobs.cpu_onednn)
    return contextlib.nullcontext()


def import_probe(module: str, extra: str) -> tuple[bool, str]:
    """(True, '') if `module` imports, else the reason and the install hint."""
    import importlib

    try:
        importlib.import_module(module)
        return True, ""
    except ImportError as exc:
        return False, f"{module} is not installed ({exc.__class__.__name__}: {str(exc)[:80]}); pip install 'fp8bench[{extra}]'"
    except Exception as exc:  # a broken install (e.g. CUDA library mismatch) is also "not available"
        return False, f"{module} failed to import: {exc.__class__.__name__}: {str(exc)[:160]}"


def install_attempt(package: str) -> str:
    """How the last attempt to install `package` on this machine ended, as scripts/install_integrations.py
    records it (a JSON object package → message in the file $FP8BENCH_INSTALL_LOG), or '' when unknown.
    A probe adds it to its import error, so a skipped case says why the package is missing, not only that."""
    import json
    import os

    path = os.environ.get("FP8BENCH_INSTALL_LOG")
    if not path or not os.path.isfile(path):
        return ""
    try:
        with open(path) as f:
            return str(json.load(f).get(package, ""))
    except (OSError, ValueError):
        return ""


def package_probe(module: str, package: str,
                  hint: str = "install it with scripts/install_integrations.py (no-deps install, then its build)",
                  ) -> tuple[bool, str]:
    """Does `module` import? If not: the error, and how installing `package` ended on this machine, or else
    `hint` (their pins, e.g. COAT's triton==3.1, clash with the GPU stack, so no fp8bench extra installs them)."""
    import importlib

    try:
        importlib.import_module(module)
        return True, ""
    except Exception as exc:  # ImportError, or a broken build failing at import
        why = f"{module} does not import ({exc.__class__.__name__}: {str(exc)[:160]})"
    attempt = install_attempt(package)
    if attempt:
        return False, f"{why}; installing {package} here: {attempt}"
    return False, f"{why}; {hint}"


def load_te_first() -> None:
    """Import Transformer Engine (when it is installed and a GPU is there) before Lightning or Accelerate.
    On the H200 box, TE imported after `lightning.pytorch` failed with "libcudnn_cnn.so.9: undefined symbol"
    (the two loaded different cuDNN builds); imported first, it works and the frameworks use it."""
    if torch.cuda.is_available():
        import importlib.util

        if importlib.util.find_spec("transformer_engine") is not None:
            with contextlib.suppress(Exception):  # a broken TE is reported by the TE probe, with its reason
                import transformer_engine.pytorch  # noqa: F401
