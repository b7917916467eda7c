"""One training loop for every mode: one process, torchrun ranks (gloo on a CPU, DDP and FSDP2), Lightning's
and Accelerate's loops train the same BF16 curve on `tiny`, and a distributed run honours the loop's settings
(BF16 master weights, checkpoint and resume) as a one-process run does."""

import os
import signal
import time
from pathlib import Path

import pytest

from fp8bench.config.compose import expand
from fp8bench.core.hardware import detect_device
from fp8bench.core.records import read_run
from fp8bench.run.plan import plan
from fp8bench.run.runner import execute

ROOT = Path(__file__).resolve().parents[1]
# 4 x 32 tokens a step: the CPU's BF16 matmuls set the pace of every mode
SMALL = ["workload=train", "model=tiny", "device=cpu", "format=bf16", "scaling=none", "workload.batch=4",
         "workload.seq=32", "workload.train.bf16_seeds=1", "store.ingest=false"]


def _train(tmp_path, *overrides):
    points, _ = expand([*SMALL, *overrides, f"results_dir={tmp_path}"], multirun=True)
    return execute(plan(points), tmp_path / "runs" / "r", "r", detect_device(), progress=False)


def _gap(a, b) -> float:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.mark.slow
def test_every_mode_trains_the_same_bf16_curve(tmp_path):
    steps = ["workload.train.steps=20", "workload.train.eval_every=10"]
    recs = {r.backend: r for r in _train(tmp_path / "one", *steps, "backend=torch,lightning-te,accelerate-te")}
    for strategy in ("ddp", "fsdp2"):
        [recs[strategy]] = _train(tmp_path / strategy, *steps, "backend=torch", "workload.train.nproc=2",
                                  f"workload.train.strategy={strategy}")
    assert all(r.status == "ok" for r in recs.values()), {k: r.reason for k, r in recs.items()}
    native = recs["torch"]
    assert len(native.samples["loss"]) == 20 and native.samples["val_step"] == [0.0, 10.0, 20.0]
    # Accelerate's steps are the loop's own: bit for bit; Lightning clips and steps the schedule in its own
    # order, and ranks reduce gradients in another order: rounding only
    assert recs["accelerate"].samples["loss"] == pytest.approx(native.samples["loss"], rel=1e-6)
    assert recs["lightning-te"].samples["loss"] == pytest.approx(native.samples["loss"], rel=1e-4)
    for strategy in ("ddp", "fsdp2"):
        r = recs[strategy]
        assert r.shape["nproc"] == 2 and r.shape["batch"] == 4  # the global batch, split over the ranks
        assert r.samples["loss"] == pytest.approx(native.samples["loss"], rel=1e-2)
        assert r.samples["val_step"] == native.samples["val_step"]
        assert r.samples["val_loss"] == pytest.approx(native.samples["val_loss"], rel=1e-2)
        assert r.metric("tokens_per_s_per_rank") == pytest.approx(r.metric("tokens_per_s") / 2)
    for r in recs.values():
        assert r.metric("loss_final") < 0.9 * r.metric("loss_initial") and r.metric("tokens_per_s") > 0


@pytest.mark.slow
def test_a_distributed_run_honours_master_weights_and_resumes(tmp_path, cli, cli_process):
    args = [*SMALL, "backend=torch", "workload.train.steps=60", "workload.train.eval_every=20",
            "workload.train.ckpt_every=10", "workload.train.master_weights=bf16"]
    dist = ["workload.train.nproc=2", "workload.train.strategy=fsdp2"]

    def run(out, *extra):
        done = cli("run", *args, *dist, f"results_dir={out}", *extra, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]

    run(tmp_path / "ref", "run_id=ref")
    # killed after its first checkpoint, torchrun and its ranks with it (one process group)
    killed = cli_process("run", *args, *dist, f"results_dir={tmp_path / 'k'}", "run_id=k", new_session=True)
    work = tmp_path / "k" / "runs" / "k" / "work"
    deadline = time.time() + 300
    while not list(work.glob("*/checkpoint.pt")) and time.time() < deadline and killed.is_alive():
        time.sleep(0.05)
    assert killed.is_alive(), "the run finished before it could be killed"
    os.killpg(killed.pid, signal.SIGKILL)
    killed.join()
    run(tmp_path / "k", "resume=k")

    [ref] = read_run(tmp_path / "ref" / "runs" / "ref")[1]
    [res] = read_run(tmp_path / "k" / "runs" / "k")[1]
    assert ref.status == res.status == "ok", (ref.reason, res.reason)
    at = int(res.samples["resumed_at_step"][0])
    assert 0 < at < 60 and at % 10 == 0
    assert res.samples["loss"] == pytest.approx(ref.samples["loss"], rel=1e-6)  # the resumed steps re-run exactly
    assert res.samples["val_loss"] == pytest.approx(ref.samples["val_loss"], rel=1e-6)
    assert not list(work.glob("*/checkpoint.pt"))

    # BF16 master weights: the curve of one process with BF16 weights, not the FP32-master one
    steps = [a for a in args if a.startswith("workload.train.") and "ckpt" not in a and "master" not in a]
    [bf16_master] = _train(tmp_path / "b", *steps, "workload.train.master_weights=bf16")
    [fp32_master] = _train(tmp_path / "f", *steps, "workload.train.master_weights=fp32")
    assert _gap(ref.samples["loss"], bf16_master.samples["loss"]) < 0.5 * _gap(ref.samples["loss"],
                                                                              fp32_master.samples["loss"])
