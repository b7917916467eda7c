"""Closed vocabularies of fp8bench, as enums that carry their facts (no torch import: config and case ids
are built without it).

Every other module speaks these names; the string values are the config names users type
(`format=e4m3 scaling=current backend=torch`) and the short names inside a `case_id`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


@dataclass(frozen=True)
class ElementSpec:
    """An element type (what one stored number is), with the facts the quantizers need.

    Sources: OCP 8-bit Floating Point Specification (OFP8) rev 1.0 for E4M3/E5M2; OCP Microscaling
    Formats (MX) v1.0 for E2M1 and E8M0.
    """

    name: str
    exp_bits: int
    man_bits: int
    bias: int
    max: float
    """Largest finite magnitude."""
    has_inf: bool
    torch_dtype_name: str | None
    """Name of torch's storage dtype, where torch has one (None for E2M1 values held one per element).
    A name, not the dtype, so that this module (and config, and case ids) never imports torch."""

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.torch_dtype_name) if self.torch_dtype_name else None

    @property
    def min_normal_exp(self) -> int:
        """Exponent of the smallest normal number: 1 - bias."""
        return 1 - self.bias

    @property
    def min_subnormal(self) -> float:
        return 2.0 ** (self.min_normal_exp - self.man_bits)

    @property
    def bits(self) -> int:
        return 1 + self.exp_bits + self.man_bits


class Element(enum.Enum):
    """Element types fp8bench quantizes to."""

    E4M3 = ElementSpec("e4m3", 4, 3, 7, 448.0, False, "float8_e4m3fn")
    E5M2 = ElementSpec("e5m2", 5, 2, 15, 57344.0, True, "float8_e5m2")
    E2M1 = ElementSpec("e2m1", 2, 1, 1, 6.0, False, None)
    BF16 = ElementSpec("bf16", 8, 7, 127, 3.3895313892515355e38, True, "bfloat16")

    @property
    def spec(self) -> ElementSpec:
        return self.value

    @property
    def max(self) -> float:
        return self.value.max


class Format(str, enum.Enum):
    """Recipe-level number format: which element type each GEMM operand uses."""

    BF16 = "bf16"
    E4M3 = "e4m3"
    HYBRID = "hybrid"
    """E4M3 for forward tensors (activations, weights), E5M2 for gradients (TE's Format.HYBRID)."""
    MXFP8 = "mxfp8"
    NVFP4 = "nvfp4"

    def element(self, is_grad: bool = False) -> Element:
        """The element type of one tensor: gradients differ only under HYBRID."""
        if self is Format.BF16:
            return Element.BF16
        if self is Format.HYBRID and is_grad:
            return Element.E5M2
        if self is Format.NVFP4:
            return Element.E2M1
        return Element.E4M3

    @property
    def is_low_precision(self) -> bool:
        return self is not Format.BF16

    @property
    def bits(self) -> int:
        return self.element().spec.bits


class Scaling(str, enum.Enum):
    """How scale factors are chosen and at what granularity."""

    NONE = "none"
    DELAYED = "delayed"
    """Tensorwise, from an amax history of earlier steps (TE DelayedScaling)."""
    CURRENT = "current"
    """Tensorwise, from this tensor's own amax."""
    ROWWISE = "rowwise"
    """One scale per row (per token for activations, per output channel for weights)."""
    BLOCKWISE = "blockwise"
    """1x128 for activations and gradients, 128x128 for weights (DeepSeek-V3)."""
    MX = "mx"
    """32-element blocks along K with E8M0 (power-of-two) scales (OCP MX v1.0)."""
    NVFP4 = "nvfp4"
    """16-element blocks with E4M3 scales and one FP32 global scale (NVIDIA NVFP4)."""


# Which scaling modes give a meaningful recipe for each format. Anything else is an impossible
# combination: a single run refuses it, a sweep drops it (and says how many it dropped).
VALID_SCALINGS: dict[Format, frozenset[Scaling]] = {
    Format.BF16: frozenset({Scaling.NONE}),
    Format.E4M3: frozenset({Scaling.DELAYED, Scaling.CURRENT, Scaling.ROWWISE, Scaling.BLOCKWISE}),
    Format.HYBRID: frozenset({Scaling.DELAYED, Scaling.CURRENT, Scaling.ROWWISE, Scaling.BLOCKWISE}),
    Format.MXFP8: frozenset({Scaling.MX}),
    Format.NVFP4: frozenset({Scaling.NVFP4}),
}


class WorkloadName(str, enum.Enum):
    GEMM = "gemm"
    QUANTIZE = "quantize"
    LINEAR = "linear"
    MLP = "mlp"
    LAYER = "layer"
    TRAIN = "train"


class GemmRole(str, enum.Enum):
    """The three GEMMs of a linear layer's training step (Y = X Wᵀ)."""

    FPROP = "fprop"
    """Y[M=tokens, N=out] = X[tokens, in] · W[out, in]ᵀ"""
    DGRAD = "dgrad"
    """dX[M=tokens, N=in] = dY[tokens, out] · W[out, in]"""
    WGRAD = "wgrad"
    """dW[M=out, N=in] = dYᵀ[out, tokens] · X[tokens, in]"""

    def operands_are_grad(self) -> tuple[bool, bool]:
        """(A is a gradient, B is a gradient): decides E5M2 under HYBRID."""
        return {GemmRole.FPROP: (False, False), GemmRole.DGRAD: (True, False),
                GemmRole.WGRAD: (True, False)}[self]

    def operands_are_weight(self) -> tuple[bool, bool]:
        """(A is a weight, B is a weight): weights take 128x128 blocks under BLOCKWISE."""
        return {GemmRole.FPROP: (False, True), GemmRole.DGRAD: (False, True),
                GemmRole.WGRAD: (False, False)}[self]


class Status(str, enum.Enum):
    OK = "ok"
    SKIPPED = "skipped"
    FAILED = "failed"
    DIVERGED = "diverged"
    """A training run whose loss became NaN/Inf: a result about the recipe, kept (not re-run on resume)."""


def choices(enum_cls: type[enum.Enum]) -> list[str]:
    """The config names of an enum, for error messages."""
    return [m.value if isinstance(m.value, str) else m.name.lower() for m in enum_cls]


FP8_ALL_GATHER_TAG = "fp8ag"
"""Ends the shape name of a distributed training run whose FSDP2 all-gathers FP8 weights ('...fsdp2x2fp8ag'):
the same run without it is that case's BF16-gather counterpart (records.derive_speedups)."""
