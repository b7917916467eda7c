"""Where one layer or MLP case's fwd+bwd step spends GPU time, kernel by kernel: the names, launches and
milliseconds per step behind the `gpu_*_ms` categories a sweep records (fp8bench.workloads.profile), largest
first. Used to find which of the blockwise recipe's casts and GEMMs hold the `triton` backend's layer back.

Usage on the GPU box: python3 scripts/kernel_breakdown.py workload=layer model=llama2-7b workload.batch=2 \
    workload.seq=4096 backend=triton format=e4m3 scaling=blockwise [--out FILE.json]
Anywhere, recorded files side by side as a Markdown table (each kernel's category by today's rules):
    python3 scripts/kernel_breakdown.py --markdown FILE.json [FILE.json ...]
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from fp8bench.backends import get_backend
from fp8bench.config.compose import expand
from fp8bench.report.probe_tables import kernel_breakdown
from fp8bench.run.plan import plan
from fp8bench.workloads.profile import category

STEPS = 5


def main() -> int:
    out = next((Path(a.split("=", 1)[1]) for a in sys.argv[1:] if a.startswith("--out=")), None)
    [case] = plan(expand([a for a in sys.argv[1:] if not a.startswith("--out=")])[0])
    if not case.runnable:
        print(f"{case.case_id}: not runnable here: {case.reason}")
        return 2
    s, backend = case.shape, get_backend(case.config.backend_name)
    if case.config.workload.name not in ("layer", "mlp"):
        print("workload must be layer or mlp")
        return 2
    x = torch.randn((s["batch"], s["seq"], s["hidden"]), device="cuda")
    dy = torch.randn_like(x) * 1e-2
    build = backend.layer if case.config.workload.name == "layer" else backend.mlp
    op = build(case.config.model, x, dy, case.recipe)
    for _ in range(3):
        op.step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(STEPS):
            op.step()
        torch.cuda.synchronize()
    per = defaultdict(lambda: [0, 0.0])
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start:
            per[e.name][0] += 1
            per[e.name][1] += (e.time_range.end - e.time_range.start) / 1000.0
    rows = sorted(({"kernel": k[:140], "category": category(k), "launches_per_step": n / STEPS,
                    "ms_per_step": ms / STEPS} for k, (n, ms) in per.items()), key=lambda r: -r["ms_per_step"])
    total = sum(r["ms_per_step"] for r in rows)
    print(f"{case.case_id}: {total:.3f} ms of kernels per step")
    for r in rows:
        print(f"{r['ms_per_step']:8.3f} ms {r['launches_per_step']:5.1f}x {r['category']:>10}  {r['kernel']}")
    if out:
        out.write_text(json.dumps({"case_id": case.case_id, "kernels": rows}, indent=1))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--markdown"]:
        print(kernel_breakdown([Path(a) for a in sys.argv[2:]]), end="")
        sys.exit(0)
    sys.exit(main())
