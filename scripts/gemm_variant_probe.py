"""Blockwise GEMM probe: which change to fp8bench's blockwise kernel closes the gap to cuBLAS on the H200?

A copy of kernels/gemm_blockwise.py's kernel with switches for what might cost it time, each timed with the
settled steady_do_bench against cuBLAS (torch._scaled_mm) blockwise and tensorwise:
- SA_T: activation scales read from a [K/128, M] (M-major) copy, so a tile's 1x128 scales are one coalesced
  load instead of BLOCK_M loads 4·K/128 bytes apart (DeepGEMM asks for this layout);
- PREFETCH: each K step's scales are loaded one step ahead, so their latency hides behind the previous
  step's tensor-core work (Triton pipelines the TMA operand loads, not these pointer loads);
- PERSISTENT: one program per SM walks the tiles (grouped order), instead of one program per tile;
- SCALED=False: no scales in the K loop at all (plain tensorwise accumulation): the same kernel's ceiling,
  i.e. what Triton's code generation reaches here before any blockwise work.
Stage 1 runs every variant at 8192³ (time-boxed); stage 2 the best few at the Llama shapes.

Usage: python3 scripts/gemm_variant_probe.py OUT.json [--budget-s 200]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

GROUP = 128


@triton.jit
def _tile_coords(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    grid_m, grid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    first_m = (tile // width) * GROUP_M
    group_m = tl.minimum(grid_m - first_m, GROUP_M)
    return first_m + (tile % width) % group_m, (tile % width) // group_m


@triton.jit
def _one_tile(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, M, N, n_kgroups, sa_sm, sa_sk, off_m, off_n,
              BLOCK_M: tl.constexpr, NSUB: tl.constexpr, PROMOTE: tl.constexpr, PREFETCH: tl.constexpr,
              SCALED: tl.constexpr):
    BLOCK_K: tl.constexpr = 128
    SUB_N: tl.constexpr = 128
    rm = off_m + tl.arange(0, BLOCK_M)
    row_ok = rm < M
    sa_rows = sa_ptr + rm * sa_sm
    sb0_ptr = sb_ptr + (off_n // SUB_N) * n_kgroups
    sb1_ptr = sb0_ptr + n_kgroups
    has_sub1 = off_n + SUB_N < N
    acc0 = tl.zeros((BLOCK_M, SUB_N), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, SUB_N), dtype=tl.float32)
    s0 = tl.full((BLOCK_M,), 1.0, tl.float32)
    s1 = tl.full((BLOCK_M,), 1.0, tl.float32)
    sa_n = tl.load(sa_rows, mask=row_ok, other=1.0)
    sb0_n = tl.load(sb0_ptr)
    sb1_n = tl.load(sb1_ptr, mask=has_sub1, other=1.0)
    for kg in range(n_kgroups):
        a = a_desc.load([off_m, kg * BLOCK_K])
        b0 = b_desc.load([off_n, kg * BLOCK_K])
        if PREFETCH:  # this step's scales were loaded last step; load the next step's now
            sa, sb0, sb1 = sa_n, sb0_n, sb1_n
            nxt = tl.minimum(kg + 1, n_kgroups - 1)  # the last step reloads its own (unused) scales
            sa_n = tl.load(sa_rows + nxt * sa_sk, mask=row_ok, other=1.0)
            sb0_n = tl.load(sb0_ptr + nxt)
            sb1_n = tl.load(sb1_ptr + nxt, mask=has_sub1, other=1.0)
        else:
            sa = tl.load(sa_rows + kg * sa_sk, mask=row_ok, other=1.0)
            sb0 = tl.load(sb0_ptr + kg)
            sb1 = tl.load(sb1_ptr + kg, mask=has_sub1, other=1.0)
        if not SCALED:
            acc0 = tl.dot(a, tl.trans(b0), acc0)
        elif PROMOTE:
            acc0 += tl.dot(a, tl.trans(b0)) * (sa * sb0)[:, None]
        else:
            s = sa * sb0
            acc0 = tl.dot(a, tl.trans(b0), acc0 * (s0 / s)[:, None])
            s0 = s
        if NSUB == 2:
            b1 = b_desc.load([off_n + SUB_N, kg * BLOCK_K])
            if not SCALED:
                acc1 = tl.dot(a, tl.trans(b1), acc1)
            elif PROMOTE:
                acc1 += tl.dot(a, tl.trans(b1)) * (sa * sb1)[:, None]
            else:
                s = sa * sb1
                acc1 = tl.dot(a, tl.trans(b1), acc1 * (s1 / s)[:, None])
                s1 = s
    if SCALED and not PROMOTE:
        acc0 = acc0 * s0[:, None]
        acc1 = acc1 * s1[:, None]
    c_desc.store([off_m, off_n], acc0.to(tl.bfloat16))
    if NSUB == 2:
        c_desc.store([off_m, off_n + SUB_N], acc1.to(tl.bfloat16))


@triton.jit
def _probe_kernel(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, M, N, n_kgroups, sa_sm, sa_sk,
                  BLOCK_M: tl.constexpr, NSUB: tl.constexpr, GROUP_M: tl.constexpr, PROMOTE: tl.constexpr,
                  PREFETCH: tl.constexpr, SCALED: tl.constexpr, PERSISTENT: tl.constexpr, NUM_SMS: tl.constexpr):
    BLOCK_N: tl.constexpr = NSUB * 128
    if PERSISTENT:
        n_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        for tile in range(tl.program_id(0), n_tiles, NUM_SMS):
            pid_m, pid_n = _tile_coords(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            _one_tile(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, M, N, n_kgroups, sa_sm, sa_sk, pid_m * BLOCK_M,
                      pid_n * BLOCK_N, BLOCK_M, NSUB, PROMOTE, PREFETCH, SCALED)
    else:
        pid_m, pid_n = _tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
        _one_tile(a_desc, b_desc, c_desc, sa_ptr, sb_ptr, M, N, n_kgroups, sa_sm, sa_sk, pid_m * BLOCK_M,
                  pid_n * BLOCK_N, BLOCK_M, NSUB, PROMOTE, PREFETCH, SCALED)


def probe_gemm(a, sa, b, sb, *, block_m, nsub, warps, stages, promote=True, prefetch=False, sa_t=False,
               scaled=True, persistent=False):
    """BF16 C from E4M3 A (1x128 inverse scales sa [M, K/128]) and B (128x128 sb). With `sa_t` the kernel reads
    sa from an M-major copy made here (its cost is inside the timing)."""
    m, k = a.shape
    n = b.shape[0]
    c = torch.empty((m, n), device=a.device, dtype=torch.bfloat16)
    a_desc = TensorDescriptor.from_tensor(a, [block_m, GROUP])
    b_desc = TensorDescriptor.from_tensor(b, [GROUP, GROUP])
    c_desc = TensorDescriptor.from_tensor(c, [block_m, GROUP])
    if sa_t:
        sa = sa.t().contiguous()  # [K/128, M]
        sa_sm, sa_sk = 1, m
    else:
        sa_sm, sa_sk = sa.shape[1], 1
    tiles = triton.cdiv(m, block_m) * triton.cdiv(n, nsub * GROUP)
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else 4
    grid = (min(tiles, sms),) if persistent else (tiles,)
    _probe_kernel[grid](a_desc, b_desc, c_desc, sa, sb, m, n, triton.cdiv(k, GROUP), sa_sm, sa_sk,
                        BLOCK_M=block_m, NSUB=nsub, GROUP_M=8, PROMOTE=promote, PREFETCH=prefetch, SCALED=scaled,
                        PERSISTENT=persistent, NUM_SMS=sms, num_warps=warps, num_stages=stages)
    return c


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


def label(v: dict) -> str:
    if not v.get("scaled", True):
        return f"unscaled {v['block_m']}x{128 * v['nsub']} w{v['warps']} s{v['stages']}" + (" persistent" if v.get("persistent") else "")
    flags = [f for f in ("sa_t", "prefetch", "persistent") if v.get(f)]
    return (f"{'promote' if v['promote'] else 'rescale'} {v['block_m']}x{128 * v['nsub']} w{v['warps']} "
            f"s{v['stages']}" + "".join(f" +{f}" for f in flags))


def probe_shape(name: str, mnk: tuple[int, int, int], todo: list[dict], deadline: float | None,
                best: list[tuple[float, dict]]) -> dict:
    """One shape: cuBLAS blockwise and tensorwise, the autotuned kernel, then each variant in `todo` (until
    `deadline`); the scaled variants' TFLOPS go to `best`."""
    from fp8bench_kernels._tune import steady_do_bench
    from fp8bench_kernels.gemm_blockwise import gemm_blockwise
    from fp8bench_kernels.quantize_blockwise import quantize_blockwise
    from kernel_bench import recipe

    from fp8bench.backends import get_backend
    from fp8bench.types import GemmRole

    m, n, k = mnk
    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(n, k, device="cuda").bfloat16()
    qa, sa = quantize_blockwise(a, (1, 128), True)
    qb, sb = quantize_blockwise(b, (128, 128), True)
    ref = gemm_blockwise(qa, sa, qb, sb).float()
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
            y = probe_gemm(qa, sa, qb, sb, **v).float()
            err = ((y - ref).norm() / ref.norm()).item()
            if v.get("scaled", True) and err > 1e-2:
                row[label(v)] = f"wrong: rel err {err:.3g}"
            else:
                tf = fl / steady_do_bench(lambda v=v: probe_gemm(qa, sa, qb, sb, **v)) / 1e9
                row[label(v)] = round(tf, 1)
                if v.get("scaled", True):
                    best.append((tf, v))
        except Exception as e:  # a config that does not compile is a finding, not the end of the probe
            row[label(v)] = f"failed: {type(e).__name__}: {str(e)[:160]}"
        print(name, label(v), row[label(v)], flush=True)
    return row


def main() -> int:
    sys.path.insert(0, "scripts")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--budget-s", type=float, default=200.0)
    args = ap.parse_args()
    rows: list[dict] = []
    best: list[tuple[float, dict]] = []
    for stage, (name, mnk) in enumerate(SHAPES.items()):
        if stage == 0:
            rows.append(probe_shape(name, mnk, list(variants()), time.monotonic() + args.budget_s, best))
            top = [v for _, v in sorted(best, key=lambda t: -t[0])[:8]] + list(variants())[:3]  # + ceilings
        else:
            rows.append(probe_shape(name, mnk, top, None, []))
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
