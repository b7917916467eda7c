"""`fp8bench calibrate`: this machine's measured ceilings, next to its spec sheet.

- BF16 GEMM: the best TFLOPS over a shape search (square and Llama-shaped GEMMs), `a @ b.T`;
- FP8 GEMM: the same search through `torch._scaled_mm` on pre-quantized E4M3 operands (tensorwise scales), with
  and without fast accumulation (the ceiling is the faster);
- copy bandwidth: `dst.copy_(src)` on a buffer far larger than any cache (bytes read + written / time).

Every figure is timed with fp8bench's own timer (fp8bench.core.measure). The result is one JSON file per device
under `results/calibration/` (it travels from a GPU box without DuckDB); `fp8bench ingest` loads it into the
`ceilings` table, and the report divides each case's TFLOPS (GB/s) by its format's ceiling.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

GPU_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (16384, 8192, 8192), (8192, 8192, 16384),
              (8192, 28672, 8192), (8192, 8192, 28672), (16384, 16384, 16384), (8192, 22016, 4096)]
CPU_SHAPES = [(512, 512, 512), (1024, 1024, 1024), (8192, 256, 256)]
"""CPUs have no FP8 units (torch's CPU _scaled_mm is a reference path): small shapes keep calibrate short."""


@dataclass
class Ceilings:
    device_name: str
    device_kind: str
    measured_at: float
    bf16_tflops: float
    fp8_tflops: float
    copy_gbps: float
    spec_bf16_tflops: float | None = None
    spec_fp8_tflops: float | None = None
    spec_gbps: float | None = None
    spec_source: str = ""
    details: dict = field(default_factory=dict)
    """Per shape: TFLOPS of each format; the copy size; the environment fingerprint."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)


def _timer(device: torch.device, budget_s: float) -> dict:
    """The hopper preset's sample budget (up to 50 iterations in a fraction of a second, L2 flushed) without
    settling: the ceiling is the best the chip reaches before its power limit pulls the clocks down. Cases are
    timed after `measure.settle_ms` (MEASUREMENT_VERSION 3), at the level the board holds under sustained load,
    so on a power-capped GPU they sit below it by that much (docs/why-not-2x.md)."""
    return dict(device=device, warmup=5 if device.type == "cuda" else 1, iters=50,
                min_samples=10 if device.type == "cuda" else 3, max_time_s=budget_s, flush_l2=device.type == "cuda")


def gemm_tflops(m: int, n: int, k: int, fp8: bool, device: torch.device, budget_s: float,
                fast_accum: bool = False) -> float:
    from fp8bench.core.measure import time_fn

    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(m, k, generator=g, device=device).bfloat16()
    b = torch.randn(n, k, generator=g, device=device).bfloat16()
    if fp8:
        sa = (448.0 / a.float().abs().amax()).float()
        sb = (448.0 / b.float().abs().amax()).float()
        a8 = (a.float() * sa).to(torch.float8_e4m3fn)
        b8 = (b.float() * sb).to(torch.float8_e4m3fn)
        ia, ib = sa.reciprocal(), sb.reciprocal()

        def fn():
            # on CPU, torch's own FP8 GEMM (oneDNN's is a slow reference without FP8 units; see
            # fp8bench.backends.base.cpu_scaled_mm_path)
            with torch.backends.mkldnn.flags(enabled=device.type != "cpu"):
                return torch._scaled_mm(a8, b8.t(), scale_a=ia, scale_b=ib, out_dtype=torch.bfloat16,
                                        use_fast_accum=fast_accum)
    else:
        def fn():
            return a @ b.t()
    t = time_fn(fn, **_timer(device, budget_s))
    return 2.0 * m * n * k / t.median_ms / 1e9


def copy_op(device: torch.device, nbytes: int) -> Callable[[], object]:
    """A call copying an `nbytes` buffer of random floats into another (2 x nbytes moved: read and written)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def copy_gbps(device: torch.device, nbytes: int, budget_s: float, timer: dict | None = None) -> float:
    """GB/s of copying an `nbytes` buffer (2 x nbytes moved: read and written), timed as the ceilings are, or
    with `time_fn`'s keyword arguments `timer` (a benchmark comparing its kernels with a copy timed as they are)."""
    from fp8bench.core.measure import time_fn

    t = time_fn(copy_op(device, nbytes), **(timer or _timer(device, budget_s)))
    return 2.0 * nbytes / t.median_ms / 1e6


def calibrate(device_info, budget_s: float = 0.15, shapes: list[tuple[int, int, int]] | None = None) -> Ceilings:
    from fp8bench.core.hardware import environment, spec_sheet

    device = device_info.torch_device
    shapes = shapes or (GPU_SHAPES if device_info.is_cuda else CPU_SHAPES)
    per_shape = {}
    for m, n, k in shapes:
        # FP8 at its fastest: Hopper's fast accumulation (no periodic promotion to FP32) is the hardware's
        # ceiling; the default (promoted) path is recorded next to it
        per_shape[f"{m}x{n}x{k}"] = {"bf16_tflops": gemm_tflops(m, n, k, False, device, budget_s),
                                     "fp8_tflops": gemm_tflops(m, n, k, True, device, budget_s),
                                     "fp8_fast_accum_tflops": gemm_tflops(m, n, k, True, device, budget_s, True)}
        if device_info.is_cuda:
            torch.cuda.empty_cache()
    nbytes = 2 * 1024**3 if device_info.is_cuda else 256 * 1024**2
    bw = copy_gbps(device, nbytes, budget_s)
    sheet = spec_sheet(device_info)
    env = environment()
    return Ceilings(
        device_name=device_info.name, device_kind=device_info.kind, measured_at=time.time(),
        bf16_tflops=max(v["bf16_tflops"] for v in per_shape.values()),
        fp8_tflops=max(max(v["fp8_tflops"], v["fp8_fast_accum_tflops"]) for v in per_shape.values()), copy_gbps=bw,
        spec_bf16_tflops=sheet.bf16_tflops if sheet else None, spec_fp8_tflops=sheet.fp8_tflops if sheet else None,
        spec_gbps=sheet.hbm_tbps * 1000 if sheet else None, spec_source=sheet.source if sheet else "",
        details={"shapes": per_shape, "copy_bytes": nbytes, "timer_budget_s": budget_s, "env_id": env["env_id"],
                 "torch": env.get("torch_version"), "cuda": env.get("cuda"), "driver": env.get("driver")})


def slug(device_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", device_name).strip("-").lower() or "device"


def write(ceilings: Ceilings, out_dir: Path) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{slug(ceilings.device_name)}.json"
    path.write_text(ceilings.to_json() + "\n")
    return path


def read(path: Path) -> Ceilings:
    return Ceilings(**json.loads(path.read_text()))
