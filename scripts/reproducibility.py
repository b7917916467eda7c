"""Do two runs of one sweep on two boxes agree? Per workload and model: how many speedups (with quantization
and kernel-only) of cases measured on both lie within each other's 95% intervals, the across-box interval
(speedup_vs_bf16_box_lo/hi) and the run's own interval over its rounds; how many agree within 5%; how many
cases are host-bound (labelled on either box) or carry no label.

Usage: python3 scripts/reproducibility.py RUN_A RUN_B [--db results/fp8bench.duckdb] [--json FILE] [--markdown]
(--markdown prints the table docs/reproducibility.md holds; tests/test_docs.py checks that it is current).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fp8bench.core.markdown import table  # noqa: E402
from fp8bench.data import store  # noqa: E402

SERIES = {"with quantization": "speedup_vs_bf16", "kernel only": "speedup_vs_bf16_kernel"}


def _metrics(con, run_id: str) -> dict[str, dict]:
    out: dict[str, dict] = defaultdict(dict)
    for case, workload, model, metric, value in con.execute(
            "SELECT c.case_id, c.workload, c.model, m.metric, m.value FROM cases c JOIN measurements m "
            "USING (run_id, case_id) WHERE c.run_id = ? AND c.status = 'ok' AND c.backend != 'emulated'",
            [run_id]).fetchall():
        out[case].update({"workload": workload, "model": model, metric: value})
    return out


def within(x: float, lo: float | None, hi: float | None) -> bool:
    return lo is not None and hi is not None and lo <= x <= hi


def tally(a: dict[str, dict], b: dict[str, dict]) -> dict:
    rows: dict[tuple[str, str, str], dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for case in sorted(set(a) & set(b)):
        ma, mb = a[case], b[case]
        bound = (ma.get("host_bound"), mb.get("host_bound"))
        label = "host-bound" if 1.0 in bound else "unlabelled" if None in bound else "device-bound"
        for series, s in SERIES.items():
            if s not in ma or s not in mb:
                continue
            r = rows[(ma["workload"], ma["model"], series)]
            r["cases"] += 1
            r[label] += 1
            if label == "host-bound":
                continue
            sa, sb = ma[s], mb[s]
            r["not host-bound"] += 1
            r["within box intervals"] += within(sa, mb.get(f"{s}_box_lo"), mb.get(f"{s}_box_hi")) and within(
                sb, ma.get(f"{s}_box_lo"), ma.get(f"{s}_box_hi"))
            r["within round intervals"] += within(sa, mb.get(f"{s}_lo"), mb.get(f"{s}_hi")) and within(
                sb, ma.get(f"{s}_lo"), ma.get(f"{s}_hi"))
            r["within 5%"] += abs(sa / sb - 1) <= 0.05
    return {" / ".join(k): dict(v) for k, v in sorted(rows.items())}


COLUMNS = ("cases", "host-bound", "unlabelled", "not host-bound", "within box intervals", "within round intervals",
           "within 5%")


def markdown(rows: dict, runs: tuple[str, str]) -> str:
    """The tally as a markdown table, with the totals over the Llama-size models and over all."""
    head = f"Runs `{runs[0]}` and `{runs[1]}`; counts of speedups measured in both (emulator excluded).\n\n"
    llama: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    lines = []
    for key, r in rows.items():
        lines.append([key, *(r.get(c, 0) for c in COLUMNS)])
        for c in COLUMNS:
            total[c] += r.get(c, 0)
            llama[c] += r.get(c, 0) if "gpt-125m" not in key else 0
    for name, t in (("Llama-size models", llama), ("all", total)):
        lines.append([f"**{name}**", *(t[c] for c in COLUMNS)])
    return head + table(["workload / model / speedup", *COLUMNS], lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--db", default="results/fp8bench.duckdb")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--markdown", action="store_true", help="print the table as markdown (docs/reproducibility.md)")
    ns = p.parse_args(argv)
    con = store.connect(ns.db, read_only=True)
    rows = tally(_metrics(con, ns.run_a), _metrics(con, ns.run_b))
    if ns.markdown:
        print(markdown(rows, (ns.run_a, ns.run_b)), end="")
        return 0
    cols = COLUMNS
    print("workload / model / speedup".ljust(44) + "".join(c.rjust(24) for c in cols))
    total: dict[str, int] = defaultdict(int)
    for key, r in rows.items():
        print(key.ljust(44) + "".join(str(r.get(c, 0)).rjust(24) for c in cols))
        for c in cols:
            total[c] += r.get(c, 0)
    print("all".ljust(44) + "".join(str(total[c]).rjust(24) for c in cols))
    if ns.json:
        ns.json.write_text(json.dumps({"runs": [ns.run_a, ns.run_b], "rows": rows, "total": dict(total)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
