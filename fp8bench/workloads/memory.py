"""Where a step's memory goes: tensors saved for backward, split by storage dtype (fp8bench's census), and
the phases of one instrumented forward+backward (used by the `layer` and `train` workloads)."""

from __future__ import annotations

import torch

from fp8bench.records import Metric

FP8_STORAGE = {torch.uint8, torch.float8_e4m3fn, torch.float8_e5m2}
"""How FP8 data is stored in saved tensors (TE keeps raw uint8 buffers, torch and torchao float8 dtypes)."""


class SavedTensorCensus:
    """Bytes saved for backward during one forward, split into FP8 storage and everything else (parameters
    excluded; a storage shared by several saved tensors counted once)."""

    def __init__(self, params: list[torch.Tensor]) -> None:
        self.param_ptrs = {p.untyped_storage().data_ptr() for p in params}
        self.seen: set[int] = set()
        self.fp8 = 0
        self.other = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        inner = getattr(t, "_data", None)  # torchao's float8 tensor subclass wraps its FP8 payload
        probe = inner if isinstance(inner, torch.Tensor) else t
        try:
            storage = probe.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError, TypeError):
            key, nbytes = id(probe), probe.numel() * probe.element_size()
        if key not in self.seen and key not in self.param_ptrs:
            self.seen.add(key)
            if probe.dtype in FP8_STORAGE:
                self.fp8 += nbytes
            else:
                self.other += nbytes
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t




def allocated(device: torch.device) -> int:
    return int(torch.cuda.memory_allocated()) if device.type == "cuda" else 0


def step_breakdown(op, params: list[torch.Tensor], device: torch.device) -> list[Metric]:
    """Run one instrumented step of a LinearOp: resident before the forward, saved by it (FP8 vs other
    storage), and the backward's transient peak on top. On CPU only the census (torch keeps no counters)."""
    census = SavedTensorCensus(params)
    phases: dict[str, int] = {}

    def start():  # the previous step's gradients are freed: what is resident now is what a step starts from
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        phases["before"] = allocated(device)

    op.probe(hooks=(census.pack, census.unpack), start=start,
             between=lambda: phases.__setitem__("after_forward", allocated(device)))
    out = [Metric.of("mem_saved_fp8_bytes", census.fp8), Metric.of("mem_saved_hp_bytes", census.other),
           Metric.of("mem_weights_bytes", sum(p.numel() * p.element_size() for p in params))]
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = int(torch.cuda.max_memory_allocated())
        weights = out[-1].value
        out += [Metric.of("mem_persistent_other_bytes", phases["before"] - weights),
                Metric.of("mem_activations_bytes", phases["after_forward"] - phases["before"]),
                Metric.of("mem_transient_bytes", peak - phases["after_forward"]),
                Metric.of("mem_step_peak_bytes", peak)]
    return out
