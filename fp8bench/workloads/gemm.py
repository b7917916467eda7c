"""`gemm`: the fprop, dgrad and wgrad GEMMs of every distinct linear of a model, or explicit M×N×K."""

from __future__ import annotations

from fp8bench.backends.emulator import emulated_gemm
from fp8bench.core.measure import steady_peak_bytes
from fp8bench.core.numerics import rel_err, sqnr_db
from fp8bench.core.records import Metric
from fp8bench.core.types import Format, GemmRole
from fp8bench.workloads.common import (
    NUMERICS_ROWS,
    CaseInput,
    CaseOutput,
    Prepared,
    check_against_emulator,
    generator,
    randn,
    run_alone,
    speed_metrics,
    timing_samples,
)


def flops(shape: dict) -> float:
    return 2.0 * shape["m"] * shape["n"] * shape["k"]


def prepare(case: CaseInput) -> Prepared:
    s, dev = case.shape, case.device
    g = generator(case.config, case.shape_name, dev)
    a = randn((s["m"], s["k"]), g, dev)
    b = randn((s["n"], s["k"]), g, dev)
    role = GemmRole(s["role"])
    op = case.backend.gemm(a, b, role, case.recipe)
    peak = None  # the emulator's memory is not a kernel's: it runs once, for its numerics
    if case.backend.timed:
        op.with_quant()  # first-call allocations (workspaces, autotuning) before memory is read
        peak = steady_peak_bytes(op.with_quant, dev, case.others_bytes)
    timed = {"time_ms": op.with_quant}
    if op.real_kernel and op.kernel_only is not None and case.recipe.format is not Format.BF16:
        timed["time_ms_kernel"] = op.kernel_only

    def finish(timings: dict) -> CaseOutput:
        timing = timings["time_ms"]
        metrics = speed_metrics(case, timing, flops(s), peak_bytes=peak)
        samples = timing_samples("time_ms", timing)
        if "time_ms_kernel" in timings:
            kt = timings["time_ms_kernel"]
            metrics.append(Metric.of("time_ms_kernel", kt.median_ms))
            metrics.append(Metric.of("tflops_kernel", flops(s) / kt.median_ms / 1e9))
            samples |= timing_samples("time_ms_kernel", kt)
        rows = min(NUMERICS_ROWS, s["m"])
        out = (timing.last_result if timing.last_result is not None else op.with_quant())[:rows].float()
        ref = a[:rows].double() @ b.double().t()
        metrics += [Metric.of("sqnr_db", sqnr_db(ref, out)), Metric.of("rel_err", rel_err(ref, out))]
        if op.real_kernel and case.recipe.format is not Format.BF16:
            emu = emulated_gemm(a, b, role, case.backend.effective_recipe(case.recipe), rows=rows)
            vs = sqnr_db(emu, out)
            metrics.append(Metric.of("sqnr_vs_emulated_db", vs))
            check_against_emulator(case.recipe.format, vs, f"{case.backend.name} GEMM output")
        return CaseOutput(metrics, samples, ran=dict(op.ran), graphs=timings["time_ms"].cuda_graph)

    return Prepared(timed, finish, cuda_graph=case.measure.cuda_graph)


def run(case: CaseInput) -> CaseOutput:
    return run_alone(case, prepare)
