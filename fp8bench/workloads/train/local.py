"""The `train` workload in one process: the backend prepares the model, fp8bench's loop trains it."""

from __future__ import annotations

from fp8bench.backends.base import is_compiled
from fp8bench.core.measure import reset_peak_memory
from fp8bench.workloads.common import CaseInput, CaseOutput
from fp8bench.workloads.train.loop import Engine, TrainData, fit, load_data, new_decoder, optimizer


def build_engine(case: CaseInput) -> tuple[Engine, TrainData]:
    """The case's model, freshly initialised from its seed and prepared by its backend, its optimiser and its
    data: what `run` trains, and what a training sandwich times (fp8bench.workloads.train.sandwich)."""
    cfg, dev = case.config.workload.train, case.device
    data = load_data(cfg, case.shape, dev)
    setup = case.backend.prepare_training(new_decoder(case), case.recipe)
    autocast = cfg.master_weights == "fp32"
    model = setup.model
    if setup.capture:  # the first batch's shape is every batch's (validation's too)
        model = setup.capture(model, data.batch_at(0)[:, :-1].contiguous(), autocast)
    opt = optimizer(model, cfg, setup.make_optimizer, fused=dev.type == "cuda")
    # a replayed graph's saved tensors are its own, out of reach of the census's saved-tensor hooks
    engine = Engine(model, opt, autocast=autocast, forward_context=setup.forward_context,
                    step_context=setup.step_context, census=setup.capture is None, replayed=setup.capture is not None,
                    compiled=is_compiled(setup.model))
    return engine, data


def run(case: CaseInput) -> CaseOutput:
    reset_peak_memory(case.device)
    engine, data = build_engine(case)
    return fit(case, engine, data)
