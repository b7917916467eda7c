"""Do two runs of one sweep on two boxes agree? (fp8bench.analysis.reproducibility says what is counted.)

Usage: python3 scripts/reproducibility.py RUN_A RUN_B [--db results/fp8bench.duckdb] [--json FILE] [--markdown]
(--markdown prints the table docs/reproducibility.md holds; tests/test_docs.py checks that it is current).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

from fp8bench.analysis.reproducibility import COLUMNS, markdown, run_metrics, tally
from fp8bench.data import store


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_a")
    p.add_argument("run_b")
    p.add_argument("--db", default="results/fp8bench.duckdb")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--markdown", action="store_true", help="print the table as markdown (docs/reproducibility.md)")
    ns = p.parse_args(argv)
    con = store.connect(ns.db, read_only=True)
    rows = tally(run_metrics(con, ns.run_a), run_metrics(con, ns.run_b))
    if ns.markdown:
        print(markdown(rows, (ns.run_a, ns.run_b)), end="")
        return 0
    print("workload / model / speedup".ljust(44) + "".join(c.rjust(24) for c in COLUMNS))
    total: dict[str, int] = defaultdict(int)
    for key, r in rows.items():
        print(key.ljust(44) + "".join(str(r.get(c, 0)).rjust(24) for c in COLUMNS))
        for c in COLUMNS:
            total[c] += r.get(c, 0)
    print("all".ljust(44) + "".join(str(total[c]).rjust(24) for c in COLUMNS))
    if ns.json:
        ns.json.write_text(json.dumps({"runs": [ns.run_a, ns.run_b], "rows": rows, "total": dict(total)}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
