"""Direct launches (`_launch`): the keys that pick a compiled binary tell apart what Triton specializes on, a
launch binds only constexprs once per key, and a direct launch writes what a launch through Triton writes."""


import pytest
import torch
from kernel_cases import CUDA, DEV, GEMMS, bits, data, gemm_operands


def test_launch_key_tells_apart_what_triton_specializes_a_binary_on(k):
    """The fast launch reuses a compiled binary only for calls Triton would have given the same one."""
    from fp8bench_kernels._launch import launch_key
    from triton.tools.tensor_descriptor import TensorDescriptor

    x = torch.zeros(64, 64, dtype=torch.bfloat16, device=DEV)
    base = launch_key((x, 64, x.stride(0)), {"POW2": False})
    assert launch_key((torch.ones_like(x), 64, 64), {"POW2": False}) == base  # another tensor alike
    for other in [((x.view(-1)[1:], 64, 64), {"POW2": False}),  # 2 bytes on: not 16-byte aligned
                  ((x.float(), 64, 64), {"POW2": False}), ((x, 65, 64), {"POW2": False}),
                  ((x, 1, 64), {"POW2": False}), ((x, 64, 64), {"POW2": True}), ((x, 64, 64), {})]:
        assert launch_key(*other) != base, other
    assert launch_key((x, True), {}) != launch_key((x, 1), {})
    desc = TensorDescriptor.from_tensor(x, [16, 32])
    assert launch_key((desc,), {}) == launch_key((TensorDescriptor.from_tensor(x.clone(), [16, 32]),), {})
    assert launch_key((desc,), {}) != launch_key((TensorDescriptor.from_tensor(x, [32, 32]),), {})
    assert launch_key((desc,), {}) != launch_key((TensorDescriptor.from_tensor(x[:32], [16, 32]),), {})


def test_what_a_launch_passes_by_keyword_is_a_constexpr_the_key_fixes(k, monkeypatch):
    """A direct launch binds the parameters a call does not pass positionally once per key (`Launcher.launch`):
    right only where they are constexprs. Every launcher a cast or GEMM calls here passes nothing else by
    keyword, and a kernel's constexprs are found as Triton finds them (on the H200 the direct-launch test checks
    the Gluon kernels' calls bit for bit against Triton's)."""
    from fp8bench_kernels._launch import Launcher

    seen: dict[Launcher, set[str]] = {}  # by launcher: the Triton and Gluon GEMMs' kernels share a name
    launch = Launcher.launch

    def recording(self, key, grid, args, kwargs):
        seen.setdefault(self, set()).update(self.arg_names[len(args):])
        return launch(self, key, grid, args, kwargs)
    monkeypatch.setattr(Launcher, "launch", recording)
    x = data(256, 384)
    k.quantize_current.quantize_current(x)
    k.quantize_blockwise.quantize_blockwise(x, (1, 128))
    k.quantize_blockwise.quantize_blockwise(x, (128, 128))
    # on a GPU, X with unit stride along K goes to the Gluon cast; X laid out along M to the Triton kernels
    for both in (x, data(384, 256).t()) if CUDA else (x,):
        k.quantize_blockwise.quantize_blockwise_both(both)
        k.quantize_blockwise.quantize_blockwise_both(both, weight=True)
    k.quantize_mx.quantize_mx(x)
    a, sa, b, sb = gemm_operands(k, *GEMMS[0][:3] if not CUDA else (256, 256, 256))
    for fast_accum in (False, True):  # one launcher each
        k.gemm_blockwise.gemm_blockwise(a, sa, b, sb, fast_accum=fast_accum)
    b_along_k, sb_along_k = k.quantize_blockwise.quantize_blockwise(data(*b.shape, 2), (1, 128))
    k.gemm_blockwise_wgrad.gemm_blockwise_wgrad(a, sa, b_along_k, sb_along_k)
    modules = [k.quantize_current, k.quantize_blockwise, k.quantize_mx, k.gemm_blockwise_wgrad]
    if CUDA:  # the Hopper kernels, which the interpreter does not run
        k.gemm_blockwise_gluon.gemm_blockwise_gluon(a, sa, b, sb, config=k.gemm_blockwise_gluon.CONFIGS[2])
        modules += [k.gemm_blockwise_gluon, k.quantize_blockwise_gluon]
    assert {"_current_cast_kernel", "_quantize_1x128_kernel", "_quantize_128x128_kernel"} <= {
        lau.name for lau in seen}
    launchers = {lau for mod in modules for lau in vars(mod).values() if isinstance(lau, Launcher)}
    launchers.update(k.gemm_blockwise._LAUNCH_AUTOTUNED.values())
    assert set(seen) == launchers, sorted(lau.name for lau in set(seen) ^ launchers)
    for launcher, rest in seen.items():
        assert rest <= launcher._constexprs(), (launcher.name, rest - launcher._constexprs())
    assert k.quantize_current._launch_cast._constexprs() == {"BLOCK_M", "BLOCK_N", "TRANSPOSE", "REVERSE"}


def test_cast_launch_keys_tell_apart_what_launch_key_tells_apart(monkeypatch):
    """The blockwise and current-scaling casts key their direct launches themselves (`cast_key`: X, the integer
    arguments and the flags, not the fresh outputs): per launcher, over shapes, input dtypes, a misaligned input,
    power-of-two scales, both scale layouts, with or without Yᵀ and two tiles of the current-scaling cast, two
    calls get the same key exactly when `launch_key` gives them the same one. Different binaries never share a key, and no key
    is finer than Triton's (a key that took in an output would miss on every call and keep every compiled
    kernel)."""
    from itertools import combinations, product

    from fp8bench_kernels import quantize_blockwise as qb
    from fp8bench_kernels import quantize_current as qc
    from fp8bench_kernels._launch import launch_key

    class Recording:
        def __init__(self):
            self.keys = []

        def launch(self, key, grid, args, kwargs):
            self.keys.append((key, launch_key(args, kwargs)))
    launchers = {"_launch_1x128": qb, "_launch_128x128": qb, "_launch_128x128_both": qb, "_launch_along_m": qb,
                 "_launch_cast": qc}
    recordings = {name: Recording() for name in launchers}
    for name, recording in recordings.items():
        monkeypatch.setattr(launchers[name], name, recording)

    def inputs(m, k, dtype):
        # each twice, at two addresses (both kept alive): the same binary, so the same key
        aligned = [torch.zeros(m, k, dtype=dtype) for _ in range(2)]
        off = [torch.zeros(m * k + 1, dtype=dtype)[1:].view(m, k) for _ in range(2)]  # off 16-byte alignment
        return aligned + off
    for (m, k), dtype, pow2 in product([(256, 256), (256, 384), (272, 256), (256, 272)],
                                       (torch.bfloat16, torch.float32), (False, True)):
        for x in inputs(m, k, dtype):
            qb.quantize_blockwise(x, (1, 128), pow2)
            qb.quantize_blockwise(x, (1, 128), pow2, m_major_scales=True)
            qb.quantize_blockwise(x, (128, 128), pow2)
            qb.quantize_blockwise_both(x, pow2_scales=pow2)
            if dtype == torch.bfloat16:  # from FP32 the weight path casts Y alone (then transposes it)
                qb.quantize_blockwise_both(x, weight=True, pow2_scales=pow2)
            # pow2 stands in for the other flag; both values per input. An explicit grid: the default one is
            # found by compiling for X's device, a CPU here
            qc.quantize_current(x, transpose=pow2, programs=1)
            qc.quantize_current(x, transpose=pow2, programs=1, config=qc.CONFIGS[2])  # another tile, warps, order
    for name, recording in recordings.items():
        distinct = {theirs for _, theirs in recording.keys}
        assert 16 <= len(distinct) < len(recording.keys), name  # the calls differ, and some are the same binary
        for (ours1, theirs1), (ours2, theirs2) in combinations(recording.keys, 2):
            assert (theirs1 == theirs2) == (ours1 == ours2), (name, ours1, ours2)


@pytest.mark.gpu
def test_direct_launches_write_what_launches_through_triton_write(k):
    """After a kernel's first call with a key, the next call goes straight to its binary (its launcher counts it)
    and, on other data, writes the bits the same call writes through Triton; an input 2 bytes off alignment is a
    key of its own, whose first call goes through Triton."""
    from fp8bench_kernels import gemm_blockwise_gluon as g
    from fp8bench_kernels import gemm_blockwise_wgrad as w
    from fp8bench_kernels import quantize_blockwise as qb
    from fp8bench_kernels import quantize_blockwise_gluon as qg
    from fp8bench_kernels import quantize_current as qc
    from fp8bench_kernels import quantize_mx as qm
    from fp8bench_kernels._launch import Launcher

    def same(u, v):
        return all(torch.equal(bits(s.reshape(-1)), bits(t.reshape(-1))) for s, t in zip(u, v, strict=True))

    def direct_then_through_triton(call, launchers):
        before = [lau.fast_launches for lau in launchers]
        direct = call()
        Launcher.direct = False
        try:
            through_triton = call()
        finally:
            Launcher.direct = True
        assert [lau.fast_launches for lau in launchers] == [b + 1 for b in before]  # once each, the first call
        return direct, through_triton

    x, other = data(4096, 2048), data(4096, 2048, seed=3)
    casts = {"current": (qc.quantize_current, [qc._launch_cast]),
             "1x128 both": (qb.quantize_blockwise_both, [qg._launch_both]),
             "128x128 both": (lambda t: qb.quantize_blockwise_both(t, weight=True), [qg._launch_both]),
             "mx": (qm.quantize_mx, [qm._launch_mx])}
    for name, (cast, launchers) in casts.items():
        cast(x)  # the key's first call: through Triton (compiled, tuned)
        assert same(*direct_then_through_triton(lambda cast=cast: cast(other), launchers)), name

    # a view one BF16 element in: the same shape and strides, only the address 2 bytes off 16-byte alignment
    off = torch.empty(4096 * 2048 + 1, dtype=torch.bfloat16, device=DEV)[1:].view(4096, 2048)
    off.copy_(x)
    qb.quantize_blockwise(x, (1, 128))
    before = qb._launch_1x128.fast_launches
    first = qb.quantize_blockwise(off, (1, 128))
    assert qb._launch_1x128.fast_launches == before  # a key of its own: through Triton
    assert same(first, qb.quantize_blockwise_reference(x, (1, 128)))
    # its second call: direct, on data no earlier call quantized (freed blocks holding x's bits could otherwise
    # pass for the output of a launch that wrote nothing)
    fresh = data(4096, 2048, seed=7)
    off.copy_(fresh)
    direct, through_triton = direct_then_through_triton(lambda: qb.quantize_blockwise(off, (1, 128)),
                                                        [qb._launch_1x128])
    assert same(direct, through_triton) and same(direct, qb.quantize_blockwise_reference(fresh, (1, 128)))

    a, sa, b, sb = gemm_operands(k, 4096, 2048, 4096)
    a2, sa2 = qb.quantize_blockwise(data(4096, 4096, 5), (1, 128))
    bw, sbw = qb.quantize_blockwise(data(2048, 4096, 2), (1, 128))
    gemms = {"gluon": (lambda a, sa: g.gemm_blockwise_gluon(a, sa, b, sb, g.CONFIGS[0]), g._launch_gemm),
             "wgrad": (lambda a, sa: w.gemm_blockwise_wgrad(a, sa, bw, sbw), w._launch_autotuned)}
    for name, (gemm, launcher) in gemms.items():
        gemm(a, sa)
        direct, through_triton = direct_then_through_triton(lambda gemm=gemm: gemm(a2, sa2), [launcher])
        assert same((direct,), (through_triton,)), name  # bits: -0.0 and NaN told apart
