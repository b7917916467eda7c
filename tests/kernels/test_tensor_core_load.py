"""The tensor-core filler behind the slowdown knob (`tensor_core_load`)."""


import pytest
import torch
from kernel_cases import CUDA, DEV


@pytest.mark.parametrize("iters", [1, 7])
def test_tensor_core_load_accumulates_every_iteration(k, iters):
    """The slowdown knob's filler must do `iters` MMAs per program (a dropped loop would inject nothing)."""
    mod = k.tensor_core_load
    block = mod.BLOCK if CUDA else 32  # the interpreter is slow at 128³ dots
    a = mod.make_operand(DEV, block)
    out = mod.tensor_core_load(a, iters, programs=3)
    torch.testing.assert_close(out, mod.tensor_core_load_reference(a, iters, 3), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="square FP16"):
        mod.tensor_core_load(a.float(), iters, 1)
