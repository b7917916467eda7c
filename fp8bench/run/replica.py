"""A unit's side-by-side timing repeated in a process of its own (`measure.processes` > 1).

The variance of a speedup between processes (allocator state, clocks settled anew, code paths warmed anew) is
larger than within one process's rounds, and a published interval must cover it (fp8bench.core.intervals).
The run times each unit in its own process first (building, memory, numerics, the first process's rounds),
then starts `measure.processes - 1` fresh interpreters (`python -m fp8bench.run.replica PAYLOAD RESULT`),
each of which builds the same twin and recipes from the same seeds and times them the same way; their rounds
join the first process's in the records.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

REPLICA_TIMEOUT_S = 1800
"""A replica that takes longer is abandoned (its rounds are missing; the record says how many processes ran)."""


def in_fresh_process(module: str, payload: dict) -> dict | str:
    """Run `python -m <module> PAYLOAD RESULT` with `payload` pickled: the JSON it writes to RESULT, or the
    reason it failed. What every timing repeated in a process of its own goes through."""
    with tempfile.TemporaryDirectory(prefix="fp8bench-replica-") as tmp:
        path, result = Path(tmp) / "payload.pkl", Path(tmp) / "result.json"
        path.write_bytes(pickle.dumps(payload))
        try:
            proc = subprocess.run([sys.executable, "-m", module, str(path), str(result)],
                                  capture_output=True, text=True, timeout=REPLICA_TIMEOUT_S,
                                  env={**os.environ, "FP8BENCH_REPLICA": "1"})
        except subprocess.TimeoutExpired:
            return f"a replica process ran past {REPLICA_TIMEOUT_S} s"
        if proc.returncode != 0 or not result.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return f"a replica process exited {proc.returncode}: {' | '.join(tail)}"
        return json.loads(result.read_text())


def time_elsewhere(cases: list, run_id: str, device_kind: str) -> dict[str, dict] | str:
    """Time `cases` (the twin first) side by side in a fresh process: {op: {"rounds", "wall", "device"}} with
    the op keys of fp8bench.run.groups (`twin:<metric>`, `<i>:<metric>`), or the reason it failed."""
    return in_fresh_process("fp8bench.run.replica", {"cases": cases, "run_id": run_id, "device": device_kind})


def main(argv: list[str]) -> int:
    import torch

    from fp8bench.core.hardware import DeviceInfo, detect_device
    from fp8bench.core.measure import time_interleaved
    from fp8bench.run.caserun import case_input
    from fp8bench.workloads import get_workload

    payload = pickle.loads(Path(argv[0]).read_bytes())
    cases, run_id = payload["cases"], payload["run_id"]
    device = detect_device() if payload["device"] == "cuda" else DeviceInfo("cpu", "cpu", None, None)
    prepared = [get_workload(case.config.workload.name).prepare(case_input(case, run_id, device)) for case in cases]
    ops = {f"twin:{n}": fn for n, fn in prepared[0].timed.items()}
    for i, p in enumerate(prepared[1:]):
        ops |= {f"{i}:{n}": fn for n, fn in p.timed.items()}
    twin = cases[0]
    ms = twin.config.measure
    timings = time_interleaved(ops, device=torch.device(device.torch_device), warmup=ms.warmup, rounds=ms.rounds,
                               block_ms=ms.block_ms, settle_ms=ms.settle_ms, flush_l2=ms.flush_l2,
                               cuda_graph=prepared[0].cuda_graph,
                               slowdown=twin.config.slowdown_for(twin.config.backend_name))
    out = {name: {"rounds": t.rounds, "wall": list(t.bound.wall_ms) if t.bound else None,
                  "device": list(t.bound.device_ms) if t.bound else None} for name, t in timings.items()}
    Path(argv[1]).write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
