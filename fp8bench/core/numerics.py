"""Exact quantizers in plain torch, accuracy metrics and the tolerance table.

The `emulated` backend and every accuracy check build on `fake_quant`: the dequantized tensor a GEMM
would see after quantizing `x` to `format` with `scaling`. Rounding is done here with integer/power-of-two
arithmetic in float32 (never through torch's float8 casts), so the tests can hold it bit-exact against
torch's casts for E4M3/E5M2 and against the OCP MX v1.0 and NVIDIA NVFP4 definitions for block formats.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8bench.core.types import VALID_SCALINGS, Element, Format, Scaling, choices

# Fixed granularities of the block formats (sources in the Scaling enum docstrings).
ACT_BLOCK = (1, 128)
WEIGHT_BLOCK = (128, 128)
MX_BLOCK = 32
NVFP4_BLOCK = 16
# torchao's floor for amax before dividing (torchao/float8/float8_utils.py: EPS = 1e-12).
AMAX_EPS = 1e-12


# --------------------------------------------------------------------------- exact element rounding

def pow2(k: torch.Tensor) -> torch.Tensor:
    """Exact 2**k as float32 for integer k in [-149, 127], built from bits (no exp2 rounding doubts)."""
    k = k.to(torch.int32)
    normal = ((k + 127).clamp(min=1) << 23).view(torch.float32)
    subnormal = (torch.ones_like(k) << (k + 149).clamp(0, 22)).view(torch.float32)
    return torch.where(k >= -126, normal, subnormal)


def round_to_element(x: torch.Tensor, element: Element, saturate: bool = True) -> torch.Tensor:
    """Round float32 values to the nearest value of `element` (ties to even); returns float32.

    `saturate=True` clamps magnitudes past the largest finite value to it (what scaled quantizers do,
    and what torch's own E4M3 cast does). Otherwise overflow gives inf where the type has one, else NaN
    (OCP OFP8 non-saturating mode). NaN stays NaN; the sign of zero is kept.
    """
    spec = element.spec
    x = x.float()
    a = x.abs()
    # Normal range: round half to even on the float32 bit pattern, keeping man_bits mantissa bits. A carry
    # out of the mantissa bumps the exponent, which is the correctly rounded next binade.
    shift = 23 - spec.man_bits
    bits = a.view(torch.int32)
    normal = ((bits + ((1 << (shift - 1)) - 1) + ((bits >> shift) & 1)) & ~((1 << shift) - 1)).view(torch.float32)
    # Below the smallest normal the step is fixed at 2**(emin - man_bits): adding then subtracting a power
    # of two whose float32 ulp is that step makes the FPU round to it (ties to even).
    magic = 2.0 ** (spec.min_normal_exp - spec.man_bits + 23)
    subnormal = (a + magic) - magic
    q = torch.where(a < 2.0 ** spec.min_normal_exp, subnormal, normal)
    if saturate:
        q = torch.clamp(q, max=spec.max)
    else:
        q = torch.where(q > spec.max, float("inf") if spec.has_inf else float("nan"), q)
    q = torch.where(torch.isnan(a), a, q)
    return torch.copysign(q, x)


# --------------------------------------------------------------------------- scales

def amax_to_scale(amax: torch.Tensor, element: Element, pow2_scale: bool = False, margin: int = 0) -> torch.Tensor:
    """Quantization scale (multiply before the cast): max / amax, as torchao and TE compute it.

    `margin` backs the scale off by 2**margin (TE DelayedScaling). `pow2_scale` rounds the scale down to a
    power of two (TE Float8BlockScaling's default), so that scaling itself adds no rounding error.
    """
    scale = element.max / torch.clamp(amax.float(), min=AMAX_EPS)
    scale = scale / (2.0 ** margin)
    return _pow2_floor(scale) if pow2_scale else scale


def _pow2_floor(scale: torch.Tensor) -> torch.Tensor:
    """The largest power of two ≤ scale (within float32's normal range)."""
    _, e = torch.frexp(scale)
    return pow2((e - 1).clamp(-126, 127))


def _blocks(x: torch.Tensor, rows: int, cols: int) -> tuple[torch.Tensor, tuple[int, int]]:
    """View a 2-D tensor as (R, rows, C, cols) tiles, zero-padded to whole tiles."""
    m, k = x.shape
    pm, pk = (-m) % rows, (-k) % cols
    if pm or pk:
        x = torch.nn.functional.pad(x, (0, pk, 0, pm))
    mm, kk = x.shape
    return x.reshape(mm // rows, rows, kk // cols, cols), (m, k)


def _unblock(t: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    r, rows, c, cols = t.shape
    return t.reshape(r * rows, c * cols)[: shape[0], : shape[1]]


def _as_2d(x: torch.Tensor) -> torch.Tensor:
    if x.dim() == 0:
        raise ValueError("fake_quant needs at least a 1-D tensor")
    return x.reshape(1, -1) if x.dim() == 1 else x.reshape(-1, x.shape[-1])


def quant_dequant_scaled(x: torch.Tensor, element: Element, scale: torch.Tensor) -> torch.Tensor:
    """(x * scale) rounded to `element` with saturation, then multiplied by 1/scale (float32), as the GEMM
    epilogue applies the inverse scales that scaled_mm, TE and torchao pass."""
    return round_to_element(x.float() * scale, element, saturate=True) * scale.reciprocal()


def _blockwise(x2: torch.Tensor, element: Element, block: tuple[int, int], pow2_scale: bool) -> torch.Tensor:
    t, shape = _blocks(x2.float(), *block)
    amax = t.abs().amax(dim=(1, 3), keepdim=True)
    scale = amax_to_scale(amax, element, pow2_scale)
    return _unblock(quant_dequant_scaled(t, element, scale), shape)


def mx_shared_scale(amax: torch.Tensor, element: Element) -> torch.Tensor:
    """OCP MX v1.0 shared scale X = 2**(floor(log2 amax) - emax_elem), clamped to E8M0's range.

    An all-zero block gets X = 1 (any scale represents it). NaN amax gives a NaN scale (E8M0's NaN).
    """
    emax_elem = int(torch.frexp(torch.tensor(element.max))[1].item()) - 1  # 8 for E4M3, 2 for E2M1
    _, e = torch.frexp(amax.float())
    shared = ((e - 1) - emax_elem).clamp(-127, 127)
    scale = torch.where(amax > 0, pow2(shared), torch.ones_like(amax, dtype=torch.float32))
    return torch.where(torch.isnan(amax), torch.full_like(scale, float("nan")), scale)


def _mx(x2: torch.Tensor, element: Element) -> torch.Tensor:
    t, shape = _blocks(x2.float(), 1, MX_BLOCK)
    x_scale = mx_shared_scale(t.abs().amax(dim=(1, 3), keepdim=True), element)
    # Elements are V / X with saturation to the element's max (OCP MX v1.0 section 6.3).
    q = round_to_element(t / x_scale, element, saturate=True) * x_scale
    return _unblock(q, shape)


def nvfp4_scales(x2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(global encode scale S_enc, per-16-block E4M3 decode scales as float32, shape (R,1,C,1)).

    Two-level NVFP4 scaling as in TE's NVFP4 reference quantizer: S_enc = 448·6 / amax(tensor); a block's
    decode scale is amax(block) / 6 · S_enc, rounded to E4M3 (saturating).
    """
    t, _ = _blocks(x2.float(), 1, NVFP4_BLOCK)
    amax_t = x2.float().abs().amax()
    s_enc = torch.where(amax_t > 0, (Element.E4M3.max * Element.E2M1.max) / amax_t, torch.ones_like(amax_t))
    s_enc = torch.clamp(s_enc, max=torch.finfo(torch.float32).max)
    block_amax = t.abs().amax(dim=(1, 3), keepdim=True)
    decode = round_to_element(block_amax / Element.E2M1.max * s_enc, Element.E4M3, saturate=True)
    return s_enc, decode


def _nvfp4(x2: torch.Tensor) -> torch.Tensor:
    t, shape = _blocks(x2.float(), 1, NVFP4_BLOCK)
    s_enc, decode = nvfp4_scales(x2)
    global_decode = 1.0 / s_enc
    encode = torch.where(decode > 0, 1.0 / (decode * global_decode), torch.zeros_like(decode))
    q = round_to_element(t * encode, Element.E2M1, saturate=True)
    return _unblock(q * decode * global_decode, shape)


# --------------------------------------------------------------------------- public API

@dataclass(frozen=True, kw_only=True)
class QuantOptions:
    """Per-tensor knobs of `fake_quant` beyond format and scaling."""

    is_grad: bool = False
    """The tensor is a gradient: E5M2 under the HYBRID format."""
    is_weight: bool = False
    """The tensor is a weight: 128x128 blocks under BLOCKWISE scaling."""
    amax_history: tuple[float, ...] = ()
    """DELAYED scaling: amaxes of earlier steps (most recent last); empty means this tensor's amax."""
    amax_compute_algo: str = "max"
    """DELAYED scaling: 'max' over the history or 'most_recent' (TE DelayedScaling)."""
    margin: int = 0
    pow2_scale: bool = False


def _parse(format: Format | str, scaling: Scaling | str) -> tuple[Format, Scaling]:
    try:
        fmt = Format(format)
    except ValueError:
        raise ValueError(f"format={format!r} is unknown; choose one of {choices(Format)}") from None
    try:
        sc = Scaling(scaling)
    except ValueError:
        raise ValueError(f"scaling={scaling!r} is unknown; choose one of {choices(Scaling)}") from None
    if sc not in VALID_SCALINGS[fmt]:
        ok = sorted(s.value for s in VALID_SCALINGS[fmt])
        raise ValueError(f"scaling={sc.value!r} does not apply to format={fmt.value!r}; choose one of {ok}")
    return fmt, sc


def fake_quant(x: torch.Tensor, format: Format | str, scaling: Scaling | str,
               options: QuantOptions | None = None) -> torch.Tensor:
    """Quantize `x` to (`format`, `scaling`) and dequantize: the tensor a low-precision GEMM would see.

    Scales and blocks run along the last dimension (the GEMM's K for both operands in TN layout).
    Returns float32 of `x`'s shape (BF16 rounds to bfloat16 values).
    """
    fmt, sc = _parse(format, scaling)
    opt = options or QuantOptions()
    shape = x.shape
    x2 = _as_2d(x)
    element = fmt.element(opt.is_grad)
    if fmt is Format.BF16:
        out = round_to_element(x2, Element.BF16, saturate=False)
    elif sc in (Scaling.CURRENT, Scaling.DELAYED):
        amax = x2.float().abs().amax()
        if sc is Scaling.DELAYED and opt.amax_history:
            hist = torch.tensor(opt.amax_history, dtype=torch.float32)
            amax = hist.max() if opt.amax_compute_algo == "max" else hist[-1]
        out = quant_dequant_scaled(x2, element, amax_to_scale(amax, element, opt.pow2_scale, opt.margin))
    elif sc is Scaling.ROWWISE:
        amax = x2.float().abs().amax(dim=-1, keepdim=True)
        out = quant_dequant_scaled(x2, element, amax_to_scale(amax, element, opt.pow2_scale))
    elif sc is Scaling.BLOCKWISE:
        out = _blockwise(x2, element, WEIGHT_BLOCK if opt.is_weight else ACT_BLOCK, opt.pow2_scale)
    elif sc is Scaling.MX:
        out = _mx(x2, element)
    else:
        out = _nvfp4(x2)
    return out.reshape(shape)


class DelayedScale:
    """One tensor's cast across steps under TE's DelayedScaling (TE docs, "FP8 Delayed Scaling"; TE 2.20's
    transformer_engine/pytorch/quantization.py): the cast uses the scale that earlier steps' amaxes gave (1 at
    the first step, as TE initializes it), then this step's amax enters the window and the next scale is
    max / amax of the window (`algo` 'max') or of this step ('most_recent'), backed off by 2**margin; a zero
    or non-finite amax keeps the old scale, an infinite scale becomes float32's max. The window holds `length`
    amaxes, this step's included, as TE's rotated amax_history does. `pow2_scale` (not TE's) rounds the
    scale down to a power of two."""

    def __init__(self, element: Element, length: int, algo: str = "max", margin: int = 0,
                 pow2_scale: bool = False) -> None:
        if algo not in ("max", "most_recent"):
            raise ValueError(f"amax_compute_algo={algo!r} is unknown; choose one of ['max', 'most_recent']")
        self.element, self.length, self.algo = element, length, algo
        self.margin, self.pow2_scale = margin, pow2_scale
        self.window: torch.Tensor | None = None  # oldest first, created on the first tensor's device
        self.scale: torch.Tensor | None = None

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """The scale to cast x with (earlier steps'), after which x's amax is recorded for the next steps."""
        if self.window is None:
            self.window = torch.zeros(self.length, device=x.device)
            self.scale = torch.ones((), device=x.device)
        used_scale = self.scale
        amax = x.detach().float().abs().amax()
        self.window = torch.cat([self.window[1:], amax.reshape(1)])
        ref = self.window.max() if self.algo == "max" else amax
        # TE's rule, no amax floor, an infinite scale becomes float32's max. Its arithmetic is fp8bench's
        # everywhere (torch's `max / amax`: reciprocal, then multiply, as torchao and our kernels compute it),
        # where TE's fused update divides correctly rounded: the scales can differ by an ulp
        new = self.element.max / ref / 2.0 ** self.margin
        new = torch.where((ref > 0) & torch.isfinite(ref), new, self.scale)
        new = torch.where(torch.isinf(new), torch.finfo(torch.float32).max, new)
        self.scale = _pow2_floor(new) if self.pow2_scale else new
        return used_scale

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """Fake-quantize x (float32 of x's shape) with the scale of earlier steps, and record x's amax."""
        return quant_dequant_scaled(x.float(), self.element, self.take(x))


# --------------------------------------------------------------------------- accuracy metrics

def sqnr_db(ref: torch.Tensor, out: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio 10·log10(‖ref‖² / ‖ref − out‖²), scale-invariant; inf if exact."""
    ref64, out64 = ref.double(), out.double()
    noise = torch.sum((ref64 - out64) ** 2).item()
    signal = torch.sum(ref64 ** 2).item()
    if noise != noise:  # NaN in the output
        return float("nan")
    if noise == 0.0:
        return float("inf")
    import math

    return 10.0 * math.log10(signal / noise) if signal > 0 else float("-inf")


def rel_err(ref: torch.Tensor, out: torch.Tensor) -> float:
    """‖ref − out‖ / ‖ref‖ in float64."""
    ref64, out64 = ref.double(), out.double()
    denom = torch.linalg.vector_norm(ref64).item()
    num = torch.linalg.vector_norm(ref64 - out64).item()
    return num / denom if denom > 0 else float("inf") if num > 0 else 0.0


@dataclass(frozen=True)
class Tolerance:
    """Smallest acceptable SQNR of a real backend's output measured against the emulator's output."""

    min_sqnr_db: float
    source: str


# Real kernels vs the emulator on the same inputs: both quantize identically, so what differs is
# accumulation order and output rounding. BF16 output rounding alone bounds SQNR near 50 dB (8 mantissa
# bits: 6.02·8 + 1.76); the floors leave margin for FP32 accumulation order and fast-accumulation.
TOLERANCE: dict[Format, Tolerance] = {
    Format.BF16: Tolerance(40.0, "bf16 output rounding ~50 dB; accumulation-order noise well below"),
    Format.E4M3: Tolerance(35.0, "same quantized operands; differences come from accumulation and bf16 output"),
    Format.HYBRID: Tolerance(35.0, "as E4M3"),
    Format.MXFP8: Tolerance(35.0, "as E4M3; scales are exact powers of two"),
    Format.NVFP4: Tolerance(30.0, "FP4 products accumulate in fp32 on Blackwell; looser for scale-rounding order"),
}
