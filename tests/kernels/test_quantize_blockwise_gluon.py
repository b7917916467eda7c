"""The Gluon two-layout casts (`quantize_blockwise_gluon`), compiled for sm_90 without a GPU: what their
structure promises (bit-exactness runs on a GPU: tests/kernels/test_quantize_blockwise.py)."""


import pytest
from kernel_cases import _compiled_for_sm90

_COMPILE_GLUON_CASTS_SM90 = """
from fp8bench_kernels import quantize_blockwise_gluon as qg
builds = {f"weight={weight} {dtype}": qg.compile_sm90(weight, dtype, maxnreg=qg.MAXNREG)
          for weight in (False, True) for dtype in ("bf16", "fp32")}
"""


@pytest.mark.slow
def test_the_gluon_casts_compile_for_hopper_without_spills_or_a_shared_memory_transpose():
    """The two-layout casts as `quantize_blockwise_both` launches them on a GPU, from BF16 and FP32, compiled for
    sm_90 and assembled by ptxas: nothing spills; the transpose to Yᵀ stays in registers (shared memory holds
    the reductions' few KB, not a 16-64 KB tile); X arrives in 16-byte vectors and no
    store is narrower than 4 bytes (a thread's 64 elements of X in 8 loads from BF16, 16 from FP32); every element is rounded by the hardware's E4M3 conversion, once per layout
    (64 cvt.rn.satfinite.e4m3x2 per thread: 64 elements, two to an instruction, twice); and, the kernels being
    bound by the instructions they issue, no float64, no clamp before the saturating cvt, only the divisions
    each scale's owning threads make, and for an activation no more than 3 barriers."""
    import re

    builds = _compiled_for_sm90(_COMPILE_GLUON_CASTS_SM90)
    assert len(builds) == 4
    for name, b in builds.items():
        ptx = b["ptx"]
        b.update({"cvt_e4m3": ptx.count("cvt.rn.satfinite.e4m3x2"), "divisions": ptx.count("div.rn.f32"),
                  "float64": len(re.findall(r"\.f64\b", ptx)), "clamps": len(re.findall(r"\bmin(?:\.\w+)*\.f32", ptx)),
                  "barriers": ptx.count("bar.sync"),
                  "loads": re.findall(r"ld\.global[.\w]*", ptx),
                  "narrow_stores": re.findall(r"st\.global(?:\.v\d)?\.b(?:8|16)\b", ptx)})
        del b["ptx"]
        assert b["rc"] == 0, (name, b["ptxas"])
        assert "0 bytes spill stores" in b["ptxas"] and "0 bytes spill loads" in b["ptxas"], (name, b["ptxas"])
        assert b["shared"] <= 4096, (name, b["shared"])
        vectors = 8 if name.endswith("bf16") else 16
        assert b["loads"] == ["ld.global.v4.b32"] * vectors and not b["narrow_stores"], (name, b)
        assert b["cvt_e4m3"] == 64, (name, b["cvt_e4m3"])
        # the kernel is issue-bound: the exact reciprocals are float32 IEEE divisions, each row's and column's
        # once per owning thread (activation: a row's scale and inverse, a column's; weight: the block's), and
        # the saturating cvt clamps, so no min is left (the amax reductions are max)
        assert b["float64"] == 0 and b["divisions"] == (2 if name.startswith("weight=True") else 4), (name, b)
        assert b["clamps"] == 0, (name, b["clamps"])
        # an activation's amaxes cross warps in one shared-memory exchange and its scales come back in another
        # (3 barriers; Triton's reductions and layout conversions took 13 until the [kw, mw, r, c] tile)
        assert name.startswith("weight=True") or b["barriers"] <= 3, (name, b["barriers"])
