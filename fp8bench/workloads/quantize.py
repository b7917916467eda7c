"""`quantize`: cast kernels on the activation (tokens × hidden) and the largest weight; GB/s."""

from __future__ import annotations

from fp8bench.core.measure import time_fn
from fp8bench.core.numerics import fake_quant, rel_err, sqnr_db
from fp8bench.core.records import Metric
from fp8bench.workloads.common import (
    CaseInput,
    CaseOutput,
    check_against_emulator,
    generator,
    randn,
    timer_kwargs,
)


def run(case: CaseInput) -> CaseOutput:
    s, dev = case.shape, case.device
    g = generator(case.config, case.shape_name, dev)
    x = randn((s["rows"], s["cols"]), g, dev)
    is_weight = s["tensor"] == "weight"
    op = case.backend.quantize(x, case.recipe, is_weight)
    timing = time_fn(op.run, **timer_kwargs(case))
    deq = op.dequantized()
    metrics = [Metric.of("time_ms", timing.median_ms),
               Metric.of("gbps", op.bytes_moved / timing.median_ms / 1e6),
               Metric.of("sqnr_db", sqnr_db(x, deq)), Metric.of("rel_err", rel_err(x, deq))]
    if not case.backend.reference:
        eff = case.backend.effective_recipe(case.recipe)
        emu = fake_quant(x, eff.format, eff.scaling, eff.options(is_weight=is_weight))
        vs = sqnr_db(emu, deq)
        metrics.append(Metric.of("sqnr_vs_emulated_db", vs))
        check_against_emulator(case.recipe.format, vs, f"{case.backend.name} cast")
    return CaseOutput(metrics, {"time_ms": timing.samples_ms})
