"""The CPU training preset CI runs: `sweep=train-tiny` trains BF16 and three FP8 recipes on three seeds each, and
the report shows each recipe's pass rate over its seeds (the training page) and the decision it leads to (the
front page's recommendation table)."""

from __future__ import annotations

import re
import time

import pytest

from fp8bench.cli import main
from fp8bench.data import store
from fp8bench.report import _recommendation, data, pages

pytestmark = pytest.mark.slow

FP8_RECIPES = {"e4m3/delayed · emulated", "hybrid/delayed · emulated", "mxfp8/mx · emulated"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The preset run once, ingested; its wall time printed (the preset is sized to stay under three minutes on
    two cores)."""
    tmp = tmp_path_factory.mktemp("train-tiny")
    start = time.monotonic()
    rc = main(["run", "sweep=train-tiny", f"results_dir={tmp}", "run_id=tiny", "store.ingest=false"])
    took = time.monotonic() - start
    print(f"sweep=train-tiny: {took:.0f} s")
    assert rc == 0
    con = store.connect(tmp / "db.duckdb")
    store.ingest(con, [tmp / "runs"])
    yield con, took
    con.close()


def test_the_preset_trains_every_recipe_on_three_seeds(trained):
    con, _ = trained
    rows = con.execute("SELECT format, scaling, count(*), count(*) FILTER (WHERE status = 'ok') FROM cases "
                       "WHERE workload = 'train' GROUP BY ALL ORDER BY ALL").fetchall()
    assert rows == [("bf16", "none", 3, 3), ("e4m3", "delayed", 3, 3), ("hybrid", "delayed", 3, 3),
                    ("mxfp8", "mx", 3, 3)]
    # every FP8 case was judged against the three BF16 seeds, and its recipe over its three seeds
    judged = con.execute("SELECT count(*) FROM measurements WHERE metric = 'parity_seeds' AND value = 3").fetchone()[0]
    assert judged == 9


def test_the_training_page_shows_each_recipes_pass_rate_over_its_seeds(trained):
    con, _ = trained
    head = data.latest(data.cases(con))
    html = pages.training_page(head, data.train_curves(con)).render()
    passes = con.execute("""
        SELECT c.label, m.value FROM cases c JOIN measurements m USING (run_id, case_id)
        WHERE m.metric = 'parity_passes' AND c.shape_name LIKE '%seed0%'""").fetchall()
    assert len(passes) == 3
    rows = re.findall(r"<tr><td>([^<]+)</td><td>[^<]*</td><td>(\d/\d)</td><td>([^<]+)</td>", html)
    shown = {recipe: (rate, verdict) for recipe, rate, verdict in rows}
    assert set(shown) == FP8_RECIPES, rows
    for recipe, (rate, verdict) in shown.items():
        passed = int(rate.split("/")[0])
        assert rate.endswith("/3") and (verdict.startswith("passes 3/3") if passed == 3 else
                                        verdict.startswith(f"FAIL {rate} pass: ")), (recipe, rate, verdict)
    assert sorted(int(shown[r][0][0]) for r in FP8_RECIPES) == sorted(int(v) for _, v in passes)


def test_the_front_page_recommends_no_recipe_on_the_emulators_times(trained):
    """The emulator's times are no speeds (it runs FP8 math in software): the recipes have verdicts but no
    whole-step speedup, so the front page's table recommends nothing rather than the one that passed."""
    from fp8bench.report.recommendation import HEADERS

    con, _ = trained
    table = _recommendation(con)
    assert list(table.columns) == HEADERS
    assert table.iloc[:, 0].tolist() == ["no recommendation"]
