"""What `fp8bench run` prints at the end (fp8bench.run.summary), on hand-made records."""

from rich.console import Console

from fp8bench.core.records import CaseRecord, Metric
from fp8bench.run.summary import results_table


def _train(seed, fmt, scaling, loss, step_ms):
    case = f"train.tiny.b8s128n200.seed{seed}.{fmt}.{scaling}.emulated"
    return CaseRecord(run_id="r", case_id=case, workload="train", model="tiny", format=fmt, scaling=scaling,
                      backend="emulated", shape_name="b8s128n200", shape={"seed": seed}, status="ok",
                      metrics=[Metric.of("time_ms", step_ms), Metric.of("loss_final", loss)])


def _text(tables):
    console = Console(record=True, width=200)
    for t in tables:
        console.print(t)
    return console.export_text()


def test_training_cases_print_one_row_per_recipe_with_its_seeds_pooled():
    records = [_train(s, "bf16", "none", loss, 100 + s) for s, loss in enumerate((2.30, 2.29, 2.35))]
    records += [_train(0, "e4m3", "current", 2.31, 170.0), _train(1, "e4m3", "current", 2.33, 172.0)]
    derived = {records[3].case_id: {"loss_gap_vs_bf16": 0.0, "parity_pass": 1.0},
               records[4].case_id: {"loss_gap_vs_bf16": 0.02, "parity_pass": 0.0}}
    text = _text(results_table(records, derived))
    rows = [line for line in text.splitlines() if "train.tiny" in line]
    assert len(rows) == 2 and all(".seed" not in row for row in rows)
    bf16 = next(row for row in rows if ".bf16." in row)
    assert " 3 " in bf16 and "2.300 (2.290-2.350)" in bf16 and "101" in bf16
    fp8 = next(row for row in rows if ".e4m3." in row)
    assert "+0.010" in fp8 and "1 of 2" in fp8 and "171" in fp8


def test_a_sweep_with_many_cases_prints_no_per_case_table():
    records = [_train(s, "bf16", "none", 2.3, 100.0) for s in range(40)]
    assert results_table(records) == []
