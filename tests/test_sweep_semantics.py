"""One sweep semantics: `fp8bench run -m` and a sweep preset over the same axes make the same cases and the same
twin groups; every case a sweep asks for is a row of its own; every stored speedup divides by a recorded twin of
the same run; Hydra's own sweep grammar (comma lists, choice(), range(), glob()) expands as comma lists do."""

import dataclasses
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from fp8bench.config.compose import conf_dir, expand_request, group_options
from fp8bench.core.hardware import DESCRIBED_DEVICES, DeviceInfo
from fp8bench.core.intervals import recorded_speedup
from fp8bench.run.plan import execution_order, job_groups, needs_twin, plan

CPU = DeviceInfo("cpu", "cpu", None, None)
H200 = DESCRIBED_DEVICES["h200"]
TINY_TRAIN = ["workload.train.steps=4", "workload.train.eval_every=2", "workload.batch=2", "workload.seq=32"]
QUICK_TIMER = ["measure.rounds=6", "measure.iters=5", "measure.min_samples=3", "measure.max_time_s=0.1",
               "measure.warmup=1"]


def planned(overrides: list[str], device: DeviceInfo = CPU, multirun: bool = True):
    return plan(list(expand_request(overrides, multirun=multirun).points), device, installed=False)


def groups_of(cases) -> list[list[str]]:
    return [[c.case_id for c in g] for g in job_groups(execution_order(cases))]


def stored(db: Path) -> tuple[list[dict], dict[tuple[str, str], dict[str, list[float]]], dict]:
    """(case rows, samples by (run, case), stored measured metrics by (run, case)) of a DuckDB file."""
    import duckdb

    con = duckdb.connect(str(db), read_only=True)
    try:
        cols = ["run_id", "case_id", "label", "twin_id", "format", "backend", "status", "reason", "params", "shape",
                "measurement", "ran"]
        rows = [dict(zip(cols, r, strict=True)) for r in con.execute(f"SELECT {', '.join(cols)} FROM cases").fetchall()]
        for r in rows:
            for k in ("params", "shape", "measurement", "ran"):
                r[k] = json.loads(r[k] or "{}")
        samples: dict[tuple[str, str], dict[str, list[float]]] = {}
        for run, case, metric, values in con.execute(
                "SELECT run_id, case_id, metric, list(value ORDER BY i) FROM samples GROUP BY ALL").fetchall():
            samples.setdefault((run, case), {})[metric] = values
        metrics: dict[tuple[str, str], dict[str, float]] = {}
        for run, case, metric, value in con.execute(
                "SELECT run_id, case_id, metric, value FROM measurements WHERE NOT derived").fetchall():
            metrics.setdefault((run, case), {})[metric] = value
    finally:
        con.close()
    return rows, samples, metrics


# --------------------------------------------------------------------------- every case asked for is a row


@pytest.mark.slow
def test_a_master_weights_sweep_stores_each_value_as_its_own_cases(cli, tmp_path):
    res = cli("run", "-m", "workload=train", "model=tiny", "backend=torch", "format=bf16", "scaling=none", *TINY_TRAIN,
              "workload.train.master_weights=fp32,bf16", f"results_dir={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows, _, _ = stored(tmp_path / "fp8bench.duckdb")
    assert len(rows) == 6 == len({r["case_id"] for r in rows}), [r["case_id"] for r in rows]
    assert len({r["run_id"] for r in rows}) == 1
    assert all(r["status"] == "ok" for r in rows), [(r["case_id"], r["reason"]) for r in rows]
    by_value: dict[str, set] = {}
    for r in rows:
        by_value.setdefault(r["params"]["workload.train.master_weights"], set()).add(r["shape"]["seed"])
    assert by_value == {"fp32": {0, 1, 2}, "bf16": {0, 1, 2}}


def test_a_scaling_knob_sweep_keeps_every_case_apart():
    cases = planned(["workload=linear", "model=tiny", "backend=torch", "format=e4m3", "scaling=current",
                     "scaling.margin=0,1"])
    recipes = [c for c in cases if c.recipe.format.value == "e4m3"]
    assert len(recipes) == 8 == len({c.case_id for c in recipes})
    assert sorted(c.identity["scaling.margin"] for c in recipes) == [0.0] * 4 + [1.0] * 4
    twins = [c for c in cases if c.is_bf16]
    assert len(twins) == 4 and all(c.added for c in twins)  # the four shapes' BF16 twin, shared by both margins
    assert {c.twin_id for c in recipes} == {c.case_id for c in twins}


@pytest.mark.slow
def test_a_scaling_knob_sweep_stores_every_case(cli, tmp_path):
    res = cli("run", "-m", "workload=linear", "model=tiny", "backend=torch", "format=e4m3", "scaling=current",
              "scaling.margin=0,1", *QUICK_TIMER, f"results_dir={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows, _, _ = stored(tmp_path / "fp8bench.duckdb")
    recipes = [r for r in rows if r["format"] == "e4m3"]
    assert len(recipes) == 8 == len({r["case_id"] for r in recipes})
    assert sorted(r["params"]["scaling.margin"] for r in recipes) == [0.0] * 4 + [1.0] * 4
    assert len([r for r in rows if r["format"] == "bf16"]) == 4


# --------------------------------------------------------------------------- speedups divide by a recorded twin


@pytest.mark.slow
def test_every_stored_speedup_recomputes_from_its_row_and_its_recorded_twin(cli, tmp_path):
    res = cli("run", "-m", "workload=linear", "model=tiny", "backend=torch", "format=bf16,e4m3",
              "scaling=none,rowwise", *QUICK_TIMER, f"results_dir={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows, samples, metrics = stored(tmp_path / "fp8bench.duckdb")
    by_id = {(r["run_id"], r["case_id"]): r for r in rows}
    recipes = [r for r in rows if r["format"] != "bf16"]
    assert len(recipes) == 4 and len(rows) == 8
    for r in recipes:
        key = (r["run_id"], r["case_id"])
        twin = by_id.get((r["run_id"], r["twin_id"]))
        assert twin is not None and twin["format"] == "bf16" and twin["status"] == "ok", r["twin_id"]
        assert r["measurement"]["method"] == "interleaved"
        estimate = recorded_speedup(samples[(twin["run_id"], twin["case_id"])], samples[key])
        assert estimate is not None, f"{r['case_id']}: no rounds recorded"
        stored_metrics = metrics[key]
        assert stored_metrics["speedup_vs_bf16"] == estimate.value, r["case_id"]
        assert (stored_metrics["speedup_vs_bf16_lo"], stored_metrics["speedup_vs_bf16_hi"]) == (estimate.lo,
                                                                                                estimate.hi)


# --------------------------------------------------------------------------- a preset and -m: the same cases

QUICK_AXES = ["workload=gemm,quantize,linear", "format=bf16,e4m3,hybrid,mxfp8,nvfp4",
              "scaling=none,current,rowwise,blockwise,mx,nvfp4", "backend=emulated,torch,torchao,te,triton"]
QUICK_SETTINGS = ["workload.tokens=16", "measure.warmup=1", "measure.iters=5", "measure.min_samples=3",
                  "measure.max_time_s=0.1", "measure.rounds=6"]


def _same_request(preset: list[str], by_hand: list[str], device: DeviceInfo) -> None:
    a, b = expand_request(preset), expand_request(by_hand, multirun=True)
    assert len(a.points) == len(b.points) and a.dropped == b.dropped
    for p, q in zip(a.points, b.points, strict=True):  # the same points, but for the preset's name
        assert dataclasses.replace(p, sweep_name=None) == dataclasses.replace(q, sweep_name=None)
    ca, cb = plan(list(a.points), device, installed=False), plan(list(b.points), device, installed=False)
    assert [c.case_id for c in ca] == [c.case_id for c in cb]
    assert [(c.runnable, c.reason, c.added) for c in ca] == [(c.runnable, c.reason, c.added) for c in cb]
    assert groups_of(ca) == groups_of(cb)


def test_the_quick_preset_and_m_over_its_axes_make_the_same_cases_and_twin_groups():
    _same_request(["sweep=quick", "model=tiny"], ["model=tiny", *QUICK_AXES, *QUICK_SETTINGS], CPU)
    cases = planned(["model=tiny", *QUICK_AXES, *QUICK_SETTINGS])
    timed = [c for c in cases if c.runnable and needs_twin(c)]
    assert timed
    for group in job_groups(execution_order(cases)):  # a unit of scheduling holds the twin its recipes divide by
        ids = {c.case_id for c in group}
        assert all(c.twin_id in ids for c in group if c in timed), [c.case_id for c in group]


def _overrides(values: dict, prefix: str = "") -> list[str]:
    """A preset's own settings as command-line overrides (key=value, lists as [a,b])."""
    out = []
    for key, value in values.items():
        if isinstance(value, dict):
            out += _overrides(value, f"{prefix}{key}.")
        elif isinstance(value, list):
            out.append(f"{prefix}{key}=[{','.join(str(v) for v in value)}]")
        else:
            out.append(f"{prefix}{key}={'null' if value is None else str(value).lower() if isinstance(value, bool) else value}")
    return out


def preset_by_hand(name: str) -> list[str]:
    """The `-m` request that names a sweep preset's axes and settings by hand."""
    values = OmegaConf.to_container(OmegaConf.load(conf_dir() / "sweep" / f"{name}.yaml"))
    axes = values.pop("hydra")["sweeper"]["params"]
    values.pop("sweep_name", None)
    return [*(f"{k}={v}" for k, v in axes.items()), *_overrides(values)]


@pytest.mark.slow
@pytest.mark.parametrize("preset", group_options("sweep"))
def test_every_preset_and_m_over_its_axes_make_the_same_cases_and_twin_groups(preset):
    _same_request([f"sweep={preset}"], preset_by_hand(preset), H200)


# --------------------------------------------------------------------------- Hydra's sweep grammar

GRAMMAR = [
    (["workload=gemm", "backend=emulated", "format=e4m3", "scaling=current"], "model=glob(tin*)", "model=tiny"),
    (["workload=gemm", "backend=emulated", "format=e4m3", "scaling=current"], "model=glob(llama2-7b*)",
     "model=llama2-7b,llama2-7b-1l,llama2-7b-4l"),
    (["workload=train", "model=tiny", "backend=emulated", "format=e4m3", "scaling=current"],
     "workload.train.steps=range(2,5)", "workload.train.steps=2,3,4"),
    (["workload=linear", "model=tiny", "backend=torch", "format=e4m3"], "scaling=choice(current,rowwise)",
     "scaling=current,rowwise"),
    (["workload=gemm", "model=tiny", "backend=torch", "format=e4m3"], "measure.flush_l2=choice(true,false)",
     "measure.flush_l2=true,false"),
]


@pytest.mark.parametrize("base,sweep,listed", GRAMMAR, ids=[g[1] for g in GRAMMAR])
def test_hydra_sweep_functions_make_the_cases_their_comma_lists_make(base, sweep, listed):
    a, b = planned([*base, sweep]), planned([*base, listed])
    assert len(a) > 1 and [c.case_id for c in a] == [c.case_id for c in b]
    assert groups_of(a) == groups_of(b)


def test_plan_m_lists_the_same_cases_for_a_sweep_function_and_its_comma_list(capfd):
    from fp8bench.cli import main

    lines = []
    for sweep in ("model=glob(llama2-7b*)", "model=llama2-7b,llama2-7b-1l,llama2-7b-4l"):
        assert main(["plan", "--on", "h200", "-m", "workload=gemm", sweep, "backend=torch", "format=e4m3",
                     "scaling=current,rowwise"]) == 0
        out = capfd.readouterr().out
        lines.append([line.split()[0] for line in out.splitlines() if line.startswith("gemm.")])
    assert lines[0] and lines[0] == lines[1]


@pytest.mark.slow
def test_run_m_with_choice_stores_the_cases_of_the_comma_list(cli, tmp_path):
    res = cli("run", "-m", "workload=gemm", "model=tiny", "backend=emulated", "format=e4m3",
              "scaling=choice(current,rowwise)", "workload.roles=[fprop]", f"results_dir={tmp_path}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    rows, _, _ = stored(tmp_path / "fp8bench.duckdb")
    expected = planned(["workload=gemm", "model=tiny", "backend=emulated", "format=e4m3", "scaling=current,rowwise",
                        "workload.roles=[fprop]"])
    assert sorted(r["case_id"] for r in rows) == sorted(c.case_id for c in expected)
    assert all(r["status"] == "ok" for r in rows), [(r["case_id"], r["reason"]) for r in rows]
