"""`linear`: one linear layer forward + backward (fprop, dgrad, wgrad and the casts a recipe adds)."""

from __future__ import annotations

import math

import torch

from fp8bench.backends.emulated import EmulatedBackend
from fp8bench.config.schema import Config
from fp8bench.measure import peak_memory_bytes, reset_peak_memory, time_fn
from fp8bench.numerics import rel_err, sqnr_db
from fp8bench.records import Metric
from fp8bench.types import Format
from fp8bench.workloads.common import CaseInput, CaseOutput, check_against_emulator, generator, randn


def shapes(config: Config) -> list[tuple[str, dict]]:
    out = []
    for lin in config.workload.linears:
        in_f, out_f = config.model.linear_dims(lin)
        out.append((lin, {"tokens": config.workload.tokens, "in": in_f, "out": out_f}))
    return out


def flops(shape: dict) -> float:
    return 3 * 2.0 * shape["tokens"] * shape["in"] * shape["out"]


def run(case: CaseInput) -> CaseOutput:
    s, dev, ms = case.shape, case.device, case.measure
    g = generator(case.config, case.shape_name, dev)
    x = randn((s["tokens"], s["in"]), g, dev)
    w = randn((s["out"], s["in"]), g, dev, scale=1.0 / math.sqrt(s["in"]))
    dy = randn((s["tokens"], s["out"]), g, dev)
    reset_peak_memory(dev)
    op = case.backend.linear(x, w, dy, case.recipe)
    timing = time_fn(op.step, device=dev, warmup=ms.warmup, iters=ms.iters, min_samples=ms.min_samples,
                     max_time_s=ms.max_time_s, flush_l2=ms.flush_l2, cuda_graph=False)
    metrics = [Metric.of("time_ms", timing.median_ms)]
    peak = peak_memory_bytes(dev)
    if peak is not None:
        metrics.append(Metric.of("peak_mem_bytes", peak))
    if case.backend.name != "emulated":
        metrics.append(Metric.of("tflops", flops(s) / timing.median_ms / 1e9))
    y, dx, dw = op.outputs()
    xd, wd, dyd = x.double(), w.double(), dy.double()
    y_ref, dx_ref, dw_ref = xd @ wd.t(), dyd @ wd, dyd.t() @ xd
    metrics += [Metric.of("sqnr_db", sqnr_db(y_ref, y)), Metric.of("rel_err", rel_err(y_ref, y)),
                Metric.of("dgrad_sqnr_db", sqnr_db(dx_ref, dx)), Metric.of("wgrad_sqnr_db", sqnr_db(dw_ref, dw))]
    if case.backend.name != "emulated" and case.recipe.format is not Format.BF16:
        y_emu, _, _ = EmulatedBackend().linear(x, w, dy, case.backend.effective_recipe(case.recipe)).outputs()
        vs = sqnr_db(y_emu, y)
        metrics.append(Metric.of("sqnr_vs_emulated_db", vs))
        check_against_emulator(case.recipe.format, vs, f"{case.backend.name} linear output")
    if dev.type == "cuda":
        del op
        torch.cuda.empty_cache()
    return CaseOutput(metrics, {"time_ms": timing.samples_ms})
