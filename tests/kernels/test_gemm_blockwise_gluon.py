"""The Gluon blockwise GEMMs (`gemm_blockwise_gluon`): descriptors and launch keys on the CPU, the structure
compiled for sm_90 without a GPU, and on a GPU every config against the dequantized reference."""


import pytest
import torch
from kernel_cases import DEV, GEMMS, _compiled_elsewhere, data, gemm_operands

from fp8bench.core.numerics import sqnr_db


def test_gluon_gemm_keeps_descriptors_by_address_and_no_tensor_alive():
    """The Gluon GEMM's descriptors are built once per address, shape, strides and block, on a base that holds
    the address only: a kept descriptor pins no memory, and Triton keys it as it keys the tensor's own."""
    import weakref

    from fp8bench_kernels import gemm_blockwise_gluon as g
    from fp8bench_kernels._launch import launch_key

    t = torch.zeros(256, 256, dtype=torch.float8_e4m3fn)
    d = g._descriptor(t, (128, 128))
    assert g._descriptor(t, (128, 128)) is d
    assert (d.base.data_ptr(), d.shape, d.strides, d.block_shape) == (t.data_ptr(), [256, 256], [256, 1], [128, 128])
    built = g.TensorDescriptor.from_tensor(t, [128, 128], d.layout)
    assert launch_key((d,), {}) == launch_key((built,), {})
    for other in [g._descriptor(t[128:], (128, 128)), g._descriptor(t, (64, 128)), g._descriptor(t[:, :128], (128, 128)),
                  g._descriptor(t.view(torch.uint8), (128, 128), d.layout)]:
        assert other is not d and launch_key((other,), {}) != launch_key((d,), {})
    twin = torch.zeros_like(t)  # the same in all but its address
    assert g._descriptor(twin, (128, 128)).base.data_ptr() == twin.data_ptr() != t.data_ptr()
    # the same address and shape, other strides
    square, strided = t.view(-1)[:128 * 128].view(128, 128), t[:128, :128]
    assert g._descriptor(square, (128, 128)).strides == [128, 1] and g._descriptor(strided, (128, 128)).strides == [256, 1]
    alive = weakref.ref(t)
    del t, built, twin, square, strided
    assert alive() is None
    with pytest.raises(AssertionError, match="16-byte aligned"):  # validated when built, as from_tensor does
        g._descriptor(torch.zeros(256 * 256 + 1, dtype=torch.float8_e4m3fn)[1:].view(256, 256), (128, 128))


def test_gluon_gemm_launch_keys_tell_apart_what_launch_key_tells_apart(monkeypatch):
    """The Gluon GEMMs key their direct launches themselves (cheaper than `launch_key` over 17 arguments): any two
    calls that `launch_key` would give different binaries must get different keys from them too."""
    from itertools import combinations

    from fp8bench_kernels import gemm_blockwise_gluon as g
    from fp8bench_kernels._launch import launch_key

    class Recording:
        def __init__(self):
            self.keys = []

        def launch(self, key, grid, args, kwargs):
            self.keys.append((key, launch_key(args, kwargs)))
    monkeypatch.setattr(g, "sm_count", lambda device: 132)
    fp8 = torch.float8_e4m3fn

    def call(m, n, k, misaligned_sb=False, wgrad=False):
        groups = -(-k // 128)
        a, b = torch.zeros(m, k, dtype=fp8), torch.zeros(n, k, dtype=fp8)
        sa_t, c = g.m_major(torch.ones(m, groups)).t(), torch.empty(m, n, dtype=torch.bfloat16)
        if wgrad:
            g._launch(a, sa_t, b, g.m_major(torch.ones(n, groups)).t(), c, g.WGRAD_CONFIGS[0], True, groups)
            return
        sb = torch.ones(-(-n // 128) * groups + 1)[int(misaligned_sb):][:-(-n // 128) * groups or None]
        g._launch(a, sa_t, b, sb.view(-(-n // 128), groups), c, g.CONFIGS[3], True, groups)
    shapes = [(256, 256, 256), (256, 256, 128), (272, 256, 256), (256, 272, 256), (256, 256, 384), (512, 256, 256)]
    variants = [*shapes, (256, 256, 256, True), *[(*s, False, True) for s in shapes]]  # fprop, then wgrad
    recording = Recording()
    monkeypatch.setattr(g, "_launch_gemm", recording)
    for v in variants:
        call(*v)
    for (ours1, theirs1), (ours2, theirs2) in combinations(recording.keys, 2):
        assert theirs1 == theirs2 or ours1 != ours2, (ours1, ours2)
    assert len({theirs for _, theirs in recording.keys}) == len(variants)  # each variant its own binary


def gluon_configs():
    """The tuned configs, the candidates not yet timed on the H200 and the free-running promote the probes time
    against the tuned one: all must build and be right."""
    from fp8bench_kernels.gemm_blockwise_gluon import CANDIDATES, CONFIGS

    return CONFIGS + CANDIDATES + (CONFIGS[2]._replace(pingpong=False),)  # + the probes' free-running kernel


def sm90_configs():
    """What CI compiles for sm_90: `gluon_configs`, and the weight gradient's kernel taking turns and not."""
    from fp8bench_kernels.gemm_blockwise_gluon import WGRAD_CONFIGS

    return gluon_configs() + WGRAD_CONFIGS + (WGRAD_CONFIGS[0]._replace(pingpong=False),)


_COMPILE_SM90 = """
import json, sys
from fp8bench_kernels.gemm_blockwise_gluon import Config, compile_sm90
builds = {repr(config): compile_sm90(config) for config in (Config(*fields) for fields in json.load(sys.stdin))}
"""


@pytest.fixture(scope="module")
def sm90_builds():
    """Every Gluon config compiled for sm_90 (`_compiled_elsewhere`)."""
    import json

    return _compiled_elsewhere(_COMPILE_SM90, json.dumps(sm90_configs()))


@pytest.mark.slow
@pytest.mark.parametrize("config", sm90_configs(), ids=repr)
def test_gluon_gemm_compiles_for_hopper_with_no_wgmma_serialized(config, sm90_builds):
    """The Gluon kernel cannot run under the interpreter, so CI compiles it for sm_90 and checks what makes it
    fast: warp-specialized (register reallocation between producer and math warpgroups), FP8 wgmmas of the
    half-tile width, and no wgmma that ptxas serializes or waits on behind the kernel's back (C7514/C7517:
    an accumulator register read while a wgmma is in flight, what held the Triton kernel back), no spills."""
    from fp8bench_kernels._sm90 import assemble_sm90
    from fp8bench_kernels.gemm_blockwise_gluon import SMEM_LIMIT

    build = sm90_builds[repr(config)]
    ptx = build["ptx"]
    assert "setmaxnreg.dec.sync.aligned.u32" in ptx
    assert f"wgmma.mma_async.sync.aligned.m64n{config.sub_n}k32.f32.e4m3.e4m3" in ptx
    # the math warpgroups' turns: each syncs on its own named barrier and arrives on the other's
    turns = [f"bar.{op} {barrier}, 256" for op in ("sync", "arrive") for barrier in (8, 9)]
    assert [t in ptx for t in turns] == [config.pingpong] * 4
    assert config.smem_bytes() <= build["shared"] <= SMEM_LIMIT
    ptxas = assemble_sm90(ptx)
    assert ptxas.returncode == 0, ptxas.stderr
    assert "wgmma" not in ptxas.stderr, ptxas.stderr  # C7514 / C7517 name the serialized wgmma
    assert "0 bytes spill stores" in ptxas.stderr


RAGGED = (1001, 1064, 1008)
"""Ragged edges: partial tiles in M, a half-tile past N, a partial K group; M % 4 = 1, so A's scales are copied
for the TMA unless the quantizer wrote them M-major and padded"""
GLUON_GEMMS = GEMMS + [pytest.param(*RAGGED, marks=pytest.mark.gpu)]


@pytest.mark.gpu
@pytest.mark.parametrize("fast_accum", [False, True], ids=["promote", "rescale"])
@pytest.mark.parametrize("m,n,kk", GLUON_GEMMS)
def test_gluon_gemm_tunes_within_one_numerics(k, m, n, kk, fast_accum):
    from fp8bench_kernels import gemm_blockwise_gluon as g

    a, sa, b, sb = gemm_operands(k, m, n, kk)
    c = g.gemm_blockwise_gluon(a, sa, b, sb, fast_accum=fast_accum)
    assert sqnr_db(k.gemm_blockwise.gemm_blockwise_reference(a, sa, b, sb), c.float()) > 40.0
    config, _ = g._picked[(m, n, kk, fast_accum, sa.stride(), a.device)]
    assert config.promote is not fast_accum


@pytest.mark.gpu
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "tile-per-program"])
@pytest.mark.parametrize("config", gluon_configs(), ids=repr)
@pytest.mark.parametrize("m,n,kk", GLUON_GEMMS)
def test_gluon_gemm_matches_the_dequantized_reference(k, m, n, kk, config, persistent):
    from fp8bench_kernels.gemm_blockwise_gluon import gemm_blockwise_gluon

    a, sa, b, sb = gemm_operands(k, m, n, kk)
    ref = k.gemm_blockwise.gemm_blockwise_reference(a, sa, b, sb)
    padded = k.quantize_blockwise.quantize_blockwise(data(m, kk, 1), (1, 128), m_major_scales=True)[1]
    for scales in (sa, sa.t().contiguous().t(), padded):  # row-major, M-major unpadded, M-major padded
        c = gemm_blockwise_gluon(a, scales, b, sb, config, persistent)
        assert c.dtype == torch.bfloat16 and c.shape == (m, n)
        assert sqnr_db(ref, c.float()) > 40.0


@pytest.mark.gpu
@pytest.mark.parametrize("persistent", [True, False], ids=["persistent", "tile-per-program"])
@pytest.mark.parametrize("config", [c for c in gluon_configs() if c.pingpong], ids=repr)
def test_gluon_gemm_turns_change_only_the_order_of_issue(k, config, persistent):
    """The math warpgroups' turns reorder when wgmmas are issued, not what is computed: bit-identical to the
    same config running free, ragged edges included (tiles stay tile-local, each sum in its own order)."""
    from fp8bench_kernels.gemm_blockwise_gluon import gemm_blockwise_gluon

    a, sa, b, sb = gemm_operands(k, *RAGGED)
    turns = gemm_blockwise_gluon(a, sa, b, sb, config, persistent)
    free = gemm_blockwise_gluon(a, sa, b, sb, config._replace(pingpong=False), persistent)
    assert torch.equal(turns, free)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,kk", [(4096, 11008, 8192), (1040, 4112, 2064)])
def test_gluon_wgrad_gemm_matches_the_dequantized_reference(k, m, n, kk):
    """The Gluon structure with B's scales per column (WGRAD_CONFIGS), every config and grid kind, the tuner's
    pick and row-major scales (copied M-major): at the shape of Llama-2-7B's down-projection weight gradient
    (4096 x 11008 over 8192 tokens) and at one of partial tiles and groups everywhere (the scales' TMA
    zero-fill past N)."""
    from fp8bench_kernels import gemm_blockwise_gluon as g

    rows = torch.logspace(-2, 2, n, device=DEV)[:, None]  # B's scales differ by column, not only along K
    a, sa = k.quantize_blockwise.quantize_blockwise(data(m, kk, 1), (1, 128), m_major_scales=True)
    b, sb = k.quantize_blockwise.quantize_blockwise((data(n, kk, 2) * rows).bfloat16(), (1, 128), m_major_scales=True)
    ref = k.gemm_blockwise_wgrad.gemm_blockwise_wgrad_reference(a, sa, b, sb)
    runs = [(config, persistent) for config in g.WGRAD_CONFIGS for persistent in (True, False)]
    turns = g.gemm_blockwise_gluon_wgrad(a, sa, b, sb, g.WGRAD_CONFIGS[0])  # the turns order issue only
    assert torch.equal(turns, g.gemm_blockwise_gluon_wgrad(a, sa, b, sb, g.WGRAD_CONFIGS[0]._replace(pingpong=False)))
    for config, persistent in [*runs, (None, True)]:
        c = g.gemm_blockwise_gluon_wgrad(a, sa, b, sb, config, persistent)
        assert c.dtype == torch.bfloat16 and c.shape == (m, n)
        assert sqnr_db(ref, c.float()) > 40.0, (config, persistent)
    assert sqnr_db(ref, g.gemm_blockwise_gluon_wgrad(a, sa.contiguous(), b, sb.contiguous()).float()) > 40.0
    with pytest.raises(ValueError, match="weight-gradient config"):
        g.gemm_blockwise_gluon_wgrad(a, sa, b, sb, g.CONFIGS[0])
