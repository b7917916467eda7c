"""Blockwise GEMM probe: which change to fp8bench's blockwise kernel closes the gap to cuBLAS on the H200?

Times kernels/gemm_blockwise.py with each switch that might cost it time, with the settled steady_do_bench,
against cuBLAS (torch._scaled_mm) blockwise and tensorwise:
- sa_t: activation scales passed M-major (`m_major`, a [K/128, M] buffer, copied inside the timing), so a
  tile's 1x128 scales are one coalesced load instead of BLOCK_M loads 4·K/128 bytes apart (DeepGEMM's layout);
- prefetch (`PREFETCH`): each K group's scales are loaded one step ahead;
- persistent (`PERSISTENT`): one program per SM walks the tiles (grouped order);
- unscaled: a plain FP8 GEMM of the same tiles with no scales in the K loop (`_unscaled_kernel` here): the
  ceiling of Triton's code generation before any blockwise work;
- ws (`WS`, with --ws): Triton's warp specialization on the K loop, over the tiles of WS_TILES;
- gluon (with --gluon): kernels/gemm_blockwise_gluon.py, each config and each CANDIDATE (not yet tuned on),
  and the 128x256 configs with free-running math warpgroups (`pingpong=False`, the kernel before e8337d4),
  with a persistent grid and one program per tile, A's scales M-major as the triton backend quantizes them,
  next to the unscaled ceilings of Triton's kernel and of the Gluon kernel's own structure
  (research/gluon_unscaled.py: each K group waited for, or one in flight, or waited for and its accumulators
  multiplied by a per-row factor with nothing loaded); then the error of every blockwise GEMM here, rescale
  and promote, ours and cuBLAS's with and without fast accumulation, against the exact product (FP64) of the
  dequantized operands. --gluon-ceilings: only the 128x256 configs and those ceilings, no accuracy.
Stage 1 runs every variant at 8192³ (time-boxed); stage 2 the best few at the Llama shapes. With --ws, every
WS variant and two plain baselines run at each shape. A config that fails to compile or returns a wrong
result is recorded as such. Results (results/h200-kernels/): gemm_variant_probe.json (committed in 21f59d1, which timed a
copy of the kernel with these switches, since folded in) and gemm_ws_probe.json (committed in cdeaac9, recorded by this
probe's WS part when it was scripts/gemm_ws_probe.py; re-run it after a Triton upgrade) and
gemm_gluon_probe.json (--gluon, at e8337d4).

Usage: python3 research/gemm_variant_probe.py OUT.json [--budget-s 200] [--ws | --gluon | --gluon-ceilings]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton
import triton.language as tl
from fp8bench_kernels.gemm_blockwise import (
    CONFIGS,
    GROUP,
    _set_block_shapes,
    _tile,
    gemm_blockwise,
    gemm_blockwise_reference,
    m_major,
)
from triton.tools.tensor_descriptor import TensorDescriptor

try:  # Gluon's Hopper kernel (needs a Triton with triton.experimental.gluon)
    from fp8bench_kernels.gemm_blockwise_gluon import CANDIDATES, gemm_blockwise_gluon
    from fp8bench_kernels.gemm_blockwise_gluon import CONFIGS as GLUON_CONFIGS

    GLUON_CONFIGS += CANDIDATES  # the configs the tuner may pick, and those that wait for this probe
    # and the 128x256 ones with the math warpgroups running free, as before e8337d4
    GLUON_CONFIGS += tuple(c._replace(pingpong=False) for c in GLUON_CONFIGS if c.block_n == 256 and c.pingpong)
    from gluon_unscaled import unscaled_gluon_gemm
except ImportError:
    GLUON_CONFIGS, gemm_blockwise_gluon, unscaled_gluon_gemm = (), None, None


@triton.jit
def _unscaled_kernel(a_desc, b_desc, c_desc, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     PERSISTENT: tl.constexpr, NUM_SMS: tl.constexpr):
    start = tl.program_id(0)
    step = NUM_SMS if PERSISTENT else tl.num_programs(0)
    stop = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N) if PERSISTENT else start + 1
    for tile_id in range(start, stop, step):
        off_m, off_n = _tile(tile_id, M, N, BLOCK_M, BLOCK_N, 8)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, K, 128):
            acc = tl.dot(a_desc.load([off_m, k]), tl.trans(b_desc.load([off_n, k])), acc)
        c_desc.store([off_m, off_n], acc.to(tl.bfloat16))


def unscaled_gemm(a, b, *, block_m, nsub, warps, stages, persistent=False):
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), device=a.device, dtype=torch.bfloat16)
    bn = nsub * GROUP
    descs = [TensorDescriptor.from_tensor(a, [block_m, GROUP]), TensorDescriptor.from_tensor(b, [bn, GROUP]),
             TensorDescriptor.from_tensor(c, [block_m, bn])]
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, bn)
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else 4
    _unscaled_kernel[(min(tiles, sms) if persistent else tiles,)](
        *descs, m, n, k, BLOCK_M=block_m, BLOCK_N=bn, PERSISTENT=persistent, NUM_SMS=sms, num_warps=warps,
        num_stages=stages)
    return c


def probe_gemm(a, sa, b, sb, *, block_m=None, nsub=None, warps=None, stages=None, promote=True, prefetch=False, sa_t=False,
               scaled=True, persistent=False, ws=False, gluon=None, gluon_in_flight=None, multiply=False):
    """One variant: fp8bench's kernel with that config, or (scaled=False) the unscaled ceiling: Triton's, or with
    `gluon_in_flight` the Gluon kernel's structure (research/gluon_unscaled.py)."""
    if gluon is not None:
        return gemm_blockwise_gluon(a, sa, b, sb, gluon, persistent)  # sa: as the triton backend quantizes it
    if gluon_in_flight is not None:
        return unscaled_gluon_gemm(a, b, gluon_in_flight, stages, persistent, multiply)
    if not scaled:
        return unscaled_gemm(a, b, block_m=block_m, nsub=nsub, warps=warps, stages=stages, persistent=persistent)
    config = triton.Config({"BLOCK_M": block_m, "NSUB": nsub, "GROUP_M": 8, "PROMOTE": promote,
                            "PREFETCH": prefetch, "PERSISTENT": persistent, "WS": ws},
                           num_warps=warps, num_stages=stages, pre_hook=_set_block_shapes)
    return gemm_blockwise(a, m_major(sa) if sa_t else sa, b, sb, config)


TILES = [  # (promote, block_m, nsub, warps, stages): the kernel's best configs in the earlier probes
    (True, 64, 1, 4, 4), (True, 64, 1, 4, 3), (True, 128, 1, 8, 4), (True, 128, 2, 8, 3),
    (False, 128, 1, 8, 4), (False, 128, 2, 8, 3)]
SHAPES = {"8192^3": (8192, 8192, 8192), "l2-7b gate_up": (8192, 22016, 4096),
          "l3-70b down fprop": (8192, 8192, 28672)}


def variants():
    """The kernel's ceiling first, then the switches (outer) over the tiles (inner): if the time box ends
    stage 1 early, what is left out is the least likely combinations."""
    for bm, ns, w, st in ((64, 1, 4, 4), (128, 1, 8, 4), (128, 2, 8, 3)):
        yield dict(block_m=bm, nsub=ns, warps=w, stages=st, scaled=False)
    flags = [(False, False, False), (True, True, False), (True, False, False), (False, True, False),
             (True, True, True), (False, False, True), (True, False, True), (False, True, True)]
    for sa_t, pre, pers in flags:
        for p, bm, ns, w, st in TILES:
            yield dict(promote=p, block_m=bm, nsub=ns, warps=w, stages=st, sa_t=sa_t, prefetch=pre, persistent=pers)
    for bm, ns, w, st in ((64, 1, 4, 4), (128, 1, 8, 4), (128, 2, 8, 3)):
        yield dict(block_m=bm, nsub=ns, warps=w, stages=st, scaled=False, persistent=True)


WS_TILES = [(128, 1, 4, 3), (128, 1, 4, 4), (128, 1, 8, 3), (128, 1, 8, 4), (128, 2, 8, 3), (64, 1, 4, 4),
            (64, 2, 4, 3), (128, 2, 4, 3), (256, 1, 8, 3)]
"""(BLOCK_M, NSUB, warps, stages) tried with WS, for both the promote and rescale variants."""


def ws_variants():
    for p in (True, False):
        for bm, ns, w, st in WS_TILES:
            yield dict(promote=p, block_m=bm, nsub=ns, warps=w, stages=st, ws=True)
    for bm, ns, w, st in ((64, 1, 4, 4), (128, 1, 8, 4)):  # the best plain configs of the earlier kernel
        yield dict(promote=True, block_m=bm, nsub=ns, warps=w, stages=st)


def gluon_variants():
    for persistent in (True, False):
        for config in GLUON_CONFIGS:
            yield dict(gluon=config, persistent=persistent)
    yield from (v for v in gluon_ceiling_variants() if v.get("gluon") is None)  # the ceilings


def gluon_ceiling_variants():
    """Promote and rescale on 128x256 tiles against the ceilings of the same tiles: Triton's unscaled kernel and
    the Gluon structure's own, each K group waited for, one in flight, or waited for and multiplied."""
    if GLUON_CONFIGS:
        for promote in (True, False):
            yield dict(gluon=next(c for c in GLUON_CONFIGS if c.block_n == 256 and c.promote is promote),
                       persistent=True)
    yield dict(block_m=128, nsub=2, warps=8, stages=3, scaled=False, persistent=True)
    for in_flight in (0, 1):
        yield dict(gluon_in_flight=in_flight, stages=3, scaled=False, persistent=True)
    yield dict(gluon_in_flight=0, multiply=True, stages=3, scaled=False, persistent=True)


def label(v: dict) -> str:
    if v.get("gluon") is not None:
        return f"gluon {v['gluon']!r}" + (" persistent" if v["persistent"] else "")
    if v.get("gluon_in_flight") is not None:
        return (f"unscaled gluon 128x256 s{v['stages']} groups in flight {v['gluon_in_flight']} persistent"
                + (" + per-group multiply" if v.get("multiply") else ""))
    if not v.get("scaled", True):
        return f"unscaled {v['block_m']}x{128 * v['nsub']} w{v['warps']} s{v['stages']}" + (" persistent" if v.get("persistent") else "")
    flags = [f for f in ("sa_t", "prefetch", "persistent") if v.get(f)]
    return (f"{'promote' if v['promote'] else 'rescale'} {v['block_m']}x{128 * v['nsub']} w{v['warps']} "
            f"s{v['stages']}" + "".join(f" +{f}" for f in flags) + (" WS" if v.get("ws") else ""))


def probe_shape(name: str, mnk: tuple[int, int, int], todo: list[dict], deadline: float | None,
                best: list[tuple[float, dict]]) -> dict:
    """One shape: cuBLAS blockwise and tensorwise, the autotuned kernel, then each variant in `todo` (until
    `deadline`); the scaled variants' TFLOPS go to `best`."""
    from fp8bench_kernels._tune import steady_do_bench
    from fp8bench_kernels.quantize_blockwise import quantize_blockwise
    from kernel_bench import recipe

    from fp8bench.backends import get_backend
    from fp8bench.core.types import GemmRole

    m, n, k = mnk
    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(n, k, device="cuda").bfloat16()
    qa, sa = quantize_blockwise(a, (1, 128), True)
    sa_tma = m_major(sa)  # padded M-major, as the triton backend's quantizer writes them: what the Gluon TMA reads
    qb, sb = quantize_blockwise(b, (128, 128), True)
    ref = gemm_blockwise(qa, sa, qb, sb).float()
    ref_unscaled = qa.float() @ qb.float().t()
    fl = 2.0 * m * n * k
    row: dict = {"shape": name, "mnk": [m, n, k]}
    for scaling in ("blockwise", "current"):
        op = get_backend("torch").gemm(a, b, GemmRole.FPROP, recipe("torch", scaling))
        row[f"cublas_{scaling}"] = round(fl / steady_do_bench(op.kernel_only) / 1e9, 1)
    row["fp8bench_autotuned"] = round(fl / steady_do_bench(lambda: gemm_blockwise(qa, sa, qb, sb)) / 1e9, 1)
    for v in todo:
        if deadline is not None and time.monotonic() > deadline:
            row["stopped"] = "budget spent"
            break
        try:
            scales = sa_tma if v.get("gluon") is not None else sa
            y = probe_gemm(qa, scales, qb, sb, **v).float()
            want = ref if v.get("scaled", True) else ref_unscaled
            err = ((y - want).norm() / want.norm()).item()
            if err > 1e-2:
                row[label(v)] = f"wrong: rel err {err:.3g}"
            else:
                tf = fl / steady_do_bench(lambda v=v, s=scales: probe_gemm(qa, s, qb, sb, **v)) / 1e9
                row[label(v)] = round(tf, 1)
                if v.get("scaled", True):
                    best.append((tf, v))
        except Exception as e:  # a config that does not compile is a finding, not the end of the probe
            row[label(v)] = f"failed: {type(e).__name__}: {str(e)[:160]}"
        print(name, label(v), row[label(v)], flush=True)
    return row


def cublas_blockwise(qa, sa, qb, sb, fast_accum: bool):
    """F.scaled_mm (cuBLAS) on the same quantized operands, scales in the layouts it asks for."""
    import torch.nn.functional as F

    from fp8bench.backends.scaled_mm import cublas_blockwise_scales
    return F.scaled_mm(qa, qb.t(), cublas_blockwise_scales(sa, False), F.ScalingType.BlockWise1x128,
                       cublas_blockwise_scales(sb, True), F.ScalingType.BlockWise128x128,
                       output_dtype=torch.bfloat16, use_fast_accum=fast_accum)


def accuracy(name: str, mnk: tuple[int, int, int], rows: int = 512) -> dict:
    """Each GEMM's error on the first `rows` x `rows` outputs against the exact (FP64) product of the dequantized
    operands: relative Frobenius error and the largest error over the output's RMS."""
    from fp8bench_kernels.quantize_blockwise import quantize_blockwise
    m, n, k = mnk
    g = torch.Generator(device="cuda").manual_seed(0)
    qa, sa = quantize_blockwise(torch.randn(m, k, device="cuda", generator=g).bfloat16(), (1, 128), True)
    qb, sb = quantize_blockwise(torch.randn(n, k, device="cuda", generator=g).bfloat16(), (128, 128), True)
    exact = gemm_blockwise_reference(qa[:rows].double(), sa[:rows].double(), qb[:rows].double(),
                                     sb[: rows // GROUP].double())
    promote = next(c for c in CONFIGS if c.kwargs["PROMOTE"] and c.kwargs["NSUB"] == 2)
    rescale = next(c for c in CONFIGS if not c.kwargs["PROMOTE"] and c.kwargs["NSUB"] == 2)
    runs = {"triton promote": lambda: gemm_blockwise(qa, sa, qb, sb, promote),
            "triton rescale": lambda: gemm_blockwise(qa, sa, qb, sb, rescale),
            "cublas blockwise": lambda: cublas_blockwise(qa, sa, qb, sb, False),
            "cublas blockwise fast_accum": lambda: cublas_blockwise(qa, sa, qb, sb, True)}
    for config in GLUON_CONFIGS:
        runs[f"gluon {config!r}"] = lambda config=config: gemm_blockwise_gluon(qa, m_major(sa), qb, sb, config)
    row: dict = {"shape": name, "mnk": [m, n, k], "rows": rows}
    bf16 = exact.bfloat16().double()  # the floor: rounding the exact product to BF16
    row["bf16 rounding of exact"] = {"rel_fro": ((bf16 - exact).norm() / exact.norm()).item()}
    for label_, run in runs.items():
        try:
            y = run()[:rows, :rows].double()
            d = y - exact
            row[label_] = {"rel_fro": (d.norm() / exact.norm()).item(),
                           "max_over_rms": (d.abs().max() / exact.pow(2).mean().sqrt()).item()}
        except Exception as e:
            row[label_] = f"failed: {type(e).__name__}: {str(e)[:160]}"
        print(name, "accuracy", label_, row[label_], flush=True)
    return row


def main() -> int:
    sys.path.insert(0, "scripts")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--ws", action="store_true", help="probe Triton's warp specialization instead")
    ap.add_argument("--gluon", action="store_true", help="probe the Gluon kernel (and every kernel's accuracy)")
    ap.add_argument("--gluon-ceilings", action="store_true",
                    help="only the Gluon kernel's 128x256 configs against the unscaled ceilings of those tiles")
    args = ap.parse_args()
    rows: list[dict] = []
    best: list[tuple[float, dict]] = []
    for stage, (name, mnk) in enumerate(SHAPES.items()):
        if args.ws:
            rows.append(probe_shape(name, mnk, list(ws_variants()), None, []))
        elif args.gluon:
            rows.append(probe_shape(name, mnk, list(gluon_variants()), None, []))
        elif args.gluon_ceilings:
            rows.append(probe_shape(name, mnk, list(gluon_ceiling_variants()), None, []))
        elif stage == 0:
            rows.append(probe_shape(name, mnk, list(variants()), time.monotonic() + args.budget_s, best))
            top = [v for _, v in sorted(best, key=lambda t: -t[0])[:8]] + list(variants())[:3]  # + ceilings
        else:
            rows.append(probe_shape(name, mnk, top, None, []))
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
        torch.cuda.empty_cache()
    if args.gluon:
        for name in ("8192^3", "l3-70b down fprop"):
            rows.append(accuracy(name, SHAPES[name]))
            with open(args.out, "w") as f:
                json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
