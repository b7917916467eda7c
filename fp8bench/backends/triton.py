"""`triton`: fp8bench's own kernels (`kernels/`, imported as `fp8bench_kernels`).

The kernels themselves arrive with the kernels issue; until a kernel exists for a case, the case is
recorded `skipped` with that reason (never run under another backend's name).
"""

from __future__ import annotations

import torch

from fp8bench.backends.base import Backend, import_probe


class TritonBackend(Backend):
    name = "triton"
    workloads = frozenset({"gemm", "quantize"})

    def available(self):
        if not torch.cuda.is_available() and not _interpreting():
            return False, "triton kernels need a CUDA GPU (or TRITON_INTERPRET=1 for correctness only)"
        return import_probe("triton", "gpu")

    def supports(self, workload, recipe, device):
        ok, why = super().supports(workload, recipe, device)
        if not ok:
            return ok, why
        return False, f"fp8bench_kernels has no {workload} kernel for {recipe.format.value}/{recipe.scaling.value} yet"


def _interpreting() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"
