"""scripts/ holds entry points only: each is indexed in scripts/README.md, and nothing imports one or puts the
folder on sys.path (DESIGN: what other code needs lives in the package, in its layer). The probes that left the
tree are indexed in docs/probes.md, whose result files all exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULT_PATH = re.compile(r"results/[A-Za-z0-9_./*-]+")  # a path, or a glob such as results/x/gemm_*.json
SCANNED = ("fp8bench", "kernels", "tests", "benchmarks", "scripts", "asv_plugins")
"""Every folder of Python the repository has: none of it may import a script."""


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


def script_imports(source: str, scripts: set[str], in_scripts: bool = False) -> list[tuple[int, str]]:
    """(line, what) for each import of a script (`import reproducibility`, `from scripts.x import y`) and each
    change of sys.path that brings scripts/ in (`sys.path.insert(0, ".../scripts")`,
    `monkeypatch.syspath_prepend(ROOT / "scripts")`). A script itself (`in_scripts`) may not change sys.path
    at all: a script that puts its own folder first is there to import a sibling."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names
                      if a.name.split(".")[0] in scripts | {"scripts"}]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            if node.module.split(".")[0] in scripts | {"scripts"}:
                found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            call = ast.unparse(node.func)
            path_change = call.startswith("sys.path.") or call.endswith(("syspath_prepend", "addsitedir"))
            if path_change and (in_scripts or "scripts" in ast.unparse(node)):
                found.append((node.lineno, ast.unparse(node)))
    return found


SCRIPTS = {"reproducibility", "recipe_bench"}  # stand-ins for the planted examples below


@pytest.mark.parametrize("source", [
    "import recipe_bench", "from reproducibility import tally", "import scripts.recipe_bench",
    "from scripts import recipe_bench", "sys.path.insert(0, str(ROOT / 'scripts'))",
    "sys.path.append('scripts')", "monkeypatch.syspath_prepend(str(ROOT / 'scripts'))",
    "site.addsitedir(Path(__file__).parents[1] / 'scripts')",
])
def test_a_planted_script_import_is_found(source):
    assert script_imports(source, SCRIPTS), source


@pytest.mark.parametrize("source", [
    "from fp8bench.analysis import reproducibility", "import fp8bench.report.kernel_tables",
    "subprocess.run([sys.executable, 'scripts/publish.py'])", "sys.path.insert(0, site)",
    "runpy.run_path(str(ROOT / 'scripts' / 'recipe_bench.py'))", "from . import recipe_bench",
])
def test_what_is_not_a_script_import_is_left_alone(source):
    assert not script_imports(source, SCRIPTS), source


def test_a_script_that_changes_sys_path_is_found():
    assert script_imports("sys.path.insert(0, str(Path(__file__).parent))", SCRIPTS, in_scripts=True)


def test_nothing_imports_a_script():
    scripts = {p.stem for p in _scripts()}
    offenders = []
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            found = script_imports(path.read_text(encoding="utf-8"), scripts, in_scripts=folder == "scripts")
            offenders += [f"{rel}:{line}: {what}" for line, what in found]
    assert not offenders, ("scripts/ are entry points: move what other code needs into the package\n"
                           + "\n".join(offenders))
