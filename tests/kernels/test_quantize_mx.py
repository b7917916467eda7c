"""The MXFP8 cast (`quantize_mx`): bit-exact with its reference and the emulator."""


import pytest
import torch
from kernel_cases import SHAPES, bits, data

from fp8bench.core.numerics import fake_quant


@pytest.mark.parametrize("m,n", SHAPES)
def test_mx_quantization_is_bit_exact(k, m, n):
    x = data(m, n)
    y, e = k.quantize_mx.quantize_mx(x)
    ry, re = k.quantize_mx.quantize_mx_reference(x)
    assert torch.equal(bits(y), bits(ry)) and torch.equal(e, re)
    assert torch.equal(k.quantize_mx.dequantize_mx(y, e), fake_quant(x, "mxfp8", "mx"))
