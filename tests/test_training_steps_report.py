"""The Training page's whole-step study from planted records: speedup by depth and TE path, the published
figures beside fp8bench's best, and where a step's time goes (its parts add up to the measured step)."""

import html
import re

import pytest

from fp8bench.core.records import CaseRecord, Metric, ShardWriter, write_manifest
from fp8bench.data import store
from fp8bench.report import data, pages
from fp8bench.report.anchors import ANCHORS

DEVICE = "Planted GPU"
STEP_MS = {("te", "bf16"): 800.0, ("te", "hybrid"): 600.0, ("te-layer", "bf16"): 640.0, ("te-layer", "hybrid"): 400.0}
"""Whole-step times at Llama-2-7B width: per block, FP8 is 1.60x its BF16 twin; per linear 1.33x."""


def _case(model, backend, fmt, time_ms, layers, scaling="delayed", dist=None):
    scaling = "none" if fmt == "bf16" else scaling
    shape = {"batch": 2, "seq": 4096, "steps": 20, "seed": 0, "vocab": 256, "tokens_per_step": 8192}
    shape_name = "b2s4096n20.seed0"
    if dist:  # (nproc, fp8 all-gather): an FSDP2 run and its tag, as fp8bench.models.shapes names it
        shape |= {"nproc": dist[0], "strategy": "fsdp2", "fp8_all_gather": dist[1]}
        shape_name += f".fsdp2x{dist[0]}" + ("fp8ag" if dist[1] else "")
    kernels = {"gpu_gemm_ms": 0.5 * time_ms, "gpu_quantize_ms": 0.1 * time_ms, "gpu_attention_ms": 0.1 * time_ms,
               "gpu_optimizer_ms": 0.08 * time_ms, "gpu_communication_ms": 0.0, "gpu_other_ms": 0.2 * time_ms}
    metrics = {"time_ms": time_ms, "tokens_per_s": 8192 / (time_ms / 1e3), "peak_mem_bytes": 2**30 * layers * 2,
               "gpu_busy_ms": 0.98 * time_ms, "gpu_profiled_step_ms": 1.01 * time_ms, **kernels}
    twin = f"train.{model}.{shape_name.removesuffix('fp8ag')}.bf16.none.{backend}"
    return CaseRecord(run_id="steps", case_id=f"train.{model}.{shape_name}.{fmt}.{scaling}.{backend}", twin_id=twin,
                      workload="train", model=model, format=fmt, scaling=scaling, backend=backend, shape_name=shape_name,
                      shape=shape, params={"model.layers": layers, "workload.train.master_weights": "bf16"},
                      status="ok", metrics=[Metric.of(k, v) for k, v in metrics.items()],
                      samples={"time_ms": [time_ms] * 5, "loss": [5.0, 4.0], "val_loss": [5.0, 4.0],
                               "val_step": [0.0, 20.0]})


@pytest.fixture(scope="module")
def training_html(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("steps")
    run_dir = tmp / "runs" / "steps"
    write_manifest(run_dir, {"run_id": "steps", "started_at": 1.8e9, "git_commit": "c0", "git_dirty": False,
                             "device_name": DEVICE, "config": {}, "measurement": {"version": 4},
                             "env": {"env_id": "planted", "device_name": DEVICE}})
    with ShardWriter(run_dir) as w:
        for (backend, fmt), ms in STEP_MS.items():
            for model, layers in (("llama2-7b-4l", 4), ("llama2-7b", 32)):
                w.write(_case(model, backend, fmt, ms * layers / 4, layers))
        # two ranks of Llama-3-8B under FSDP2: BF16, and torchao tensorwise with the FP8 all-gather (1.25x)
        w.write(_case("llama3-8b", "torchao", "bf16", 1000.0, 32, dist=(2, False)))
        w.write(_case("llama3-8b", "torchao", "hybrid", 800.0, 32, scaling="current", dist=(2, True)))
    con = store.connect(tmp / "db.duckdb")
    store.ingest(con, [tmp / "runs"])
    head = data.latest(data.cases(con))
    page = pages.training_page(head, data.train_curves(con), data.waterfalls(con))
    con.close()
    return html.unescape(re.sub(r"<[^>]+>", " ", page.render()))


def test_each_depth_and_te_path_has_its_step_speedup_memory_and_tokens(training_html):
    section = training_html.split("Whole training steps at Llama scale")[1].split("Against the published")[0]
    text = " ".join(section.split())
    # per block 640/400 = 1.60x, per linear 800/600 = 1.33x, at 4 and 32 layers alike
    # columns: device, model, layers, seq, setting, path, recipe, tokens/s, BF16 tokens/s, speedup, peak GiB,
    # BF16 peak GiB, change %, run
    assert re.search(r"Planted GPU llama2-7b-4l 4 4096 2x4096 BF16-master 1GPU per block "
                     r"\(te.TransformerLayer\) hybrid/delayed 20480 12800 1\.60 8\.0 8\.0 0 steps", text), text
    assert re.search(r"llama2-7b 32 4096 2x4096 BF16-master 1GPU per linear \(te.Linear\) "
                     r"hybrid/delayed \d+ \d+ 1\.33", text)


def test_the_published_figures_sit_beside_the_best_measured_step(training_html):
    section = training_html.split("Against the published figures")[1].split("Where a whole step")[0]
    text = " ".join(section.split())
    assert "1.34x" in text  # the claim under test is named
    best = re.search(r"fp8bench, run steps llama2-7b \(32 layers\) Planted GPU, 2x4096 BF16-master 1GPU"
                     r" hybrid/delayed · per block \(te.TransformerLayer\) "
                     r"BF16, same path (\d\.\d\d)", text)
    assert best and best.group(1) == "1.60"
    for anchor in ANCHORS:
        assert anchor.url.removeprefix("https://") in text and f"{anchor.speedup:.2f}" in text


def test_a_steps_parts_add_up_to_the_measured_step(training_html):
    section = training_html.split("Where a whole step")[1].split("Why not 2x")[0]
    text = " ".join(section.split())
    # 32 layers per block FP8: 3200 ms; gemm 50%, casts 10%, attention 10%, optimizer 8%, comm 0, other 20%,
    # idle = 3200 - 0.98 * 3200 = 64 ms, overlap = the parts' 98% - busy's 98% = 0; the profiled steps ran at
    # 101% of the timed ones
    assert "llama2-7b b2s4096n20.seed0 per block (te.TransformerLayer) hybrid/delayed 3200.0 1600.0 320.0 320.0 " \
           "256.0 0.0 640.0 64.0 0.0 101.0" in text
    assert "Why not 2x" in training_html  # the step's waterfall chart and table follow


def test_an_fp8_all_gather_run_is_its_own_path_against_bf16_fsdp2_on_as_many_gpus(training_html):
    section = " ".join(training_html.split("Whole training steps at Llama scale")[1].split("Against the")[0].split())
    # 8192 tokens per step: 10240 tokens/s against BF16 FSDP2's 8192, 1.25x, on 2 GPUs
    assert re.search(r"llama3-8b 32 4096 2x4096 BF16-master 2GPU torchao · fsdp2 x2 FP8 all-gather "
                     r"hybrid/current 10240 8192 1\.25", section), section
