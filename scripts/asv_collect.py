"""Collect asv result files recorded in separate clones (one per commit, each with its own interpreter path)
into results/asv/<machine>/ under one environment name.

asv names an `existing` environment after its interpreter's path, so per-commit virtualenvs (used to run
several commits side by side on one box) would give every commit its own series. The runs used the same
Python and the same packages; only the path differed. The measurements are copied unchanged.

Usage: python3 scripts/asv_collect.py RESULT.json... [--into results/asv] [--env-name existing-py_python3.12]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", type=Path, nargs="+")
    ap.add_argument("--into", type=Path, default=Path("results/asv"))
    ap.add_argument("--env-name", default="existing-py_python3.12")
    a = ap.parse_args()
    python = a.env_name.removeprefix("existing-py_")
    for src in a.results:
        d = json.loads(src.read_text())
        machine = d["params"]["machine"]
        out = a.into / machine
        out.mkdir(parents=True, exist_ok=True)
        if not (out / "machine.json").is_file():
            shutil.copyfile(src.parent / "machine.json", out / "machine.json")
        d["env_name"], d["python"], d["params"]["python"] = a.env_name, python, python
        dest = out / f"{d['commit_hash'][:8]}-{a.env_name}.json"
        dest.write_text(json.dumps(d, indent=None, sort_keys=True))
        print(f"{src} -> {dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
