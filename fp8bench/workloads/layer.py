"""`layer`: one transformer block forward + backward at (batch, seq) of the model preset.

TE runs its `TransformerLayer` (RMSNorm, SwiGLU, GQA, causal attention); the other backends run the plain-torch
`LlamaBlock` with their linears. Numerics: the block's output under the recipe against the same block's
BF16 output (same weights), since a full-layer FP64 reference would dominate the case's time. TE's layer is
scored against our FP32 LlamaBlock carrying its weights (fp8bench.backends.te_reference), and every TE case
records `reference_sqnr_db`, TE's BF16 layer against that reference: the check that the reference computes
the same block. Below REFERENCE_MIN_DB no `sqnr_db` is recorded: it would measure the reference.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from fp8bench.backends.base import REFERENCE_MIN_DB, LinearOp, reference_agreement
from fp8bench.core.measure import peak_memory_bytes, reset_peak_memory, steady_peak_bytes
from fp8bench.core.numerics import rel_err, sqnr_db
from fp8bench.core.records import Metric
from fp8bench.core.types import Format
from fp8bench.models.block import block_flops
from fp8bench.workloads.common import (
    CaseInput,
    CaseOutput,
    Prepared,
    generator,
    randn,
    run_alone,
    speed_metrics,
    timing_samples,
)
from fp8bench.workloads.memory import step_breakdown
from fp8bench.workloads.profile import kernel_metrics


def prepare(case: CaseInput) -> Prepared:
    return prepare_module(case, case.backend.layer, block_flops(case.config.model, case.shape["batch"], case.shape["seq"]),
                          REFERENCE_MIN_DB)


def prepare_module(case: CaseInput, build: Callable[..., LinearOp], flops: float, reference_min_db: float) -> Prepared:
    """A module case (a block, or its MLP: fp8bench.workloads.mlp): `build(model, x, dy, recipe)` gives the
    backend's module; `flops` its fwd+bwd FLOPs; below `reference_min_db` a reference_check's reference is
    not trusted to score the FP8 output."""
    s, dev = case.shape, case.device
    g = generator(case.config, case.shape_name, dev)
    x = randn((s["batch"], s["seq"], s["hidden"]), g, dev)
    dy = randn((s["batch"], s["seq"], s["hidden"]), g, dev, scale=1e-2)
    torch.manual_seed(case.config.seed)  # module initialisation: same weights for every recipe
    reset_peak_memory(dev)
    op = build(case.config.model, x, dy, case.recipe)
    metrics, peak = [], None
    if case.backend.timed:  # the emulator's memory is not a kernel's: it runs once, for its numerics
        # The first step also builds library state (cuDNN attention plans, cuBLAS workspaces, TE's FP8
        # weight caches) with one-off transients; peak_mem_bytes is the steady state every later step
        # repeats, and the first step's own peak is recorded next to it.
        op.step()
        first_peak = peak_memory_bytes(dev)
        if first_peak is not None:
            metrics.append(Metric.of("peak_mem_first_step_bytes", first_peak - case.others_bytes))
        peak = steady_peak_bytes(op.step, dev, case.others_bytes)
        if op.probe is not None:  # one more, instrumented step: where that peak goes
            metrics += step_breakdown(op, op.params, dev, others_bytes=case.others_bytes)

    def finish(timings: dict) -> CaseOutput:
        timing = timings["time_ms"]
        out = speed_metrics(case, timing, flops, peak_bytes=peak)
        out += metrics
        if case.backend.timed:  # after timing: the profiler's overhead stays out of time_ms
            out += kernel_metrics(op.step, dev)
        y_hp, reference_ok = None, True
        if op.reference_check is not None:  # first: a reference that is not the module's block scores nothing
            own, y_hp = op.reference_check()
            agreement = reference_agreement(own, y_hp)
            del own
            out.append(Metric.of("reference_sqnr_db", agreement))
            reference_ok = agreement >= reference_min_db
        if case.recipe.format is not Format.BF16 and reference_ok:
            y, _, _ = op.outputs()
            if y_hp is None:
                y_hp, _, _ = op.reference_outputs()
            out += [Metric.of("sqnr_db", sqnr_db(y_hp, y)), Metric.of("rel_err", rel_err(y_hp, y))]
        return CaseOutput(out, timing_samples("time_ms", timing),
                          ran=case.backend.kernels(case.config.workload.name, case.recipe, dev), compiled=op.compiled)

    return Prepared({"time_ms": op.step}, finish)


def run(case: CaseInput) -> CaseOutput:
    return run_alone(case, prepare)
