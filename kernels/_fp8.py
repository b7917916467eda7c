"""Element rounding shared by the quantize kernels: E4M3 with ties to even and saturation. On a GPU the cast
instruction does it (cvt.rn.satfinite); under Triton's interpreter, whose float32->fp8 conversion rounds some
values to the wrong binade, it is done on float32 bit patterns, so the value handed to `.to(tl.float8e4nv)` is
already exactly representable and the cast is exact there too."""

import triton
import triton.language as tl

from ._tune import INTERPRETING

E4M3_MAX = 448.0
AMAX_EPS = 1e-12
"""Floor for amax before dividing (torchao's EPS; fp8bench.core.numerics.AMAX_EPS)."""
# The same numbers for @triton.jit code: compiled Triton reads only constexpr globals (its interpreter reads
# any, which is why tests/kernels/test_constexpr_globals.py checks)
E4M3_MAX_C = tl.constexpr(E4M3_MAX)
AMAX_EPS_C = tl.constexpr(AMAX_EPS)


SOFTWARE_ROUNDING = tl.constexpr(INTERPRETING)
"""Round on bit patterns only under the interpreter. Compiled for a GPU, `.to(tl.float8e4nv)` is one
`cvt.rn.satfinite` per two elements (ties to even, saturating), which the GPU tests check bit for bit against
the same reference; the bit arithmetic would cost ~20 ALU ops per element and make the casts compute-bound."""


@triton.jit
def round_to_e4m3(x):
    """float32 -> nearest E4M3 value (ties to even), saturating at +-448, as float32 (the interpreter), or x
    itself for the compiled cast to round (on a GPU); keeps the sign of zero."""
    q = x
    if SOFTWARE_ROUNDING:
        bits = x.to(tl.int32, bitcast=True)
        sign = bits & -0x80000000
        a = tl.abs(x)
        abits = a.to(tl.int32, bitcast=True)
        # normal range: keep 3 of 23 mantissa bits, half to even on the bit pattern (a carry bumps the exponent)
        normal = ((abits + 0x7FFFF + ((abits >> 20) & 1)) & -0x100000).to(tl.float32, bitcast=True)
        # below 2**-6 the step is 2**-9: adding 2**14 (whose float32 ulp is 2**-9) makes the FPU round to it
        sub = (a + 16384.0) - 16384.0
        r = tl.where(a < 0.015625, sub, normal)
        r = tl.minimum(r, E4M3_MAX_C)
        q = (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return q


@triton.jit
def e4m3_scale(amax):
    """448 / max(amax, 1e-12) in float32, evaluated as torch evaluates it (exact reciprocal, then multiply)."""
    return E4M3_MAX_C * exact_rcp(tl.maximum(amax, AMAX_EPS_C))


@triton.jit
def block_scale(amax, POW2: tl.constexpr):
    """A block's scale from its amax: `e4m3_scale`, rounded down to a power of two when POW2 (DeepSeek-V3's
    option, so that scaling changes only exponents); every blockwise cast's step."""
    scale = e4m3_scale(amax)
    if POW2:
        scale = pow2_floor(scale)
    return scale


@triton.jit
def scale_to_e4m3(x, scale):
    """x * scale, saturated to +-448 and rounded to E4M3 (ties to even), as float8e4nv: every scaled cast's
    element step (x float32; scale a scalar or a tensor broadcast to x)."""
    y = x * scale
    if SOFTWARE_ROUNDING:
        y = round_to_e4m3(tl.minimum(tl.maximum(y, -E4M3_MAX_C), E4M3_MAX_C))
    # compiled, the saturating cvt clamps (a NaN stays NaN, as in torch's clamp-then-cast; the interpreter's
    # clamp, np.fmax, still makes it -448); an explicit clamp would add two FMNMX per element to the Gluon
    # activation cast, which is bound by the instructions it issues
    return y.to(tl.float8e4nv)


@triton.jit
def pow2_floor(s):
    """The largest power of two <= s (s positive, normal): the exponent bits alone."""
    return (s.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)


@triton.jit
def exact_rcp(b):
    """1 / b correctly rounded to float32 (IEEE division, `div.rn.f32`; numpy's under the interpreter). Triton's
    float32 `/` is an approximate division. Scales are then computed the way torch evaluates `448 / amax`
    (reciprocal, then multiply), which fp8bench's emulator and torchao use. A float64 reciprocal rounded once
    to float32 would give the same values (double rounding through 53 bits is harmless for a 24-bit quotient,
    53 >= 2*24 + 2), but a float64 division is about ten DFMA with a slow-path call, several per thread in the
    Gluon activation cast, which is bound by the instructions it issues."""
    b = b.to(tl.float32)
    # a 1.0 shaped (and, in Gluon, laid out) as b: the integer product by zero folds to a constant
    one = (b.to(tl.int32, bitcast=True) * 0 + 0x3F800000).to(tl.float32, bitcast=True)
    return tl.math.div_rn(one, b)
