"""The advisor says which kind of accuracy backs a recommendation: a training step's loss parity against the
BF16 seed band, or (one-step workloads) the kernels' agreement with the emulator; never the one for the other."""

from fp8bench.core.records import CaseRecord, Metric, ShardWriter, write_manifest
from fp8bench.data import store
from fp8bench.report import data
from fp8bench.report.pages import advisor


def _train(run_id, fmt, seed, tokens_per_s, parity=None):
    metrics = {"time_ms": 100.0 * 1000 / tokens_per_s, "tokens_per_s": tokens_per_s, "loss_final": 2.0}
    if parity is not None:
        metrics["parity_pass"] = parity
    scaling = "none" if fmt == "bf16" else "delayed"
    return CaseRecord(run_id=run_id, case_id=f"train.m.b8s128n200.seed{seed}.{fmt}.{scaling}.te", workload="train",
                      model="m", format=fmt, scaling=scaling, backend="te", shape_name=f"b8s128n200.seed{seed}",
                      shape={}, status="ok", metrics=[Metric.of(k, v) for k, v in metrics.items()])


def _advice(tmp_path, run_id, records):
    run_dir = tmp_path / "runs" / run_id
    write_manifest(run_dir, {"run_id": run_id, "started_at": 1.8e9, "git_commit": "c", "git_dirty": False,
                             "device_name": "GPU", "config": {}, "env": {"env_id": "e", "device_name": "GPU"}})
    with ShardWriter(run_dir) as w:
        for r in records:
            w.write(r)
    con = store.connect(tmp_path / f"{run_id}.duckdb")
    store.ingest(con, [run_dir])
    return advisor(data.cases(con))


def test_a_training_recipe_without_a_parity_verdict_is_not_recommended(tmp_path):
    adv = _advice(tmp_path, "one-seed", [_train("one-seed", "bf16", 0, 1000.0), _train("one-seed", "e4m3", 0, 1300.0)])
    [row] = adv.to_dict("records")
    assert row["kernels"] == "agree with emulator" and row["loss_parity"] == "no parity verdict"
    assert row["recommended"].startswith("no recommendation") and "no parity verdict" in row["recommended"]


def test_a_training_recipe_is_recommended_on_loss_parity(tmp_path):
    records = [_train("band", "bf16", s, 1000.0) for s in range(3)] + [_train("band", "e4m3", 0, 1300.0, parity=1.0)]
    [row] = _advice(tmp_path, "band", records).to_dict("records")
    assert row["loss_parity"] == "pass" and row["recommended"].startswith("use this: fastest with loss parity passed")
    failed = [_train("fail", "bf16", s, 1000.0) for s in range(3)] + [_train("fail", "e4m3", 0, 1300.0, parity=0.0)]
    [row] = _advice(tmp_path, "fail", failed).to_dict("records")
    assert row["loss_parity"].startswith("FAIL") and row["recommended"].startswith("no recommendation")
