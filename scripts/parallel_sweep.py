"""One sweep through the local-gpus launcher, first with one GPU visible, then with all: wall time of each,
the speedup, and which GPU every job ran on (from its shard name, jobN-gpuK).

Both runs write to WORKDIR (run ids `one-gpu`, `all-gpus`), so the second hands its jobs out longest first by
what the first measured, as a re-run of any sweep does (the launcher reads the shards under results_dir).

    python scripts/parallel_sweep.py OUT.json WORKDIR fp8bench-run-overrides...
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path


def run(overrides: list[str], results: Path, run_id: str, env: dict) -> tuple[float, list[dict]]:
    cmd = [sys.executable, "-m", "fp8bench", "run", "-m", *overrides, "hydra/launcher=local-gpus",
           f"results_dir={results}", f"run_id={run_id}", "store.ingest=false"]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode:
        sys.exit(f"sweep failed ({proc.returncode}): {proc.stderr[-3000:]}")
    jobs = []
    for shard in sorted((results / "runs" / run_id).glob("shard-*.jsonl")):
        m = re.search(r"(job\d+)(?:-gpu(\d+))?", shard.name)
        cases = [json.loads(line) for line in shard.read_text().splitlines() if line.strip()]
        jobs.append({"job": m.group(1) if m else shard.name, "gpu": m.group(2) if m and m.group(2) else None,
                     "cases": len(cases), "ok": sum(c.get("status") == "ok" for c in cases),
                     "seconds": round(sum(c.get("duration_s", 0.0) for c in cases), 2)})
    return wall, jobs


def main() -> None:
    out, work, overrides = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    one_env = {**os.environ, "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0]}
    one_wall, one_jobs = run(overrides, work, "one-gpu", one_env)
    all_wall, all_jobs = run(overrides, work, "all-gpus", dict(os.environ))
    report = {"command": "fp8bench run -m " + " ".join(overrides) + " hydra/launcher=local-gpus",
              "one_gpu_s": round(one_wall, 1), "all_gpus_s": round(all_wall, 1),
              "speedup": round(one_wall / all_wall, 3),
              "gpus_used": sorted({j["gpu"] for j in all_jobs if j["gpu"] is not None}),
              "one_gpu_jobs": one_jobs, "all_gpu_jobs": all_jobs}
    out.write_text(json.dumps(report, indent=1))
    print(f"one GPU {one_wall:.1f} s, all GPUs {all_wall:.1f} s: {one_wall / all_wall:.2f}x; "
          f"GPUs per job: {[(j['job'], j['gpu']) for j in all_jobs]}")


if __name__ == "__main__":
    main()
