"""The recipe's Triton kernels compiled for sm_90 without a GPU (`_sm90`) and assembled by ptxas: FP8 wgmmas
ptxas does not serialize, the hardware's saturating conversion, a barrier of global atomics, no spills."""


import pytest
from kernel_cases import _compiled_for_sm90

_COMPILE_RECIPE_SM90 = """
from fp8bench_kernels import gemm_blockwise_wgrad as wgrad, quantize_blockwise as qb, quantize_current as qc
builds = {"wgrad " + str(c.all_kwargs()): wgrad.compile_sm90(c) for c in wgrad.CONFIGS}
builds.update({"along-m " + str(c.all_kwargs()): qb.compile_along_m_sm90(c.kwargs["BLOCK_K"], c.num_warps)
               for c in qb.ALONG_M_CONFIGS})
builds.update({"blocks-transposed " + str(c.all_kwargs()): qb.compile_blocks_both_sm90(c)
               for c in qb.BOTH_LAYOUTS_CONFIGS})
builds.update({"current " + str(c): qc.compile_sm90(c) for c in qc.CONFIGS})
"""


@pytest.mark.slow
def test_the_recipe_kernels_compile_for_hopper_without_spills_or_serialized_wgmma():
    """The wgrad GEMM and the transposed-layout casts of BlockwiseLinearFn, and the one-launch current-scaling
    cast, every config compiled for sm_90 (in a process without the interpreter) and assembled by ptxas: the
    GEMM issues FP8 wgmmas that ptxas does not serialize (C7514/C7517 would name them), the casts round with the
    hardware's saturating E4M3 conversion, the current-scaling cast's barrier is global atomics, and nothing
    spills."""
    builds = _compiled_for_sm90(_COMPILE_RECIPE_SM90)
    assert sum(n.startswith("wgrad") for n in builds) >= 3 and sum(n.startswith("along-m") for n in builds) >= 2
    assert sum(n.startswith("blocks-transposed") for n in builds) == 2
    assert sum(n.startswith("current") for n in builds) >= 4
    for name, b in builds.items():
        assert b["rc"] == 0, (name, b["ptxas"])
        assert "0 bytes spill stores" in b["ptxas"] and "0 bytes spill loads" in b["ptxas"], (name, b["ptxas"])
        if name.startswith("wgrad"):
            assert "wgmma.mma_async.sync.aligned" in b["ptx"] and ".e4m3.e4m3" in b["ptx"], name
            assert "wgmma" not in b["ptxas"], (name, b["ptxas"])
        else:
            assert "cvt.rn.satfinite.e4m3x2" in b["ptx"], name
        if name.startswith("current"):
            # the max and the counts are global atomics; the count in releases, the waits acquire
            assert "atom.global" in b["ptx"] and "release" in b["ptx"] and "acquire" in b["ptx"], name
