"""The tables docs/ quotes are generated from the committed results: each test regenerates one and fails
when the committed page is stale."""

import re
import subprocess
import sys
from pathlib import Path

from fp8bench.data import store

ROOT = Path(__file__).resolve().parents[1]
TRIALS = ["regression_trials.json", "regression_trials_feedback.json", "regression_trials_settled.json",
          "regression_trials_s6.json", "regression_trials_s7.json"]


def generated_block(doc: str) -> str:
    m = re.search(r"<!-- generated: [^>]*-->\n(.*?)<!-- end generated -->", (ROOT / "docs" / doc).read_text(), re.S)
    assert m, f"docs/{doc} has no generated block"
    return m.group(1)


def test_the_reproducibility_table_is_the_committed_runs(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import reproducibility

    con = store.connect(tmp_path / "db.duckdb")
    store.ingest(con, [ROOT / "results" / "h200-hopper", ROOT / "results" / "spread"])
    rows = reproducibility.tally(reproducibility._metrics(con, "hopper-a"), reproducibility._metrics(con, "hopper-b"))
    assert generated_block("reproducibility.md") == reproducibility.markdown(rows, ("hopper-a", "hopper-b"))


def test_the_regression_trials_table_is_the_committed_judgements():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "regression_trials.py"), "table",
                          *(str(ROOT / "results" / "h200-checks" / f) for f in TRIALS)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 0, res.stderr
    assert generated_block("regression.md") == res.stdout
