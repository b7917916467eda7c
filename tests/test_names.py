"""Names are names: every value that becomes part of a path (run ids, resume ids, sweep and model names, what a
case id carries) is letters, digits, '-', '_' and '.', never '..', never absolute; anything else exits 2 naming
the field, and nothing is written anywhere, least of all outside results_dir."""

import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from fp8bench import backends
from fp8bench.backends.base import Knobs
from fp8bench.backends.emulated import EmulatedBackend
from fp8bench.cli import main

POINT = ["workload=gemm", "model=tiny", "backend=emulated", "format=e4m3", "scaling=current"]
BAD_NAMES = [
    ("run_id=../../escape1", "run_id"),
    ("run_id=/tmp/escape2", "run_id"),
    ("run_id=a/b", "run_id"),
    ("run_id=.", "run_id"),
    ("resume=a/b", "resume"),
    ("resume=../escape3", "resume"),
    ("model.name=../x", "model.name"),
    ("sweep_name=../s", "sweep_name"),
]


def tree(root: Path) -> list[str]:
    """Every path under `root`, relative to it."""
    return sorted(str(Path(d, f).relative_to(root)) for d, dirs, files in os.walk(root) for f in [*dirs, *files])


@pytest.mark.parametrize("command", [["run"], ["run", "-m"], ["plan"]], ids=["run", "run -m", "plan"])
@pytest.mark.parametrize("bad,field", BAD_NAMES, ids=[b for b, _ in BAD_NAMES])
def test_a_name_that_is_not_a_name_exits_2_naming_the_field_and_writes_nothing(bad, field, command, tmp_path,
                                                                                monkeypatch, capfd):
    where = tmp_path / "a" / "b"  # room above results_dir for a path to climb into
    results = where / "R"
    results.mkdir(parents=True)
    (results / "runs").mkdir()
    monkeypatch.chdir(where)
    before = tree(tmp_path)
    code = main([*command, *POINT, f"results_dir={results}", bad])
    err = capfd.readouterr().err
    assert code == 2, err
    assert f"{field}=" in err and "is not a valid name" in err and "Traceback" not in err
    assert tree(tmp_path) == before
    assert not Path("/tmp/escape2").exists()


@pytest.mark.parametrize("bad,field", [("run_id=ok.name,../up", "run_id"), ("model.name=tiny,../up", "model.name")])
def test_a_sweep_over_names_checks_every_one(bad, field, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    code = main(["run", "-m", *POINT, f"results_dir={tmp_path / 'R'}", bad])
    err = capfd.readouterr().err
    assert code == 2 and f"{field}='../up'" in err, err
    assert tree(tmp_path) == []


@dataclass(frozen=True, kw_only=True)
class _TagKnobs(Knobs):
    names_tag: str = ""
    """A free-form string knob: its value is part of the case's id, which names the case's work folder."""


class _Tagged(EmulatedBackend):
    name = "test-tagged"
    knobs = _TagKnobs


@pytest.fixture
def tagged():
    backends.register(_Tagged)
    yield _Tagged.name
    backends.unregister(_Tagged.name)


def test_a_string_knob_a_case_id_carries_is_a_name_too(tagged, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    point = ["workload=gemm", "model=tiny", f"backend.name={tagged}", "format=e4m3", "scaling=current"]
    code = main(["run", *point, "+backend.names_tag=../../up", f"results_dir={tmp_path / 'R'}"])
    err = capfd.readouterr().err
    assert code == 2 and "backend.names_tag='../../up' is not a valid name" in err, err
    assert tree(tmp_path) == []
    assert main(["plan", *point, "+backend.names_tag=v2.1"]) == 0
    assert f".{tagged}+v2.1" in capfd.readouterr().out


def test_good_names_pass():
    from fp8bench.config.schema import check_name

    for good in ("20261205T120713Z-f89e", "my-run.1", "a_b", "llama2-7b"):
        check_name("run_id", good)
