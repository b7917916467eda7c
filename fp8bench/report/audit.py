"""`fp8bench audit`: every figure README.md and docs/ publish, re-derived from the committed samples alone.

From a DuckDB of the committed result sets (what `make results-page` ingests), it checks
1. every generated block: rendered again by the generator its header names, and compared cell by cell;
2. every stored speedup: rebuilt from the samples of its record and of its BF16 twin
   (fp8bench.analysis.rebuild); the `fp8bench report` blocks are then rendered again from the rebuilt
   speedups (time_ms from the median of its samples, the across-box intervals derived again from the
   rebuilt ones), so each speedup they show is checked to the digits it prints. A speedup whose samples
   are not committed cannot be rebuilt: the pages withdraw it (fp8bench.report.data.withdraw) and the
   audit lists it;
3. every figure in prose that carries a marker (fp8bench.report.audit_pages): the stored (rebuilt) value it
   names, to the digits it prints;
4. every speedup the pages publish, in any generated table or behind a marker: that it shows its interval and
   its measurement version, or is withdrawn with the reason (fp8bench.report.audit_speedups).
Figures with a unit in prose without a marker are counted as unverifiable. A problem is anything that
differs or cannot be rebuilt; `audit` returns them all, never the first alone.
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fp8bench.analysis import rebuild as rb
from fp8bench.core.records import StoreError
from fp8bench.data import store
from fp8bench.report import audit_pages as ap
from fp8bench.report import audit_speedups as aus

REPORT = ("fp8bench", "report", "--markdown")
"""The header of the blocks `fp8bench report --markdown` writes from the store: those that show speedups."""
DB_PLACEHOLDER = "DB_OF_COMMITTED_RESULTS"
"""What a block's header writes for the database of the committed result sets."""


@dataclass(frozen=True)
class Problem:
    """A published figure that differs from its rebuild or cannot be rebuilt."""

    page: str
    line: int
    where: str
    what: str

    def text(self) -> str:
        return f"{self.page}{f':{self.line}' if self.line else ''}: {self.where}: {self.what}"


@dataclass
class Counts:
    """What the audit checked on one page."""

    blocks: int = 0
    cells: int = 0
    speedups: int = 0
    """Speedup cells of `fp8bench report` blocks, rendered again from the rebuilt speedups."""
    tagged: int = 0
    unverifiable: int = 0
    shown: aus.Tally = field(default_factory=aus.Tally)
    """Speedups the page shows with an interval and a measurement version, and withdrawn."""


@dataclass
class Audit:
    pages: dict[str, Counts] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)
    rebuilt: list[rb.Rebuilt] = field(default_factory=list)
    """Every stored speedup of the committed runs, with what its samples give."""
    withdrawn: dict[tuple[str, str, str], str] = field(default_factory=dict)
    untagged: list[tuple[str, ap.Untagged]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


class Unrenderable(ValueError):
    """A block whose header names no generator the audit knows, or inputs that are not there."""


def pages_of(root: Path) -> list[Path]:
    """README.md and docs/*.md under `root` (the repository)."""
    readme = root / "README.md"
    if not readme.is_file():
        raise StoreError(f"root {str(root)!r} has no README.md; give the repository's root (--root)")
    return [readme, *sorted((root / "docs").glob("*.md"))]


def committed_db(root: Path):
    """An in-memory DuckDB of the committed result sets under `root`/results."""
    results = root / "results"
    if not results.is_dir():
        raise StoreError(f"root {str(root)!r} has no results/ folder; give the repository's root (--root)")
    con = store.connect(":memory:")
    store.ingest(con, store.committed_result_sets(results))
    return con


def render(command: str, con, root: Path) -> str:
    """The body the generator named by a block's header writes, from `con` and the files under `root`."""
    from fp8bench.analysis import reproducibility
    from fp8bench.report import kernel_tables, markdown, probe_tables

    args = shlex.split(command)
    if tuple(args[:3]) == REPORT and len(args) == 4:
        if args[3] not in markdown.KINDS:
            raise Unrenderable(f"`fp8bench report --markdown {args[3]}` is no generated block kind; choose one of "
                               f"{sorted(markdown.KINDS)}")
        return markdown.KINDS[args[3]](con)
    script, rest = (Path(args[1]).name, args[2:]) if len(args) > 2 and args[0].startswith("python") else ("", [])
    files = [root / a for a in rest[1:]]
    missing = [str(f) for f in files if script != "reproducibility.py" and not f.is_file()]
    if missing:
        raise Unrenderable(f"its inputs {missing} are not committed")
    if script == "recipe_bench.py" and rest[:1] == ["--markdown"] and len(files) == 1:
        return kernel_tables.markdown(json.loads(files[0].read_text())) + "\n"
    if script == "kernel_breakdown.py" and rest[:1] == ["--markdown"] and files:
        return probe_tables.kernel_breakdown(files)
    if script == "regression_trials.py" and rest[:1] == ["table"] and files:
        return probe_tables.regression_trials(files)
    if script == "reproducibility.py" and "--markdown" in rest and rest[2:4] == ["--db", DB_PLACEHOLDER]:
        runs = (rest[0], rest[1])
        metrics = [reproducibility.run_metrics(con, r) for r in runs]
        return reproducibility.markdown(reproducibility.tally(*metrics), runs)
    raise Unrenderable(f"no generator the audit knows writes `{command}`")


def _where(block: ap.Block, d: ap.CellDiff | None = None) -> str:
    head = f"block `{block.command[:80]}`"
    return head if d is None else f"{head}, {d.row}, column {d.column!r}"


def _check_blocks(page: ap.Page, con, root: Path, audit: Audit, counts: Counts) -> dict[int, str]:
    """Each block against what its generator writes from the stored data, and each speedup it shows against
    the rule for a published one; returns those renders."""
    rendered = {}
    for block in page.blocks:
        counts.blocks += 1
        cells, speedups = ap.table_cells(block.body)
        counts.cells += cells
        for row, column, what in aus.table_problems(block.body, counts.shown):
            audit.problems.append(Problem(page.name, block.line, _where(block, ap.CellDiff(row, column, "", "")),
                                          what))
        try:
            rendered[block.line] = body = render(block.command, con, root)
        except (Unrenderable, OSError, ValueError, KeyError) as exc:
            audit.problems.append(Problem(page.name, block.line, _where(block), f"cannot be rebuilt: {exc}"))
            continue
        if tuple(shlex.split(block.command)[:3]) == REPORT:
            counts.speedups += speedups
        for d in ap.diff(block.body, body):
            audit.problems.append(Problem(page.name, block.line, _where(block, d),
                                          f"stale or edited by hand: the page shows {d.page!r}, the committed data "
                                          f"give {d.rebuilt!r}"))
    return rendered


def _check_rebuilt_blocks(page: ap.Page, con, rendered: dict[int, str], audit: Audit) -> None:
    """The `fp8bench report` blocks rendered from the rebuilt speedups against their render from the stored
    ones: a difference is a stored figure its samples do not give, to the digits the page prints."""
    from fp8bench.report import markdown

    for block in page.blocks:
        args = shlex.split(block.command)
        if tuple(args[:3]) != REPORT or block.line not in rendered:
            continue
        for d in ap.diff(rendered[block.line], markdown.KINDS[args[3]](con)):
            audit.problems.append(Problem(page.name, block.line, _where(block, d),
                                          f"differs from its rebuild from the committed samples: the stored figure "
                                          f"{d.page!r}, the samples {d.rebuilt!r}"))


def apply_rebuild(con, rebuilt: list[rb.Rebuilt], spread: Path | None) -> None:
    """Replace, in `con`, every rebuilt speedup and its interval by its rebuild (an interval its samples do not
    give goes; a speedup that cannot be rebuilt stays, for the pages withdraw it), each `time_ms` and
    `time_ms_kernel` by the median of its samples, and derive the across-box intervals again from the rebuilt
    intervals and the committed spread (`spread`: results/spread)."""
    values = pd.DataFrame([(r.run_id, r.case_id, r.metric + suffix, v) for r in rebuilt
                           for suffix, v in (("", r.value), ("_lo", r.lo), ("_hi", r.hi)) if v is not None],
                          columns=["run_id", "case_id", "metric", "value"])
    keys = pd.DataFrame([(r.run_id, r.case_id, r.metric) for r in rebuilt if r.rebuilt],
                        columns=["run_id", "case_id", "metric"])
    con.register("rebuilt_values", values)
    con.register("rebuilt_keys", keys)
    try:
        con.execute("""DELETE FROM measurements m USING rebuilt_keys k
                       WHERE m.run_id = k.run_id AND m.case_id = k.case_id
                         AND m.metric IN (k.metric || '_lo', k.metric || '_hi', k.metric || '_box_lo', k.metric || '_box_hi')
                         AND NOT EXISTS (SELECT 1 FROM rebuilt_values v WHERE v.run_id = m.run_id
                                         AND v.case_id = m.case_id AND v.metric = m.metric)""")
        con.execute("""UPDATE measurements m SET value = v.value FROM rebuilt_values v
                       WHERE m.run_id = v.run_id AND m.case_id = v.case_id AND m.metric = v.metric""")
    finally:
        con.unregister("rebuilt_values")
        con.unregister("rebuilt_keys")
    con.execute("""UPDATE measurements m SET value = s.med
                   FROM (SELECT run_id, case_id, metric, median(value) AS med FROM samples
                         WHERE metric IN ('time_ms', 'time_ms_kernel') GROUP BY ALL) s
                   WHERE m.run_id = s.run_id AND m.case_id = s.case_id AND m.metric = s.metric""")
    if spread is not None and spread.is_dir():
        store.ingest(con, [spread])


def _check_rebuilt_records(audit: Audit) -> None:
    """A stored speedup its samples do not give, or one they should give and do not, is a problem wherever it
    is shown: the pages show every one not withdrawn."""
    for r in audit.rebuilt:
        where = f"run {r.run_id}, case {r.case_id}, {r.metric}"
        for d in r.differences():
            audit.problems.append(Problem("(stored data)", 0, where, f"differs from its samples: {d}"))
        if not r.rebuilt and (r.run_id, r.case_id, r.metric) not in audit.withdrawn:
            audit.problems.append(Problem("(stored data)", 0, where, f"cannot be rebuilt, yet is not withdrawn: "
                                                                       f"{r.reason}"))


def _check_markers(page: ap.Page, con, audit: Audit, counts: Counts) -> None:
    """Each marked figure against the value it names, from the rebuilt data."""
    for m in page.markers:
        counts.tagged += 1
        where = f"figure {m.figure or '(none)'} marked " + " ".join(f"{k}={v}" for k, v in m.spec.items())
        what = m.problem and f"the marker cannot be read: {m.problem}"
        if not what:
            what = _marked_value_problem(con, m, audit.withdrawn)
        if what:
            audit.problems.append(Problem(page.name, m.line, where, what))


def _marked_value_problem(con, m: ap.Marker, withdrawn: dict[tuple[str, str, str], str]) -> str:
    """What is wrong with a readable marker's figure ('' when the data give it)."""
    run, metric = m.spec["run"], m.spec["metric"]
    ids = [c for (c,) in con.execute("SELECT case_id FROM cases WHERE run_id = ? AND (case_id = ? OR label = ?)",
                                     [run, m.spec["case"], m.spec["case"]]).fetchall()]
    if len(ids) != 1:
        return (f"names {len(ids)} cases of run {run!r}: give the case id" if ids else
                f"names no case of run {run!r} in the committed data (a case id, or a label naming one case)")
    if (run, ids[0], metric) in withdrawn:
        return f"cannot be rebuilt: {withdrawn[(run, ids[0], metric)]}"
    row = con.execute("SELECT value FROM measurements WHERE run_id = ? AND case_id = ? AND metric = ?",
                      [run, ids[0], metric]).fetchone()
    if row is None or row[0] is None:
        return f"names no stored {metric!r} of case {ids[0]!r}"
    value = row[0] * float(m.spec.get("scale", 1))
    if not ap.matches(value, m.figure):
        return f"the committed data give {value:.6g}"
    return aus.marker_problem(con, run, ids[0], metric, m.figure, m.after)


def audit(root: Path, pages: list[Path] | None = None, db: Path | None = None) -> Audit:
    """Check `pages` (README.md and docs/*.md by default) against the committed result sets under `root`
    (or the DuckDB file `db`, which this never writes)."""
    root = Path(root)
    paths = pages if pages else pages_of(root)
    for p in paths:
        if not Path(p).is_file():
            raise StoreError(f"page {str(p)!r} does not exist; give Markdown files (default: README.md, docs/*.md)")
    con = store.in_memory_copy(db) if db is not None else committed_db(root)
    result = Audit()
    read = []
    for path in paths:
        name = str(Path(path).resolve().relative_to(root.resolve())) if Path(path).resolve().is_relative_to(
            root.resolve()) else str(path)
        page = ap.read_page(name, Path(path).read_text(encoding="utf-8"))
        counts = result.pages.setdefault(name, Counts())
        read.append((page, _check_blocks(page, con, root, result, counts)))
        counts.unverifiable = len(page.untagged)
        result.untagged += [(name, u) for u in page.untagged]
    result.withdrawn = rb.withdrawn(con)
    result.rebuilt = rb.rebuild(con)
    _check_rebuilt_records(result)
    apply_rebuild(con, result.rebuilt, root / "results" / store.SPREAD_DIR)
    for page, rendered in read:
        _check_rebuilt_blocks(page, con, rendered, result)
        _check_markers(page, con, result, result.pages[page.name])
    con.close()
    return result


def summary(a: Audit, verbose: bool = False) -> list[str]:
    """What the audit checked, by page and kind, and what it found; with `verbose`, every withdrawn and every
    unverifiable figure too."""
    total = Counts()
    lines = ["page | generated blocks | cells | speedups rebuilt | tagged figures | unverifiable | "
             "speedups shown with interval | withdrawn"]
    for name, c in a.pages.items():
        lines.append(f"{name} | {c.blocks} | {c.cells} | {c.speedups} | {c.tagged} | {c.unverifiable} | "
                     f"{c.shown.with_interval} | {c.shown.withdrawn}")
        for k in ("blocks", "cells", "speedups", "tagged", "unverifiable"):
            setattr(total, k, getattr(total, k) + getattr(c, k))
        total.shown.with_interval += c.shown.with_interval
        total.shown.withdrawn += c.shown.withdrawn
    lines.append(f"all {len(a.pages)} pages | {total.blocks} | {total.cells} | {total.speedups} | {total.tagged} | "
                 f"{total.unverifiable} | {total.shown.with_interval} | {total.shown.withdrawn}")
    methods = Counter(r.method for r in a.rebuilt if r.rebuilt)
    lines.append(f"stored speedups of the committed runs (what the pages and the site read): {len(a.rebuilt)}; "
                 + ", ".join(f"{n} rebuilt by {m}" for m, n in sorted(methods.items()))
                 + f"; {len(a.withdrawn)} cannot be rebuilt and are withdrawn from the pages"
                 + ("" if verbose or not a.withdrawn else " (--verbose lists them)"))
    if verbose:
        stored = {(r.run_id, r.case_id, r.metric): r.stored for r in a.rebuilt}
        by_reason = Counter(a.withdrawn.values())
        lines += [f"  withdrawn for {n}: {why}" for why, n in by_reason.most_common()]
        lines += [f"  withdrawn: run {run}, case {case}, {metric} {stored.get((run, case, metric), float('nan')):.2f}x"
                  for (run, case, metric) in sorted(a.withdrawn)]
    lines.append(f"unverifiable: {len(a.untagged)} figures with a unit in prose carry no marker"
                 + ("" if verbose or not a.untagged else " (--verbose lists them)"))
    if verbose:
        lines += [f"  {page}:{u.line}: {u.figure}  ({u.context})" for page, u in a.untagged]
    return lines
