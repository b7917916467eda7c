"""scripts/ and research/ each have a README that indexes them: every script there is named in it, and every
result file research/README.md points to exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULT_PATH = re.compile(r"results/[A-Za-z0-9_./*-]+")  # a path, or a glob such as results/x/gemm_*.json


def _scripts(folder: str) -> list[Path]:
    return sorted((ROOT / folder).glob("*.py"))


@pytest.mark.parametrize("folder", ["scripts", "research"])
def test_every_script_is_in_its_folders_readme(folder):
    readme = (ROOT / folder / "README.md").read_text(encoding="utf-8")
    assert _scripts(folder), f"{folder}/ has no scripts"
    missing = [p.name for p in _scripts(folder) if not re.search(rf"(?<![\w/]){re.escape(p.name)}\b", readme)
               and f"{folder}/{p.name}" not in readme]
    assert not missing, f"{folder}/README.md does not mention {missing}"


def test_research_readme_result_files_exist():
    readme = (ROOT / "research" / "README.md").read_text(encoding="utf-8")
    paths = sorted({m.group(0).rstrip(".,") for m in RESULT_PATH.finditer(readme)})
    assert paths, "research/README.md names no result file"
    missing = [p for p in paths if not list(ROOT.glob(p))]
    assert not missing, f"research/README.md names result files that do not exist: {missing}"


def test_research_readme_names_only_scripts_that_exist():
    """A script path in the index is either in the repository or marked as gone."""
    readme = (ROOT / "research" / "README.md").read_text(encoding="utf-8")
    for line in readme.splitlines():
        for path in re.findall(r"(?:scripts|research)/\w+\.py", line):
            assert (ROOT / path).is_file() or "no longer in the repository" in line, path
