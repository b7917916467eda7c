"""The asv gate (`make asv-gate`): `asv continuous BASE HEAD` over the suite's lower-is-better series, then
`fp8bench asv-compare BASE HEAD` over everything both commits recorded, with asv's results kept in a
temporary folder so the clone is left as it was.

asv writes its results where asv.conf.json's `results_dir` says (results/asv): run in place, it rewrote the
tracked results/asv/benchmarks.json and left an untracked results/asv/<machine>/ behind. Here a copy of
asv.conf.json in a temporary folder points results and html there; the repository, the suite, the plugin and
the environments (.asv/env, git-ignored) stay where they are. --keep DIR keeps the results in DIR instead.

Usage: python3 scripts/asv_gate.py --machine M --bench REGEX [--keep DIR] BASE HEAD
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def gate_config(where: Path) -> Path:
    """asv.conf.json with every path absolute and results/html under `where`, the plugin beside it (asv
    imports plugins relative to its config)."""
    cfg = json.loads((ROOT / "asv.conf.json").read_text())
    cfg.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks"), env_dir=str(ROOT / cfg["env_dir"]),
               results_dir=str(where / "results"), html_dir=str(where / "html"))
    shutil.copytree(ROOT / "asv_plugins", where / "asv_plugins", dirs_exist_ok=True)
    path = where / "asv.conf.json"
    path.write_text(json.dumps(cfg, indent=1))
    return path


def _rev(ref: str) -> str:
    return subprocess.run(["git", "rev-parse", ref], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("base")
    p.add_argument("head")
    p.add_argument("--machine", required=True)
    p.add_argument("--bench", required=True, help="asv's --bench: the series asv itself judges")
    p.add_argument("--factor", default="1.1")
    p.add_argument("--keep", type=Path, default=None, help="keep asv's results in this folder")
    ns = p.parse_args(argv)
    bindir = Path(sys.executable).parent
    asv = shutil.which("asv", path=str(bindir)) or "asv"
    where = Path(tempfile.mkdtemp(prefix="fp8bench-asv-gate-")) if ns.keep is None else ns.keep.resolve()
    try:
        where.mkdir(parents=True, exist_ok=True)
        config = gate_config(where)
        base, head = _rev(ns.base), _rev(ns.head)
        subprocess.run([asv, "machine", "--yes", "--machine", ns.machine], cwd=ROOT, check=True)
        code = subprocess.run([asv, "continuous", "--config", str(config), "--machine", ns.machine, "--bench",
                               ns.bench, "--factor", ns.factor, "--show-stderr", base, head], cwd=ROOT).returncode
        judged = subprocess.run([sys.executable, "-m", "fp8bench", "asv-compare", base, head, "--machine",
                                 ns.machine, "--results", str(where / "results")], cwd=ROOT).returncode
        return code or judged
    finally:
        if ns.keep is None:
            shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
