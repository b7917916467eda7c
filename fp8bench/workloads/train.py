"""`train`: a Llama-style decoder trained for N steps on real text, under one recipe.

Loss per step, validation loss, step time, tokens/s, peak memory and its breakdown go into the record; the
verdict against the BF16 seeds (fp8bench.parity) is derived at ingest, where every case of the run is known.

Mixed precision by default: FP32 master weights and AdamW state, forward under torch.autocast(bf16), the
recipe's FP8 (or the emulator's fake-quant) inside the blocks' linears. Checkpoints (every
`train.ckpt_every` steps) hold model, optimiser, loss-scaler and curve state; batches are a function of
(seed, step), so a resumed run continues exactly where the killed one would have gone.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import torch

from fp8bench.measure import peak_memory_bytes, reset_peak_memory
from fp8bench.records import Metric
from fp8bench.workloads import corpus as corpus_mod
from fp8bench.workloads.common import CaseInput, CaseOutput, Diverged, speed_metrics
from fp8bench.workloads.decoder import LlamaDecoder, lm_loss, model_flops
from fp8bench.workloads.memory import (
    SavedTensorCensus,
    allocated,
    breakdown_metrics,
    optimizer_state_bytes,
    tensor_bytes,
)

FINITE_CHECK_EVERY = 10
"""Steps between NaN/Inf checks of the loss (each check synchronises the GPU once)."""


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
    """Linear warm-up to `lr`, then cosine decay to lr·min_lr_ratio at the last step."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
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
        if self.cuda:
            torch.cuda.synchronize()
            out = [b.elapsed_time(e) for b, e in self.pending]
        else:
            out = [(e - b) / 1e6 for b, e in self.pending]
        self.pending = []
        return out


def _save_checkpoint(path: Path, model, opt, scaler, curve: Curve) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scaler": scaler.state_dict(),
                "curve": curve.__dict__}, tmp)
    os.replace(tmp, path)  # atomic: a kill mid-save leaves the previous checkpoint intact


def _load_checkpoint(path: Path, model, opt, scaler) -> Curve:
    state = torch.load(path, map_location=next(model.parameters()).device, weights_only=False)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    return Curve(**state["curve"])


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


FP8_LINEAR_CLASSES = {"Float8Linear", "FP8Linear", "RecipeLinear"}
"""torchao's, COAT's and fp8bench's (torch/emulated) low-precision linears; te.Linear is told by its module."""


def linear_coverage(model: torch.nn.Module, recipe) -> list[Metric]:
    """How many of the model's linears run the recipe (`linears_fp8`) out of all (`linears_total`): the
    backends and integrations differ here (the output head, Accelerate's first/last-layer filter)."""
    total = low = 0
    for m in model.modules():
        kind = type(m).__name__
        is_te = kind == "Linear" and type(m).__module__.startswith("transformer_engine")
        if isinstance(m, torch.nn.Linear) or is_te or kind in FP8_LINEAR_CLASSES:
            total += 1
            low += recipe.format.value != "bf16" and (is_te or kind in FP8_LINEAR_CLASSES)
    return [Metric.of("linears_fp8", low), Metric.of("linears_total", total)]


def steady_steps(step_ms: list[float], warmup: int) -> list[float]:
    """Step times without the first `warmup` steps (compilation, allocator warm-up), keeping at least one."""
    return step_ms[min(warmup, max(0, len(step_ms) - 1)):] or step_ms


@dataclass
class TrainData:
    """A training case's text on its device: the batch of a step is a function of (seed, step) only, so
    every loop (fp8bench's, Lightning's, Accelerate's) and a resumed run see the same tokens."""

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
    """The case's model, freshly initialised from its seed: every recipe and loop of one seed starts from the
    same weights (FP32 master weights unless `train.master_weights=bf16`)."""
    torch.manual_seed(case.shape["seed"])
    dtype = torch.float32 if case.config.workload.train.master_weights == "fp32" else torch.bfloat16
    return LlamaDecoder(case.config.model, corpus_mod.VOCAB, device=case.device, dtype=dtype)


def run(case: CaseInput) -> CaseOutput:
    if case.config.workload.train.nproc > 1:
        from fp8bench.workloads import dist_train

        return dist_train.run(case)
    if case.backend.loop != "fp8bench":
        from fp8bench.workloads import framework_train

        return framework_train.run(case)
    cfg, dev = case.config.workload.train, case.device
    steps = case.shape["steps"]
    data = load_data(cfg, case.shape, dev)
    val = data.val

    reset_peak_memory(dev)
    setup = case.backend.prepare_training(new_decoder(case), case.recipe)
    model = setup.model
    params = list(model.parameters())
    opt = optimizer(model, cfg, setup.make_optimizer, fused=dev.type == "cuda")
    scaler = torch.amp.GradScaler(dev.type, enabled=cfg.dynamic_loss_scale)
    mixed = cfg.master_weights == "fp32"

    def forward_loss(tokens: torch.Tensor) -> torch.Tensor:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=mixed), setup.forward_context():
            logits = model(tokens[:, :-1])
        return lm_loss(logits, tokens[:, 1:])

    def evaluate() -> float:
        with torch.no_grad(), setup.step_context():
            return float(torch.stack([forward_loss(b) for b in val]).mean())

    def train_step(step: int, census: SavedTensorCensus | None = None) -> torch.Tensor:
        tokens = data.batch_at(step)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        with setup.step_context():
            hooks = (torch.autograd.graph.saved_tensors_hooks(census.pack, census.unpack) if census
                     else contextlib.nullcontext())
            with hooks:
                loss = forward_loss(tokens)
            if census:
                memory["after_forward"] = allocated(dev)
            scaler.scale(loss * cfg.loss_scale if cfg.loss_scale != 1.0 else loss).backward()
            scaler.unscale_(opt)
            if cfg.loss_scale != 1.0:
                torch._foreach_div_([p.grad for p in params if p.grad is not None], cfg.loss_scale)
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip, foreach=True)
            if census:
                memory["grads"] = tensor_bytes(p.grad for p in params)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad(set_to_none=True)
        return loss.detach()

    ckpt = case.work_dir / "checkpoint.pt" if case.work_dir is not None and cfg.ckpt_every else None
    curve = Curve()
    if ckpt is not None and ckpt.is_file():
        curve = _load_checkpoint(ckpt, model, opt, scaler)
        curve.resumed_at.append(curve.step)
    if not curve.val_steps:
        curve.val_steps.append(0)
        curve.val_losses.append(evaluate())

    memory: dict[str, int] = {}
    census: SavedTensorCensus | None = None
    census_step = min(curve.step + 1, steps - 1)
    timer = StepTimer(dev)
    pending: list[torch.Tensor] = []

    def sync_curve() -> None:
        """Move losses and step times off the device; stop with what was measured if the loss went bad."""
        if not pending:
            return
        values = torch.stack(pending).float().cpu().tolist()
        curve.losses += values
        curve.step_ms += timer.drain()
        pending.clear()
        bad = next((i for i, v in enumerate(curve.losses) if not math.isfinite(v)), None)
        if bad is not None:
            raise diverged(f"loss became {curve.losses[bad]} at step {bad} (lr {lr_at(bad, cfg):.3g})", bad)

    def diverged(message: str, at: int) -> Diverged:
        if ckpt is not None and ckpt.is_file():
            ckpt.unlink()  # a diverged run is a result: resuming it would only diverge again
        return Diverged(message, _output(case, curve, memory, diverged_at=at))

    while curve.step < steps:
        k = curve.step
        if k == census_step:
            sync_curve()
            census = SavedTensorCensus(params)
            if dev.type == "cuda":
                torch.cuda.synchronize()
                memory["run_peak_before"] = int(torch.cuda.max_memory_allocated())
                torch.cuda.reset_peak_memory_stats()
            memory["before_forward"] = allocated(dev)
        begin = timer.start()
        pending.append(train_step(k, census if k == census_step else None))
        timer.stop(begin)
        if k == census_step:
            memory["step_peak"] = peak_memory_bytes(dev) or 0
            memory["saved_fp8"], memory["saved_hp"] = census.fp8, census.other
        curve.step = k + 1
        if len(pending) >= FINITE_CHECK_EVERY:
            sync_curve()
        if curve.step % cfg.eval_every == 0 or curve.step == steps:
            sync_curve()
            curve.val_steps.append(curve.step)
            curve.val_losses.append(evaluate())
            if not math.isfinite(curve.val_losses[-1]):
                raise diverged(f"validation loss became {curve.val_losses[-1]} at step {curve.step}", curve.step)
        if ckpt is not None and curve.step % cfg.ckpt_every == 0 and curve.step < steps:
            sync_curve()
            _save_checkpoint(ckpt, model, opt, scaler, curve)
    sync_curve()
    memory["weights"] = tensor_bytes(params)
    memory["optimizer"] = optimizer_state_bytes(opt)
    if ckpt is not None and ckpt.is_file():
        ckpt.unlink()  # the record now holds the run; checkpoints of large models are GBs
    out = _output(case, curve, memory)
    out.metrics += linear_coverage(model, case.recipe)
    return out


def _output(case: CaseInput, curve: Curve, memory: dict, diverged_at: int | None = None) -> CaseOutput:
    s = case.shape
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
        timing = SimpleNamespace(median_ms=statistics.median(timed), injected_slowdown=None)
        flops = model_flops(case.config.model, s["vocab"], s["batch"], s["seq"])
        run_peak = peak_memory_bytes(case.device)  # reset at the census step: the run's peak is the larger
        metrics += speed_metrics(case, timing, flops, peak_bytes=None if run_peak is None
                                 else max(run_peak, memory.get("run_peak_before", 0)))
        if case.backend.timed:
            metrics.append(Metric.of("tokens_per_s", s["tokens_per_step"] / (timing.median_ms / 1e3)))
    if curve.val_losses:
        metrics += [Metric.of("loss_initial", curve.val_losses[0]), Metric.of("loss_final", curve.val_losses[-1])]
    metrics += breakdown_metrics(memory, case.device)
    return CaseOutput(metrics, samples)
