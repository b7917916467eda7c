"""scripts/ holds entry points, each indexed in scripts/README.md. The probes that left the tree are indexed in
docs/probes.md, whose result files all exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULT_PATH = re.compile(r"results/[A-Za-z0-9_./*-]+")  # a path, or a glob such as results/x/gemm_*.json


def _scripts() -> list[Path]:
    return sorted((ROOT / "scripts").glob("*.py"))


def test_every_script_is_in_the_readme():
    readme = (ROOT / "scripts" / "README.md").read_text(encoding="utf-8")
    assert _scripts(), "scripts/ has no scripts"
    missing = [p.name for p in _scripts() if not re.search(rf"(?<![\w/]){re.escape(p.name)}\b", readme)
               and f"scripts/{p.name}" not in readme]
    assert not missing, f"scripts/README.md does not mention {missing}"


def test_the_probes_index_names_result_files_that_exist():
    index = (ROOT / "docs" / "probes.md").read_text(encoding="utf-8")
    paths = sorted({m.group(0).rstrip(".,") for m in RESULT_PATH.finditer(index)})
    assert paths, "docs/probes.md names no result file"
    missing = [p for p in paths if not list(ROOT.glob(p))]
    assert not missing, f"docs/probes.md names result files that do not exist: {missing}"
