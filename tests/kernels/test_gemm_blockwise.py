"""The blockwise Triton GEMM (`gemm_blockwise`): every config against the dequantized reference, the autotuner
kept to one numerics, the scale layout it reads, and the operands it refuses."""


import pytest
import torch
from kernel_cases import CUDA, DEV, GEMMS, data, gemm_operands

from fp8bench.core.numerics import sqnr_db


def gemm_configs():
    """Every variant by name (None: the autotuner's pick); on CPU the interpreter's small tiles."""
    from fp8bench_kernels.gemm_blockwise import CONFIGS

    return [None, *CONFIGS]


def every_config_on_each_shape():
    """(m, n, kk, config) for every config on every shape; on CPU the second (ragged) shape's fixed configs are
    in the slow tier, so `make test-fast` interprets each config once and the autotuner on both shapes."""
    out = []
    for i, shape in enumerate(GEMMS):
        shape_values, shape_marks = (shape.values, list(shape.marks)) if hasattr(shape, "values") else (shape, [])
        for config in gemm_configs():
            marks = shape_marks + ([pytest.mark.slow] if not CUDA and i > 0 and config is not None else [])
            out.append(pytest.param(*shape_values, config, marks=marks,
                                    id=f"{'-'.join(map(str, shape_values))}-"
                                       f"{'autotuned' if config is None else str(config.all_kwargs())}"))
    return out


@pytest.mark.parametrize("m,n,kk,config", every_config_on_each_shape())
def test_blockwise_gemm_matches_the_dequantized_reference(k, m, n, kk, config):
    a, sa, b, sb = gemm_operands(k, m, n, kk)
    c = k.gemm_blockwise.gemm_blockwise(a, sa, b, sb, config)
    ref = k.gemm_blockwise.gemm_blockwise_reference(a, sa, b, sb)
    assert c.dtype == torch.bfloat16 and c.shape == (m, n)
    assert sqnr_db(ref, c.float()) > 40.0  # BF16 output rounding (~48 dB); a misplaced scale gives < 10 dB


@pytest.mark.parametrize("fast_accum", [False, True], ids=["promote", "rescale"])
@pytest.mark.parametrize("m,n,kk", GEMMS)
def test_autotuned_gemm_picks_only_among_one_numerics(k, m, n, kk, fast_accum):
    """Promote and rescale differ in accuracy: the autotuner must not trade one for the other by speed."""
    tuned = k.gemm_blockwise._AUTOTUNED[fast_accum]
    assert tuned.configs and all(c.kwargs["PROMOTE"] is not fast_accum for c in tuned.configs)
    a, sa, b, sb = gemm_operands(k, m, n, kk)
    c = k.gemm_blockwise.gemm_blockwise(a, sa, b, sb, fast_accum=fast_accum)
    assert sqnr_db(k.gemm_blockwise.gemm_blockwise_reference(a, sa, b, sb), c.float()) > 40.0
    assert tuned.best_config.kwargs["PROMOTE"] is not fast_accum


@pytest.mark.parametrize("m", [8, 13])
def test_m_major_copies_only_what_tma_cannot_read(k, m):
    """Row-major scales, or M-major ones whose rows are not 16-byte aligned (M % 4), go through one copy into
    a padded M-major buffer; the values never change."""
    sa = torch.rand(m, 3, device=DEV)
    for scales in (sa, sa.t().contiguous().t()):
        t = k.gemm_blockwise.m_major(scales)
        assert t.shape == (m, 3) and torch.equal(t, sa)
        assert t.stride(0) == 1 and t.stride(1) % 4 == 0
        assert (t.data_ptr() == scales.data_ptr()) == (scales.stride(0) == 1 and m % 4 == 0)


def test_gemm_rejects_unaligned_rows(k):
    a, sa = k.quantize_blockwise.quantize_blockwise(data(64, 200), (1, 128))
    b, sb = k.quantize_blockwise.quantize_blockwise(data(128, 200), (128, 128))
    with pytest.raises(ValueError, match="multiple of 16"):
        k.gemm_blockwise.gemm_blockwise(a, sa, b, sb)


def test_gemm_rejects_mismatched_scales(k):
    a, sa = k.quantize_blockwise.quantize_blockwise(data(64, 256), (1, 128))
    b, sb = k.quantize_blockwise.quantize_blockwise(data(128, 256), (1, 128))  # 1x128 where 128x128 belongs
    with pytest.raises(ValueError, match="128x128"):
        k.gemm_blockwise.gemm_blockwise(a, sa, b, sb)
