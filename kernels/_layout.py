"""Scale layouts shared by the casts that write scales and the GEMMs that read them."""

from __future__ import annotations

import torch

from ._launch import cdiv


def m_major_empty(m: int, groups: int, device: torch.device) -> torch.Tensor:
    """Room for 1x128 scales [m, groups] laid out M-major: a view of a [groups, m] buffer whose rows are padded to
    16 bytes, so each starts aligned (TMA's rule)."""
    # one allocation with the view's strides (a [groups, padded m] buffer sliced and transposed takes three ops)
    return torch.empty_strided((m, groups), (1, cdiv(m, 4) * 4), device=device, dtype=torch.float32)
