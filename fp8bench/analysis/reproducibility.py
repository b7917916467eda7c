"""Do two runs of one sweep on two boxes agree? Per workload and model: how many speedups (with quantization and
kernel-only) of cases measured on both lie within each other's 95% intervals, the across-box interval
(speedup_vs_bf16_box_lo/hi) and the run's own interval over its rounds; how many agree within 5%; how many cases
are host-bound (labelled on either box) or carry no label. `scripts/reproducibility.py` prints it; docs/
reproducibility.md holds its tables. No duckdb import: queries go through the store connection."""

from __future__ import annotations

from collections import defaultdict

from fp8bench.core.markdown import table
from fp8bench.core.records import TIMED_SQL

SERIES = {"with quantization": "speedup_vs_bf16", "kernel only": "speedup_vs_bf16_kernel"}
COLUMNS = ("cases", "host-bound", "unlabelled", "not host-bound", "within box intervals", "within round intervals",
           "within 5%")


def run_metrics(con, run_id: str) -> dict[str, dict]:
    """{case_id: {workload, model, metric: value...}} of the run's ok cases on a real backend (not the
    emulator, whose time is emulation's)."""
    out: dict[str, dict] = defaultdict(dict)
    for case, workload, model, metric, value in con.execute(
            "SELECT c.case_id, c.workload, c.model, m.metric, m.value FROM cases c JOIN measurements m "
            f"USING (run_id, case_id) WHERE c.run_id = ? AND c.status = 'ok' AND {TIMED_SQL}",
            [run_id]).fetchall():
        out[case].update({"workload": workload, "model": model, metric: value})
    return out


def within(x: float, lo: float | None, hi: float | None) -> bool:
    return lo is not None and hi is not None and lo <= x <= hi


def tally(a: dict[str, dict], b: dict[str, dict]) -> dict:
    """Per 'workload / model / series': the COLUMNS' counts over the cases both runs measured."""
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
