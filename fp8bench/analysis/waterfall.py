"""The speedup waterfall: why an FP8 linear, layer or training step is not 2x its BF16 twin, from measured
components (the per-step kernel times by category that fp8bench.workloads.profile records), not guesses.

With T the measured step time and, per step, G the linears' GEMM kernels, Q the FP8 cast/transpose/amax
kernels, A attention, O everything else and idle = T - busy (the GPU waiting on the CPU: launch overhead,
Python), each stage replaces one more BF16 component by its FP8 measurement:

    promise        2x
    ideal          T16 / (T16 - G16/2): every GEMM twice as fast, nothing else changes or is added
    GEMM kernels   T16 / (T16 - G16 + G8)
    + casts        ... + (Q8 - Q16)
    + non-GEMM     ... + (A8 - A16) + (O8 - O16)
    + idle         ... + (idle8 - idle16) = T8: the measured speedup

The components of the FP8 step add up to its measured time by construction (idle is the remainder); how much
of it the kernels explain, `busy / T`, is reported next to it (a step far from 100% is CPU-bound). The
kernels are recorded in profiled steps after the timed ones; `gpu_profiled_step_ms` (their own wall time)
says whether those steps ran like the timed ones.
Torch-free: it runs on DuckDB rows anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from fp8bench.core.records import VARIANT_SQL

PARTS = ("gemm", "quantize", "attention", "other")


@dataclass(frozen=True)
class Step:
    time_ms: float
    gemm: float
    quantize: float
    attention: float
    other: float
    busy: float

    @property
    def idle(self) -> float:
        return self.time_ms - self.busy

    @property
    def kernels(self) -> float:
        return self.gemm + self.quantize + self.attention + self.other


@dataclass(frozen=True)
class Waterfall:
    ideal: float
    gemm_only: float
    with_casts: float
    with_non_gemm: float
    measured: float
    explained_pct: float
    """Kernel time of the FP8 step as % of its measured time."""

    def stages(self) -> list[tuple[str, float]]:
        return [("promise", 2.0), ("ideal", self.ideal), ("gemm", self.gemm_only), ("+casts", self.with_casts),
                ("+non-gemm", self.with_non_gemm), ("measured", self.measured)]


def waterfall(bf16: Step, fp8: Step) -> Waterfall:
    # The kernel stages start from the BF16 step as the profiler saw it when its kernels add up to more than
    # the separately timed step, so no stage promises more than 2x. That happens where the timed steps ran
    # before the clocks had settled (measurement version 2), not from the tracing, which does not lengthen the
    # kernels it records (docs/why-not-2x.md).
    t16 = max(bf16.time_ms, bf16.busy)
    after_gemm = t16 - bf16.gemm + fp8.gemm
    after_casts = after_gemm + fp8.quantize - bf16.quantize
    after_other = after_casts + (fp8.attention - bf16.attention) + (fp8.other - bf16.other)
    return Waterfall(ideal=t16 / (t16 - bf16.gemm / 2), gemm_only=t16 / after_gemm, with_casts=t16 / after_casts,
                     with_non_gemm=t16 / after_other, measured=bf16.time_ms / fp8.time_ms,
                     explained_pct=100.0 * fp8.busy / fp8.time_ms)


class CaseWaterfall(NamedTuple):
    case_id: str
    bf16_case: str
    fp8: Step
    bf16: Step
    waterfall: Waterfall
    run_id: str


def from_db(con) -> list[CaseWaterfall]:
    """The waterfall of every linear/layer/train FP8 case with kernel metrics and a BF16 case of the same run,
    model, shape, backend and variant: one per case, from the latest run that has it (a case re-run is one
    case, not several rows)."""
    rows = con.execute("""
        WITH k AS (
          SELECT c.run_id, c.case_id, r.started_at, r.device_name, c.workload, c.model, c.shape_name, c.backend, c.format,
                 """ + VARIANT_SQL + """ AS variant,
                 max(m.value) FILTER (WHERE m.metric = 'time_ms') AS time_ms,
                 max(m.value) FILTER (WHERE m.metric = 'gpu_gemm_ms') AS gemm,
                 max(m.value) FILTER (WHERE m.metric = 'gpu_quantize_ms') AS quantize,
                 max(m.value) FILTER (WHERE m.metric = 'gpu_attention_ms') AS attention,
                 -- a training step's optimizer and communication kernels are non-GEMM time like the rest
                 max(m.value) FILTER (WHERE m.metric = 'gpu_other_ms')
                   + coalesce(max(m.value) FILTER (WHERE m.metric = 'gpu_optimizer_ms'), 0)
                   + coalesce(max(m.value) FILTER (WHERE m.metric = 'gpu_communication_ms'), 0) AS other,
                 max(m.value) FILTER (WHERE m.metric = 'gpu_busy_ms') AS busy
          FROM cases c JOIN runs r USING (run_id) JOIN measurements m USING (run_id, case_id)
          WHERE c.workload IN ('linear', 'mlp', 'layer', 'train') AND c.status = 'ok' GROUP BY ALL)
        SELECT f.*, b.case_id AS bf16_case, b.time_ms AS b_time_ms, b.gemm AS b_gemm, b.quantize AS b_quantize,
               b.attention AS b_attention, b.other AS b_other, b.busy AS b_busy
        FROM k f JOIN k b ON b.run_id = f.run_id AND b.workload = f.workload AND b.model = f.model
             AND b.shape_name = f.shape_name AND b.backend = f.backend AND b.variant = f.variant
             AND b.format = 'bf16'
        WHERE f.format != 'bf16' AND f.busy IS NOT NULL AND b.busy IS NOT NULL
        QUALIFY row_number() OVER (PARTITION BY f.device_name, f.case_id ORDER BY f.started_at DESC) = 1
        ORDER BY f.workload, f.model, f.shape_name, f.backend, f.case_id""").fetchall()
    cols = [d[0] for d in con.description]
    out = []
    for row in rows:
        r = dict(zip(cols, row, strict=True))
        fp8 = Step(r["time_ms"], r["gemm"], r["quantize"], r["attention"], r["other"], r["busy"])
        bf16 = Step(r["b_time_ms"], r["b_gemm"], r["b_quantize"], r["b_attention"], r["b_other"], r["b_busy"])
        out.append(CaseWaterfall(r["case_id"], r["bf16_case"], fp8, bf16, waterfall(bf16, fp8), r["run_id"]))
    return out
