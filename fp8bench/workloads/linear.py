"""`linear`: one linear layer forward + backward (fprop, dgrad, wgrad and the casts a recipe adds)."""

from __future__ import annotations

import math

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
from fp8bench.workloads.profile import kernel_metrics


def flops(shape: dict) -> float:
    return 3 * 2.0 * shape["tokens"] * shape["in"] * shape["out"]


def prepare(case: CaseInput) -> Prepared:
    s, dev = case.shape, case.device
    g = generator(case.config, case.shape_name, dev)
    x = randn((s["tokens"], s["in"]), g, dev)
    w = randn((s["out"], s["in"]), g, dev, scale=1.0 / math.sqrt(s["in"]))
    dy = randn((s["tokens"], s["out"]), g, dev)
    op = case.backend.linear(x, w, dy, case.recipe)
    peak = None  # the emulator's memory is not a kernel's: it runs once, for its numerics
    if case.backend.timed:
        op.step()  # first-call allocations (gradients, workspaces) before memory is read
        peak = steady_peak_bytes(op.step, dev, case.others_bytes)

    def finish(timings: dict) -> CaseOutput:
        timing = timings["time_ms"]
        metrics = speed_metrics(case, timing, flops(s), pct_of_peak=False, peak_bytes=peak)
        if case.backend.timed:  # after timing: the profiler's overhead stays out of time_ms
            metrics += kernel_metrics(op.step, dev)
        y, dx, dw = op.outputs()
        # References on the first rows (tokens) of y and dx and the first output features of dW.
        r, c = min(NUMERICS_ROWS, s["tokens"]), min(NUMERICS_ROWS, s["out"])
        xd, wd, dyd = x.double(), w.double(), dy.double()
        y_ref, dx_ref, dw_ref = xd[:r] @ wd.t(), dyd[:r] @ wd, dyd[:, :c].t() @ xd
        metrics += [Metric.of("sqnr_db", sqnr_db(y_ref, y[:r])), Metric.of("rel_err", rel_err(y_ref, y[:r])),
                    Metric.of("dgrad_sqnr_db", sqnr_db(dx_ref, dx[:r])),
                    Metric.of("wgrad_sqnr_db", sqnr_db(dw_ref, dw[:c]))]
        if case.backend.timed and case.recipe.format is not Format.BF16:
            y_emu = emulated_gemm(x, w, GemmRole.FPROP, case.backend.effective_recipe(case.recipe), rows=r)
            vs = sqnr_db(y_emu, y[:r])
            metrics.append(Metric.of("sqnr_vs_emulated_db", vs))
            check_against_emulator(case.recipe.format, vs, f"{case.backend.name} linear output")
        return CaseOutput(metrics, timing_samples("time_ms", timing),
                          ran=case.backend.kernels("linear", case.recipe, dev), compiled=op.compiled)

    return Prepared({"time_ms": op.step}, finish)


def run(case: CaseInput) -> CaseOutput:
    return run_alone(case, prepare)
