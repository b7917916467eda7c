"""Backend adapters, one per module; `get_backend(name)` is the registry."""

from __future__ import annotations

from fp8bench.backends.base import Backend, GemmOp, LinearOp, QuantizeOp, Recipe, TrainSetup
from fp8bench.core.types import BackendName, choices


def get_backend(name: str) -> Backend:
    if name == "emulated":
        from fp8bench.backends.emulated import EmulatedBackend as cls
    elif name == "torch":
        from fp8bench.backends.scaled_mm import ScaledMMBackend as cls
    elif name == "torchao":
        from fp8bench.backends.torchao import TorchaoBackend as cls
    elif name == "te":
        from fp8bench.backends.te import TEBackend as cls
    elif name == "triton":
        from fp8bench.backends.triton import TritonBackend as cls
    elif name == "lightning-te":
        from fp8bench.backends.lightning_te import LightningTEBackend as cls
    elif name == "accelerate":
        from fp8bench.backends.accelerate import AccelerateBackend as cls
    elif name == "coat":
        from fp8bench.backends.coat import CoatBackend as cls
    elif name == "deepgemm":
        from fp8bench.backends.deepgemm import DeepGemmBackend as cls
    elif name == "msamp":
        from fp8bench.backends.msamp import MsampBackend as cls
    else:
        raise ValueError(f"backend={name!r} is unknown; choose one of {choices(BackendName)}")
    return cls()


__all__ = ["Backend", "GemmOp", "LinearOp", "QuantizeOp", "Recipe", "TrainSetup", "get_backend"]
