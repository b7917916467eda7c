"""The `train` workload in a framework's loop, as its users write it: Lightning's `Trainer.fit`, or an
Accelerate loop (`accelerator.prepare` / `backward` / `clip_grad_norm_`).

Everything else is the `train` workload's (fp8bench.workloads.train.loop): the same seeded model, the same
batch for each step, learning-rate schedule, AdamW groups, validation points and record, so a framework's row
differs from the direct `te` / `torchao` row only by what the framework adds. Accelerate's steps run in the
shared loop (`fit`) with Accelerate's backward and clipping; Lightning's run in `Trainer.fit`, timed from one
step's start to the next on the GPU timeline, so the framework's work between steps is counted; validation
is left out of it. Neither records the saved-tensor census (the memory record has weights, optimizer state
and the peak); settings a framework's loop does not honour are refused at plan time (`Backend.unsupported_train`).
"""

from __future__ import annotations

import torch

from fp8bench.backends.base import is_compiled
from fp8bench.core.measure import reset_peak_memory
from fp8bench.models.decoder import lm_loss
from fp8bench.workloads.common import CaseInput, CaseOutput
from fp8bench.workloads.memory import optimizer_state_bytes, tensor_bytes
from fp8bench.workloads.train.loop import (
    Engine,
    Progress,
    fit,
    linear_coverage,
    load_data,
    lr_at,
    new_decoder,
    optimizer,
    output,
)


def run(case: CaseInput) -> CaseOutput:
    """The case in its backend's framework loop; the settings that loop does not honour were refused when the
    case was planned (`Backend.unsupported_train`)."""
    return {"lightning": _lightning, "accelerate": _accelerate}[case.backend.loop](case)


def _lightning(case: CaseInput) -> CaseOutput:
    import lightning.pytorch as pl

    cfg, dev, steps = case.config.workload.train, case.device, case.shape["steps"]
    data = load_data(cfg, case.shape, dev)
    reset_peak_memory(dev)
    model = new_decoder(case)
    progress = Progress(case)
    precision = case.backend.precision(case.recipe, mixed=cfg.master_weights == "fp32")

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            tokens = data.batch_at(self.global_step)
            return lm_loss(self.model(tokens[:, :-1]), tokens[:, 1:])

        def configure_optimizers(self):
            # Lightning's mixed-precision plugin refuses to clip the gradients of a fused AdamW (it "unscales
            # internally"): there it gets torch's default foreach AdamW; the TE plugin takes the fused one
            fused = dev.type == "cuda" and not isinstance(precision, str)
            opt = optimizer(self.model, cfg, fused=fused)
            schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_at(step, cfg) / cfg.lr)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    class Record(pl.Callback):
        def evaluate(self, trainer) -> float:
            with torch.no_grad(), trainer.strategy.precision_plugin.forward_context():
                return float(torch.stack([lm_loss(model(b[:, :-1]), b[:, 1:]) for b in data.val]).mean())

        def on_train_start(self, trainer, pl_module):
            progress.validate(lambda: self.evaluate(trainer))

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            progress.step_begins()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            progress.step_ends(outputs["loss"], lambda: self.evaluate(trainer))

    trainer = pl.Trainer(
        accelerator="gpu" if dev.type == "cuda" else "cpu", devices=1, max_steps=steps, max_epochs=1,
        **({"precision": precision} if isinstance(precision, str) else {"plugins": [precision]}),
        gradient_clip_val=cfg.grad_clip or None, gradient_clip_algorithm="norm", callbacks=[Record()],
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0)
    # one "sample" per step: the batch itself is a function of the step (TrainData.batch_at)
    trainer.fit(Module(), train_dataloaders=torch.utils.data.DataLoader(range(steps), batch_size=None))
    progress.close()
    progress.sync()
    opt = trainer.optimizers[0]
    out = output(case, progress.curve, {"weights": tensor_bytes(model.parameters()),
                                        "optimizer": optimizer_state_bytes(opt)})
    out.metrics += linear_coverage(model, case.recipe)
    return out


def _accelerate(case: CaseInput) -> CaseOutput:
    cfg, dev = case.config.workload.train, case.device
    data = load_data(cfg, case.shape, dev)
    reset_peak_memory(dev)
    accelerator = case.backend.accelerator(case.recipe, dev)
    model = new_decoder(case)
    opt = optimizer(model, cfg, fused=dev.type == "cuda")
    model, opt = accelerator.prepare(model, opt)  # converts the linears (TE / torchao) and wraps the forward
    engine = Engine(model, opt, autocast=False, backward=accelerator.backward,
                    clip=accelerator.clip_grad_norm_,
                    step_context=lambda: case.backend.step_context(case.recipe, dev), census=False,
                    coverage_model=model, compiled=is_compiled(model))
    try:
        return fit(case, engine, data)
    finally:
        accelerator.free_memory()

