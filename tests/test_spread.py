"""The between-box spread (fp8bench.analysis.spread): |log(speedup_A / speedup_B)| per series, its quantile as the
half-width, host-bound cases left out, and runs that span GPU models or share a GPU refused."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from fp8bench.analysis import spread


def record(case_id: str, workload: str, speedup: float, host_bound: float = 0.0, kernel: float | None = None):
    metrics = {"speedup_vs_bf16": speedup, "speedup_vs_bf16_lo": speedup * 0.99, "host_bound": host_bound}
    if kernel is not None:
        metrics |= {"speedup_vs_bf16_kernel": kernel, "speedup_vs_bf16_kernel_lo": kernel * 0.99}
    return SimpleNamespace(case_id=case_id, workload=workload, status="ok", metric=metrics.get)


def runs(monkeypatch, by_dir: dict[str, tuple[dict, list]]):
    monkeypatch.setattr(spread, "read_run", lambda d: (*by_dir[Path(d).name], []))


def manifest(run_id: str, gpu: str, device: str = "NVIDIA H200") -> dict:
    return {"run_id": run_id, "device_name": device, "env": {"gpu_uuid": gpu}, "git_commit": "c0ffee0",
            "git_dirty": False}


def test_the_half_width_is_the_quantile_of_the_log_ratios_per_series(monkeypatch):
    runs(monkeypatch, {
        "a": (manifest("a", "gpu-a"), [record("g1", "gemm", 1.50, kernel=1.80), record("g2", "gemm", 1.20),
                                      record("l1", "layer", 1.40), record("l2", "layer", 1.30, host_bound=1.0)]),
        "b": (manifest("b", "gpu-b"), [record("g1", "gemm", 1.47, kernel=1.71), record("g2", "gemm", 1.26),
                                      record("l1", "layer", 1.40), record("l2", "layer", 1.00)]),
    })
    out = spread.between_box_spread([Path("a")], [Path("b")], q=0.95)
    assert out["device_name"] == "NVIDIA H200" and out["boxes"] == {"a": ["gpu-a"], "b": ["gpu-b"]}
    assert out["series"]["gemm"] == {"half_width": pytest.approx(abs(math.log(1.20 / 1.26))), "cases": 2}
    assert out["series"]["gemm_kernel"]["half_width"] == pytest.approx(abs(math.log(1.80 / 1.71)))
    assert out["series"]["layer"] == {"half_width": 0.0, "cases": 1}  # l2 is host-bound on box A: left out
    assert len(out["pairs"]) == 4


def test_runs_of_two_gpu_models_or_one_gpu_are_refused(monkeypatch):
    runs(monkeypatch, {"a": (manifest("a", "gpu-a"), [record("g1", "gemm", 1.5)]),
                       "b": (manifest("b", "gpu-b", "NVIDIA H100"), [record("g1", "gemm", 1.5)]),
                       "c": (manifest("c", "gpu-a"), [record("g1", "gemm", 1.5)]),
                       "empty": (None, [])})
    with pytest.raises(ValueError, match="several GPU models"):
        spread.between_box_spread([Path("a")], [Path("b")])
    with pytest.raises(ValueError, match="share a GPU"):
        spread.between_box_spread([Path("a")], [Path("c")])
    with pytest.raises(ValueError, match="holds no run"):
        spread.between_box_spread([Path("empty")], [Path("a")])
