"""A backend is one module: an adapter with a knob of its own, defined and registered here (no preset, no other
file), plans, runs on the CPU, ingests and shows in the report; and no module of fp8bench names a backend
outside that backend's own module (a role is a declaration or a record fact, read through the registry)."""

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from fp8bench import backends
from fp8bench.backends.base import Backend, GemmOp, Knobs
from fp8bench.config.compose import conf_dir, expand_request
from fp8bench.config.schema import ConfigError
from fp8bench.core.hardware import DeviceInfo, Rule
from fp8bench.core.numerics import fake_quant
from fp8bench.core.types import Format
from fp8bench.run.plan import plan

ROOT = Path(__file__).resolve().parents[1]
CPU = DeviceInfo("cpu", "cpu", None, None)
NAME = "test-ktiled"


@dataclass(frozen=True, kw_only=True)
class KTiledKnobs(Knobs):
    ktiled_tile: int = 0
    """Accumulate each GEMM over K in tiles of this many columns, each tile's product summed in FP32 (0: the
    whole K at once)."""


def tiled_matmul(a: torch.Tensor, b: torch.Tensor, tile: int) -> torch.Tensor:
    """a @ b.T over K in tiles of `tile` columns, each partial product summed in FP32."""
    if tile <= 0:
        return a.float() @ b.float().t()
    out = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float32, device=a.device)
    for k in range(0, a.shape[1], tile):
        out += a[:, k:k + tile].float() @ b[:, k:k + tile].float().t()
    return out


class KTiledBackend(Backend):
    """E4M3 GEMMs with emulated casts and K-tiled FP32 accumulation: a backend of this test only."""

    name = NAME
    knobs = KTiledKnobs
    workloads = frozenset({"gemm"})
    rules = (Rule(frozenset({"e4m3"}), frozenset({"current"}), None, None, True,
                  "a test's adapter: emulated E4M3 casts, K-tiled FP32 accumulation, any device"),)

    def gemm(self, a, b, role, recipe):
        tile = recipe.knobs.ktiled_tile
        if recipe.format is Format.BF16:
            a16, b16 = a.bfloat16(), b.bfloat16()
            return GemmOp(with_quant=lambda: tiled_matmul(a16, b16, tile))
        opt_a, opt_b = recipe.role_options(role)
        aq, bq = fake_quant(a, recipe.format, recipe.scaling, opt_a), fake_quant(b, recipe.format, recipe.scaling, opt_b)

        def with_quant():
            return tiled_matmul(fake_quant(a, recipe.format, recipe.scaling, opt_a),
                                fake_quant(b, recipe.format, recipe.scaling, opt_b), tile)
        return GemmOp(with_quant=with_quant, kernel_only=lambda: tiled_matmul(aq, bq, tile))


@pytest.fixture
def ktiled():
    backends.register(KTiledBackend)
    yield NAME
    backends.unregister(NAME)


POINT = ["workload=gemm", "model=tiny", "format=e4m3", "scaling=current", "workload.roles=[fprop]"]


def test_its_knob_is_its_own_and_it_needs_no_preset(ktiled):
    assert not (conf_dir() / "backend" / f"{NAME}.yaml").exists()
    assert backends.knob_catalog()["ktiled_tile"] == (0, [NAME])
    assert type(backends.get_backend(NAME)).__module__ == __name__
    with pytest.raises(ConfigError, match=f"backend='{NAME}' is not a preset"):
        expand_request([*POINT, f"backend={NAME}"])
    # a point names it by backend.name; its knob is given as backend.<knob>= or +backend.<knob>= alike
    ids = [[c.case_id for c in plan(list(expand_request([*POINT, f"backend.name={NAME}", knob]).points), CPU)]
           for knob in ("backend.ktiled_tile=64", "+backend.ktiled_tile=64")]
    assert ids[0] == ids[1] and ids[0]
    assert all(i.startswith("gemm.tiny.fprop_") and f".{NAME}+64" in i for i in ids[0]), ids[0]


def test_another_backend_set_with_its_knob_is_skipped_with_the_reason(ktiled):
    cases = plan(list(expand_request([*POINT, "backend=torch", "backend.ktiled_tile=64"]).points), CPU)
    assert cases and all(not c.runnable for c in cases)
    assert all(c.reason == "torch does not support backend.ktiled_tile=64" for c in cases)
    assert all(c.case_id.endswith(".torch+64") for c in cases)  # a case of its own, not torch's plain one
    with pytest.raises(ConfigError, match=rf"backend.ktiled_tile='x' must be of type int \(a knob of '{NAME}'\)"):
        plan(list(expand_request([*POINT, f"backend.name={NAME}", "backend.ktiled_tile=x"]).points), CPU)


def test_its_plan_divides_each_recipe_by_a_recorded_twin_of_its_own(ktiled):
    cases = plan(list(expand_request(["workload=gemm", "model=tiny", f"backend.name={NAME}", "format=bf16,e4m3",
                                      "scaling=none,current", "backend.ktiled_tile=64,0"], multirun=True).points), CPU)
    recipes = [c for c in cases if not c.is_bf16]
    assert len(recipes) == 24 and all(c.runnable for c in cases), [(c.case_id, c.reason) for c in cases]
    twins = {c.case_id: c for c in cases if c.is_bf16}
    assert all(c.twin_id in twins and twins[c.twin_id].recipe.knobs == c.recipe.knobs for c in recipes)


@pytest.mark.slow
def test_it_plans_runs_ingests_and_reports_on_the_cpu(ktiled, tmp_path, monkeypatch, capfd):
    import duckdb

    from fp8bench.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(["run", "-m", "workload=gemm", "model=tiny", f"backend.name={NAME}", "format=bf16,e4m3",
                 "scaling=none,current", "workload.roles=[fprop]", "backend.ktiled_tile=32", "measure.rounds=6",
                 "measure.iters=5", f"results_dir={tmp_path}"])
    assert code == 0, capfd.readouterr().err
    con = duckdb.connect(str(tmp_path / "fp8bench.duckdb"), read_only=True)
    rows = con.execute("SELECT c.case_id, c.label, c.format, c.status, c.reason, "
                       "json_extract(c.params, '$.\"backend.ktiled_tile\"')::INT, m.value FROM cases c "
                       "LEFT JOIN measurements m ON m.run_id = c.run_id AND m.case_id = c.case_id "
                       "AND m.metric = 'speedup_vs_bf16' WHERE c.backend = ?", [NAME]).fetchall()
    con.close()
    assert len(rows) == 8, rows  # four fprop GEMMs, each an E4M3 recipe and its BF16 twin
    assert all(r[3] == "ok" for r in rows), [(r[0], r[4]) for r in rows]
    assert all(r[5] == 32 and r[1].endswith(f".{NAME}+32") for r in rows)
    assert all(r[6] is not None and r[6] > 0 for r in rows if r[2] == "e4m3")  # timed beside their twin
    site = tmp_path / "site"
    assert main(["report", "--db", str(tmp_path / "fp8bench.duckdb"), "--out", str(site)]) == 0
    pages = {p.name: p.read_text() for p in site.glob("*.html")}
    shown = sorted(name for name, text in pages.items() if f"e4m3/current · {NAME}+32" in text)
    assert "gemm.html" in shown, sorted(pages)


# --------------------------------------------------------------------------- no backend named outside its module

ALLOWED = {
    # (file, literal): why the literal is a package's, a module's or a logger's name, not a backend's
    ("fp8bench/core/hardware.py", "torch"): "a package whose version the environment records",
    ("fp8bench/core/hardware.py", "triton"): "a package whose version the environment records",
    ("fp8bench/core/hardware.py", "torchao"): "a package whose version the environment records",
    ("fp8bench/analysis/compare.py", "torch"): "an environment key: the package's version",
    ("fp8bench/analysis/compare.py", "triton"): "an environment key: the package's version",
    ("fp8bench/analysis/compare.py", "torchao"): "an environment key: the package's version",
    ("fp8bench/analysis/calibrate.py", "torch"): "an environment key: the package's version",
    ("fp8bench/report/pages.py", "torch"): "an environment column: the package's version",
    ("fp8bench/report/pages.py", "triton"): "an environment column: the package's version",
    ("fp8bench/report/pages.py", "torchao"): "an environment column: the package's version",
    ("fp8bench/report/kernel_tables.py", "triton"): "the Triton-language kernel of a kernel probe's results",
    ("fp8bench/cli.py", "torchao"): "a logger (THIRD_PARTY_NOISE)",
    ("fp8bench/workloads/train/frameworks.py", "accelerate"): "a framework's loop, by its package (Backend.loop)",
}


def _docstrings(tree: ast.AST) -> set[int]:
    """The string constants that are docstrings: a module's, class's or function's, and the bare strings that
    document an attribute."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def backend_literals(files: list[Path] | None = None) -> dict[tuple[str, str], list[int]]:
    """(file, backend name) → lines where a string literal of `files` (every module of fp8bench/) is that name
    or quotes it (SQL like `backend != 'emulated'`), outside the backend's own module and docstrings."""
    own = {}
    for name in backends.names():
        module = type(backends.get_backend(name)).__module__
        if module.startswith("fp8bench.backends."):
            own[name] = Path(sys.modules[module].__file__).resolve()
    quoted = re.compile(r"""['"]({})['"]""".format("|".join(re.escape(n) for n in sorted(own, key=len, reverse=True))))
    found: dict[tuple[str, str], list[int]] = {}
    for path in files if files is not None else sorted((ROOT / "fp8bench").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        docs = _docstrings(tree)
        rel = str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str) or id(node) in docs:
                continue
            named = {node.value} & set(own) | {m.group(1) for m in quoted.finditer(node.value)}
            for name in named:
                if path.resolve() != own[name]:
                    found.setdefault((rel, name), []).append(node.lineno)
    return found


def test_no_module_names_a_backend_outside_that_backends_own_module():
    found = backend_literals()
    named = {k: v for k, v in found.items() if k not in ALLOWED}
    assert not named, "backend names used as identifiers outside their module: " + "; ".join(
        f"{f}:{lines} {name!r}" for (f, name), lines in sorted(named.items()))
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"allowed literals no longer there (drop them from ALLOWED): {stale}"


def test_the_scan_finds_what_it_looks_for(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('"""Docstrings may say emulated."""\nQUERY = "SELECT 1 WHERE backend != \'emulated\'"\n'
                       'ROLE = {"te-layer": "x"}\nif ROLE == "te":\n    """An attribute\'s docstring: te."""\n')
    assert backend_literals([planted]) == {("planted.py", "emulated"): [2], ("planted.py", "te-layer"): [3],
                                          ("planted.py", "te"): [4]}
