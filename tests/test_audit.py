"""`fp8bench audit`: the repository's pages pass it, and an edit of any one figure in its scope (a generated
cell, a marked figure in prose, a stored speedup its samples do not give) fails it, naming the figure."""

import math
import re
import shutil
import statistics
from pathlib import Path

import pytest

from fp8bench.analysis import rebuild
from fp8bench.cli import main
from fp8bench.core.speedup import ratio_interval
from fp8bench.data import store
from fp8bench.report import audit_pages

ROOT = Path(__file__).resolve().parents[1]
WITHDRAWN_CASE = ("hopper-e", "layer.llama2-7b.b2s4096.hybrid.delayed.te")
"""A layer speedup timed beside its twin in a later batch: the samples it was divided by are not committed."""


@pytest.fixture(scope="module")
def committed_db(tmp_path_factory):
    """A DuckDB file of the committed result sets only, built once here."""
    path = tmp_path_factory.mktemp("committed") / "committed.duckdb"
    con = store.connect(path)
    store.ingest(con, store.committed_result_sets(ROOT / "results"))
    con.close()
    return path


def audit(capsys, *args) -> tuple[int, str]:
    code = main(["audit", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


# --------------------------------------------------------------------------- the repository

@pytest.mark.slow
def test_the_repository_passes_its_audit(capsys):
    """From the committed result sets alone, every figure of README.md and docs/ is rebuilt (or withdrawn)."""
    code, out = audit(capsys, "--root", ROOT)
    assert code == 0, out
    assert "every checked figure is rebuilt from the committed samples" in out
    for page in ("README.md", "docs/results.md", "docs/training.md", "docs/why-not-2x.md", "docs/kernels.md"):
        assert re.search(rf"^{re.escape(page)} \| [1-9]\d* \| [1-9]", out, re.M), page
    assert "cannot be rebuilt and are withdrawn from the pages" in out
    # speedups shown with an interval and withdrawn, the last two columns
    for page in ("README.md", "docs/results.md", "docs/training.md", "docs/why-not-2x.md"):
        assert re.search(rf"^{re.escape(page)} \| \d+ \| \d+ \| [1-9]\d* \|.* \| [1-9]\d* \| [1-9]\d*$", out, re.M), page


# --------------------------------------------------------------------------- one figure edited

def _first_digit_cell(text: str, command: str) -> tuple[int, int, str]:
    """(offset, length, cell) of the first cell with a digit in the first data row of the block whose header
    contains `command`."""
    m = re.search(r"<!-- generated: [^>]*" + re.escape(command) + r"[^>]*-->\n", text)
    lines = text[m.end():].split("\n")
    start = m.end()
    for i, line in enumerate(lines):
        if line.startswith("|") and i > 0 and re.match(r"^\|[-:|]+\|$", lines[i - 1].strip()):
            offset = start + 1
            for cell in line[1:-1].split("|"):
                if re.search(r"\d", cell) and "`" not in cell:
                    return offset, len(cell), cell.strip()
                offset += len(cell) + 1
        start += len(line) + 1
    raise AssertionError(f"no data row with a number in block {command!r}")


def _bump(cell: str) -> str:
    """The cell with its last digit changed."""
    i = max(i for i, c in enumerate(cell) if c.isdigit())
    return cell[:i] + str((int(cell[i]) + 1) % 10) + cell[i + 1:]


BLOCKS = [("README.md", "--markdown recommendation"), ("README.md", "--markdown headline"),
          ("docs/results.md", "--markdown results"), ("docs/results.md", "--markdown withdrawn"),
          ("docs/training.md", "--markdown parity"), ("docs/training.md", "--markdown steps"),
          ("docs/why-not-2x.md", "--markdown layer-waterfall"), ("docs/kernels.md", "recipe_bench.py"),
          ("docs/kernels.md", "kernel_breakdown.py"), ("docs/regression.md", "regression_trials.py"),
          ("docs/reproducibility.md", "reproducibility.py hopper-c hopper-e")]


@pytest.mark.slow
@pytest.mark.parametrize("page,command", BLOCKS)
def test_an_edited_generated_cell_fails_naming_page_block_row_and_column(committed_db, tmp_path, capsys, page,
                                                                        command):
    text = (ROOT / page).read_text()
    offset, length, cell = _first_digit_cell(text, command)
    edited = _bump(cell)
    copy = tmp_path / Path(page).name
    copy.write_text(text[:offset] + f" {edited} ".ljust(length) + text[offset + length:])
    code, out = audit(capsys, copy, "--root", ROOT, "--db", committed_db)
    assert code == 1, out
    problem = next(line for line in out.splitlines() if line.startswith(str(copy)))
    assert command in problem and "row 1" in problem and "column '" in problem, problem
    assert f"the page shows {edited!r}" in problem and "stale or edited by hand" in problem


PUBLISHED = "run=hopper-e case=layer.llama2-7b.b2s4096.e4m3.delayed.te metric=speedup_vs_bf16"
"""A layer speedup timed side by side, with its interval: 1.46x (1.44–1.50), measurement version 4."""


@pytest.mark.slow
def test_an_edited_marked_figure_fails_naming_it(committed_db, tmp_path, capsys):
    page = tmp_path / "page.md"
    page.write_text(f"E4M3 delayed <!-- figure: {PUBLISHED} -->1.46x (1.44–1.50, v4) on one layer.\n")
    assert audit(capsys, page, "--root", ROOT, "--db", committed_db)[0] == 0
    page.write_text(f"E4M3 delayed <!-- figure: {PUBLISHED} -->1.48x (1.44–1.50, v4) on one layer.\n")
    code, out = audit(capsys, page, "--root", ROOT, "--db", committed_db)
    assert code == 1, out
    assert f"{page}:1: figure 1.48x marked {PUBLISHED}: the committed data give 1.45" in out


@pytest.mark.slow
@pytest.mark.parametrize("after,says", [
    ("", "a speedup in prose shows its interval and measurement version after it"),
    (" (1.44–1.50)", "a speedup in prose shows its interval and measurement version after it"),
    (" (1.44–1.52, v4)", "its interval (1.44–1.52): the committed data give 1.4"),
    (" (1.44–1.50, v3)", "its measurement version v3: run hopper-e is v4")])
def test_a_marked_speedup_without_its_interval_and_version_fails(committed_db, tmp_path, capsys, after, says):
    page = tmp_path / "page.md"
    page.write_text(f"E4M3 delayed <!-- figure: {PUBLISHED} -->1.46x{after} on one layer.\n")
    code, out = audit(capsys, page, "--root", ROOT, "--db", committed_db)
    assert code == 1, out
    assert f"{page}:1: figure 1.46x marked {PUBLISHED}: {says}" in out


@pytest.mark.slow
@pytest.mark.parametrize("page,command", [("docs/results.md", "--markdown results"),
                                          ("README.md", "--markdown headline"),
                                          ("docs/why-not-2x.md", "--markdown layer-waterfall")])
def test_a_page_with_one_interval_removed_fails_naming_the_speedup(committed_db, tmp_path, capsys, page, command):
    """The check on the published speedups: the first interval of a block taken out of a copy of its page
    fails the audit, naming page, block, row and column, beside the cell's difference from its rebuild."""
    text = (ROOT / page).read_text()
    start = text.index(f"<!-- generated: fp8bench report {command} -->")
    m = re.compile(r"(\d+\.\d+x) \(\d+\.\d+–\d+\.\d+\)").search(text, start)
    copy = tmp_path / Path(page).name
    copy.write_text(text[:m.start()] + m.group(1) + text[m.end():])
    code, out = audit(capsys, copy, "--root", ROOT, "--db", committed_db)
    assert code == 1, out
    line = text.count("\n", 0, start) + 1
    assert re.search(rf"^{re.escape(str(copy))}:{line}: block `fp8bench report {command}`, row \d+ \([^)]*\), "
                     rf"column '[^']*': the speedup {re.escape(m.group(1))} shows no interval", out, re.M), out


@pytest.mark.slow
def test_a_stored_speedup_its_samples_do_not_give_fails_even_where_the_page_agrees(committed_db, tmp_path,
                                                                                    capsys):
    """The page rendered from a store whose speedup was changed agrees with that store; the samples do not."""
    from fp8bench.report import markdown

    db = tmp_path / "changed.duckdb"
    shutil.copy(committed_db, db)
    con = store.connect(db)
    con.execute("UPDATE measurements SET value = 1.60 WHERE run_id = 'hopper-e' AND metric = 'speedup_vs_bf16' "
                "AND case_id = 'layer.llama2-7b.b2s4096.e4m3.delayed.te'")
    page = tmp_path / "README.md"
    page.write_text(markdown.render((ROOT / "README.md").read_text(), con))
    con.close()
    code, out = audit(capsys, page, "--root", ROOT, "--db", db)
    assert code == 1, out
    assert ("run hopper-e, case layer.llama2-7b.b2s4096.e4m3.delayed.te, speedup_vs_bf16: differs from its "
            "samples: speedup 1.6000 stored, 1.4594 from the samples (rounds from the sample order)") in out
    assert re.search(r"block `fp8bench report --markdown headline`, row \d+ \(NVIDIA H200 · llama2-7b\), column "
                     r"'speedup vs BF16 \(95% interval\)': differs from its rebuild from the committed samples: "
                     r"the stored figure '1\.60x", out)


@pytest.mark.slow
def test_a_marker_naming_a_withdrawn_speedup_fails(committed_db, tmp_path, capsys):
    run, case = WITHDRAWN_CASE
    page = tmp_path / "page.md"
    page.write_text(f"The layer reads <!-- figure: run={run} case={case} metric=speedup_vs_bf16 -->1.47x.\n")
    code, out = audit(capsys, page, "--root", ROOT, "--db", committed_db)
    assert code == 1, out
    assert "cannot be rebuilt: timed beside its BF16 twin in a later batch" in out


# --------------------------------------------------------------------------- withdrawn figures

@pytest.mark.slow
def test_a_speedup_the_samples_cannot_rebuild_is_withdrawn_from_the_case_table(committed_db):
    from fp8bench.report import data

    with store.connect(committed_db, read_only=True) as con:
        gone = rebuild.withdrawn(con)
        cases = data.cases(con).set_index(["run_id", "case_id"])
    assert gone[(*WITHDRAWN_CASE, "speedup_vs_bf16")].startswith("timed beside its BF16 twin in a later batch")
    row = cases.loc[WITHDRAWN_CASE]
    assert row[["speedup", "speedup_lo", "speedup_hi", "speedup_box_lo", "speedup_box_hi"]].isna().all()
    assert row["withdrawn"] == gone[(*WITHDRAWN_CASE, "speedup_vs_bf16")]
    kept = cases.loc[("hopper-e", "layer.llama2-7b.b2s4096.e4m3.delayed.te")]
    assert kept["withdrawn"] == "" and kept["speedup"] == pytest.approx(1.4594, abs=1e-4)


# --------------------------------------------------------------------------- the rules, on planted samples

def test_a_version_4_side_by_side_speedup_is_rebuilt_from_the_order_of_its_samples():
    """Rounds of an equal block per op, stored round after round: the rebuild is the run's own ratio_interval."""
    twin_rounds = [[10.0 + r * 0.1, 10.2 + r * 0.1, 10.1 + r * 0.1] for r in range(10)]
    case_rounds = [[6.0 + r * 0.05 + (r % 3) * 0.02, 6.1 + r * 0.05] for r in range(10)]
    value, lo, hi, method, why = rebuild.rebuild_one(
        "speedup_vs_bf16", {"method": "interleaved", "rounds": 10},
        {"time_ms": [x for r in case_rounds for x in r]}, {"time_ms": [x for r in twin_rounds for x in r]})
    expected = ratio_interval(twin_rounds, case_rounds)
    assert (value, lo, hi, method, why) == (expected.value, expected.lo, expected.hi, rebuild.BLOCKS, "")


def test_samples_that_do_not_split_into_their_rounds_cannot_be_rebuilt():
    value, *_, why = rebuild.rebuild_one("speedup_vs_bf16", {"method": "interleaved", "rounds": 10},
                                         {"time_ms": [1.0] * 25}, {"time_ms": [2.0] * 20})
    assert value is None and why == "its samples (25 and the twin's 20) do not split into its 10 rounds"


def test_a_speedup_timed_alone_is_the_ratio_of_the_medians():
    value, lo, hi, method, _ = rebuild.rebuild_one("speedup_vs_bf16_kernel", {"method": "alone"},
                                                   {"time_ms_kernel": [2.0, 4.0, 5.0]}, {"time_ms": [9.0, 8.0, 10.0]})
    assert (value, lo, hi, method) == (2.25, None, None, rebuild.MEDIANS)


# --------------------------------------------------------------------------- reading pages

PAGE = """# A page

The layer runs <!-- figure: run=r case=c metric=speedup_vs_bf16 -->1.47x faster, at 17.8 ms and 706 TFLOPS.
Code is never read: `1.23x`, nor a marker in it `<!-- figure: run=r case=c metric=m -->9.99x`.

```bash
fp8bench run   # 2.5x in a comment of a code block
```

<!-- generated: fp8bench report --markdown headline -->
| model | speedup |
|---|---|
| a | 1.10x |
<!-- end generated -->

See [why-not-2x](docs/why-not-2x.md); <!-- figure: run=r case=c bogus -->3%.
"""


def test_a_page_gives_its_markers_blocks_and_untagged_figures():
    page = audit_pages.read_page("page.md", PAGE)
    assert [(m.line, m.spec, m.figure, m.problem) for m in page.markers] == [
        (3, {"run": "r", "case": "c", "metric": "speedup_vs_bf16"}, "1.47x", ""),
        (16, {"run": "r", "case": "c"}, "3%", "'bogus' is not one of ['case', 'metric', 'run', 'scale'] as "
                                             "key=value; it lacks ['metric']")]
    assert [b.command for b in page.blocks] == ["fp8bench report --markdown headline"]
    assert [u.figure for u in page.untagged] == ["17.8 ms", "706 TFLOPS"]


@pytest.mark.parametrize("value,figure,ok", [(1.4649, "1.46x", True), (1.4651, "1.46x", False),
                                             (1234.4, "1,234 ms", True), (-0.14, "−14%", False),
                                             (-14.2, "−14%", True), (0.5, "0.50", True)])
def test_a_figure_matches_to_the_digits_it_prints(value, figure, ok):
    assert audit_pages.matches(value, figure) is ok


def test_a_block_differs_by_row_and_column():
    page = "| model | speedup | run |\n|---|---|---|\n| a | 1.10x | `r1` |\n| b | 1.20x | `r2` |\n"
    rebuilt = "| model | speedup | run |\n|---|---|---|\n| a | 1.10x | `r1` |\n| b | 1.21x | `r2` |\n| c | 0.90x | `r3` |\n"
    assert [(d.row, d.column, d.page, d.rebuilt) for d in audit_pages.diff(page, rebuilt)] == [
        ("row 2 (b)", "speedup", "1.20x", "1.21x"),
        ("row 3 (c)", "(whole row)", "(no such row)", "| c | 0.90x | `r3` |")]


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("args,message", [
    (["--root", "{tmp}"], "has no README.md; give the repository's root"),
    (["{tmp}/missing.md", "--root", str(ROOT)], "page '{tmp}/missing.md' does not exist"),
    (["--root", str(ROOT), "--db", "{tmp}/none.duckdb"], "--db '{tmp}/none.duckdb' does not exist"),
    (["--bogus"], "unrecognized arguments: --bogus"),
])
def test_bad_input_exits_2_with_one_message(tmp_path, capsys, args, message):
    code, out = audit(capsys, *(a.format(tmp=tmp_path) for a in args))
    assert code == 2 and message.format(tmp=tmp_path) in out, out


def _interleaved_pair(rng, shape: str, speedup: float, processes: int = 3, rounds: int = 10):
    """A recipe and its BF16 twin timed side by side in `processes` processes of `rounds` rounds, as the run
    records them: samples with their round and process, the speedup over the processes' own interval."""
    from fp8bench.core.intervals import recorded_speedup
    from fp8bench.core.records import CaseRecord, Metric

    def timing(ms, offsets):
        values = [ms * off * float(rng.lognormal(0, 0.01)) for p in range(processes) for _ in range(rounds * 3)
                  for off in [offsets[p]]]
        order = [(float(r), float(p)) for p in range(processes) for r in range(rounds) for _ in range(3)]
        return {"time_ms": values, "time_ms_round": [r for r, _ in order], "time_ms_process": [p for _, p in order]}
    offsets = rng.normal(0, 0.01, processes)
    twin_s = timing(2.0, [1.0] * processes)
    case_s = timing(2.0 / speedup, list(1 + offsets))
    est = recorded_speedup(twin_s, case_s)
    method = {"method": "interleaved", "rounds": rounds, "processes": processes, "timed_with": [shape]}
    common = dict(run_id="r", workload="gemm", model="tiny", backend="torch", shape_name=shape, shape={},
                  params={}, status="ok")
    twin_id, case_id = f"gemm.tiny.{shape}.bf16.none.torch", f"gemm.tiny.{shape}.e4m3.current.torch"
    twin = CaseRecord(case_id=twin_id, twin_id=twin_id, format="bf16", scaling="none", measurement=method,
                      metrics=[Metric.of("time_ms", 2.0)], samples=twin_s, **common)
    case = CaseRecord(case_id=case_id, twin_id=twin_id, format="e4m3", scaling="current",
                      measurement=method | {"interval": est.to_measurement(), "speedup_bound": "device"},
                      metrics=[Metric.of("time_ms", 2.0 / speedup)]
                      + [Metric.of(k, v) for k, v in est.metrics().items()], samples=case_s, **common)
    return twin, case, est


@pytest.mark.parametrize("shapes", [10, 3])
def test_ingest_publishes_a_run_s_like_speedups_moderated_and_the_audit_rebuilds_them(tmp_path, shapes):
    """What the run stores is each speedup's interval over its own three processes; ingest publishes it
    moderated over the run's like speedups where they are enough to fit a prior, and the audit rebuilds the
    published figure from the samples alone."""
    import numpy as np

    from fp8bench.core.records import ShardWriter, write_manifest

    rng = np.random.default_rng(3)
    run_dir = tmp_path / "runs" / "r"
    write_manifest(run_dir, {"run_id": "r", "started_at": 1.7e9, "git_commit": "abc", "git_dirty": False,
                             "device_name": "H", "env": {"env_id": "e1", "device_name": "H"}, "config": {}})
    own = {}
    with ShardWriter(run_dir) as w:
        for k in range(shapes):
            twin, case, est = _interleaved_pair(rng, f"s{k}", 1.2 + 0.05 * k)
            w.write(twin)
            w.write(case)
            own[case.case_id] = est
    con = store.connect(tmp_path / "r.duckdb")
    store.ingest(con, [tmp_path / "runs"])
    rows = {cid: (unit, lo, hi) for cid, unit, lo, hi in con.execute(
        "SELECT c.case_id, json_extract_string(c.measurement, '$.interval.unit'), lo.value, hi.value FROM cases c "
        "JOIN measurements lo USING (run_id, case_id) JOIN measurements hi USING (run_id, case_id) "
        "WHERE lo.metric = 'speedup_vs_bf16_lo' AND hi.metric = 'speedup_vs_bf16_hi'").fetchall()}
    rebuilt = rebuild.rebuild(con)
    con.close()
    assert len(rows) == shapes and len(rebuilt) == shapes
    widths = [math.log(hi / lo) for _, lo, hi in rows.values()]
    own_widths = [math.log(own[cid].hi / own[cid].lo) for cid in rows]
    if shapes >= 8:  # a prior over the run's like speedups: narrower than two degrees of freedom allow alone
        assert {unit for unit, _, _ in rows.values()} == {"processes + run prior"}
        assert statistics.median(widths) < 0.8 * statistics.median(own_widths)
    else:
        assert {unit for unit, _, _ in rows.values()} == {"processes"}
        assert widths == pytest.approx(own_widths)
    assert all(r.reason == "" and not r.differences() for r in rebuilt), [r.differences() for r in rebuilt]
