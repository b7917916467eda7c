"""Why does fp8bench's timer read an 8192³ FP8 GEMM ~2% faster than `triton.testing.do_bench` on some H200
boxes (tests/test_gpu.py::test_timer_matches_triton_do_bench_within_2_percent: 0.8728 vs 0.8933 ms at 0624da5,
0.8739 vs 0.8920 at 865b59e), while both zero the same 256 MB before each call and time it with events queued
back to back?

The two differ in what runs just before their timed calls: fp8bench (`time_fn` as the test calls it) runs 10
calls, syncs, times 3 flushed calls, syncs and starts sampling; do_bench times 5 flushed calls, syncs, then
queues ~25 ms of calls without a flush and starts sampling behind them. A GPU at its power cap sets its clocks
by the load of the last tens of milliseconds, so the two may sample different clocks. Each method runs in
interleaved rounds (order rotated) and every sample is kept, summarised per tenth of the run, so a transient at
the start shows as a first tenth unlike the rest:

- `ours`: `time_fn` as the test calls it (warmup 10, no settling);
- `ours_settled`: the same with `settle_ms=25` (25 ms of flushed calls queued before the samples);
- `do_bench`: Triton's, as the test calls it (warmup 25 ms, rep 300 ms);
- `do_bench_cold`: do_bench with warmup=0 (one call of warm-up: its samples start right after its estimate);
- `ours_200`, `do_bench_200`: both settled 200 ms before sampling (fp8bench's `measure.settle_ms` default, and
  do_bench's warmup in ms), as scripts/gpu_checks.compare_timers compares them since 7c8a8fb's finding (files
  recorded before then have the first four only).

`settle_s` (default 3) of untimed calls precede each op's rounds, as in compare_timers.

Usage on the GPU box: python3 research/timer_vs_do_bench.py OUT.json [ROUNDS] [SETTLE_S]
Anywhere, the Markdown table of a recorded file: python3 research/timer_vs_do_bench.py --markdown OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys


def tenths(samples: list[float]) -> list[float]:
    """Median of each tenth of the run, in order."""
    n = len(samples)
    return [statistics.median(samples[i * n // 10:max((i + 1) * n // 10, i * n // 10 + 1)]) for i in range(10)]


def _gpu_checks():
    """scripts/gpu_checks.py, whose timer settings (fp8bench_samples) and load (sustain) this probe shares."""
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    import gpu_checks

    return gpu_checks


def methods(fn) -> dict:
    from triton.testing import do_bench

    samples = _gpu_checks().fp8bench_samples

    def ours(settle_ms: float):
        return lambda: samples(fn, settle_ms)
    return {"ours": ours(0.0), "ours_settled": ours(25.0),
            "do_bench": lambda: do_bench(fn, warmup=25, rep=300, return_mode="all"),
            "do_bench_cold": lambda: do_bench(fn, warmup=0, rep=300, return_mode="all"),
            "ours_200": ours(200.0), "do_bench_200": lambda: do_bench(fn, warmup=200, rep=300, return_mode="all")}


def probe(rounds: int, settle_s: float) -> dict:

    import torch

    from fp8bench.backends import get_backend, make_recipe
    from fp8bench.core.types import GemmRole

    recipe = make_recipe("torch", "e4m3", "current")
    g = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(8192, 8192, device="cuda", generator=g).bfloat16()
    b = torch.randn(8192, 8192, device="cuda", generator=g).bfloat16()
    ops = {"fp8_e4m3_current_8192": get_backend("torch").gemm(a, b, GemmRole.FPROP, recipe).kernel_only,
           "bf16_8192": lambda: a @ b.t()}
    out: dict = {"device": torch.cuda.get_device_name(), "rounds": rounds, "settle_s": settle_s, "ops": {}}
    for op_name, fn in ops.items():
        _gpu_checks().sustain(fn, settle_s)  # as compare_timers: clocks lowered by sustained load first
        ms = methods(fn)
        names = list(ms)
        runs: dict = {n: [] for n in names}
        for r in range(rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for n in order:
                samples = ms[n]()
                runs[n].append({"median": statistics.median(samples), "n": len(samples), "tenths": tenths(samples)})
        out["ops"][op_name] = runs
        print(op_name, {n: round(statistics.median(x["median"] for x in v), 4) for n, v in runs.items()}, flush=True)
    return out


def markdown(data: dict) -> str:
    lines = [f"{data['device']}, {data['rounds']} rounds per method (order rotated) after "
             f"{data.get('settle_s', 1.0)} s of untimed calls; ms, median over rounds",
             "", "| op | method | median | vs do_bench (per round) | first tenth | last tenth | samples |",
             "|---|---|---|---|---|---|---|"]
    for op, runs in data["ops"].items():
        ref = [x["median"] for x in runs["do_bench"]]
        for name, rs in runs.items():
            ratio = statistics.median(x["median"] / r for x, r in zip(rs, ref, strict=True))
            first = statistics.median(x["tenths"][0] for x in rs)
            last = statistics.median(x["tenths"][-1] for x in rs)
            lines.append(f"| {op} | {name} | {statistics.median(x['median'] for x in rs):.4f} | {ratio:.4f} | "
                         f"{first:.4f} | {last:.4f} | {statistics.median(x['n'] for x in rs)} |")
    settled = {op: statistics.median(o["median"] / t["median"] for o, t in
                                     zip(runs["ours_200"], runs["do_bench_200"], strict=True))
               for op, runs in data["ops"].items() if "ours_200" in runs}
    if settled:
        lines += ["", "Both settled 200 ms, fp8bench / do_bench per round (median): "
                  + "; ".join(f"{op} {ratio:.4f}" for op, ratio in settled.items()) + "."]
    return "\n".join(lines)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--markdown"]:
        print(markdown(json.loads(open(argv[1]).read())))
        return
    data = probe(int(argv[1]) if len(argv) > 1 else 8, float(argv[2]) if len(argv) > 2 else 3.0)
    with open(argv[0], "w") as f:
        json.dump(data, f, indent=1)
    print(markdown(data))


if __name__ == "__main__":
    main(sys.argv[1:])
