"""The Markdown tables of two GPU probes' recorded files, as docs/ shows them: the kernel breakdown of a layer
step (`scripts/kernel_breakdown.py --markdown`) and the regression trials (`scripts/regression_trials.py
table`). The scripts print them; `fp8bench audit` renders them from the same committed files. Plain Python
over the recorded values, no GPU."""

from __future__ import annotations

import json
from pathlib import Path

from fp8bench.core.markdown import table

SHOWN_MS = 0.1
"""The breakdown lists the kernels taking at least this many milliseconds a step in some file; the rest are summed."""


def kernel_breakdown(paths: list[Path]) -> str:
    """One row per kernel of SHOWN_MS or more in any file, one column per file (ms a step, launches a step),
    then the rest and the total of each. Each kernel's category is today's rule's (workloads.profile, which
    imports torch: imported here only)."""
    from fp8bench.workloads.profile import category

    files = [json.loads(p.read_text()) for p in paths]
    per = [{r["kernel"]: r for r in f["kernels"]} for f in files]
    names = sorted({k for p in per for k, r in p.items() if r["ms_per_step"] >= SHOWN_MS},
                   key=lambda k: -max(p[k]["ms_per_step"] if k in p else 0.0 for p in per))

    def cell(p: dict, k: str) -> str:
        return f"{p[k]['ms_per_step']:.3f} ({p[k]['launches_per_step']:g}x)" if k in p else ""
    rows = [[f"`{k[:100]}`", category(k), *(cell(p, k) for p in per)] for k in names]
    rows.append(["the rest", "", *(f"{sum(r['ms_per_step'] for k, r in p.items() if k not in names):.3f}"
                                   for p in per)])
    rows.append(["**kernels a step**", "", *(f"**{sum(r['ms_per_step'] for r in p.values()):.3f}**" for p in per)])
    header = ["kernel", "category", *(f"`{f['case_id'].split('.', 3)[-1]}` ({p.stem.rsplit('_', 1)[-1]}), ms"
                                      for f, p in zip(files, paths, strict=True))]
    return table(header, rows)


def _short(case_id: str) -> str:
    workload, _, _, fmt = case_id.split(".")[:4]
    return f"{'FP8' if fmt != 'bf16' else 'BF16'} {workload}"


def regression_trials(files: list[Path]) -> str:
    """One row per judged trials file: A/A pairs, false verdicts, 'insufficient data', and per case how many
    3% and 10% slowdowns were called regressions."""
    rows = []
    for f in files:
        d = json.loads(f.read_text())
        cases = d["per_case"]
        comparisons = sum(c["aa_pairs"] for c in cases.values())

        def caught(level: str, cases: dict = cases) -> str:
            return "; ".join(f"{_short(k)} {c[f'detected_{level}']}/{c.get(f'compared_{level}', 0)}"
                             for k, c in sorted(cases.items()))
        rows.append([f"`{f.name}`", d["pairs"], f"{d['aa_false_regressions']} / {comparisons}",
                     sum(c["aa_false_improvements"] for c in cases.values()),
                     sum(c.get("aa_insufficient_data", 0) for c in cases.values()), caught("slow3"),
                     caught("slow10")])
    return table(["trials", "A/A pairs", "false regressions", "false improvements", "insufficient data (A/A)",
                  "3% caught", "10% caught"], rows)
