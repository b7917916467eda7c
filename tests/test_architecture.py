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
    runnable = {(c.config.format.name, c.config.scaling.name) for c in cases if c.runnable and not c.added}
    assert runnable == {("e4m3", "current"), ("hybrid", "current")}
    # the BF16 twin the runnable recipes divide by, planned for the same backend
    twins = [c for c in cases if c.added]
    assert twins and all(c.runnable and c.case_id.split(".")[3:] == ["bf16", "none", "fake-fp8"] for c in twins)
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


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["linear", "mlp", "layer", "train", "train-diverged"])
def test_the_kernels_a_backend_picks_are_recorded_with_the_case(tmp_path, workload):
    """A backend that chooses among kernels at run time (the triton backend: Gluon on Hopper, Triton elsewhere)
    says which it took in `kernels()`, and the case's record carries it: a choice never hides under the id."""
    from fp8bench.backends.scaled_mm import ScaledMMBackend
    from fp8bench.core.hardware import detect_device
    from fp8bench.run.runner import execute

    class Chooser(ScaledMMBackend):
        name = "fake-chooser"

        def kernels(self, workload, recipe, device):
            return {"gemm_kernel": f"{workload}-{recipe.format.value}-{device.type}"}

    train = ["workload.train.steps=2", "workload.train.eval_every=2", "workload.train.bf16_seeds=1",
             "workload.batch=2", "workload.seq=32"]
    extra = {"linear": ["workload.linears=[o]", "workload.tokens=64"],
             "mlp": ["workload.batch=1", "workload.seq=64"], "layer": ["workload.batch=1", "workload.seq=64"],
             "train": train,  # a diverged run is a result too, recorded with what ran
             "train-diverged": [*train, "diverge_at_step=1"]}[workload]
    backends.register(Chooser)
    try:
        points, _ = expand([f"workload={workload.split('-')[0]}", "model=tiny", "device=cpu",
                            "backend.name=fake-chooser", "format=e4m3", "scaling=current", "measure.iters=3",
                            f"results_dir={tmp_path}", *extra])
        recs = execute(plan(points), tmp_path / "runs" / "r", "r", detect_device(), progress=False)
    finally:
        backends.unregister(Chooser.name)
    fp8 = [r for r in recs if r.format == "e4m3"]
    status = "diverged" if workload == "train-diverged" else "ok"
    assert fp8 and all(r.status == status for r in fp8), [(r.case_id, r.status, r.reason) for r in fp8]
    name = workload.split("-")[0]
    assert all(r.ran["gemm_kernel"] == f"{name}-e4m3-cpu" for r in fp8), [r.ran for r in fp8]


def test_the_triton_backend_names_the_gemm_kernels_it_picks():
    import torch

    from fp8bench.backends import get_backend, make_recipe

    def recipe(fmt, sc, **knobs):
        return make_recipe("triton", fmt, sc, **knobs)
    be, cpu = get_backend("triton"), torch.device("cpu")
    for workload in ("linear", "mlp", "layer", "train"):  # off Hopper (here: the CPU) the Triton kernels
        assert be.kernels(workload, recipe("e4m3", "blockwise"), cpu) == {"gemm_kernel": "triton",
                                                                          "wgrad_kernel": "triton-wgrad"}
    assert be.kernels("gemm", recipe("e4m3", "blockwise"), cpu) == {}  # the gemm workload records its own role's
    assert be.kernels("linear", recipe("bf16", "none"), cpu) == {}  # a BF16 twin runs torch's matmul
