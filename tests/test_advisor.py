"""The advisor says which kind of accuracy backs a recommendation: a training step's loss parity against the
BF16 seed band, or (one-step workloads) the kernels' agreement with the emulator; never the one for the other."""

from fp8bench.core.records import CaseRecord, Metric, ShardWriter, write_manifest
from fp8bench.data import store
from fp8bench.report.pages import advisor
from fp8bench.report.published import for_the_site


def _train(run_id, fmt, seed, tokens_per_s, parity=None, passes=None):
    """A training case; `parity`: its own verdict (1.0 pass), `passes`: how many of its recipe's three seeds
    passed (the recipe's verdict, as fp8bench.analysis.parity stores it on each of them)."""
    metrics = {"time_ms": 100.0 * 1000 / tokens_per_s, "tokens_per_s": tokens_per_s, "loss_final": 2.0}
    if parity is not None:
        metrics["parity_pass"] = parity
    if passes is not None:
        metrics |= {"parity_seeds": 3, "parity_passes": passes, "parity_recipe_pass": float(passes == 3)}
    scaling = "none" if fmt == "bf16" else "delayed"
    return CaseRecord(run_id=run_id, case_id=f"train.m.b8s128n200.seed{seed}.{fmt}.{scaling}.te",
                      twin_id=f"train.m.b8s128n200.seed{seed}.bf16.none.te", workload="train",
                      model="m", format=fmt, scaling=scaling, backend="te", shape_name=f"b8s128n200.seed{seed}",
                      shape={}, status="ok", metrics=[Metric.of(k, v) for k, v in metrics.items()])


def _ingest(tmp_path, runs: dict) -> store.duckdb.DuckDBPyConnection:
    """One DuckDB file holding each run of {run_id: (started_at, records)}."""
    con = store.connect(tmp_path / "parity.duckdb")
    for run_id, (started, records) in runs.items():
        run_dir = tmp_path / "runs" / run_id
        write_manifest(run_dir, {"run_id": run_id, "started_at": started, "git_commit": run_id, "git_dirty": False,
                                 "device_name": "GPU", "config": {}, "env": {"env_id": "e", "device_name": "GPU"}})
        with ShardWriter(run_dir) as w:
            for r in records:
                w.write(r)
        store.ingest(con, [run_dir])
    return con


def _advice(tmp_path, run_id, records):
    """The advisor over the cases as the site reads them: a speedup only with its interval (here: over the
    recipe's seeds)."""
    return advisor(for_the_site(_ingest(tmp_path / run_id, {run_id: (1.8e9, records)})))


def test_a_training_recipe_without_a_parity_verdict_is_not_recommended(tmp_path):
    adv = _advice(tmp_path, "one-seed", [_train("one-seed", "bf16", 0, 1000.0), _train("one-seed", "e4m3", 0, 1300.0)])
    [row] = adv.to_dict("records")
    assert row["loss_parity"].startswith("not judged") and "accuracy ok" not in str(row["numerics"])
    assert row["recommended"].startswith("no recommendation")


def test_a_training_recipe_is_recommended_on_its_pass_rate_over_three_seeds(tmp_path):
    band = [_train("band", "bf16", s, 1000.0) for s in range(3)]
    records = band + [_train("band", "e4m3", s, 1300.0, parity=1.0, passes=3) for s in range(3)]
    [row] = _advice(tmp_path, "band", records).to_dict("records")
    assert row["loss_parity"].startswith("passes 3/3"), row["loss_parity"]
    assert row["recommended"].startswith("use this: fastest with loss parity passed on 3+ seeds")
    band = [_train("fail", "bf16", s, 1000.0) for s in range(3)]
    failed = band + [_train("fail", "e4m3", s, 1300.0, parity=float(s > 0), passes=2) for s in range(3)]
    [row] = _advice(tmp_path, "fail", failed).to_dict("records")
    assert row["loss_parity"].startswith("FAIL 2/3") and row["recommended"].startswith("no recommendation")
    one = [_train("one", "bf16", s, 1000.0) for s in range(3)] + [_train("one", "e4m3", 0, 1300.0, parity=1.0)]
    [row] = _advice(tmp_path, "one", one).to_dict("records")
    assert row["recommended"].startswith("no recommendation")  # one passing seed is no pass of the recipe


def _step_record(run_id, model, fmt, seed, status="ok", reason=""):
    """A training case; ingest judges parity (fp8bench.analysis.parity) where a run holds a BF16 band."""
    scaling = "none" if fmt == "bf16" else "blockwise"
    final = 2.0 + 0.01 * (seed - 1) if fmt == "bf16" else 2.0
    metrics = {"tokens_per_s": 1000.0, "loss_final": final, "peak_mem_bytes": 2.0**30}
    if status == "diverged":
        metrics = {"tokens_per_s": 900.0, "peak_mem_bytes": 2.0**30}
    name = f"b8s128n200.seed{seed}" if fmt == "bf16" else "b8s128n200"
    return CaseRecord(run_id=run_id, case_id=f"train.{model}.{name}.{fmt}.{scaling}.triton",
                      twin_id=f"train.{model}.b8s128n200.seed{seed}.bf16.none.triton", workload="train",
                      model=model, format=fmt, scaling=scaling, backend="triton", shape_name=name,
                      shape={"batch": 8, "seq": 128, "steps": 200, "seed": seed}, status=status, reason=reason,
                      metrics=[Metric.of(k, v) for k, v in metrics.items()])


def test_the_parity_table_keeps_a_judged_verdict_and_lists_a_diverged_recipe(tmp_path):
    """A later run of an FP8 case without a BF16 band beside it does not hide the verdict of the run that
    judged it; a recipe that diverged beside a band is listed with its divergence, not left out."""
    from fp8bench.report.markdown import parity_block

    band = [_step_record("judged", "m", "bf16", s) for s in range(3)]
    con = _ingest(tmp_path, {
        "judged": (1.8e9, [*band, _step_record("judged", "m", "e4m3", 0)]),
        "again": (1.9e9, [_step_record("again", "m", "e4m3", 0)]),
        "nan": (1.9e9, [*(_step_record("nan", "m2", "bf16", s) for s in range(3)),
                        _step_record("nan", "m2", "e4m3", 0, status="diverged",
                                     reason="loss became nan at step 1 (lr 4e-05)")])})
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in parity_block(con).splitlines()[2:]]
    fp8 = {r[0].split(" · ")[1]: r for r in rows if r[2].startswith("e4m3")}
    assert fp8["m"][7].startswith("pass") and fp8["m"][8] == "`judged`"
    assert fp8["m2"][7] == "diverged: loss became nan at step 1 (lr 4e-05)" and fp8["m2"][8] == "`nan`"
    assert fp8["m2"][6] == "" and fp8["m2"][3] == "900"  # no final loss; the speed until it diverged
    assert not any("`again`" in r for r in rows)


def test_the_parity_table_names_the_seed_of_an_fp8_recipe_trained_on_several(tmp_path):
    """An FP8 recipe trained on several seeds beside one band is one row per seed, each naming its seed (a
    verdict is per run); trained on one seed its row names none, as before."""
    from dataclasses import replace

    from fp8bench.report.markdown import parity_block

    band = [_step_record("seeds", "m", "bf16", s) for s in range(3)]
    fp8 = [replace(r, case_id=r.case_id.replace("b8s128n200", f"b8s128n200.seed{s}"),
                   shape_name=f"b8s128n200.seed{s}", shape={**r.shape, "seed": s})
           for s in (0, 1) for r in [_step_record("seeds", "m", "e4m3", s)]]
    one = [*(_step_record("one", "m2", "bf16", s) for s in range(3)), _step_record("one", "m2", "e4m3", 0)]
    con = _ingest(tmp_path, {"seeds": (1.8e9, [*band, *fp8]), "one": (1.8e9, one)})
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in parity_block(con).splitlines()[2:]]
    labels = sorted(r[2] for r in rows if r[2].startswith("e4m3"))
    assert labels == ["e4m3/blockwise · triton", "e4m3/blockwise · triton seed 0",
                      "e4m3/blockwise · triton seed 1"], labels


def test_the_headline_parity_counts_every_run_that_judged_a_recipe(tmp_path):
    """A recipe judged in two runs, passing in the first and failing in the second, reads "1 of 2 pass": the
    later verdict does not replace the earlier one, nor the earlier one hide the later."""
    from dataclasses import replace

    from fp8bench.report.markdown import parity_where_judged

    def run(run_id, final):
        band = [_step_record(run_id, "m", "bf16", s) for s in range(3)]
        fp8 = _step_record(run_id, "m", "e4m3", 0)
        return [*band, replace(fp8, metrics=[x if x.name != "loss_final" else Metric.of("loss_final", final)
                                             for x in fp8.metrics])]

    con = _ingest(tmp_path, {"first": (1.8e9, run("first", 2.0)), "again": (1.9e9, run("again", 9.0))})
    assert parity_where_judged(con) == {"e4m3/blockwise · triton": "1 of 2 pass at m"}
