"""The weight-gradient GEMM (`gemm_blockwise_wgrad`): both operands' 1x128 scales along K applied as an outer
product."""


import pytest
import torch
from kernel_cases import CUDA, GEMMS, data

from fp8bench.core.numerics import sqnr_db


@pytest.mark.parametrize("m,n,kk", GEMMS + [pytest.param(4112, 1040, 2064, marks=pytest.mark.gpu) if CUDA else (136, 72, 208)])
def test_wgrad_gemm_matches_the_dequantized_reference(k, m, n, kk):
    """Both operands 1x128 along K, each group's scales an outer product: a scale applied per 128 columns
    instead (fprop's layout) or to the wrong operand's rows drops the SQNR below 10 dB."""
    from fp8bench_kernels.gemm_blockwise_wgrad import CONFIGS, INTERPRETER_CONFIG

    a, sa = k.quantize_blockwise.quantize_blockwise(data(m, kk, 1), (1, 128), m_major_scales=True)
    b, sb = k.quantize_blockwise.quantize_blockwise(data(n, kk, 2), (1, 128), m_major_scales=True)
    ref = k.gemm_blockwise_wgrad.gemm_blockwise_wgrad_reference(a, sa, b, sb)
    for config in [None, *(CONFIGS if CUDA else [INTERPRETER_CONFIG])]:
        c = k.gemm_blockwise_wgrad.gemm_blockwise_wgrad(a, sa, b, sb, config)
        assert c.dtype == torch.bfloat16 and c.shape == (m, n)
        assert sqnr_db(ref, c.float()) > 40.0, config
    with pytest.raises(ValueError, match="1x128"):
        k.gemm_blockwise_wgrad.gemm_blockwise_wgrad(a, sa, b, sb[:, :1])
