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

That table is a fused cast (TE's, torchao's compiled, fp8bench's Triton kernels). The `torch` backend casts
op by op in eager torch, the way a user without those libraries writes it: upcast to FP32, abs, amax, scale,
clamp, downcast, each a kernel reading and writing whole FP32 tensors. `EAGER_CAST` counts what those kernels
move (39 bytes per BF16 element, against 5 for a fused two-pass cast), so a case is modelled with the casts
its backend really runs (`cast_impl`); `expected_fused` is what the same GEMM would give with fused casts.

Expected speedup = expected BF16 time / expected FP8 time. Ceilings come from `fp8bench calibrate`; no
number here is a guess about the hardware. The model itself is torch-free; which casts a backend runs is its
declaration, read through the backends' registry.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from fp8bench.core.records import TIMED_SQL, VARIANT_SQL

LAUNCH_US = 4.0
"""Per-kernel launch and tail floor (µs): a CUDA kernel launch plus a wave's tail on an idle GPU."""

CAST = {  # scaling: (reads of the BF16 operand, bytes written per element, scale bytes per element)
    "current": (2, 1.0, 0.0), "delayed": (1, 1.0, 0.0),
    "rowwise": (1, 1.0, None), "blockwise": (1, 1.0, None),
    "mx": (1, 1.0, 1 / 32), "nvfp4": (2, 0.5, 1 / 16),
}
"""Delayed scaling reads its amax from history, so its cast is one pass (the amax of this step is fused)."""

EAGER_CAST = {  # scaling: (bytes moved per BF16 element, kernels for an activation, kernels for a weight)
    "current": (39.0, 11, 11), "delayed": (39.0, 11, 11), "rowwise": (39.0, 11, 11), "blockwise": (39.0, 12, 13),
}
"""The eager casts of `fp8bench.backends.scaled_mm.quantize_operand`, counted op by op: `.float()` (2 + 4
bytes), `abs` (4 + 4), `amax` (4), `* scale` (4 + 4), `clamp` (4 + 4), `.to(fp8)` (4 + 1), plus scalar and
scale kernels. tests/test_roofline.py recounts them with a dispatch mode, so the table cannot drift from the
code. (The torch backend computes delayed scaling's amax from the tensor itself, like current.)"""

def cast_impl(backend: str) -> str:
    """'eager' for a backend whose casts are eager torch ops (its declaration, `Backend.eager_casts`), else
    'fused'. Reading a declaration imports the backends' registry, and torch with it."""
    from fp8bench import backends

    return "eager" if backends.declared(backend, "eager_casts", False) else "fused"


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


def _eager_cast(rows: int, cols: int, scaling: str, is_weight: bool) -> tuple[float, int]:
    per_elem, kernels_act, kernels_weight = EAGER_CAST[scaling]
    return per_elem * rows * cols, kernels_weight if is_weight else kernels_act


def gemm_time_ms(m: int, n: int, k: int, fmt: str, scaling: str, ceiling: Ceiling, with_quant: bool = True,
                 b_is_weight: bool = True, cast: str = "fused") -> float:
    """`cast`: 'fused' (CAST's passes) or 'eager' (EAGER_CAST's op-by-op traffic)."""
    bw = ceiling.copy_gbps * 1e6  # bytes per ms
    if fmt == "bf16":
        compute = 2.0 * m * n * k / (ceiling.bf16_tflops * 1e9)
        memory = (2 * (m * k + n * k) + 2 * m * n) / bw
        return max(compute, memory) + LAUNCH_US / 1000
    elem = 0.5 if fmt == "nvfp4" else 1.0
    compute = 2.0 * m * n * k / (ceiling.fp8_tflops * 1e9)
    memory = (elem * (m * k + n * k) + 2 * m * n) / bw
    t = max(compute, memory) + LAUNCH_US / 1000
    if with_quant and cast == "eager" and scaling in EAGER_CAST:
        (bytes_a, kernels_a), (bytes_b, kernels_b) = _eager_cast(m, k, scaling, False), _eager_cast(n, k, scaling, b_is_weight)
        t += (bytes_a + bytes_b) / bw + (kernels_a + kernels_b) * LAUNCH_US / 1000
    elif with_quant:
        moved = _cast_bytes(m, k, scaling, False) + _cast_bytes(n, k, scaling, b_is_weight)
        kernels = 2 * (2 if CAST[scaling][0] == 2 else 1)
        t += moved / bw + kernels * LAUNCH_US / 1000
    return t


def expected_speedup(m: int, n: int, k: int, fmt: str, scaling: str, ceiling: Ceiling, with_quant: bool = True,
                     b_is_weight: bool = True, cast: str = "fused") -> float:
    return (gemm_time_ms(m, n, k, "bf16", "none", ceiling) /
            gemm_time_ms(m, n, k, fmt, scaling, ceiling, with_quant, b_is_weight, cast))


def expected_vs_measured(con, with_quant: bool = False):
    """GEMM cases (each from the latest run that has it with its BF16 twin) with ceilings for their device:
    expected and measured
    speedup (kernel-only by default: `time_ms_kernel` against the BF16 time), and the relative error. With
    quantization each case is modelled with its backend's casts (`cast`: eager or fused; none for the kernel
    alone), and `expected_fused` is what fused casts would give the same GEMM."""
    import pandas as pd

    rows = con.execute("""
        WITH g AS (
          SELECT c.run_id, c.case_id, c.model, c.shape_name, c.backend, c.format, c.scaling, c.shape, r.device_name,
                 r.started_at,
                 max(m.value) FILTER (WHERE m.metric = 'time_ms') AS time_ms,
                 max(m.value) FILTER (WHERE m.metric = 'time_ms_kernel') AS time_ms_kernel,
                 max(m.value) FILTER (WHERE m.metric = 'speedup_vs_bf16' AND NOT m.derived) AS side_by_side,
                 max(m.value) FILTER (WHERE m.metric = 'speedup_vs_bf16_kernel') AS side_by_side_kernel,
                 """ + VARIANT_SQL + """ AS variant
          FROM cases c JOIN runs r USING (run_id) JOIN measurements m USING (run_id, case_id)
          WHERE c.workload = 'gemm' AND c.status = 'ok' AND """ + TIMED_SQL + """ GROUP BY ALL)
        SELECT f.*, b.time_ms AS bf16_ms, k.bf16_tflops, k.fp8_tflops, k.copy_gbps
        FROM g f JOIN g b ON b.run_id = f.run_id AND b.model = f.model AND b.shape_name = f.shape_name
             AND b.backend = f.backend AND b.variant = f.variant AND b.format = 'bf16'
        JOIN ceilings k ON k.device_name = f.device_name
        WHERE f.format != 'bf16'
        QUALIFY row_number() OVER (PARTITION BY f.device_name, f.case_id ORDER BY f.started_at DESC) = 1""").fetchdf()
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
        cast = cast_impl(r.backend) if with_quant else "none"
        args = (shape["m"], shape["n"], shape["k"], r.format, r.scaling, ceiling, with_quant,
                shape.get("role") != "wgrad")
        exp = expected_speedup(*args, cast=cast)
        # timed side by side with its twin (measurement version 4) where it was; else the two cases' medians
        side = r.side_by_side if with_quant else r.side_by_side_kernel
        meas = side if side is not None and not pd.isna(side) else r.bf16_ms / measured_ms
        out.append({"run_id": r.run_id, "device": r.device_name, "case_id": r.case_id, "cast": cast,
                    "expected": exp, "expected_fused": expected_speedup(*args), "measured": meas,
                    "rel_error": meas / exp - 1})
    return pd.DataFrame(out)


def median_abs_error(df) -> float | None:
    return statistics.median(abs(e) for e in df["rel_error"]) if len(df) else None
