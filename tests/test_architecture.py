"""The package's structure holds: every subpackage is installed, and a backend is one module (here, one class
registered from a test) that the planner and `fp8bench doctor` both pick up from its own declaration. The
import layering itself is checked by `lint-imports` in `make test` (contract: .importlinter)."""

from pathlib import Path

import pytest
import tomllib

from fp8bench import backends
from fp8bench.backends.base import Backend
from fp8bench.cli import main
from fp8bench.config.compose import expand
from fp8bench.config.schema import ConfigError
from fp8bench.core.hardware import FP8, DeviceInfo, Rule
from fp8bench.run.plan import plan

ROOT = Path(__file__).resolve().parents[1]
CPU = DeviceInfo("cpu", "cpu", None, None)


def test_every_subpackage_is_installed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "fp8bench").rglob("__init__.py")}
    assert on_disk <= listed, f"not in pyproject's packages: {sorted(on_disk - listed)}"


class FakeBackend(Backend):
    name = "fake-fp8"
    workloads = frozenset({"gemm"})
    rules = (Rule(FP8, frozenset({"current"}), None, None, True, "fake-fp8: a test's adapter, runs anywhere"),)


@pytest.fixture
def fake():
    backends.register(FakeBackend)
    yield FakeBackend
    backends.unregister(FakeBackend.name)


@pytest.mark.slow
def test_a_registered_backend_is_planned_by_its_own_rules(fake):
    points, _ = expand(["workload=gemm", "model=tiny", "device=cpu", "backend.name=fake-fp8",
                        "format=e4m3,hybrid,mxfp8", "scaling=current,mx"], multirun=True)
    cases = plan(points, CPU)
    assert cases and all(c.case_id.endswith(".fake-fp8") for c in cases)
    runnable = {(c.config.format.name, c.config.scaling.name) for c in cases if c.runnable}
    assert runnable == {("e4m3", "current"), ("hybrid", "current")}
    mx = next(c for c in cases if c.config.format.name == "mxfp8")
    assert not mx.runnable and "backend 'fake-fp8' has no mxfp8/mx recipe" in mx.reason


@pytest.mark.slow
def test_a_registered_backend_appears_in_doctor(fake, capsys):
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "fake-fp8" in out
    row = next(line for line in out.splitlines() if "e4m3/current" in line)
    cells = [c.strip() for c in row.strip("│┃ ").split("│")]
    assert cells[1 + backends.names().index("fake-fp8")] == "yes"


def test_an_unknown_backend_names_the_registered_ones():
    points, _ = expand(["workload=gemm", "model=tiny", "device=cpu", "backend.name=nope"])
    with pytest.raises(ConfigError, match=r"backend='nope' is unknown; choose one of \['emulated', 'torch'"):
        plan(points, CPU)


def test_the_torch_backend_says_it_has_no_mx_path_instead_of_promising_blackwell():
    ok, why = backends.capability("torch", "mxfp8", "mx", DeviceInfo("cuda", "B200", (10, 0), "13.0"))
    assert not ok and "no MX/NVFP4 path" in why
