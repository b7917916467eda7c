"""Workloads: each module gives `run(case_input)`; the shapes of a sweep point are in `fp8bench.models.shapes`."""

from __future__ import annotations

from types import ModuleType

from fp8bench.core.types import WorkloadName, choices


def get_workload(name: str) -> ModuleType:
    if name == "gemm":
        from fp8bench.workloads import gemm as mod
    elif name == "quantize":
        from fp8bench.workloads import quantize as mod
    elif name == "linear":
        from fp8bench.workloads import linear as mod
    elif name == "mlp":
        from fp8bench.workloads import mlp as mod
    elif name == "layer":
        from fp8bench.workloads import layer as mod
    elif name == "train":
        from fp8bench.workloads import train as mod
    else:
        raise ValueError(f"workload={name!r} is not implemented; choose one of "
                         f"{choices(WorkloadName)}")
    return mod
