"""`fp8bench audit`'s check that every speedup the pages publish shows its 95% interval and its measurement
version, or is withdrawn with the reason.

What counts as a published speedup:
- in a table of a generated block of README.md or docs/*.md, every figure printed as a decimal with an `x`
  (`1.46x`), in whichever column, and every cell of a speedup column (its header names its interval,
  `(95% interval)`, or is a speedup's name alone, `speedup`, `vs BF16`: fp8bench.report.audit_pages.is_speedup_column);
- in prose, the figure after a marker naming a stored speedup (`metric=speedup_vs_bf16`,
  `speedup_vs_bf16_kernel`).

Each must read as fp8bench.report.published writes it: the figure with its interval right after it,
`1.46x (1.44–1.50)` (`over N seeds` inside the parentheses where the interval is over a recipe's seeds),
holding the figure, and with its measurement version: the row's `measurement version` cell (`v4`), or in
prose inside the parentheses, `1.46x (1.44–1.50, v4)`, both matching the committed data. Otherwise the cell
reads `withdrawn: <why>` and prints no figure. A speedup column's cell that is neither (a bare number, a
figure without `x`, `withdrawn` without a reason) is a problem; an empty cell shows no speedup.

Not speedups: the waterfall's ratios modelled from the kernel times of profiled steps, in columns whose header
ends in `(model)` (fp8bench.report.published.MODELLED). They attribute a measured step to its parts, rest on
kernel times stored one figure a category (no repeat to give an interval), and are printed without `x`; one
printed with `x` is a bare speedup here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from fp8bench.report.audit_pages import is_speedup_column, matches, table_rows
from fp8bench.report.published import INTERVAL, SPEEDUP, VERSION, WITHDRAWN

SPEEDUP_METRICS = ("speedup_vs_bf16", "speedup_vs_bf16_kernel")
"""Stored speedups a prose marker may name."""
VERSION_COLUMN = "measurement version"


@dataclass
class Tally:
    """The speedups a page shows: with an interval and a measurement version, and withdrawn."""

    with_interval: int = 0
    withdrawn: int = 0


def cell_problem(cell: str, speedup_column: bool, version: str | None, tally: Tally) -> str:
    """What is wrong with one table cell as a published speedup ('' when nothing); counts it in `tally`.
    `version`: the row's measurement version cell (None: the table has no such column)."""
    figures = list(SPEEDUP.finditer(cell))
    if cell.startswith("withdrawn"):
        if not WITHDRAWN.match(cell):
            return f"{cell!r} is withdrawn without its reason (`withdrawn: why`)"
        tally.withdrawn += 1
        return f"{cell!r} is withdrawn, yet prints the speedup {figures[0].group(0)}" if figures else ""
    if not figures:
        if speedup_column and re.search(r"\d", cell):
            return (f"{cell!r} in a speedup column is neither a speedup with its interval (`1.46x (1.44–1.50)`) "
                    "nor withdrawn with the reason")
        return ""
    for f in figures:
        iv = INTERVAL.match(cell, f.end())
        if iv is None:
            return f"the speedup {f.group(0)} shows no interval: give it one or withdraw it (`withdrawn: why`)"
        value, lo, hi = float(f.group("value")), float(iv.group("lo")), float(iv.group("hi"))
        if not lo <= value <= hi:
            return f"the speedup {f.group(0)} lies outside its interval ({iv.group('lo')}–{iv.group('hi')})"
    if version is None:
        return f"the speedup {figures[0].group(0)} is in a table with no {VERSION_COLUMN!r} column"
    if not VERSION.match(version):
        return f"the speedup {figures[0].group(0)} shows no measurement version (its row reads {version!r})"
    tally.with_interval += len(figures)
    return ""


def table_problems(body: str, tally: Tally) -> list[tuple[str, str, str]]:
    """(row, column, problem) of every cell of a generated block's tables that breaks the rule (module
    docstring); counts the speedups it shows in `tally`."""
    out = []
    for header, row, cells in table_rows(body):
        at = header.index(VERSION_COLUMN) if VERSION_COLUMN in header else None
        version = cells[at] if at is not None and at < len(cells) else None
        for column, cell in zip(header, cells, strict=False):
            what = cell_problem(cell, is_speedup_column(column), version, tally)
            if what:
                out.append((row, column, what))
    return out


def marker_problem(con, run: str, case: str, metric: str, figure: str, after: str) -> str:
    """What is wrong with a prose speedup (the marked `figure` of `metric` of `case` in `run`, `after` the text
    that follows it) as a published one ('' when nothing): its interval and measurement version must follow it
    and agree with the data (the across-box interval where the committed spread gives one, else the run's)."""
    if metric not in SPEEDUP_METRICS:
        return ""
    iv = INTERVAL.match(after)
    if iv is None or iv.group("version") is None:
        return (f"a speedup in prose shows its interval and measurement version after it "
                f"(`{figure} (lo–hi, vN)`), or is left to a generated table")
    ends = dict(con.execute("SELECT metric, value FROM measurements WHERE run_id = ? AND case_id = ? AND metric IN "
                            "(SELECT unnest(?::VARCHAR[]))",
                            [run, case, [f"{metric}{s}" for s in ("_lo", "_hi", "_box_lo", "_box_hi")]]).fetchall())
    lo, hi = ends.get(f"{metric}_box_lo", ends.get(f"{metric}_lo")), ends.get(f"{metric}_box_hi", ends.get(f"{metric}_hi"))
    if lo is None or hi is None:
        return "the committed data hold no interval for this speedup: the pages withdraw it"
    if not (matches(lo, iv.group("lo")) and matches(hi, iv.group("hi"))):
        return f"its interval ({iv.group('lo')}–{iv.group('hi')}): the committed data give {lo:.6g}–{hi:.6g}"
    version = con.execute("SELECT measurement_version FROM runs WHERE run_id = ?", [run]).fetchone()
    if version is None or version[0] is None or int(iv.group("version")) != int(version[0]):
        return f"its measurement version v{iv.group('version')}: run {run} is v{version[0] if version else '?'}"
    return ""
