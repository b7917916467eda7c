"""The audit's check that every speedup a generated table shows carries its interval and measurement version, or
is withdrawn with the reason (fp8bench.report.audit_speedups), cell by cell. The check on the repository's own
pages, and on prose markers, is in tests/test_audit.py."""

import pytest

from fp8bench.core.markdown import table
from fp8bench.report.audit_speedups import Tally, table_problems
from fp8bench.report.published import NO_INTERVAL, Shown

HEADER = ["device · model", "recipe", "speedup vs BF16 (95% interval)", "run", "measurement version"]


def _check(rows, header=HEADER) -> tuple[list[tuple[str, str, str]], Tally]:
    tally = Tally()
    return table_problems(table(header, rows), tally), tally


def test_a_speedup_with_its_interval_and_version_passes_and_is_counted():
    problems, tally = _check([["H200 · 7b", "e4m3", "1.46x (1.44–1.50)", "`r`", "v4"],
                              ["H200 · 7b", "e4m3", "0.94x (0.93–0.95 over 3 seeds)", "`r`", "v4"],
                              ["H200 · 7b", "hybrid", f"withdrawn: {NO_INTERVAL}", "`r`", "v4"],
                              ["H200 · 7b", "bf16", "", "`r`", "v4"]])
    assert problems == [] and (tally.with_interval, tally.withdrawn) == (2, 1)


@pytest.mark.parametrize("cell,version,says", [
    ("1.50x", "v4", "the speedup 1.50x shows no interval"),
    ("1.50x at llama2-7b", "v4", "the speedup 1.50x shows no interval"),
    ("1.46x (1.44–1.50)", "", "the speedup 1.46x shows no measurement version (its row reads '')"),
    ("1.60x (1.44–1.50)", "v4", "the speedup 1.60x lies outside its interval (1.44–1.50)"),
    ("withdrawn", "v4", "'withdrawn' is withdrawn without its reason"),
    ("withdrawn: no interval, 1.50x", "v4", "is withdrawn, yet prints the speedup 1.50x"),
    ("1.50", "v4", "'1.50' in a speedup column is neither a speedup with its interval"),
])
def test_a_speedup_shown_bare_is_named_by_row_and_column(cell, version, says):
    problems, _ = _check([["H200 · 7b", "e4m3", cell, "`r`", version]])
    assert len(problems) == 1
    row, column, what = problems[0]
    assert (row, column) == ("row 1 (H200 · 7b)", "speedup vs BF16 (95% interval)") and says in what, what


def test_a_table_without_a_measurement_version_column_fails():
    problems, _ = _check([["H200 · 7b", "1.46x (1.44–1.50)"]], header=["device · model", "speedup (95% interval)"])
    assert problems and "in a table with no 'measurement version' column" in problems[0][2]


def test_a_figure_with_x_is_a_speedup_in_any_column_and_counts_are_not():
    """A speedup printed in a column not named as one is held to the rule too; a column that counts speedups
    ('speedups withdrawn'), or a waterfall stage marked (model) printed without x, is no speedup."""
    header = ["run", "speedups withdrawn", "ideal (model)", "note", "measurement version"]
    assert _check([["`r`", "12", "1.57", "", "v4"]], header)[0] == []
    problems, _ = _check([["`r`", "12", "1.57x", "", "v4"]], header)
    assert [(c, w.split(":")[0]) for _, c, w in problems] == [("ideal (model)", "the speedup 1.57x shows no interval")]


def test_the_cells_the_generators_write_pass_the_check():
    cells = [Shown(1.4567, 1.441, 1.502).text(), Shown(0.9412, 0.93, 0.951, seeds=3).text(),
             Shown(1.5, 1.4, 1.6).text(at="llama2-7b"), Shown(withdrawn=NO_INTERVAL).text(at="llama2-7b"),
             Shown(withdrawn="its record names no BF16 twin").text(), Shown().text()]
    problems, tally = _check([["d", "r", c, "`r`", "v4"] for c in cells])
    assert problems == [] and (tally.with_interval, tally.withdrawn) == (3, 2)
