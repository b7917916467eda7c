"""Direction-aware comparison of two commits recorded by asv (`fp8bench asv-compare`).

`asv compare` treats every number as lower-is-better and always exits 0. Here each series keeps its direction
(time and memory: lower is better; TFLOPS, speedup, SQNR: higher) and a change worse than the threshold is a
regression, so CI can gate on the exit code. asv keeps one number per benchmark and commit (the statistics live
in fp8bench's own runs: `fp8bench compare` tests their samples), hence a threshold rather than a test.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from fp8bench.core.records import METRICS, StoreError


def direction(benchmark: str) -> str:
    """`track_<metric>` keeps its metric's direction (fp8bench.core.records.METRICS); asv's own default is lower."""
    return METRICS.get(benchmark.removeprefix("track_"), ("", "lower"))[1]


@dataclass(frozen=True)
class AsvChange:
    benchmark: str
    case_id: str
    base: float
    head: float
    rel_change: float
    verdict: str
    versions: str = ""
    """'fp8bench-measurement-3 → fp8bench-measurement-4' when the commits' results come from different
    benchmark versions (asv-compare --across-versions)."""


def load_result(results_dir: Path, machine: str, commit: str,
                versions: dict[str, str] | None = None) -> dict[tuple[str, str], float]:
    """{(benchmark, case_id): value} of the result file of `commit` (a prefix) on `machine`; `versions`, when
    given, receives each benchmark's version (the suite's `version`: fp8bench-measurement-N)."""
    folder = results_dir / machine
    if not folder.is_dir():
        machines = sorted(p.name for p in results_dir.glob("*") if (p / "machine.json").is_file())
        raise StoreError(f"--machine {machine!r} has no results in {results_dir}; choose one of {machines}")
    files = [p for p in folder.glob("*.json") if p.name != "machine.json"
             and json.loads(p.read_text()).get("commit_hash", "").startswith(commit)]
    if not files:
        known = sorted(json.loads(p.read_text()).get("commit_hash", "")[:8] for p in folder.glob("*.json")
                       if p.name != "machine.json")
        raise StoreError(f"commit {commit!r} has no asv result on {machine}; recorded commits: {known}")
    if len(files) > 1:
        raise StoreError(f"commit {commit!r} matches {len(files)} result files on {machine}; give more of the hash "
                         "or one environment")
    data = json.loads(files[0].read_text())
    results = data["results"]
    column = data.get("result_columns", []).index("version") if "version" in data.get("result_columns", []) else None
    out = {}
    for bench, entry in results.items():
        if versions is not None and column is not None and len(entry) > column:
            versions[bench.rsplit(".", 1)[-1]] = entry[column]
        values, params = entry[0], entry[1][0] if entry[1] else []
        for param, value in zip(params, values, strict=False):
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                out[(bench.rsplit(".", 1)[-1], param.strip("'"))] = float(value)
    return out


def compare_commits(results_dir: Path, machine: str, base: str, head: str, threshold: float,
                    across_versions: bool = False) -> list[AsvChange]:
    """Direction-aware changes between two commits. Results of different benchmark versions (a new
    measurement version starts new asv series) are refused, or with `across_versions` labelled."""
    va: dict[str, str] = {}
    vb: dict[str, str] = {}
    a, b = load_result(results_dir, machine, base, va), load_result(results_dir, machine, head, vb)
    differ = {k: f"{va[k]} → {vb[k]}" for k in set(va) & set(vb) if va[k] != vb[k]}
    if differ and not across_versions:
        name, label = sorted(differ.items())[0]
        raise StoreError(f"refusing to compare asv results of different measurement versions: {name} is "
                         f"{label.replace(' → ', f' at {base} and ')} at {head}; pass --across-versions to compare "
                         "anyway (every row is labelled)")
    changes = []
    for key in sorted(set(a) & set(b)):
        bench, case_id = key
        lower = direction(bench) == "lower"
        rel = (b[key] - a[key]) / abs(a[key]) if a[key] else 0.0
        worse = rel > threshold if lower else rel < -threshold
        better = rel < -threshold if lower else rel > threshold
        changes.append(AsvChange(bench, case_id, a[key], b[key], rel,
                                 "regression" if worse else "improvement" if better else "unchanged",
                                 differ.get(bench, "")))
    return changes
