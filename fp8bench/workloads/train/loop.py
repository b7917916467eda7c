"""The one training loop every mode of the `train` workload runs: one process, torchrun ranks (DDP, FSDP2),
and Accelerate's. Lightning drives its own loop (`Trainer.fit`) and shares the rest: the curve, the
validation schedule, divergence and the record.

A mode differs only in its `Engine`: how the model is wrapped, how the backward and the clipping are done,
which share of each batch this process takes, and how values are combined over processes (`World`). The
settings are honoured the same way in every mode: FP32 or BF16 master weights, static and dynamic loss
scaling, gradient clipping, checkpoints every `train.ckpt_every` steps with resume, and divergence (a
non-finite loss stops the run and is recorded with what was measured).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from fp8bench.backends.base import RecipeLinear
from fp8bench.core.measure import Timing, peak_memory_bytes
from fp8bench.core.records import Metric
from fp8bench.models import corpus as corpus_mod
from fp8bench.models.decoder import LlamaDecoder, lm_loss, model_flops
from fp8bench.workloads.common import CaseInput, CaseOutput, Diverged, speed_metrics
from fp8bench.workloads.memory import (
    SavedTensorCensus,
    allocated,
    breakdown_metrics,
    optimizer_state_bytes,
    tensor_bytes,
)
from fp8bench.workloads.profile import kernel_metrics

PROFILED_STEPS = 3
"""Steps after the run recorded under torch.profiler on a GPU (fp8bench.workloads.profile)."""

FINITE_CHECK_EVERY = 10
"""Steps between NaN/Inf checks of the loss (each check synchronises the GPU once)."""


class World:
    """Values combined over the processes of a run. One process: nothing to combine."""

    size = 1

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def slowest(self, values: list[float]) -> list[float]:
        """Per step, the slowest process's time (a step ends when its last rank does)."""
        return values

    def largest(self, value: float) -> float:
        return value


@dataclass
class Curve:
    """What a run has measured so far (saved in every checkpoint)."""

    step: int = 0
    losses: list[float] = field(default_factory=list)
    step_ms: list[float] = field(default_factory=list)
    val_steps: list[int] = field(default_factory=list)
    val_losses: list[float] = field(default_factory=list)
    resumed_at: list[int] = field(default_factory=list)


def lr_at(step: int, cfg) -> float:
    """Linear warm-up to `lr`, then cosine decay to lr·min_lr_ratio at the schedule's last step
    (`schedule_steps`, or the run's own `steps`)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    length = cfg.schedule_steps or cfg.steps
    progress = (step - cfg.warmup_steps) / max(1, length - cfg.warmup_steps)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


class StepTimer:
    """Per-step wall time: CUDA events recorded around each step and read only when the curve is synced
    (no sync per step); perf_counter on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.pending: list[tuple] = []

    def start(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter_ns()

    def stop(self, begin) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.pending.append((begin, e))
        else:
            self.pending.append((begin, time.perf_counter_ns()))

    def drain(self) -> list[float]:
        if self.cuda and self.pending:
            torch.cuda.synchronize()
            out = [b.elapsed_time(e) for b, e in self.pending]
        else:
            out = [(e - b) / 1e6 for b, e in self.pending]
        self.pending = []
        return out


class Progress:
    """A run's losses, step times and validation points, kept on the device until a sync (every
    FINITE_CHECK_EVERY steps and at each validation); a bad loss raises Diverged with what was measured.
    Losses are the mean over the run's processes and step times the slowest process's (`world`), so every
    process sees the same curve and stops at the same step.

    fp8bench's loop times each step itself (`timer.start` / `timer.stop` around the step it calls); a
    framework's loop, whose steps it does not call, is timed from one step's start to the next
    (`step_begins`), so the framework's work between steps counts."""

    def __init__(self, case: CaseInput, curve: Curve | None = None, memory: dict | None = None,
                 on_diverge=None, world: World | None = None, graphs: bool = False, compiled: bool = False) -> None:
        self.case, self.cfg = case, case.config.workload.train
        self.graphs, self.compiled = graphs, compiled  # what a diverged run's record states ran
        self.curve = curve if curve is not None else Curve()
        self.memory = memory if memory is not None else {}
        self.on_diverge = on_diverge
        self.world = world or World()
        self.timer = StepTimer(case.device)
        self.pending: list[torch.Tensor] = []
        self.open = None

    def step_begins(self) -> None:
        if self.open is not None:
            self.timer.stop(self.open)
        self.open = self.timer.start()

    def close(self) -> None:
        if self.open is not None:
            self.timer.stop(self.open)
            self.open = None

    def step_ends(self, loss: torch.Tensor, evaluate) -> None:
        """After optimizer step `curve.step`; validates (outside the timed period) where the schedule says."""
        self.pending.append(loss.detach().float())
        self.curve.step += 1
        if len(self.pending) >= FINITE_CHECK_EVERY:
            self.sync()
        if self.curve.step % self.cfg.eval_every == 0 or self.curve.step == self.case.shape["steps"]:
            self.close()
            self.sync()
            self.validate(evaluate)

    def validate(self, evaluate) -> None:
        self.curve.val_steps.append(self.curve.step)
        self.curve.val_losses.append(evaluate())
        if not math.isfinite(self.curve.val_losses[-1]):
            raise self.diverged(f"validation loss became {self.curve.val_losses[-1]} at step {self.curve.step}",
                                self.curve.step)

    def sync(self) -> None:
        """Move losses and step times off the device; stop with what was measured if the loss went bad."""
        if self.pending:
            self.curve.losses += self.world.mean(torch.stack(self.pending)).cpu().tolist()
            self.pending.clear()
        self.curve.step_ms += self.world.slowest(self.timer.drain())
        bad = next((i for i, v in enumerate(self.curve.losses) if not math.isfinite(v)), None)
        if bad is not None:
            raise self.diverged(f"loss became {self.curve.losses[bad]} at step {bad} (lr {lr_at(bad, self.cfg):.3g})",
                                bad)

    def diverged(self, message: str, at: int) -> Diverged:
        if self.on_diverge is not None:
            self.on_diverge()
        return Diverged(message, output(self.case, self.curve, self.memory, diverged_at=at, world=self.world,
                                        replayed=self.graphs, compiled=self.compiled))


def optimizer(model: torch.nn.Module, cfg, make=None, **implementation) -> torch.optim.Optimizer:
    """AdamW; no weight decay on norms (1-D parameters), as in GPT-2/Llama training. `implementation`:
    AdamW's fused=/foreach= choice (fused on one GPU; FSDP2's sharded parameters take foreach). `make`: a
    recipe's own AdamW (TrainSetup.make_optimizer), given the same groups and hyperparameters."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if make is not None:
        return make(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=1e-8)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=tuple(cfg.betas), eps=1e-8, **implementation)


FP8_LINEAR_CLASSES = {"Float8Linear", "FP8Linear"}
"""torchao's and COAT's low-precision linears, by name (neither library need be installed); fp8bench's own
(torch, emulated, and their delayed-scaling variant) are RecipeLinears; TE's modules are told by their module."""

TE_LINEARS = {"Linear": 1, "LayerNormLinear": 1, "LayerNormMLP": 2}
"""Transformer Engine's modules and the linears each holds (LayerNormMLP: fc1 and fc2)."""


def linear_coverage(model: torch.nn.Module, recipe) -> list[Metric]:
    """How many of the model's linears run the recipe (`linears_fp8`) out of all (`linears_total`): the
    backends and integrations differ here (the output head, Accelerate's first/last-layer filter)."""
    total = low = 0
    fp8 = recipe.format.value != "bf16"
    for m in model.modules():
        kind = type(m).__name__
        te_linears = TE_LINEARS.get(kind, 0) if type(m).__module__.startswith("transformer_engine") else 0
        if te_linears:
            total, low = total + te_linears, low + fp8 * te_linears
        elif kind in FP8_LINEAR_CLASSES or isinstance(m, RecipeLinear):
            total, low = total + 1, low + fp8
        elif isinstance(m, torch.nn.Linear):
            total += 1
    return [Metric.of("linears_fp8", low), Metric.of("linears_total", total)]


def steady_steps(step_ms: list[float], warmup: int) -> list[float]:
    """Step times without the first `warmup` steps (compilation, allocator warm-up), keeping at least one."""
    return step_ms[min(warmup, max(0, len(step_ms) - 1)):] or step_ms


@dataclass
class TrainData:
    """A training case's text on its device: the batch of a step is a function of (seed, step) only, so
    every loop (fp8bench's, Lightning's, Accelerate's), every rank and a resumed run see the same tokens."""

    corpus: corpus_mod.Corpus
    tokens: torch.Tensor
    val: list[torch.Tensor]
    seed: int
    batch: int
    seq: int

    def batch_at(self, step: int) -> torch.Tensor:
        starts = corpus_mod.train_starts(self.corpus, self.seed, step, self.batch, self.seq)
        return corpus_mod.windows(self.tokens, starts, self.seq)


def load_data(cfg, shape: dict, device: torch.device) -> TrainData:
    """The corpus of `cfg` (train settings) cut for `shape` (batch, seq, seed), on `device`."""
    data = corpus_mod.load(cfg.corpus, cfg.val_percent)
    val = [b.to(device) for b in corpus_mod.val_batches(data, cfg.eval_batches, shape["batch"], shape["seq"])]
    return TrainData(data, data.train.to(device), val, shape["seed"], shape["batch"], shape["seq"])


def new_decoder(case: CaseInput) -> LlamaDecoder:
    """The case's model, freshly initialised from its seed: every recipe, loop and rank of one seed starts
    from the same weights (FP32 master weights unless `train.master_weights=bf16`)."""
    torch.manual_seed(case.shape["seed"])
    return LlamaDecoder(case.config.model, corpus_mod.VOCAB, device=case.device, dtype=master_dtype(case))


def master_dtype(case: CaseInput) -> torch.dtype:
    return torch.float32 if case.config.workload.train.master_weights == "fp32" else torch.bfloat16


@dataclass
class Engine:
    """How one mode runs a step of the shared loop (`fit`)."""

    model: torch.nn.Module
    """What the forward calls (wrapped by DDP, sharded by FSDP2, prepared by Accelerate)."""
    opt: torch.optim.Optimizer
    autocast: bool
    """The forward under torch.autocast(bf16): FP32 master weights computed in BF16. False where the weights
    are BF16 already, or where FSDP2's mixed-precision policy casts them."""
    forward_context: Callable[[], object] = contextlib.nullcontext
    step_context: Callable[[], object] = contextlib.nullcontext
    backward: Callable[[torch.Tensor], None] = torch.Tensor.backward
    clip: Callable[[list, float], object] | None = None
    """clip(params, max_norm); torch's clip_grad_norm_ when None."""
    after_step: Callable[[], None] = lambda: None  # noqa: E731
    rows: slice = field(default_factory=lambda: slice(None))
    """This process's share of each global batch."""
    world: World = field(default_factory=World)
    census: bool = True
    """Split one step's memory by a saved-tensor census (fp8bench's own loop in one process)."""
    weights_and_state: bool = True
    """Record the bytes of weights and optimiser state (one process; a rank holds shards of them)."""
    state: Callable[[], dict] | None = None
    """The model's and optimiser's state for a checkpoint; model.state_dict()/opt.state_dict() when None."""
    load_state: Callable[[dict], None] | None = None
    writes_checkpoint: bool = True
    """Whether this process writes the checkpoint file (every process of a run reads it on resume)."""
    coverage_model: torch.nn.Module | None = None
    """The model whose linears `linear_coverage` counts (unwrapped); `model` when None."""
    replayed: bool = False
    """`model` replays CUDA graphs captured before the first step (TrainSetup.capture): the record says so."""
    compiled: bool = False
    """torch.compile runs `model` or its blocks (read from the model: the record's `ran.compiled`)."""


def _checkpoint_state(engine: Engine, scaler, curve: Curve) -> dict:
    model_opt = engine.state() if engine.state else {"model": engine.model.state_dict(),
                                                     "optimizer": engine.opt.state_dict()}
    return {**model_opt, "scaler": scaler.state_dict(), "curve": curve.__dict__}


def _save_checkpoint(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)  # atomic: a kill mid-save leaves the previous checkpoint intact


OWN_PICKLES = {"NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE": "1"}
"""Set while a run loads its own checkpoint: Transformer Engine refuses the pickled extra state (delayed
scaling's amax history and scales) of a module's state dict unless told the file is trusted. The file is
this case's own, written by `_save_checkpoint` in its work folder, as the weights_only=False load says."""


@contextlib.contextmanager
def _loading_own_checkpoint():
    before = {k: os.environ.get(k) for k in OWN_PICKLES}
    os.environ.update(OWN_PICKLES)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _load_checkpoint(path: Path, engine: Engine, scaler, device: torch.device) -> Curve:
    # a full (unsharded) state goes to host memory first: every rank reads it, and only its shard is kept
    state = torch.load(path, map_location="cpu" if engine.load_state else device, weights_only=False)
    with _loading_own_checkpoint():
        if engine.load_state:
            engine.load_state(state)
        else:
            engine.model.load_state_dict(state["model"])
            engine.opt.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    return Curve(**state["curve"])


class Stepper:
    """The forward, validation and optimiser step of one run under its Engine, and the memory phases the census
    step records."""

    def __init__(self, case: CaseInput, engine: Engine, data: TrainData) -> None:
        self.case, self.engine, self.data = case, engine, data
        self.cfg, self.dev = case.config.workload.train, case.device
        self.params = [p for p in engine.model.parameters() if p.requires_grad]
        self.val = [b[engine.rows] for b in data.val]
        self.scaler = torch.amp.GradScaler(self.dev.type, enabled=self.cfg.dynamic_loss_scale)
        self.clip = engine.clip or (lambda ps, norm: torch.nn.utils.clip_grad_norm_(ps, norm, foreach=True))
        self.memory: dict[str, int] = {}

    def forward_loss(self, tokens: torch.Tensor) -> torch.Tensor:
        e = self.engine
        with torch.autocast(self.dev.type, dtype=torch.bfloat16, enabled=e.autocast), e.forward_context():
            logits = e.model(tokens[:, :-1])
        return lm_loss(logits, tokens[:, 1:])

    def evaluate(self) -> float:
        with torch.no_grad(), self.engine.step_context():
            losses = torch.stack([self.forward_loss(b).float() for b in self.val])
            return float(self.engine.world.mean(losses.mean()))

    def step(self, step: int, census: SavedTensorCensus | None) -> torch.Tensor:
        cfg, e, opt, memory = self.cfg, self.engine, self.engine.opt, self.memory
        tokens = self.data.batch_at(step)[e.rows]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        with e.step_context():
            with torch.autograd.graph.saved_tensors_hooks(census.pack, census.unpack) if census \
                    else contextlib.nullcontext():
                loss = self.forward_loss(tokens)
            planted = self.case.config.diverge_at_step
            if planted is not None and step >= planted:  # test-only: a divergence planted on any machine
                loss = loss * float("nan")
            if census:
                memory["after_forward"] = allocated(self.dev)
            e.backward(self.scaler.scale(loss * cfg.loss_scale if cfg.loss_scale != 1.0 else loss))
            self.scaler.unscale_(opt)
            if cfg.loss_scale != 1.0:
                torch._foreach_div_([p.grad for p in self.params if p.grad is not None], cfg.loss_scale)
            if cfg.grad_clip:
                self.clip(self.params, cfg.grad_clip)
            if census:
                memory["grads"] = tensor_bytes(p.grad for p in self.params)
            self.scaler.step(opt)
            self.scaler.update()
            e.after_step()
            opt.zero_grad(set_to_none=True)
        return loss.detach()


def fit(case: CaseInput, engine: Engine, data: TrainData) -> CaseOutput:
    """Train `case.shape["steps"]` steps from the checkpoint if one is there, validating on the schedule."""
    cfg, dev, steps = case.config.workload.train, case.device, case.shape["steps"]
    run = Stepper(case, engine, data)
    memory = run.memory
    ckpt = case.work_dir / "checkpoint.pt" if case.work_dir is not None and cfg.ckpt_every else None
    curve = Curve()
    if ckpt is not None and ckpt.is_file():
        curve = _load_checkpoint(ckpt, engine, run.scaler, dev)
        curve.resumed_at.append(curve.step)
    if not curve.val_steps:
        curve.val_steps.append(0)
        curve.val_losses.append(run.evaluate())

    def forget_checkpoint() -> None:  # a diverged run is a result: resuming it would only diverge again
        if ckpt is not None and engine.writes_checkpoint and ckpt.is_file():
            ckpt.unlink()

    progress = Progress(case, curve, memory, on_diverge=forget_checkpoint, world=engine.world,
                        graphs=engine.replayed, compiled=engine.compiled)
    census_step = min(curve.step + 1, steps - 1) if engine.census else -1
    while curve.step < steps:
        k = curve.step
        census = _begin_census(progress, run.params, memory, dev) if k == census_step else None
        begin = progress.timer.start()
        loss = run.step(k, census)
        progress.timer.stop(begin)
        if census is not None:
            memory["step_peak"] = peak_memory_bytes(dev) or 0
            memory["saved_fp8"], memory["saved_hp"] = census.fp8, census.other
        progress.step_ends(loss, run.evaluate)
        if ckpt is not None and curve.step % cfg.ckpt_every == 0 and curve.step < steps:
            progress.sync()
            state = _checkpoint_state(engine, run.scaler, curve)  # collective under FSDP2: every rank takes part
            if engine.writes_checkpoint:
                _save_checkpoint(ckpt, state)
    progress.sync()
    if engine.weights_and_state:
        memory["weights"] = tensor_bytes(run.params)
        memory["optimizer"] = optimizer_state_bytes(engine.opt)
    if ckpt is not None and engine.writes_checkpoint and ckpt.is_file():
        ckpt.unlink()  # the record now holds the run; checkpoints of large models are GBs
    out = output(case, curve, memory, world=engine.world, replayed=engine.replayed, compiled=engine.compiled)
    out.metrics += linear_coverage(engine.coverage_model or engine.model, case.recipe)
    if case.backend.timed and curve.step_ms:
        # After the curve is recorded: a few more steps under the profiler, whose kernels say where a step's
        # time goes (the whole-step waterfall); their batches come after the run's, so the record is unchanged.
        extra = iter(range(steps, steps + 100))
        try:
            out.metrics += kernel_metrics(lambda: run.step(next(extra), None), dev, steps=PROFILED_STEPS)
        except RuntimeError as e:  # CUDA OOM, CUPTI; the run is measured: keep it, without a breakdown
            print(f"fp8bench: the profiled steps after {case.case_id} failed, recorded without gpu_* metrics: {e}",
                  flush=True)
    return out


def _begin_census(progress: Progress, params: list, memory: dict, dev: torch.device) -> SavedTensorCensus:
    """Start the one step whose memory is split by what its forward saves (fp8bench.workloads.memory)."""
    progress.sync()
    census = SavedTensorCensus(params)
    if dev.type == "cuda":
        torch.cuda.synchronize()
        memory["run_peak_before"] = int(torch.cuda.max_memory_allocated())
        torch.cuda.reset_peak_memory_stats()
    memory["before_forward"] = allocated(dev)
    return census


def output(case: CaseInput, curve: Curve, memory: dict, diverged_at: int | None = None,
           world: World | None = None, replayed: bool = False, compiled: bool = False) -> CaseOutput:
    """The record of a run from its curve: losses, validation points, steady step times and the speed and
    memory figures they give (peak memory: the largest process's)."""
    s, world = case.shape, world or World()
    timed = steady_steps(curve.step_ms, case.measure.warmup)
    metrics: list[Metric] = []
    samples: dict[str, list[float]] = {"loss": curve.losses, "val_loss": curve.val_losses,
                                       "val_step": [float(v) for v in curve.val_steps]}
    if curve.resumed_at:
        samples["resumed_at_step"] = [float(v) for v in curve.resumed_at]
    if diverged_at is not None:
        samples["diverged_at_step"] = [float(diverged_at)]
    if timed:
        samples["time_ms"] = timed
        timing = Timing(timed, flushed_l2=False, cuda_graph=replayed)
        flops = model_flops(case.config.model, s["vocab"], s["batch"], s["seq"])
        run_peak = peak_memory_bytes(case.device)  # reset at the census step: the run's peak is the larger
        peak = None if run_peak is None else int(world.largest(max(run_peak, memory.get("run_peak_before", 0))))
        # TFLOPS are the whole step's, over every process: a share of one GPU's peak only for one process
        metrics += speed_metrics(case, timing, flops, pct_of_peak=world.size == 1, peak_bytes=peak)
        if case.backend.timed:
            metrics.append(Metric.of("tokens_per_s", s["tokens_per_step"] / (timing.median_ms / 1e3)))
    if curve.val_losses:
        metrics += [Metric.of("loss_initial", curve.val_losses[0]), Metric.of("loss_final", curve.val_losses[-1])]
    metrics += breakdown_metrics(memory, case.device)
    # a diverged run's record too (Diverged carries this output): what ran is part of every train record
    ran = case.backend.kernels("train", case.recipe, case.device)
    return CaseOutput(metrics, samples, ran=ran, graphs=replayed, compiled=compiled)
