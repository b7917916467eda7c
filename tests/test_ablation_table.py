"""The ablation table (`fp8bench report --markdown ablation`) on a synthetic `accuracy-ablation` run: TE's
defaults plateau on every seed and fail, a variant that tracks BF16 passes; each configuration is its own row
and its own pass rate though both share the recipe label e4m3/delayed · te-layer."""

import dataclasses

import numpy as np
from parity_curves import BATCH_SD, SEED_SD, STEPS, run, shape

from fp8bench.core.records import ShardWriter, write_manifest
from fp8bench.data import store
from fp8bench.report import ablation, data
from fp8bench.report.parity_view import recipe_rates

DEFAULTS = {"scaling.amax_history_len": 1024, "scaling.amax_compute_algo": "max", "scaling.margin": 0,
            "scaling.pow2_scales": False}


def _plateau() -> np.ndarray:
    """Tracks the shared shape to step 80, climbs to 3.25 nats by step 140 and stays there."""
    base = shape(STEPS)
    t = np.arange(STEPS)
    climb = np.clip((t - 80) / 60, 0, 1)
    return np.where(t < 80, base, base * (1 - climb) + 3.25 * climb)


def _as(rec, suffix: str, params: dict):
    """`rec` as the ablation's te-layer configuration `suffix` (its case-id hash) with its scaling knobs."""
    case_id = rec.case_id.replace(".te", ".te-layer") + (f"~{suffix}" if rec.format != "bf16" else "")
    twin = rec.case_id.replace(f".{rec.format}.delayed.", ".bf16.none.").replace(".te", ".te-layer")
    return dataclasses.replace(rec, run_id="abl", case_id=case_id, backend="te-layer", params=params,
                               twin_id=twin if rec.format != "bf16" else case_id,
                               label=case_id.split("~")[0])


def _ablation_run(tmp_path):
    rng = np.random.default_rng(62)
    records = []
    for seed in range(3):
        effect, batches = rng.normal(0.0, SEED_SD), rng.normal(0.0, BATCH_SD, STEPS)
        records.append(_as(run("bf16", seed, effect, batches, rng), "", {}))
        records.append(_as(run("e4m3", seed, effect, batches, rng, curve=_plateau()), "aaaa0001", DEFAULTS))
        records.append(_as(run("e4m3", seed, effect, batches, rng), "aaaa0002",
                           DEFAULTS | {"scaling.amax_history_len": 16}))
    run_dir = tmp_path / "runs" / "abl"
    write_manifest(run_dir, {"run_id": "abl", "started_at": 1.8e9, "git_commit": "c", "git_dirty": False,
                             "device_name": "GPU", "config": {"sweep_name": ablation.SWEEP},
                             "env": {"env_id": "e", "device_name": "GPU"}})
    with ShardWriter(run_dir) as w:
        for r in records:
            w.write(r)
    con = store.connect(tmp_path / "abl.duckdb")
    store.ingest(con, [run_dir])
    return con


def test_each_configuration_is_a_row_with_its_rate_band_exit_curve_and_loss(tmp_path):
    con = _ablation_run(tmp_path)
    rows = {r["factor"]: r for _, r in ablation.rows(con).iterrows()}
    assert list(rows) == ["BF16 (the band)", "TE's defaults", "amax history len 16"]
    defaults, short = rows["TE's defaults"], rows["amax history len 16"]
    assert defaults["parity"].startswith("FAIL 0/3") and defaults["curve"].count("plateau from step") == 3
    assert defaults["leaves the band"].startswith("step ")
    assert int(defaults["leaves the band"].split()[1]) < 140
    assert float(defaults["final val loss"].split()[0]) > 3.0
    assert short["parity"] == "passes 3/3" and short["curve"] == "ok (3 seeds)"
    assert rows["BF16 (the band)"]["seeds"] == 3 and rows["BF16 (the band)"]["parity"] == ""
    text = ablation.markdown(con)
    assert "| `abl` | GPU | e4m3/delayed · te-layer | amax history len 16 | 3 | passes 3/3 |" in text
    # the training page's pass rates: two configurations of one recipe label, two rows
    rates = recipe_rates(data.cases(con)[lambda d: d["workload"] == "train"])
    assert sorted(rates["verdict"].str[:10]) == ["FAIL 0/3 p", "passes 3/3"]
    assert "e4m3/delayed · te-layer · amax history len 16" in set(rates["recipe"])
    con.close()


def test_no_ablation_run_says_so(tmp_path):
    con = store.connect(tmp_path / "empty.duckdb")
    assert ablation.markdown(con).startswith("No `accuracy-ablation` run is recorded yet")
    con.close()
