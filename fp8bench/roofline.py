"""A roofline model of one GEMM case: what speedup FP8 *can* give on this machine, to set against what it gave.

GEMM time = max(compute, memory) + launch floor, with compute = 2·M·N·K / the format's measured ceiling and
memory = bytes of A, B (and their scales) read and C written / measured copy bandwidth. With quantization (what
training pays, the `time_ms` of a gemm case) each operand's cast adds its own traffic:

| scaling   | passes over the BF16 operand | written                          |
|-----------|------------------------------|----------------------------------|
| current, delayed | 2 (amax, then cast)   | 1 byte/element                   |
| rowwise   | 1 (row amax fused)           | 1 byte/element + 4 bytes/row     |
| blockwise | 1                            | 1 byte/element + 4 bytes/128 or 128² elements |
| mx        | 1                            | 1 byte/element + 1 byte/32       |
| nvfp4     | 2 (global amax, then cast)   | 0.5 byte/element + 1 byte/16     |

Expected speedup = expected BF16 time / expected FP8 time. Ceilings come from `fp8bench calibrate`; no
number here is a guess about the hardware. Torch-free: it runs on DuckDB rows anywhere.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

LAUNCH_US = 4.0
"""Per-kernel launch and tail floor (µs): a CUDA kernel launch plus a wave's tail on an idle GPU."""

CAST = {  # scaling: (reads of the BF16 operand, bytes written per element, scale bytes per element)
    "current": (2, 1.0, 0.0), "delayed": (1, 1.0, 0.0),
    "rowwise": (1, 1.0, None), "blockwise": (1, 1.0, None),
    "mx": (1, 1.0, 1 / 32), "nvfp4": (2, 0.5, 1 / 16),
}
"""Delayed scaling reads its amax from history, so its cast is one pass (the amax of this step is fused)."""


@dataclass(frozen=True)
class Ceiling:
    bf16_tflops: float
    fp8_tflops: float
    copy_gbps: float


def _cast_bytes(rows: int, cols: int, scaling: str, is_weight: bool) -> float:
    reads, written, per_elem = CAST[scaling]
    n = rows * cols
    if per_elem is None:
        scales = rows * 4 if scaling == "rowwise" else 4 * n / (128 * 128 if is_weight else 128)
    else:
        scales = n * per_elem
    return reads * 2 * n + written * n + scales


def gemm_time_ms(m: int, n: int, k: int, fmt: str, scaling: str, ceiling: Ceiling, with_quant: bool = True,
                 b_is_weight: bool = True) -> float:
    bw = ceiling.copy_gbps * 1e6  # bytes per ms
    if fmt == "bf16":
        compute = 2.0 * m * n * k / (ceiling.bf16_tflops * 1e9)
        memory = (2 * (m * k + n * k) + 2 * m * n) / bw
        return max(compute, memory) + LAUNCH_US / 1000
    elem = 0.5 if fmt == "nvfp4" else 1.0
    compute = 2.0 * m * n * k / (ceiling.fp8_tflops * 1e9)
    memory = (elem * (m * k + n * k) + 2 * m * n) / bw
    t = max(compute, memory) + LAUNCH_US / 1000
    if with_quant:
        cast = _cast_bytes(m, k, scaling, False) + _cast_bytes(n, k, scaling, b_is_weight)
        kernels = 2 * (2 if CAST[scaling][0] == 2 else 1)
        t += cast / bw + kernels * LAUNCH_US / 1000
    return t


def expected_speedup(m: int, n: int, k: int, fmt: str, scaling: str, ceiling: Ceiling, with_quant: bool = True,
                     b_is_weight: bool = True) -> float:
    return (gemm_time_ms(m, n, k, "bf16", "none", ceiling) /
            gemm_time_ms(m, n, k, fmt, scaling, ceiling, with_quant, b_is_weight))


def expected_vs_measured(con, with_quant: bool = False):
    """GEMM cases with a BF16 twin in the same run and ceilings for their device: expected and measured
    speedup (kernel-only by default: `time_ms_kernel` against the BF16 time), and the relative error."""
    import pandas as pd

    rows = con.execute("""
        WITH g AS (
          SELECT c.run_id, c.case_id, c.model, c.shape_name, c.backend, c.format, c.scaling, c.shape, r.device_name,
                 max(m.value) FILTER (WHERE m.metric = 'time_ms') AS time_ms,
                 max(m.value) FILTER (WHERE m.metric = 'time_ms_kernel') AS time_ms_kernel
          FROM cases c JOIN runs r USING (run_id) JOIN measurements m USING (run_id, case_id)
          WHERE c.workload = 'gemm' AND c.status = 'ok' AND c.backend != 'emulated' GROUP BY ALL)
        SELECT f.*, b.time_ms AS bf16_ms, k.bf16_tflops, k.fp8_tflops, k.copy_gbps
        FROM g f JOIN g b ON b.run_id = f.run_id AND b.model = f.model AND b.shape_name = f.shape_name
             AND b.backend = f.backend AND b.format = 'bf16'
        JOIN ceilings k ON k.device_name = f.device_name
        WHERE f.format != 'bf16'""").fetchdf()
    if rows.empty:
        return rows
    import json

    out = []
    for r in rows.itertuples():
        shape = json.loads(r.shape)
        ceiling = Ceiling(r.bf16_tflops, r.fp8_tflops, r.copy_gbps)
        measured_ms = r.time_ms if with_quant else r.time_ms_kernel
        if not measured_ms or r.scaling not in CAST:
            continue
        exp = expected_speedup(shape["m"], shape["n"], shape["k"], r.format, r.scaling, ceiling, with_quant,
                               b_is_weight=shape.get("role") != "wgrad")
        meas = r.bf16_ms / measured_ms
        out.append({"run_id": r.run_id, "device": r.device_name, "case_id": r.case_id, "expected": exp,
                    "measured": meas, "rel_error": meas / exp - 1})
    return pd.DataFrame(out)


def median_abs_error(df) -> float | None:
    return statistics.median(abs(e) for e in df["rel_error"]) if len(df) else None
