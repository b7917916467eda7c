"""What `fp8bench run` prints when it ends: counts per workload × backend with the median speedup, each ok
case's figures when there are few, and why the rest were skipped, grouped by reason. No torch, no DuckDB."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict

from rich.table import Table

from fp8bench.core.records import CaseRecord, seedless
from fp8bench.core.speedup import bound_label

PER_CASE_ROWS = 30
"""A run with at most this many ok cases lists each; a sweep lists counts and median speedups per group."""
REASON_ROWS = 5
"""Skip reasons shown (the most frequent first); `fp8bench plan` and the report's Not measured list have all."""


def summary_table(records: list[CaseRecord]) -> Table:
    """Per workload × backend that ran anything: how many ok/skipped/failed, and the median speedup of the ok
    FP8 cases (groups skipped whole are named by `not_run`)."""
    table = Table(title="fp8bench run summary")
    statuses = ("ok", "skipped", "failed") + (("diverged",) if any(r.status == "diverged" for r in records) else ())
    for col in ("workload", "backend", *statuses, "median speedup vs BF16"):
        table.add_column(col, justify="left" if col in ("workload", "backend") else "right")
    counts: Counter = Counter((r.workload, r.backend, r.status) for r in records)
    speedups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in records:
        s = r.metric("speedup_vs_bf16")
        if r.status == "ok" and s is not None:
            speedups[(r.workload, r.backend)].append(s)
    for wl, be in sorted({(r.workload, r.backend) for r in records if r.status != "skipped"}):
        s = speedups.get((wl, be))
        median = (f"{statistics.median(s):.2f}x ({min(s):.2f}-{max(s):.2f}, {len(s)} cases)" if s else "")
        table.add_row(wl, be, *(str(counts[(wl, be, st)]) for st in statuses), median)
    return table


def not_run(records: list[CaseRecord]) -> str | None:
    """'nothing ran for: te (gemm, linear), triton (gemm)': the workload × backend groups skipped whole."""
    ran = {(r.workload, r.backend) for r in records if r.status != "skipped"}
    whole: dict[str, list[str]] = defaultdict(list)
    for wl, be in sorted({(r.workload, r.backend) for r in records} - ran):
        whole[be].append(wl)
    if not whole:
        return None
    return "nothing ran for: " + ", ".join(f"{be} ({', '.join(wls)})" for be, wls in sorted(whole.items()))


def results_table(records: list[CaseRecord], derived: dict[str, dict[str, float]] | None = None) -> list[Table]:
    """For a run with at most PER_CASE_ROWS ok cases: each non-training case's median time, speedup with its
    95% interval, SQNR and host-boundness, and each training recipe over its seeds (`training_table`, which
    reads the parity verdicts in `derived`: {case_id: {metric: value}} computed from the run's records).
    Empty for a sweep with more (the summary and the report carry those)."""
    ok = [r for r in records if r.status == "ok"]
    if not ok or len(ok) > PER_CASE_ROWS:
        return []
    tables = []
    timed = [r for r in ok if r.workload != "train"]
    if timed:
        table = Table(title="results (median time; speedup vs the BF16 twin with its 95% interval over rounds)")
        for col in ("case", "time_ms", "speedup", "95% interval", "sqnr_db", "bound"):
            table.add_column(col, justify="left" if col in ("case", "bound") else "right")
        for r in sorted(timed, key=lambda r: r.case_id):
            t, s, sqnr = r.metric("time_ms"), r.metric("speedup_vs_bf16"), r.metric("sqnr_db")
            lo, hi, bound = r.metric("speedup_vs_bf16_lo"), r.metric("speedup_vs_bf16_hi"), r.metric("host_bound")
            table.add_row(r.case_id, "" if t is None else f"{t:.4g}", "" if s is None else f"{s:.2f}x",
                          "" if lo is None else f"{lo:.2f}-{hi:.2f}", "" if sqnr is None else f"{sqnr:.1f}",
                          bound_label(bound))
        tables.append(table)
    trained = [r for r in ok if r.workload == "train"]
    if trained:
        tables.append(training_table(trained, derived or {}))
    return tables


def training_table(records: list[CaseRecord], derived: dict[str, dict[str, float]]) -> Table:
    """One row per training recipe, its seeds pooled: median step time, final loss (median, and the range
    over seeds), the median gap to BF16's final loss and on how many seeds the parity verdict passed."""
    by_recipe: dict[str, list[CaseRecord]] = defaultdict(list)
    for r in records:
        by_recipe[seedless(r.case_id)].append(r)
    table = Table(title="training (per recipe over its seeds: median step time, final loss, gap to BF16)")
    for col in ("recipe", "seeds", "step ms", "final loss", "gap vs BF16", "parity passed"):
        table.add_column(col, justify="left" if col == "recipe" else "right")

    def measured(rs, name):
        return [v for v in (r.metric(name) for r in rs) if v is not None]

    def verdicts(rs, name):  # derived from several cases at once, so not in a record's metrics
        return [v for v in (derived.get(r.case_id, {}).get(name) for r in rs) if v is not None]

    for recipe, rs in sorted(by_recipe.items()):
        step, loss = measured(rs, "time_ms"), measured(rs, "loss_final")
        gap, passed = verdicts(rs, "loss_gap_vs_bf16"), verdicts(rs, "parity_pass")
        table.add_row(recipe, str(len(rs)), f"{statistics.median(step):.4g}" if step else "",
                      (f"{statistics.median(loss):.3f}" + (f" ({min(loss):.3f}-{max(loss):.3f})" if len(loss) > 1
                                                           else "")) if loss else "",
                      f"{statistics.median(gap):+.3f}" if gap else "",
                      f"{int(sum(passed))} of {len(passed)}" if passed else "")
    return table


def skip_reasons(records: list[CaseRecord]) -> list[str]:
    """'N × reason' lines for the skipped cases, most frequent first, at most REASON_ROWS and a line for the
    rest."""
    reasons = Counter(r.reason for r in records if r.status == "skipped")
    lines = [f"{n:>5} × {reason}" for reason, n in reasons.most_common(REASON_ROWS)]
    rest = sum(reasons.values()) - sum(n for _, n in reasons.most_common(REASON_ROWS))
    if rest:
        lines.append(f"{rest:>5} × {len(reasons) - REASON_ROWS} other reasons (`fp8bench plan` lists each case's; "
                     "the report's Not measured list groups them)")
    return lines
