"""The emulator's quantizers: bit-exact against torch's casts, the OCP MX v1.0 rules and NVIDIA's NVFP4."""

import math

import pytest
import torch

from fp8bench.core.numerics import (
    DelayedScale,
    QuantOptions,
    amax_to_scale,
    fake_quant,
    mx_shared_scale,
    pow2,
    rel_err,
    round_to_element,
    sqnr_db,
)
from fp8bench.core.types import Element

N = 1_100_000  # more than 10**6 values per format and per test


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Bitwise equality of float32 tensors, NaN == NaN, and -0 != +0."""
    return (a.view(torch.int32) == b.view(torch.int32)) | (torch.isnan(a) & torch.isnan(b))


def _values(seed: int) -> torch.Tensor:
    """Random float32 bit patterns (every exponent, subnormals included) plus log-uniform magnitudes
    around the FP8 range, plus the special values."""
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-(2**31), 2**31 - 1, (N // 2,), generator=g, dtype=torch.int64).to(torch.int32)
    anything = bits.view(torch.float32)
    near = torch.randn(N // 2, generator=g) * torch.exp2(torch.randint(-24, 20, (N // 2,), generator=g).float())
    specials = torch.tensor([0.0, -0.0, float("nan"), float("inf"), -float("inf"), 448.0, 449.0, 464.0, 465.0,
                             480.0, -1e9, 57344.0, 61439.0, 61440.0, 2.0**-9, 2.0**-10, 1.5 * 2.0**-10,
                             2.0**-16, 2.0**-17, 3 * 2.0**-18, 2.0**-6, 2.0**-14, 1e-45])
    return torch.cat([anything, near, specials])


@pytest.mark.parametrize("element", [Element.E4M3, Element.E5M2])
def test_round_to_element_matches_torch_saturating_cast(element):
    x = _values(1)
    ours = round_to_element(x, element, saturate=True)
    theirs = x.clamp(-element.max, element.max).to(element.spec.torch_dtype).float()
    bad = ~_same(ours, theirs)
    assert x.numel() > 10**6
    assert not bad.any(), f"{element.name}: {bad.sum()} mismatches, e.g. x={x[bad][:4]} ours={ours[bad][:4]} torch={theirs[bad][:4]}"


def test_e5m2_non_saturating_overflow_matches_torch_cast():
    x = _values(2)
    ours = round_to_element(x, Element.E5M2, saturate=False)
    theirs = x.to(torch.float8_e5m2).float()
    assert _same(ours, theirs).all()
    assert torch.isinf(round_to_element(torch.tensor([61440.0]), Element.E5M2, saturate=False)).all()


def test_e4m3_non_saturating_overflow_is_nan_per_ocp():
    # torch's E4M3 cast saturates; the OCP spec's non-saturating mode gives NaN (E4M3 has no inf).
    out = round_to_element(torch.tensor([465.0, -1e6, 448.0]), Element.E4M3, saturate=False)
    assert math.isnan(out[0]) and math.isnan(out[1]) and out[2] == 448.0


def test_bf16_rounding_matches_torch():
    x = _values(3)
    assert _same(round_to_element(x, Element.BF16, saturate=False), x.to(torch.bfloat16).float()).all()


def test_subnormals_and_signed_zero():
    tiny = torch.tensor([2.0**-9, -(2.0**-9), 2.0**-10, -(2.0**-10), 3 * 2.0**-11, 0.0, -0.0])
    out = round_to_element(tiny, Element.E4M3)
    # 2^-9 is E4M3's smallest subnormal; 2^-10 ties to even (0); 3*2^-11 rounds up to 2^-9.
    assert out.tolist() == [2.0**-9, -(2.0**-9), 0.0, -0.0, 2.0**-9, 0.0, -0.0]
    assert torch.signbit(out[3]) and torch.signbit(out[6])


def test_pow2_is_exact_over_the_float32_range():
    k = torch.arange(-149, 128)
    assert torch.equal(pow2(k), torch.tensor([math.ldexp(1.0, int(i)) for i in k], dtype=torch.float32))


@pytest.mark.parametrize("fmt,scaling,is_grad", [("e4m3", "current", False), ("hybrid", "current", True),
                                                  ("e4m3", "delayed", False), ("e4m3", "rowwise", False)])
def test_fake_quant_matches_torch_scaled_cast(fmt, scaling, is_grad):
    g = torch.Generator().manual_seed(4)
    x = (torch.randn(1100, 1000, generator=g) * torch.exp2(torch.randint(-8, 8, (1100, 1), generator=g).float()))
    x[0, :4] = torch.tensor([0.0, -0.0, float("nan"), 1e30])  # NaN poisons its row's amax under rowwise
    element = Element.E5M2 if is_grad else Element.E4M3
    dim = -1 if scaling == "rowwise" else None
    amax = x.abs().nan_to_num(0).amax(dim=dim, keepdim=dim is not None) if dim else x[1:].abs().amax()
    ours = fake_quant(x[1:] if dim is None else x, fmt, scaling, QuantOptions(is_grad=is_grad))
    xs = x[1:] if dim is None else x
    scale = element.max / amax.clamp(min=1e-12)
    theirs = (xs * scale).clamp(-element.max, element.max).to(element.spec.torch_dtype).float() * scale.reciprocal()
    if dim is not None:  # rows holding NaN: NaN everywhere in both
        theirs[0] = float("nan")
        ours = ours.clone()
        ours[0] = torch.where(torch.isnan(ours[0]), ours[0], float("nan"))
    assert xs.numel() > 10**6
    assert _same(ours, theirs).all()


def test_fake_quant_saturates_values_past_max_after_scaling():
    # Delayed scaling from a stale, smaller amax history: today's larger values saturate at 448 / scale.
    x = torch.tensor([[1.0, 2.0, 4.0, -8.0]])
    out = fake_quant(x, "e4m3", "delayed", QuantOptions(amax_history=(2.0,)))
    assert out.tolist() == [[1.0, 2.0, 2.0, -2.0]]


def _step(ds: DelayedScale, amax: float) -> torch.Tensor:
    """One cast of [amax/2, amax] through `ds`."""
    return ds(torch.tensor([amax / 2, amax]))


def test_delayed_scale_follows_te_amax_history():
    """TE's DelayedScaling: the first cast uses scale 1; each later cast the scale from the window of the last
    `length` amaxes (max), so a larger tensor saturates until its own amax is in the window, and a spike
    keeps the scale low until it leaves the window."""
    ds = DelayedScale(Element.E4M3, length=3)
    assert _step(ds, 0.01).tolist() == [3 * 2**-9, 5 * 2**-9]  # scale 1: subnormals of E4M3 (ulp 2^-9)
    assert ds.scale.item() == pytest.approx(448 / 0.01, rel=1e-6)
    assert _step(ds, 4.0).tolist() == pytest.approx([0.01, 0.01], rel=1e-6)  # scale 448/0.01: saturated
    assert ds.scale.item() == 112.0  # window [0.01, 4]
    for amax, scale in ((1.0, 112.0), (1.0, 112.0), (1.0, 448.0)):  # the spike leaves the window
        assert _step(ds, amax).tolist() == [0.5, 1.0]
        assert ds.scale.item() == scale


def test_delayed_scale_divides_as_current_scaling_does():
    """One arithmetic for every scale: torch's `max / amax` (reciprocal, then multiply; torchao's and our
    kernels'), so a delayed cast whose window holds this tensor's amax is current scaling's, bit for bit. TE's
    fused update divides correctly rounded instead: at amax 33.5 it gives one ulp more (13.373134613), which
    the H200 test against te.Linear allows."""
    ds = DelayedScale(Element.E4M3, length=2)
    _step(ds, 33.5)
    assert ds.scale.item() == amax_to_scale(torch.tensor(33.5), Element.E4M3).item() == pytest.approx(13.373133659,
                                                                                                      abs=1e-9)
    assert torch.tensor(448 / 33.5, dtype=torch.float32).item() - ds.scale.item() == pytest.approx(2**-20)  # 1 ulp


def test_delayed_scale_most_recent_margin_and_zero_amax():
    ds = DelayedScale(Element.E5M2, length=1024, algo="most_recent", margin=1)
    _step(ds, 8.0)
    _step(ds, 2.0)
    assert ds.scale.item() == 57344 / 2.0 / 2  # this amax, backed off by 2**margin
    ds(torch.zeros(4))
    assert ds.scale.item() == 57344 / 2.0 / 2  # a zero amax keeps the scale
    ds(torch.tensor([1e-39]))
    assert ds.scale.item() == torch.finfo(torch.float32).max  # max / amax overflows: TE takes float32's max
    with pytest.raises(ValueError, match="most_recent"):
        DelayedScale(Element.E4M3, 16, algo="mean")


def test_mx_hand_checked_vectors():
    # One 32-element block, amax 3.0: shared exponent floor(log2 3) - emax(E4M3)=8 → 2^-7 (OCP MX v1.0 §6.3).
    block = torch.zeros(1, 32)
    block[0, :5] = torch.tensor([3.0, 0.1, -1.0, 0.0009, 0.0001])
    out = fake_quant(block, "mxfp8", "mx")
    # 3.0*128 = 384 exact; 0.1*128 = 12.8, ulp 1 → 13; 0.0009*128 = 0.1152, ulp 2^-7 → 14.75 → 15;
    # 0.0001*128 = 0.0128 is subnormal in E4M3 (< 2^-6), ulp 2^-9 → 6.55 → 7.
    assert out[0, :5].tolist() == [3.0, 13 / 128, -1.0, 15 * 2.0**-7 / 128, 7 * 2.0**-9 / 128]
    # amax 500: shared exponent 8-8=0, scale 1; 500 saturates to 448 (the MX spec clamps to the element max).
    big = torch.tensor([[500.0] + [1.0] * 31])
    assert fake_quant(big, "mxfp8", "mx")[0, 0].item() == 448.0
    # Scales are E8M0: exact powers of two, identical after torch's own e8m0 cast; zero blocks get scale 1.
    amax = torch.tensor([3.0, 500.0, 0.0, 1e-30])
    s = mx_shared_scale(amax, Element.E4M3)
    assert s.tolist()[:3] == [2.0**-7, 1.0, 1.0]
    assert torch.equal(s.to(torch.float8_e8m0fnu).float(), s)


def test_mx_blocks_are_independent_along_k():
    x = torch.ones(2, 64)
    x[0, 32:] = 1000.0  # second block of row 0 only
    out = fake_quant(x, "mxfp8", "mx")
    assert torch.equal(out[:, :32], torch.ones(2, 32)) and out[0, 32].item() == 1024.0 * 448.0 / 512.0


def test_nvfp4_hand_checked_vectors():
    # Global amax 2688 = 448*6 → S_enc = 1. Block 0 (amax 2688): decode scale 448 → 1000/448 = 2.23 → 2 → 896.
    # Block 1 (amax 6): decode scale 1 → values round straight to E2M1 {0, .5, 1, 1.5, 2, 3, 4, 6}.
    # Block 2 (amax 0.3): decode 0.05 → E4M3 13·2^-8; 0.3 → 6 · 13·2^-8, 0.1 → 2 · 13·2^-8.
    x = torch.zeros(1, 48)
    x[0, :3] = torch.tensor([2688.0, 1000.0, 1400.0])
    x[0, 16:22] = torch.tensor([6.0, 0.25, 0.75, 5.0, 5.5, -2.6])
    x[0, 32:34] = torch.tensor([0.3, 0.1])
    out = fake_quant(x, "nvfp4", "nvfp4")[0]
    d2 = 13 * 2.0**-8
    assert out[:3].tolist() == [2688.0, 896.0, 1344.0]
    assert out[16:22].tolist() == [6.0, 0.0, 1.0, 4.0, 6.0, -3.0]
    assert out[32:34].tolist() == pytest.approx([6 * d2, 2 * d2], rel=0, abs=0)


def test_blockwise_weights_use_128x128_tiles():
    x = torch.ones(256, 256)
    x[0, 0] = 100.0  # one outlier raises the scale of its whole 128x128 tile only
    w = fake_quant(x, "e4m3", "blockwise", QuantOptions(is_weight=True))
    a = fake_quant(x, "e4m3", "blockwise")
    # in the outlier's tile: 1.0 * 4.48 = 4.48 → 4.5 in E4M3 → 4.5/4.48; elsewhere exact
    assert w[1, 1].item() == pytest.approx(4.5 / 4.48) and w[200, 200].item() == 1.0
    assert a[1, 1].item() == 1.0  # 1x128 activation blocks: row 1 never sees the outlier


def test_pow2_scales_round_down():
    s = amax_to_scale(torch.tensor(3.0), Element.E4M3, pow2_scale=True)
    assert s.item() == 128.0  # 448/3 = 149.3 → 128


def test_sqnr_and_rel_err():
    ref = torch.randn(1000, dtype=torch.float64)
    assert sqnr_db(ref, ref) == float("inf") and rel_err(ref, ref) == 0.0
    noisy = ref * (1 + 0.01)
    assert sqnr_db(ref, noisy) == pytest.approx(40.0, abs=1e-6)
    assert rel_err(ref, noisy) == pytest.approx(0.01)
    assert math.isnan(sqnr_db(ref, torch.full_like(ref, float("nan"))))


def test_gaussian_e4m3_tensorwise_sqnr_band():
    # What the quick sweep reports: E4M3 tensorwise on Gaussian data sits near 31 dB per operand.
    x = torch.randn(512, 512, generator=torch.Generator().manual_seed(0))
    assert 29.0 < sqnr_db(x, fake_quant(x, "e4m3", "current")) < 33.0
    assert sqnr_db(x, fake_quant(x, "bf16", "none")) > 48.0


def test_bad_format_and_scaling_names_list_choices():
    with pytest.raises(ValueError, match=r"format='fp8'.*\['bf16', 'e4m3'"):
        fake_quant(torch.ones(4), "fp8", "current")
    with pytest.raises(ValueError, match=r"scaling='mx' does not apply to format='e4m3'"):
        fake_quant(torch.ones(4), "e4m3", "mx")
