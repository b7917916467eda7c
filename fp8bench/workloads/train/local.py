"""The `train` workload in one process: the backend prepares the model, fp8bench's loop trains it."""

from __future__ import annotations

from fp8bench.core.measure import reset_peak_memory
from fp8bench.workloads.common import CaseInput, CaseOutput
from fp8bench.workloads.train.loop import Engine, fit, load_data, new_decoder, optimizer


def run(case: CaseInput) -> CaseOutput:
    cfg, dev = case.config.workload.train, case.device
    data = load_data(cfg, case.shape, dev)
    reset_peak_memory(dev)
    setup = case.backend.prepare_training(new_decoder(case), case.recipe)
    opt = optimizer(setup.model, cfg, setup.make_optimizer, fused=dev.type == "cuda")
    engine = Engine(setup.model, opt, autocast=cfg.master_weights == "fp32", forward_context=setup.forward_context,
                    step_context=setup.step_context)
    return fit(case, engine, data)
