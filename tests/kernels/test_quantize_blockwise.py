"""The blockwise casts (`quantize_blockwise`): 1x128 and 128x128 bit-exact with the reference and the emulator,
their M-major scales, saturation, and both layouts at once (`quantize_blockwise_both`) equal to each layout's
own cast."""


import pytest
import torch
from kernel_cases import CUDA, DEV, LARGE, SHAPES, SMALL, bits, data

from fp8bench.core.numerics import fake_quant


@pytest.mark.parametrize("block", [(1, 128), (128, 128)])
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize("m,n", SHAPES)
def test_blockwise_quantization_is_bit_exact(k, m, n, block, pow2):
    x = data(m, n)
    y, s = k.quantize_blockwise.quantize_blockwise(x, block, pow2)
    ry, rs = k.quantize_blockwise.quantize_blockwise_reference(x, block, pow2)
    assert torch.equal(bits(y), bits(ry)) and torch.equal(s, rs)
    from fp8bench.core.numerics import QuantOptions

    emu = fake_quant(x, "e4m3", "blockwise", QuantOptions(is_weight=block == (128, 128), pow2_scale=pow2))
    deq = y.float() * s.repeat_interleave(block[0], 0).repeat_interleave(block[1], 1)[:m, :n]
    assert torch.equal(deq, emu)


@pytest.mark.parametrize("m,n", SHAPES)
def test_m_major_1x128_scales_are_the_same_scales_in_the_gemms_layout(k, m, n):
    """M-major scales: the same values, in a [K/128, M] buffer whose rows start 16-byte aligned (what the Gluon
    GEMM's TMA needs, so it takes them as they are)."""
    x = data(m, n)
    y, s = k.quantize_blockwise.quantize_blockwise(x, (1, 128), m_major_scales=True)
    ry, rs = k.quantize_blockwise.quantize_blockwise_reference(x, (1, 128))
    assert torch.equal(bits(y), bits(ry)) and torch.equal(s, rs)
    assert s.stride(0) == 1 and s.stride(1) % 4 == 0 and s.stride(1) >= m
    assert k.gemm_blockwise.m_major(s).data_ptr() == s.data_ptr()  # the GEMMs take them as they are
    with pytest.raises(ValueError, match="1x128"):
        k.quantize_blockwise.quantize_blockwise(x, (128, 128), m_major_scales=True)


def test_saturation_and_zeros(k):
    x = torch.zeros(4, 256, dtype=torch.bfloat16, device=DEV)
    x[1, 3] = 1e30  # one huge value: its group's scale is tiny, everything else in the group rounds to 0
    x[2, :] = -7.0
    y, s = k.quantize_blockwise.quantize_blockwise(x, (1, 128))
    assert torch.equal(bits(y), bits(k.quantize_blockwise.quantize_blockwise_reference(x, (1, 128))[0]))
    assert y.float()[1, 3] == 448.0 and y.float()[2, 0] == -448.0 and torch.all(y.float()[0] == 0)


@pytest.mark.parametrize("weight", [False, True], ids=["1x128", "128x128"])
@pytest.mark.parametrize("pow2", [False, pytest.param(True, marks=[] if CUDA else pytest.mark.slow)], ids=["exact", "pow2"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, pytest.param(torch.float32, marks=pytest.mark.slow)], ids=["bf16", "fp32"])
@pytest.mark.parametrize("m,n", SHAPES + ([pytest.param(8200, 4112, marks=pytest.mark.gpu)]
                                          + [pytest.param(*s, marks=pytest.mark.gpu) for s in SMALL] if CUDA
                                          else [(257, 130)]))
def test_both_layouts_are_each_layouts_own_quantization_bit_for_bit(k, m, n, weight, pow2, dtype):
    """quantize_blockwise_both: Y as quantize_blockwise writes it, and Yᵀ as quantize_blockwise writes the
    transposed tensor (1x128: groups along the rows of X, what wgrad sums over; 128x128: the same blocks).
    FP32 too: a training step casts its FP32 master weights (on the H200 at 865b59e the weight kernel's
    transposed store wrote a wrong Yᵀ from FP32 input, bit-exact from BF16, and training went NaN). On a GPU
    this is the Gluon kernel, at ragged small shapes too (a tile past M or K); under the interpreter, Triton's."""
    mod = k.quantize_blockwise
    x = data(m, n)
    if dtype is torch.float32:  # values BF16 cannot hold: the cast must start from the FP32 ones
        x = x.float() * (1 + 2.0**-12)
    block = (128, 128) if weight else (1, 128)
    y, s, yt, st = mod.quantize_blockwise_both(x, weight=weight, pow2_scales=pow2)
    ry, rs = mod.quantize_blockwise_reference(x, block, pow2)
    rty, rts = mod.quantize_blockwise_reference(x.t().contiguous(), block, pow2)
    assert torch.equal(bits(y), bits(ry)) and torch.equal(s, rs)
    assert torch.equal(bits(yt), bits(rty)) and torch.equal(st, rts)
    assert yt.is_contiguous() and yt.shape == (n, m)
    if weight:  # block scales row-major, and their transpose a tensor of its own
        assert s.is_contiguous() and st.is_contiguous()
    else:  # the GEMMs read 1x128 scales M-major
        assert s.stride(0) == 1 and st.stride(0) == 1


@pytest.mark.parametrize("weight", [False, True], ids=["1x128", "128x128"])
@pytest.mark.parametrize("m,n", [pytest.param(300, 200, marks=pytest.mark.gpu)] if CUDA else [(300, 200)])
def test_both_layouts_of_an_x_strided_along_k_are_those_of_its_contiguous_copy(k, m, n, weight):
    """A transposed view (stride 1 along M, not K) goes to the Triton kernels on a GPU too (the Gluon kernel
    assumes unit stride along K): its four tensors are, bit for bit, those of its contiguous copy (on a GPU,
    the Gluon kernel's)."""
    x = data(n, m).t()
    assert x.stride(1) != 1
    strided = k.quantize_blockwise.quantize_blockwise_both(x, weight=weight)
    contiguous = k.quantize_blockwise.quantize_blockwise_both(x.contiguous(), weight=weight)
    for got, want in zip(strided, contiguous, strict=True):
        assert torch.equal(bits(got) if got.dtype == torch.float8_e4m3fn else got,
                           bits(want) if want.dtype == torch.float8_e4m3fn else want)


@pytest.mark.gpu
@pytest.mark.parametrize("pow2", [False, True], ids=["exact", "pow2"])
@pytest.mark.parametrize("m,n", LARGE + [(8200, 4112)])
def test_every_weight_cast_config_writes_both_layouts_bit_for_bit(k, m, n, pow2):
    """The Triton weight kernel, which `quantize_blockwise_both` runs under the interpreter and on a GPU only for
    an X without unit stride along K (the Gluon kernel runs otherwise): each of `BOTH_LAYOUTS_CONFIGS`,
    launched by itself, writes Y, Yᵀ and the block scales bit for bit as the reference. (Under the interpreter
    the list is one config, the one the test above runs.)"""
    mod = k.quantize_blockwise
    x = data(m, n)
    ry, rs = mod.quantize_blockwise_reference(x, (128, 128), pow2)
    rty, _ = mod.quantize_blockwise_reference(x.t().contiguous(), (128, 128), pow2)
    groups = -(-n // 128)
    for config in mod.BOTH_LAYOUTS_CONFIGS:
        y = torch.empty((m, n), device=DEV, dtype=torch.float8_e4m3fn)
        yt = torch.empty((n, m), device=DEV, dtype=torch.float8_e4m3fn)
        s = torch.empty((-(-m // 128), groups), device=DEV, dtype=torch.float32)
        mod._quantize_128x128_both_kernel.fn[(s.shape[0], groups)](
            x, y, yt, s, m, n, x.stride(0), x.stride(1), groups, POW2=pow2, num_warps=config.num_warps,
            **config.kwargs)
        assert torch.equal(bits(y), bits(ry)) and torch.equal(bits(yt), bits(rty)), config
        assert torch.equal(s, rs), config
