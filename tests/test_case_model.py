"""The case model: a case is what was asked (its identity, its id), runnability is decided once at plan time
(what `plan` lists runnable, `run` runs; a knob the backend does not honour skips the case there, with the
reason), and a record states what ran, as the backend did it, in one field."""

import json
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fp8bench import backends
from fp8bench.backends import get_backend
from fp8bench.backends.base import Knobs
from fp8bench.backends.scaled_mm import ScaledMMBackend
from fp8bench.cases.identity import PREFIX_KEYS, case_id
from fp8bench.cli import main
from fp8bench.config.compose import expand_request, group_options
from fp8bench.config.schema import ConfigError
from fp8bench.core.hardware import DESCRIBED_DEVICES, detect_device
from fp8bench.core.records import read_run
from fp8bench.run.caserun import check_ran
from fp8bench.run.plan import knob_verdict, plan

ROOT = Path(__file__).resolve().parents[1]
H200 = DESCRIBED_DEVICES["h200"]


def _records(results: Path):
    [run_dir] = (results / "runs").iterdir()
    _, records, _ = read_run(run_dir)
    return records


# --------------------------------------------------------------------------- one id, one case


def test_two_requested_points_that_make_one_case_exit_2_naming_the_keys(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    for command in (["run", "-m"], ["plan", "-m"]):
        code = main([*command, "workload=gemm", "model=tiny", "backend=emulated", "format=e4m3", "scaling=current",
                     "measure.rounds=6,10", f"results_dir={tmp_path / 'R'}"])
        err = capfd.readouterr().err
        assert code == 2, err
        assert "make one case 'gemm.tiny.fprop_qkv.e4m3.current.emulated'" in err
        assert "measure.rounds (6 vs 10)" in err
    assert not (tmp_path / "R").exists()


def test_points_that_differ_in_what_is_measured_make_cases_of_their_own():
    points = expand_request(["workload=gemm", "model=tiny", "backend=emulated", "format=e4m3", "scaling=current",
                             "measure.flush_l2=true,false", "seed=0,1"], multirun=True).points
    cases = plan(list(points), H200, installed=False)
    assert len(cases) == 4 * 12 == len({c.case_id for c in cases})


# --------------------------------------------------------------------------- runnability, decided at plan time

UNHONOURED = [  # (overrides, the reason of the case that sets the knob)
    (["workload=train", "backend=torchao", "format=hybrid", "scaling=current", "backend.cuda_graph=true,false"],
     "torchao does not support backend.cuda_graph=true"),
    (["workload=train", "backend=te", "format=e4m3", "scaling=delayed", "backend.compile=true,false"],
     "te does not support backend.compile=true"),
    (["workload=linear", "backend=te", "format=e4m3", "scaling=current", "+backend.compile=true,false"],
     "te does not support backend.compile=true"),
    (["workload=train", "backend=lightning-te", "format=e4m3", "scaling=delayed", "workload.train.ckpt_every=10,0"],
     "lightning-te trains in lightning's loop, which fp8bench runs without workload.train.ckpt_every=10"),
]


@pytest.mark.parametrize("overrides,reason", UNHONOURED, ids=[o[-1] for o, _ in UNHONOURED])
def test_a_setting_the_backend_does_not_honour_skips_its_cases_at_plan_time(overrides, reason):
    cases = plan(list(expand_request(["model=tiny", *overrides], multirun=True).points), H200, installed=False)
    refused = [c for c in cases if reason in c.reason]
    others = [c for c in cases if c not in refused]
    assert refused and others and all(not c.runnable for c in refused)
    assert all(c.runnable for c in others), [(c.case_id, c.reason) for c in others]
    assert not {c.case_id for c in refused} & {c.case_id for c in others}  # the refused request is a case of its own


def test_plan_on_a_described_h200_lists_the_unhonoured_knob_as_the_reason(capfd):
    assert main(["plan", "--on", "h200", "-m", "workload=train", "model=tiny", "backend=torchao,triton",
                 "format=e4m3", "scaling=rowwise,blockwise", "backend.cuda_graph=true"]) == 0
    lines = capfd.readouterr().out.splitlines()
    torchao = [line for line in lines if ".torchao" in line.split()[0]]
    assert torchao and all("skipped: torchao does not support backend.cuda_graph=true" in line for line in torchao)
    triton = [line for line in lines if ".triton+cuda_graph" in line.split()[0] and ".blockwise." in line]
    assert triton and all(line.split()[1] == "runnable" for line in triton)  # triton declares graphs


@pytest.mark.parametrize("overrides,knob", [
    (["backend=torchao", "format=hybrid", "scaling=current", "backend.cuda_graph=true"], "backend.cuda_graph=true"),
    (["backend=te", "format=e4m3", "scaling=delayed", "+backend.compile=true"], "backend.compile=true"),
])
def test_a_single_point_with_an_unhonoured_knob_exits_2(overrides, knob, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    for command in ("plan", "run"):
        code = main([command, "workload=train", "model=tiny", *overrides, f"results_dir={tmp_path / 'R'}"])
        err = capfd.readouterr().err
        assert code == 2 and f"does not support {knob}; it honours" in err, err
    assert not (tmp_path / "R").exists()


def _backend_checks(case) -> list[tuple[bool, str]]:
    """What the case's backend itself checks before it builds anything, asked directly."""
    c, r = case.config, case.recipe
    be, cuda = get_backend(c.backend_name), torch.device("cuda")
    checks = [be.supports(c.workload.name, r, cuda), be.capability(c.format.name, c.scaling.name, H200),
              be.supports_shape(c.workload.name, case.shape, r), knob_verdict(case)]
    if c.workload.name == "train":
        checks.append(be.supports_train(c.workload.train, r, cuda))
    typed, foreign = backends.build_knobs(c.backend_name, c.backend)  # the knobs, read again by the backend
    checks.append((not foreign and typed == r.knobs, f"knobs {foreign or typed}"))
    be.effective_recipe(r)
    return checks


@pytest.mark.slow
@pytest.mark.parametrize("preset", group_options("sweep"))
def test_every_case_a_preset_plans_runnable_on_an_h200_passes_its_backends_own_checks(preset):
    cases = plan(list(expand_request([f"sweep={preset}"]).points), H200, installed=False)
    assert cases
    failing = [(c.case_id, why) for c in cases if c.runnable for ok, why in _backend_checks(c) if not ok]
    assert not failing, failing[:5]
    assert all(c.reason for c in cases if not c.runnable)


CPU_PRESETS = {  # a subset of each CPU preset, small enough for CI (every axis of the preset kept but backends)
    "quick": ["model=tiny", "workload.linears=[o]", "workload.roles=[fprop]", "backend=emulated,torch,torchao,te"],
    "train-tiny": ["workload.train.steps=2", "workload.train.eval_every=2", "workload.batch=2", "workload.seq=32",
                   "workload.train.bf16_seeds=1", "workload.train.fp8_seeds=1", "workload.train.eval_batches=1"],
    "asv-cpu": [],
}


@pytest.mark.slow
@pytest.mark.parametrize("preset", sorted(CPU_PRESETS))
def test_a_cpu_preset_runs_what_it_planned_and_refuses_nothing_after(preset, cli, tmp_path):
    overrides = [f"sweep={preset}", *CPU_PRESETS[preset]]
    cases = plan(list(expand_request(overrides, multirun=True).points), detect_device())
    res = cli("run", "-m", *overrides, f"results_dir={tmp_path}", "store.ingest=false", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    records = {r.case_id: r for r in _records(tmp_path)}
    assert sorted(records) == sorted(c.case_id for c in cases)
    assert any(c.runnable for c in cases)
    for c in cases:
        r = records[c.case_id]
        if c.runnable:
            assert r.status == "ok", f"{c.case_id} planned runnable, recorded {r.status}: {r.reason}"
        else:
            assert (r.status, r.reason) == ("skipped", c.reason), c.case_id


# --------------------------------------------------------------------------- what ran, in one field


@pytest.mark.slow
def test_a_cpu_run_asking_for_graphs_is_skipped_never_recorded_ok(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "-m", "workload=train", "model=tiny", "backend=triton", "format=bf16,e4m3",
                 "scaling=none,blockwise", "backend.cuda_graph=true", "device=cpu", "store.ingest=false",
                 f"results_dir={tmp_path / 'graphs'}"]) == 0
    assert main(["run", "workload=gemm", "model=tiny", "backend=emulated", "format=e4m3", "scaling=current",
                 "measure.cuda_graph=true", "device=cpu", "store.ingest=false", f"results_dir={tmp_path / 'gemm'}"]) == 0
    for results in ("graphs", "gemm"):
        records = _records(tmp_path / results)
        assert records and all(r.status == "skipped" for r in records), [(r.case_id, r.status) for r in records]
        assert all("CUDA" in r.reason for r in records), {r.reason for r in records}
        assert all(r.ran == {} for r in records)  # nothing ran: no graphs field claims anything


@pytest.mark.slow
def test_a_record_states_graphs_once_from_what_ran(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "workload=linear", "model=tiny", "backend=torch", "format=e4m3", "scaling=current",
                 "workload.linears=[o]", "measure.rounds=6", "measure.iters=3", "store.ingest=false",
                 f"results_dir={tmp_path}"]) == 0
    records = _records(tmp_path)
    assert {r.format for r in records} == {"bf16", "e4m3"} and all(r.status == "ok" for r in records)
    for r in records:
        assert r.ran["graphs"] is False and r.ran["compiled"] is False and r.ran["device"] == "cpu"
        assert "cuda_graph" not in r.measurement and "graphs" not in r.measurement
        assert not any("graph" in k for k in r.params if not k.endswith("cuda_graph")), r.params


@dataclass(frozen=True, kw_only=True)
class _CompileKnobs(Knobs):
    fast_accum: bool = False
    cpu_onednn: bool = False
    compile: bool = False
    """Declared, never honoured."""


class _IgnoresCompile(ScaledMMBackend):
    """The torch backend declaring a compile knob it never acts on."""

    name = "test-ignores-compile"
    knobs = _CompileKnobs


@pytest.fixture
def ignores_compile():
    backends.register(_IgnoresCompile)
    yield _IgnoresCompile.name
    backends.unregister(_IgnoresCompile.name)


@pytest.mark.slow
def test_a_backend_that_does_not_do_what_the_case_asks_records_the_case_failed(ignores_compile, tmp_path):
    from fp8bench.run.runner import execute

    points = expand_request(["workload=linear", "model=tiny", f"backend.name={ignores_compile}", "format=e4m3",
                             "scaling=current", "+backend.compile=true", "workload.linears=[o]", "measure.rounds=6",
                             "measure.iters=3", f"results_dir={tmp_path}"]).points
    cases = plan(list(points), detect_device())
    assert cases and all(c.runnable for c in cases)  # its declaration promises compilation
    records = execute(cases, tmp_path / "runs" / "r", "r", detect_device(), progress=False)
    assert {r.format for r in records} == {"bf16", "e4m3"}
    for r in records:
        assert r.status == "failed", (r.case_id, r.status)
        assert "did not run what the case asks (compiled: asked True, ran False)" in r.reason


def test_check_ran_compares_the_identity_with_what_the_backend_reports():
    [case] = [c for c in plan(list(expand_request(["workload=train", "model=tiny", "backend=triton", "format=e4m3",
                                                   "scaling=blockwise", "backend.cuda_graph=true",
                                                   "workload.train.fp8_seeds=1"]).points), H200, installed=False)
              if not c.is_bf16]
    check_ran(case, SimpleNamespace(graphs=True, compiled=False))
    with pytest.raises(RuntimeError, match=r"graphs: asked True, ran False"):
        check_ran(case, SimpleNamespace(graphs=False, compiled=False))
    with pytest.raises(RuntimeError, match=r"compiled: asked False, ran True"):
        check_ran(case, SimpleNamespace(graphs=True, compiled=True))


def test_a_knob_no_backend_declares_is_bad_input():
    with pytest.raises(ConfigError, match=r"'nope' is not a knob of any backend"):
        plan(list(expand_request(["model=tiny", "+backend.nope=1"]).points), H200, installed=False)


# --------------------------------------------------------------------------- committed results keep their ids


@pytest.mark.slow
def test_the_ids_of_committed_results_are_their_stored_identities(tmp_path):
    """Every row of the committed exports, ingested (version-1 records re-keyed on the way): its id is what the
    identity function gives from its stored workload, model, shape, format, scaling, backend and params."""
    from fp8bench.data.store import connect, ingest

    con = connect(tmp_path / "db.duckdb")
    committed = [p for p in (ROOT / "results").iterdir() if p.is_dir() and p.name not in ("runs", "hydra", "site")]
    ingest(con, committed)
    rows = con.execute("SELECT run_id, case_id, label, workload, model, shape_name, format, scaling, backend, "
                       "shape, params FROM cases").fetchall()
    con.close()
    assert len({r[3] for r in rows}) >= 5  # every workload
    wrong = []
    for run_id, cid, label, workload, model, shape_name, fmt, scaling, backend, shape, params in rows:
        params = json.loads(params)
        ident = dict(zip(PREFIX_KEYS, (workload, model, shape_name, fmt, scaling, backend), strict=True))
        ident |= {f"shape.{k}": v for k, v in json.loads(shape).items()} | params
        knobs = {k.removeprefix("backend."): v for k, v in params.items() if k.startswith("backend.")}
        typed, foreign = backends.build_knobs(backend, knobs)
        variant = backends.variant_of_knobs({**typed.set_knobs(), **foreign})
        if case_id(ident, variant) != cid or not cid.startswith(label):
            wrong.append((run_id, cid, case_id(ident, variant), label))
    assert not wrong, f"{len(wrong)} of {len(rows)} rows: {wrong[:5]}"


def test_knob_text_names_the_scaling_knobs_away_from_the_defaults_and_nothing_else():
    from fp8bench.cases.identity import knob_text

    assert knob_text("delayed", {"scaling.amax_history_len": 16, "scaling.margin": 0}) == "amax history len 16"
    assert knob_text("delayed", '{"scaling.amax_compute_algo": "most_recent", "scaling.margin": 2}') == \
        "amax compute algo most_recent, margin 2"
    assert knob_text("delayed", {"scaling.amax_history_len": 1024}) == ""  # TE's default
    # BF16's 'none', a scaling this checkout does not know, and no stored identity (NULL reads back as NaN)
    assert knob_text("none", {"scaling.margin": 2}) == "" and knob_text("gone", {"scaling.margin": 2}) == ""
    assert knob_text("delayed", float("nan")) == "" and knob_text("delayed", None) == ""
