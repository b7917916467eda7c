"""Where a step's memory goes: tensors saved for backward, split by storage dtype (fp8bench's census), and
the phases of one instrumented forward+backward (used by the `layer` and `train` workloads)."""

from __future__ import annotations

import torch

from fp8bench.core.records import Metric

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


def tensor_bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    return tensor_bytes(v for state in opt.state.values() for v in state.values())


def breakdown_metrics(phases: dict, device: torch.device) -> list[Metric]:
    """One step's peak split into what was resident before its forward (weights, optimiser state, everything
    else), what the forward saved for backward (and of that, FP8 and high-precision storage), and the
    backward's transient (gradients, temporaries) on top: the parts add up to `step_peak` by construction.

    `phases` keys: weights, saved_fp8, saved_hp and optionally optimizer, grads; on CUDA also before_forward,
    after_forward and step_peak (allocator counters; CPU has none, so there only the census is reported)."""
    out = [Metric.of(name, phases[key]) for key, name in (
        ("weights", "mem_weights_bytes"), ("optimizer", "mem_optimizer_bytes"), ("grads", "mem_grads_bytes"),
        ("saved_fp8", "mem_saved_fp8_bytes"), ("saved_hp", "mem_saved_hp_bytes")) if key in phases]
    if device.type == "cuda" and all(k in phases for k in ("weights", "before_forward", "after_forward", "step_peak")):
        before, after_fwd, peak = phases["before_forward"], phases["after_forward"], phases["step_peak"]
        out += [Metric.of("mem_persistent_other_bytes", before - phases["weights"] - phases.get("optimizer", 0)),
                Metric.of("mem_activations_bytes", after_fwd - before),
                Metric.of("mem_transient_bytes", peak - after_fwd),
                Metric.of("mem_step_peak_bytes", peak)]
    return out


def step_breakdown(op, params: list[torch.Tensor], device: torch.device, others_bytes: int = 0) -> list[Metric]:
    """Run one instrumented step of a LinearOp (fp8bench.backends.base.module_op) and break its peak down.
    `others_bytes`: memory other live cases hold (fp8bench.workloads.common.CaseInput), left out of every
    allocator reading."""
    census = SavedTensorCensus(params)
    phases: dict[str, int] = {"weights": tensor_bytes(params)}

    def start():  # the previous step's gradients are freed: what is resident now is what a step starts from
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        phases["before_forward"] = allocated(device) - others_bytes

    op.probe(hooks=(census.pack, census.unpack), start=start,
             between=lambda: phases.__setitem__("after_forward", allocated(device) - others_bytes))
    phases["saved_fp8"], phases["saved_hp"] = census.fp8, census.other
    if device.type == "cuda":
        torch.cuda.synchronize()
        phases["step_peak"] = int(torch.cuda.max_memory_allocated()) - others_bytes
    return breakdown_metrics(phases, device)
