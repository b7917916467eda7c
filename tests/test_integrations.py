"""Framework integrations (Lightning, Accelerate) and third-party FP8 libraries (COAT, DeepGEMM, MS-AMP).

On CPU: Lightning's and Accelerate's own loops reproduce fp8bench's training curve step for step (so their
rows differ from the direct ones only by what the framework adds), Accelerate's torchao FP8 path trains for
real, and every backend whose library or device is missing is recorded skipped with the reason. The FP8 paths
through Transformer Engine run on the GPU (marked `gpu`).
"""

import json

import pytest
import torch

from fp8bench.backends import get_backend, make_recipe
from fp8bench.config.compose import expand
from fp8bench.config.schema import ConfigError
from fp8bench.core.hardware import detect_device
from fp8bench.run.plan import plan
from fp8bench.run.runner import execute

TINY = ["workload=train", "model=tiny", "workload.train.steps=20", "workload.train.eval_every=10",
        "workload.train.bf16_seeds=1"]
on_gpu = torch.cuda.is_available()
DEVICE = "cuda" if on_gpu else "cpu"


def _train(tmp_path, *overrides, name="r"):
    points, _ = expand([*TINY, f"device={DEVICE}", *overrides, f"results_dir={tmp_path}"], multirun=True)
    return execute(plan(points), tmp_path / "runs" / name, name, detect_device(), progress=False)


def _by_backend(records):
    return {r.label.split(".")[-1]: r for r in records}


@pytest.mark.slow
def test_accelerate_hands_fp8_to_torchao_and_leaves_first_and_last_linear_alone(tmp_path):
    recs = _by_backend(_train(tmp_path, "format=hybrid", "scaling=current", "backend=torchao,accelerate-torchao",
                              "backend.compile=false"))
    direct, acc = recs["torchao"], recs["accelerate+torchao"]
    assert direct.status == acc.status == "ok", (direct.reason, acc.reason)
    total = direct.metric("linears_total")
    assert direct.metric("linears_fp8") == total - 1  # fp8bench keeps the output head in high precision
    assert acc.metric("linears_fp8") == total - 2  # Accelerate's filter: the first linear and the head
    # both learn, and FP8 on one more linear moves the curve only a little
    assert acc.metric("loss_final") < 0.8 * acc.metric("loss_initial")
    assert acc.metric("loss_final") == pytest.approx(direct.metric("loss_final"), rel=0.02)
    assert acc.samples["loss"] != direct.samples["loss"]


def test_integration_variants_name_their_library():
    def variant(backend, **knobs):
        return make_recipe(backend, "e4m3", "current", **knobs).knobs.variant()
    assert variant("accelerate", fp8_backend="torchao", compile=True) == "torchao+compile"
    assert variant("accelerate") == ""
    assert variant("triton", fast_accum=True) == "fast_accum"  # rescale vs promote GEMM
    assert variant("triton", triton_gemms=True) == "triton_gemms"  # Triton vs Gluon GEMMs
    assert variant("triton", cuda_graph=True) == "cuda_graph"  # replayed vs eager steps
    assert variant("te", cuda_graph=True) == "cuda_graph"  # TE's own graphed steps
    with pytest.raises(ConfigError, match=r"te-layer does not declare \['cuda_graph'\]"):
        variant("te-layer", cuda_graph=True)  # a knob te-layer does not honour: not silently dropped


def test_unknown_fp8_backend_is_a_config_error(tmp_path):
    from fp8bench.cli import main

    assert main(["plan", "workload=train", "model=tiny", "backend=accelerate-te", "backend.fp8_backend=msamp"]) == 2


@pytest.mark.skipif(on_gpu, reason="checks the CPU verdicts")
@pytest.mark.slow
def test_integrations_say_why_they_cannot_run_here(tmp_path):
    points, _ = expand([*TINY, "device=cpu", "format=e4m3,hybrid", "scaling=delayed,current",
                        "backend=lightning-te,accelerate-te,coat,msamp", f"results_dir={tmp_path}"], multirun=True)
    why = {c.label.split(".", 4)[-1]: c.reason for c in plan(points) if not c.runnable}
    assert "Transformer Engine" in why["e4m3.delayed.lightning-te"]
    assert "DelayedScaling" in why["e4m3.current.accelerate"]  # Accelerate's TE kwargs build no other recipe
    assert "CPU" in why["hybrid.current.coat"]
    assert "package registry" in why["hybrid.delayed.msamp"]
    gemm, _ = expand(["workload=gemm", "model=tiny", "device=cpu", "format=e4m3", "scaling=blockwise",
                      "backend=deepgemm", f"results_dir={tmp_path}"], multirun=True)
    assert all("Hopper" in c.reason for c in plan(gemm))


def test_a_recorded_install_failure_is_quoted_by_the_probe(tmp_path, monkeypatch):
    log = tmp_path / "install.json"
    log.write_text(json.dumps({"ms-amp": "not on the package registry", "deep-gemm": "build failed: no cute"}))
    monkeypatch.setenv("FP8BENCH_INSTALL_LOG", str(log))
    ok, why = get_backend("msamp").available()
    assert not ok and "No module named 'msamp'" in why and "installing ms-amp here: not on the package registry" in why
    monkeypatch.setenv("FP8BENCH_INSTALL_LOG", str(tmp_path / "missing.json"))
    ok, why = get_backend("msamp").available()
    assert not ok and "installing" not in why


@pytest.mark.gpu
@pytest.mark.skipif(not on_gpu, reason="Transformer Engine FP8 needs a CUDA GPU")
def test_lightning_and_accelerate_run_te_fp8_on_every_suitable_linear(tmp_path):
    recs = _by_backend(_train(tmp_path, "format=e4m3", "scaling=delayed", "backend=te,lightning-te,accelerate-te",
                              "model=gpt-125m", "workload.batch=4", "workload.seq=256"))
    assert all(r.status == "ok" for r in recs.values()), {k: r.reason for k, r in recs.items()}
    te, lightning, accelerate = recs["te"], recs["lightning-te"], recs["accelerate"]
    total = te.metric("linears_total")
    assert te.metric("linears_fp8") == total - 1  # the head stays BF16 in fp8bench's te backend
    assert lightning.metric("linears_fp8") == accelerate.metric("linears_fp8") == total  # the head too
    for r in recs.values():
        assert r.metric("loss_final") < 0.9 * r.metric("loss_initial"), r.case_id


def _train_record(run_id, backend_id, fmt, tokens_per_s, linears_fp8, parity=None):
    from fp8bench.core.records import CaseRecord, Metric

    backend = backend_id.split("+")[0]
    metrics = [Metric.of("time_ms", 4096 / tokens_per_s * 1e3), Metric.of("tokens_per_s", tokens_per_s),
               Metric.of("peak_mem_bytes", 2**30), Metric.of("loss_final", 1.8), Metric.of("linears_fp8", linears_fp8),
               Metric.of("linears_total", 49)]
    if parity is not None:
        metrics.append(Metric.of("parity_pass", parity))
    scaling = "none" if fmt == "bf16" else "current"
    return CaseRecord(run_id=run_id, case_id=f"train.gpt-125m.b8s512n300.seed0.{fmt}.{scaling}.{backend_id}",
                      twin_id=f"train.gpt-125m.b8s512n300.seed0.bf16.none.{backend_id}",
                      workload="train", model="gpt-125m", format=fmt, scaling=scaling, backend=backend,
                      shape_name="b8s512n300.seed0", shape={"batch": 8, "seq": 512, "steps": 300, "seed": 0},
                      params={}, status="ok", metrics=metrics, samples={})


def test_report_pairs_each_integration_with_its_direct_run_over_repeats(tmp_path):
    from fp8bench.core.records import ShardWriter, write_manifest
    from fp8bench.data.store import connect, ingest
    from fp8bench.report import data
    from fp8bench.report.pages import integration_overhead, integration_summary

    for run_id, direct_tps, acc_tps in (("r1", 140e3, 120e3), ("r2", 120e3, 130e3), ("r3", 150e3, 125e3)):
        run_dir = tmp_path / "runs" / run_id
        write_manifest(run_dir, {"run_id": run_id, "started_at": 1.7e9, "git_commit": "abc", "git_dirty": False,
                                 "device_name": "H", "env": {"env_id": "e1", "device_name": "H"}, "config": {}})
        with ShardWriter(run_dir) as w:
            w.write(_train_record(run_id, "torchao+compile", "hybrid", direct_tps, 48, parity=1.0))
            w.write(_train_record(run_id, "accelerate+torchao+compile", "hybrid", acc_tps, 47, parity=0.0))
            w.write(_train_record(run_id, "accelerate", "hybrid", 99e3, 49))  # no direct twin in these runs
    con = connect(tmp_path / "r.duckdb")
    ingest(con, [tmp_path / "runs"])
    df = data.cases(con)
    con.close()
    # the variant is everything after the backend, so Accelerate's torchao+compile is not mistaken for torchao's
    assert set(df["variant"]) == {"compile", "torchao+compile", ""}
    fw = integration_overhead(df)
    assert len(fw) == 3 and set(fw["direct"]) == {"hybrid/current · torchao+compile"}
    r1 = fw[fw["run_id"] == "r1"].iloc[0]
    assert r1["overhead_pct"] == pytest.approx((140 / 120 - 1) * 100)
    assert (r1["fp8_linears"], r1["fp8_linears_direct"]) == ("47/49", "48/49")
    # a stored FAIL stands though the figures of its rules were not stored with it
    assert r1["verdict"].startswith("FAIL") and r1["verdict_direct"] == "pass"
    [summary] = integration_summary(fw).to_dict("records")
    assert summary["runs"] == 3 and summary["parity"] == "0/3 pass"
    assert summary["overhead_median_pct"] == pytest.approx((140 / 120 - 1) * 100)
    assert summary["overhead_min_pct"] == pytest.approx((120 / 130 - 1) * 100)
