"""GPU measurement checks (issue: real FP8 kernels on Hopper), printed as a table.

1. fidelity: fp8bench's timer vs triton.testing.do_bench on five FP8 GEMM shapes, same process
   (fp8bench.analysis.fidelity);
2. noise: one case's median time_ms over 5 separate `fp8bench run` processes (coefficient of variation).

Usage on the GPU box: python3 scripts/gpu_checks.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from fp8bench.analysis.fidelity import compare_timers
from fp8bench.backends import get_backend, make_recipe
from fp8bench.core.types import GemmRole

SHAPES = [(8192, 8192, 8192), (8192, 12288, 4096), (8192, 4096, 4096), (8192, 22016, 4096), (8192, 4096, 11008)]


def fidelity(rounds: int = 5) -> list[dict]:
    r = make_recipe("torch", "e4m3", "current")
    rows = []
    for m, n, k in SHAPES:
        a = torch.randn(m, k, device="cuda").bfloat16()
        b = torch.randn(n, k, device="cuda").bfloat16()
        op = get_backend("torch").gemm(a, b, GemmRole.FPROP, r)
        ours, theirs, ratio = compare_timers(op.kernel_only, rounds)
        tflops = 2 * m * n * k / ours / 1e9
        rows.append({"shape": f"{m}x{n}x{k}", "fp8bench_ms": ours, "do_bench_ms": theirs,
                     "ratio": ratio, "tflops": tflops})
    return rows


def noise(results_dir: Path) -> dict:
    args = ["workload=gemm", "model=llama2-7b", "workload.linears=[gate_up]", "workload.roles=[fprop]",
            "format=e4m3", "scaling=current", "backend=torch", "store.ingest=false", f"results_dir={results_dir}",
            "measure.iters=100", "measure.min_samples=50", "measure.max_time_s=3"]
    medians = []
    for i in range(5):
        run_id = f"noise-{i}"
        subprocess.run([sys.executable, "-m", "fp8bench", "run", *args, f"run_id={run_id}"], check=True,
                       capture_output=True)
        shard = next((results_dir / "runs" / run_id).glob("shard-*.jsonl"))
        rec = json.loads(shard.read_text().splitlines()[0])
        medians.append(next(m["value"] for m in rec["metrics"] if m["name"] == "time_ms"))
    cv = statistics.stdev(medians) / statistics.mean(medians)
    return {"case": rec["case_id"], "medians_ms": medians, "cv_pct": 100 * cv}


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=Path("results/gpu_checks"))
    p.add_argument("--rounds", type=int, default=6, help="interleaved timer rounds per shape (order alternating)")
    ns = p.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    fid = fidelity(ns.rounds)
    print(f"{'shape':>20} {'fp8bench ms':>12} {'do_bench ms':>12} {'ratio':>7} {'TFLOPS':>7}")
    for r in fid:
        print(f"{r['shape']:>20} {r['fp8bench_ms']:12.4f} {r['do_bench_ms']:12.4f} {r['ratio']:7.4f} {r['tflops']:7.0f}")
    nz = noise(ns.out)
    print(f"noise: {nz['case']} medians {[round(m, 4) for m in nz['medians_ms']]} CV {nz['cv_pct']:.3f}%")
    (ns.out / "gpu_checks.json").write_text(json.dumps({"fidelity": fid, "noise": nz}, indent=1))
    ok = all(abs(r["ratio"] - 1) < 0.02 for r in fid) and nz["cv_pct"] < 1.0
    print("fidelity within 2% and noise CV < 1%:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
