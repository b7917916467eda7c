"""How far the same speedups move between two boxes of one GPU model (fp8bench.analysis.spread says how): writes
results/spread/<device>.json, which `fp8bench ingest` loads to widen every speedup interval of that device.

Give the run folders recorded on box A and on box B (measurement version 4 or later).

Usage: python3 scripts/speedup_spread.py --box-a RUN_DIR [RUN_DIR...] --box-b RUN_DIR [RUN_DIR...] --out FILE
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from fp8bench.analysis.spread import between_box_spread


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--box-a", nargs="+", type=Path, required=True)
    p.add_argument("--box-b", nargs="+", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--quantile", type=float, default=0.95)
    ns = p.parse_args(argv)
    try:
        result = between_box_spread(ns.box_a, ns.box_b, ns.quantile)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(result, indent=1) + "\n")
    for name, v in result["series"].items():
        print(f"{name}: {100 * v['half_width']:.2f}% ({v['cases']} cases)")
    print(f"written: {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
