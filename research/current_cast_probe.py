"""The current-scaling cast in one launch (kernels/quantize_current.py since it became one persistent kernel with a
grid-wide barrier) against its two-launch form of 12387a7 (an amax kernel writing per-program partial maxes, then
an autotuned cast-and-transpose kernel: kept below), on the same box.

Per form, at the cast line's shapes (scripts/recipe_bench.py's CAST_SHAPES, 32 to 224 MB): bit-exactness against
the plain-torch reference; the eager median as the cast line takes it (fp8bench's timer, the L2 flushed before
each call); the eager loop's host and GPU time per iteration (the cast line's pace check: a host as slow as its
GPU paced the loop); the device-only median (the host's cost taken out); and, at 256x256, where the kernels take
microseconds, the host's cost of one call. Every CONFIGS entry of the one-launch kernel is timed, the default
first. Percentages are of a copy of the same bytes timed the same way.

Usage on the GPU box: python3 research/current_cast_probe.py OUT.json
Anywhere, the Markdown tables of a recorded file: python3 research/current_cast_probe.py --markdown OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


def two_launch_form():
    """quantize_current as it was at 12387a7: two kernels, four allocations."""
    import triton
    import triton.language as tl
    from fp8bench_kernels._fp8 import e4m3_scale, exact_rcp, scale_to_e4m3
    from fp8bench_kernels._launch import Launcher, cast_key, cdiv, sm_count
    from fp8bench_kernels._tune import steady_do_bench
    from fp8bench_kernels.quantize_current import (  # the tile's load and two stores, shared
        load_tile,
        store_both,
    )

    @triton.jit
    def _amax_kernel(x_ptr, partial_ptr, M, N, stride_m, stride_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        tiles_n = tl.cdiv(N, BLOCK_N)
        n_tiles = tl.cdiv(M, BLOCK_M) * tiles_n
        best = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for t in range(tl.program_id(0), n_tiles, tl.num_programs(0)):
            _, _, _, x = load_tile(x_ptr, t // tiles_n, t % tiles_n, M, N, stride_m, stride_n, BLOCK_M, BLOCK_N)
            best = tl.maximum(best, tl.abs(x.to(tl.float32)))
        tl.store(partial_ptr + tl.program_id(0), tl.max(tl.max(best, axis=1), axis=0))

    configs = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w)
               for bm, bn, w in [(64, 128, 4), (128, 64, 4), (32, 256, 4), (64, 256, 8), (128, 128, 8), (64, 64, 4),
                                 (128, 128, 4)]]

    @triton.autotune(configs=configs, key=["M", "N", "n_partials", "TRANSPOSE"], do_bench=steady_do_bench)
    @triton.jit
    def _cast_transpose_kernel(x_ptr, y_ptr, yt_ptr, partial_ptr, inv_scale_ptr, M, N, stride_m, stride_n,
                               n_partials, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PARTIALS: tl.constexpr,
                               TRANSPOSE: tl.constexpr):
        p = tl.arange(0, PARTIALS)
        amax = tl.max(tl.load(partial_ptr + p, mask=p < n_partials, other=0.0), axis=0)
        scale = e4m3_scale(amax)
        if (tl.program_id(0) == 0) & (tl.program_id(1) == 0):
            tl.store(inv_scale_ptr, exact_rcp(scale))
        rows, cols, mask, x = load_tile(x_ptr, tl.program_id(0), tl.program_id(1), M, N, stride_m, stride_n,
                                        BLOCK_M, BLOCK_N)
        store_both(y_ptr, yt_ptr, rows, cols, mask, scale_to_e4m3(x.to(tl.float32), scale), M, N, TRANSPOSE)

    launch_amax, launch_cast = Launcher(_amax_kernel), Launcher(_cast_transpose_kernel)

    def quantize_current(x):
        m, n = x.shape
        programs = max(1, min(cdiv(m, 64) * cdiv(n, 128), 4 * sm_count(x.device)))
        partials = torch.empty(programs, device=x.device, dtype=torch.float32)
        args = (x, partials, m, n, x.stride(0), x.stride(1))
        launch_amax.launch(cast_key(x, args[2:]), (programs,), args, {"BLOCK_M": 64, "BLOCK_N": 128, "num_warps": 4})
        inv_scale = torch.empty((), device=x.device, dtype=torch.float32)
        y = torch.empty((m, n), device=x.device, dtype=torch.float8_e4m3fn)
        yt = torch.empty((n, m), device=x.device, dtype=torch.float8_e4m3fn)
        args = (x, y, yt, partials, inv_scale, m, n, x.stride(0), x.stride(1), programs)
        launch_cast.launch(cast_key(x, args[5:], True),
                           lambda meta: (cdiv(m, meta["BLOCK_M"]), cdiv(n, meta["BLOCK_N"])), args,
                           {"PARTIALS": triton.next_power_of_2(programs), "TRANSPOSE": True})
        return y, yt, inv_scale

    return quantize_current


def forms() -> dict:
    from fp8bench_kernels import quantize_current as qc

    out = {f"one launch {c['BLOCK_M']}x{c['BLOCK_N']} {c['num_warps']}w {c['per_sm']}/SM"
           + (" reversed" if c["reverse"] else "")
           + (" (kernels/)" if i == 0 else ""): (lambda x, c=c: qc.quantize_current(x, config=c))
           for i, c in enumerate(qc.CONFIGS)}
    out["two launches (12387a7)"] = two_launch_form()
    return out


def main(out: Path) -> None:
    from fp8bench_kernels import quantize_current as qc
    from recipe_bench import (
        CAST_SHAPES,
        CAST_TIMER,
        HOST_PACED,
        eager_pace,
        host_us_per_call,
        same_bytes_copy_gbps,
    )

    from fp8bench.core.measure import L2Flusher, time_device_only, time_fn

    flush = L2Flusher()
    rows, host = [], []
    small = torch.randn(256, 256, device="cuda").bfloat16()
    casts = forms()
    for name, cast in casts.items():
        cast(small)
        host.append({"form": name, "host_us_per_call": min(host_us_per_call(lambda c=cast: c(small), 300)
                                                             for _ in range(3))})
        print(f"{name:>40} host {host[-1]['host_us_per_call']:.1f} µs per call at 256x256", flush=True)
    for m, n in CAST_SHAPES:
        x = torch.randn(m, n, device="cuda").bfloat16()
        x[m - 1, n - 1] = 1000.0  # the amax in the last tile
        ref = qc.quantize_current_reference(x)
        nbytes = qc.bytes_moved(x)
        copy_eager, copy_device_only = same_bytes_copy_gbps(nbytes)
        for name, cast in casts.items():
            got = cast(x)
            exact = all(torch.equal(a.view(torch.uint8) if a.dtype == torch.float8_e4m3fn else a,
                                    b.view(torch.uint8) if b.dtype == torch.float8_e4m3fn else b)
                        for a, b in zip(got, ref, strict=True))
            fn = lambda c=cast, x=x: c(x)  # noqa: E731
            eager = time_fn(fn, **CAST_TIMER).median_ms
            host_us, gpu_us = eager_pace(fn, flush)
            device_only = time_device_only(fn, device=torch.device("cuda"), flush_l2=True)
            dev_ms = device_only.median_ms if device_only else None
            row = {"form": name, "shape": [m, n], "bit_exact": exact, "eager_us": 1e3 * eager,
                   "eager_pct": 100 * nbytes / eager / 1e6 / copy_eager, "loop_host_us": host_us,
                   "loop_gpu_us": gpu_us, "host_paced": host_us >= HOST_PACED * gpu_us,
                   "device_only_us": 1e3 * dev_ms if dev_ms else None,
                   "device_only_pct": (100 * nbytes / dev_ms / 1e6 / copy_device_only
                                       if dev_ms and copy_device_only else None)}
            rows.append(row)
            print(f"{name:>40} {m}x{n}: exact {exact}; eager {row['eager_us']:.1f} µs {row['eager_pct']:.1f}%; "
                  f"loop host {host_us:.1f} / GPU {gpu_us:.1f} µs{' (host-paced)' if row['host_paced'] else ''}; "
                  f"device-only {row['device_only_us'] or float('nan'):.1f} µs "
                  f"{row['device_only_pct'] or float('nan'):.1f}%", flush=True)
        del x
        torch.cuda.empty_cache()
    # the default grid per shape and config: key (device, dtype, aligned, M, N, strides, transpose, tile, warps,
    # order)
    resident = {f"{k[3]}x{k[4]} {k[8]}x{k[9]} {k[10]}w {per_sm}/SM{' reversed' if k[11] else ''}": v
                for (k, per_sm), v in qc._resident.items()}
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "host": host, "rows": rows,
                               "programs": resident}, indent=1))


def markdown(path: Path) -> str:
    rec = json.loads(path.read_text())
    shapes = list(dict.fromkeys(tuple(r["shape"]) for r in rec["rows"]))
    names = list(dict.fromkeys(r["form"] for r in rec["rows"]))
    cell = {(r["form"], tuple(r["shape"])): r for r in rec["rows"]}

    def text(r: dict) -> str:
        dev = f"{r['device_only_pct']:.0f}%" if r["device_only_pct"] else "—"
        return (f"{r['eager_us']:.1f}; {r['eager_pct']:.0f}%{' (host-paced)' if r['host_paced'] else ''}; {dev}"
                + ("" if r["bit_exact"] else " NOT bit-exact"))
    out = ["| current+transpose (eager µs; eager % of a same-bytes copy; device-only %) | "
           + " | ".join(f"{m}×{n} ({m * n * 2 // 2**20} MB)" for m, n in shapes) + " | host µs a call (256×256) |",
           "|---" * (len(shapes) + 2) + "|"]
    host = {h["form"]: h["host_us_per_call"] for h in rec["host"]}
    out += [f"| {name} | " + " | ".join(text(cell[name, s]) for s in shapes) + f" | {host[name]:.0f} |"
            for name in names]
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--markdown"]:
        print(markdown(Path(sys.argv[2])))
    else:
        main(Path(sys.argv[1]))
