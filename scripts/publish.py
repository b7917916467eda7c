"""Publish fp8bench's site, with asv's site inside it, to a git branch any static host serves (`make publish`).

Steps, each one a tool's own command:
1. `asv publish --html-dir SITE/asv` collates the asv results (asv.conf.json's results_dir) into asv's site,
   and scripts/asv_offline.py points its pages at the vendored scripts, so nothing is fetched from a CDN;
2. `fp8bench ingest` the committed result sets into a fresh DuckDB file and `fp8bench report` builds the
   site around asv's, linking it from the navigation;
3. ghp-import (the tool MkDocs publishes with) commits SITE as the whole tree of BRANCH, with a .nojekyll
   file so GitHub Pages serves it as is, without touching the working tree or the index. Pushing is left to
   the caller (`git push origin gh-pages`, or --push).

Usage: python3 scripts/publish.py [--branch gh-pages] [--site results/site] [--db FILE] [--push]
Runs in the repository root; needs asv, plotly, duckdb and ghp-import (the dev extra).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

from fp8bench.data.store import committed_result_sets

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _tool(name: str) -> str:
    return shutil.which(name, path=str(BIN)) or shutil.which(name) or name


def _run(*cmd: str) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--branch", default="gh-pages")
    ap.add_argument("--site", type=Path, default=ROOT / "results" / "site")
    ap.add_argument("--db", type=Path, default=ROOT / "results" / "published.duckdb")
    ap.add_argument("--push", action="store_true", help="push the branch to origin afterwards (ghp-import -p)")
    ns = ap.parse_args(argv)
    site, db = ns.site.resolve(), ns.db.resolve()  # the tools below run in the repository root
    if site.exists():
        shutil.rmtree(site)  # a stale page or a removed run must not survive into the published tree
    conf = json.loads((ROOT / "asv.conf.json").read_text())
    if any((ROOT / conf["results_dir"]).glob("*/machine.json")):
        _run(_tool("asv"), "publish", "--html-dir", str(site / "asv"))
        _run(sys.executable, str(ROOT / "scripts" / "asv_offline.py"), str(site / "asv"))
    else:
        print(f"no asv results under {conf['results_dir']}: the site is published without asv's", flush=True)
    db.unlink(missing_ok=True)
    fp8bench = [sys.executable, "-m", "fp8bench"]
    _run(*fp8bench, "ingest", *map(str, committed_result_sets(ROOT / "results")), "--db", str(db))
    _run(*fp8bench, "report", "--db", str(db), "--out", str(site))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    ghp = [_tool("ghp-import"), "--no-jekyll", "--branch", ns.branch, "--message", f"fp8bench site at {commit}"]
    _run(*ghp, *(["--push"] if ns.push else []), str(site))
    print(f"published {site} to branch {ns.branch} (commit {commit})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
