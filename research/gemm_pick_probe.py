"""Does the Gluon GEMM's per-shape tuner pick its fastest config at small shapes, and how far is that config from
cuBLAS there?

At 2048³ the GEMM line reads our kernel 0.974-0.992x of cuBLAS blockwise (0.964 device-only at 300739f, 0.491
host-paced at 6ff10d9), the one shape under 0.98 in those runs (results/h200-recipe-blockwise/recipe_bench_gemm_*.json). A call there takes ~20 µs on the GPU, while on the H200
boxes a call costs 25-75 µs of host time, and the tuner (`gemm_blockwise_gluon._pick`) times each option with
`steady_do_bench`, which ends in `do_bench`, whose loop (flush, event, call, event) the host paces at such shapes:
its pick can follow host time, not the kernels'.

Per shape, in `ROUNDS` rounds (the order of the options reversed every other round): every promote config of
`CONFIGS` with both grid kinds, and cuBLAS (torch._scaled_mm with the same 1x128 / 128x128 scales), each timed
device-only (`time_device_only`, the L2 flushed) and as the tuner times it (`steady_do_bench`: `do_bench`'s
mean, the L2 flushed); the option the tuner picked is marked. Medians over the rounds, a device-only round where
the host could not get ahead left out.

A tuner timing each option from a replayed CUDA graph (a4b4ff0, reverted) ranked the 2048³ options as the
device-only timings do, but tuning through graph captures took far longer on the H200: this probe ran two of
three shapes in the 120 s it was given, against all three in one call of 51 s (setup included) at fec7093, and
the GEMM rounds five of 13 shapes in the 200 s they were given, against all 13 in one call of 123 s at 300739f (`gemm_pick_probe_a4b4ff0_partial.log`,
`recipe_bench_gemm_a4b4ff0_partial.log`).

Usage on the GPU box: python3 research/gemm_pick_probe.py OUT.json
Anywhere, the Markdown table of a recorded file: python3 research/gemm_pick_probe.py --markdown OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

SHAPES = {"2048^3": (2048, 2048, 2048), "4096x4096x2048": (4096, 4096, 2048), "4096^3": (4096, 4096, 4096)}
ROUNDS = 3


def _us(ms: float | None) -> str:
    return "host not ahead" if ms is None else f"{1e3 * ms:.1f}"


def _median(values: list) -> float | None:
    done = [v for v in values if v is not None]
    return statistics.median(done) if done else None


def options() -> dict:
    from fp8bench_kernels.gemm_blockwise_gluon import CONFIGS

    return {f"{c.block_m}x{c.block_n} ({c.halves}x{c.sub_n}) {c.stages} stages {'persistent' if p else 'per tile'}":
            (c, p) for c in CONFIGS if c.promote for p in (True, False)}


def main(out_path: str) -> None:
    import torch
    from fp8bench_kernels import gemm_blockwise_gluon as gg
    from fp8bench_kernels._tune import steady_do_bench
    from fp8bench_kernels.quantize_blockwise import quantize_blockwise

    from fp8bench.backends import get_backend
    from fp8bench.core.measure import time_device_only
    from fp8bench.core.types import GemmRole

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    from kernel_bench import recipe  # the E4M3 recipes the GEMM line uses

    cuda = torch.device("cuda")
    out = {"device": torch.cuda.get_device_name(), "shapes": []}
    for name, (m, n, k) in SHAPES.items():
        a16, b16 = torch.randn(m, k, device=cuda).bfloat16(), torch.randn(n, k, device=cuda).bfloat16()
        qa, sa = quantize_blockwise(a16, (1, 128), m_major_scales=True)
        qb, sb = quantize_blockwise(b16, (128, 128))
        gg.gemm_blockwise_gluon(qa, sa, qb, sb)  # the tuner's pick for this shape
        [(picked_config, picked_persistent)] = [v for key, v in gg._picked.items() if key[:3] == (m, n, k)]
        ops = {label: (lambda c=c, p=p, ops_in=(qa, sa, qb, sb): gg.gemm_blockwise_gluon(*ops_in, config=c, persistent=p))
               for label, (c, p) in options().items()}
        # cuBLAS blockwise as the GEMM line times it: the torch backend's call on its own quantized operands
        ops["cuBLAS blockwise"] = get_backend("torch").gemm(a16, b16, GemmRole.FPROP, recipe("torch", "blockwise")).kernel_only
        times = {label: {"device_only_ms": [], "do_bench_ms": []} for label in ops}
        for r in range(ROUNDS):
            for label in (list(ops) if r % 2 == 0 else list(ops)[::-1]):
                t = time_device_only(ops[label], device=cuda, batches=2, flush_l2=True)
                times[label]["device_only_ms"].append(t.median_ms if t else None)
                times[label]["do_bench_ms"].append(steady_do_bench(ops[label]))
        picked = next(label for label, v in options().items() if v == (picked_config, picked_persistent))
        row = {"shape": name, "mnk": [m, n, k], "picked": picked,
               "options": {label: {key: _median(v) for key, v in t.items()} for label, t in times.items()}}
        out["shapes"].append(row)
        for label, t in row["options"].items():
            print(f"{name:>16} {label:>44}{' (picked)' if label == picked else '':>10}: device-only "
                  f"{_us(t['device_only_ms']):>7} µs  do_bench {1e3 * t['do_bench_ms']:7.1f} µs", flush=True)
        del a16, b16, qa, qb, ops
        torch.cuda.empty_cache()
    Path(out_path).write_text(json.dumps(out, indent=1))


def markdown(recorded: dict) -> str:
    rows = recorded["shapes"]
    labels = list(rows[0]["options"])
    out = ["| option (µs: device-only; do_bench) | " + " | ".join(f"{r['shape']}" for r in rows) + " |", "|---" * (len(rows) + 1) + "|"]
    for label in labels:
        cells = []
        for r in rows:
            t = r["options"][label]
            cells.append(f"{_us(t['device_only_ms'])}; {1e3 * t['do_bench_ms']:.1f}"
                         + (" (picked)" if label == r["picked"] else ""))
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    out.append("")
    for r in rows:
        ours = {label: t["device_only_ms"] for label, t in r["options"].items()
                if label != "cuBLAS blockwise" and t["device_only_ms"] is not None}
        cublas = r["options"]["cuBLAS blockwise"]["device_only_ms"]
        if not ours or cublas is None or r["picked"] not in ours:
            out.append(f"{r['shape']}: not every option measured device-only (the host could not get ahead).")
            continue
        best = min(ours, key=ours.get)
        out.append(f"{r['shape']}: fastest device-only {best} at {cublas / ours[best]:.3f}x of cuBLAS; the picked "
                   f"option at {cublas / ours[r['picked']]:.3f}x.")
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--markdown"]:
        print(markdown(json.loads(Path(sys.argv[2]).read_text())))
    else:
        main(sys.argv[1])
