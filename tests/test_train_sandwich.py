"""A training recipe's speedup timed as a sandwich against its BF16 twin (fp8bench.run.train_sandwich): on the
CPU, a real run of the tiny decoder with the torch backend's FP8 training, in two processes; the record stores
every step of both sides, ingest publishes the speedup with its interval, the audit rebuilds it from the
samples alone, and the whole-step table shows the twin's drift."""

from pathlib import Path

import pytest

from fp8bench.analysis.rebuild import SANDWICH, rebuild
from fp8bench.config.compose import expand
from fp8bench.config.schema import ConfigError, MeasureConfig
from fp8bench.core.hardware import detect_device
from fp8bench.core.intervals import SANDWICH_METHOD, sandwich_blocks
from fp8bench.core.records import write_manifest
from fp8bench.data import store
from fp8bench.report import published
from fp8bench.run.plan import plan
from fp8bench.run.runner import execute

RUN = ["workload=train", "model=tiny", "device=cpu", "format=e4m3", "scaling=current", "backend=torch",
       "workload.train.steps=6", "workload.train.eval_every=3", "workload.train.eval_batches=1",
       "workload.train.fp8_seeds=1", "workload.batch=2", "workload.seq=32", "measure.warmup=1",
       "measure.sandwich_blocks=3", "measure.sandwich_steps=3", "measure.processes=2"]


@pytest.fixture(scope="module")
def sandwiched(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sandwich")
    points, _ = expand([*RUN, f"results_dir={tmp}"], multirun=True)
    device = detect_device()
    records = execute(plan(points), tmp / "runs" / "sw", "sw", device, progress=False)
    write_manifest(tmp / "runs" / "sw", {"run_id": "sw", "started_at": 1.8e9, "git_commit": "c", "git_dirty": False,
                                         "device_name": device.name, "config": {},
                                         "env": {"env_id": "e", "device_name": device.name}})
    con = store.connect(tmp / "sw.duckdb")
    store.ingest(con, [tmp / "runs" / "sw"])
    con.close()
    return tmp, records


def test_the_recipe_s_record_holds_both_sides_steps_and_its_speedup_with_an_interval(sandwiched):
    _, records = sandwiched
    [fp8] = [r for r in records if r.format == "e4m3"]
    assert fp8.status == "ok", fp8.reason
    m = fp8.measurement
    assert m["method"] == SANDWICH_METHOD and m["processes"] == 2 and "sandwich_failures" not in m
    assert m["sandwich"]["orders"] == ["ABA", "ABA"] and m["sandwich"]["modes"] == ["resident", "resident"]
    assert len(m["sandwich"]["drift"]) == 2 and m["interval"]["unit"] == "processes"
    blocks = sandwich_blocks(fp8.samples)
    assert [[side for side, _ in p] for p in blocks] == [["A", "B", "A"]] * 2
    assert all(len(steps) == 3 for p in blocks for _, steps in p)
    value, lo, hi = (fp8.metric(f"speedup_vs_bf16{s}") for s in ("", "_lo", "_hi"))
    assert 0 < lo <= value <= hi and fp8.metric("speedup_vs_bf16_processes") == 2
    assert round(fp8.metric("twin_drift"), 6) in m["sandwich"]["drift"]
    # the run's own steps are still the run's: the sandwich adds its samples beside them
    assert len(fp8.samples["time_ms"]) == 6 - 1 and len(fp8.samples["loss"]) == 6


def test_ingest_publishes_it_and_the_audit_rebuilds_it_from_the_samples(sandwiched):
    tmp, records = sandwiched
    con = store.connect(tmp / "sw.duckdb")
    [rebuilt] = [r for r in rebuild(con) if r.metric == "speedup_vs_bf16"]
    assert rebuilt.method == SANDWICH and rebuilt.reason == "" and rebuilt.differences() == []
    df = published.cases(con)
    row = df[df["format"] == "e4m3"].iloc[0]
    assert row["published"] and row["shown"].lo <= row["shown"].value <= row["shown"].hi
    assert row["twin_drift"] == pytest.approx([r for r in records if r.format == "e4m3"][0].metric("twin_drift"))
    con.close()


def test_a_bf16_case_or_a_run_with_no_sandwich_keeps_its_own_timing(tmp_path):
    bf16, _ = expand([*RUN[:-3], "measure.sandwich_blocks=3", "measure.sandwich_steps=3", "format=bf16",
                      "scaling=none", "workload.train.bf16_seeds=1", f"results_dir={tmp_path}"])
    off, _ = expand([*RUN[:-3], "measure.sandwich_blocks=0", f"results_dir={tmp_path}"])
    records = [*execute(plan(bf16), tmp_path / "runs" / "a", "a", detect_device(), progress=False),
               *execute(plan(off), tmp_path / "runs" / "b", "b", detect_device(), progress=False)]
    assert sorted(r.format for r in records) == ["bf16", "e4m3"]
    for r in records:
        assert r.measurement["method"] == "alone" and "sandwich_ms" not in r.samples
        assert "sandwich_failures" not in r.measurement


@pytest.mark.parametrize("blocks,steps,field", [(2, 10, "sandwich_blocks"), (1, 10, "sandwich_blocks"),
                                                (-1, 10, "sandwich_blocks"), (3, 2, "sandwich_steps")])
def test_a_sandwich_that_cannot_give_an_interval_is_refused_naming_the_field(blocks, steps, field):
    with pytest.raises(ConfigError, match=f"measure.{field}"):
        MeasureConfig(sandwich_blocks=blocks, sandwich_steps=steps)


def test_the_cli_refuses_an_even_sandwich_with_exit_2(cli, tmp_path):
    r = cli("run", *RUN[:-3], "measure.sandwich_blocks=4", f"results_dir={tmp_path}")
    assert r.returncode == 2 and "measure.sandwich_blocks" in r.stderr and "Traceback" not in r.stderr
    assert not (Path(tmp_path) / "runs").exists() or not any((Path(tmp_path) / "runs").rglob("shard-*"))


def test_the_plan_prices_a_recipe_s_sandwich_in_every_process(sandwiched):
    """`fp8bench plan`'s estimate: a training case's time per step from the history, times its steps plus
    those its sandwich adds (blocks x steps and each side's warm-up, per process)."""
    from fp8bench.data.estimate import expected_seconds

    tmp, records = sandwiched
    con = store.connect(tmp / "sw.duckdb", read_only=True)
    device = con.execute("SELECT device_name FROM runs").fetchone()[0]
    assert device

    def planned(*settings):
        points, _ = expand([*RUN, *settings], multirun=True)
        [case] = [c for c in plan(points) if c.config.format.name == "e4m3"]
        return expected_seconds(con, [case], device).total

    alone = planned("measure.sandwich_blocks=0")
    [fp8] = [r for r in records if r.format == "e4m3"]
    assert alone == pytest.approx(fp8.duration_s)  # its one run, however many processes its sandwich took
    assert planned("measure.processes=3", "measure.sandwich_blocks=5", "measure.sandwich_steps=10") == \
        pytest.approx(alone * (6 + 3 * (5 * 10 + 2 * 1)) / 6)
    con.close()


def test_the_run_is_on_disk_before_its_sandwich_starts_and_the_sandwiched_record_replaces_it(sandwiched):
    """A sweep stopped during the sandwich keeps the run: the shard holds the run's record, marked pending,
    before the sandwiched one, and a reader (ingest, resume) keeps the later."""
    import json

    from fp8bench.core.records import read_run
    from fp8bench.run.train_sandwich import PENDING

    tmp, _ = sandwiched
    lines = [json.loads(line) for shard in sorted((tmp / "runs" / "sw").glob("shard-*.jsonl"))
             for line in shard.read_text().splitlines()]
    fp8 = [r for r in lines if r["format"] == "e4m3"]
    assert [r["measurement"]["method"] for r in fp8] == ["alone", SANDWICH_METHOD]
    assert fp8[0]["measurement"]["sandwich_failures"] == [PENDING] and fp8[0]["status"] == "ok"
    _, records, problems = read_run(tmp / "runs" / "sw")
    assert [r.measurement["method"] for r in records if r.format == "e4m3"] == [SANDWICH_METHOD] and not problems
