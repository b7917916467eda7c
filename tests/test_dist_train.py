"""Distributed training (`workload.train.nproc` > 1) through torchrun: the planner says why a point cannot run
here, and a failing rank fails its case only (the curves every mode trains: tests/test_train_modes.py). FP8 under FSDP2 (all-gather on and off) needs GPUs: tests/test_gpu.py and the H200 x2 study."""

import json

import pytest

from fp8bench.config.compose import expand
from fp8bench.core.hardware import detect_device
from fp8bench.run.plan import plan
from fp8bench.run.runner import execute

BASE = ["workload=train", "model=tiny", "device=cpu", "format=bf16", "scaling=none", "backend=torch",
        "workload.train.steps=30", "workload.train.eval_every=15", "workload.train.bf16_seeds=1"]


def _run(tmp_path, extra, base=BASE):
    points, _ = expand(base + extra + [f"results_dir={tmp_path}"])
    cases = plan(points)
    [rec] = execute(cases, tmp_path / "r", "r", detect_device(), progress=False)
    return rec


@pytest.mark.slow
def test_the_planner_says_why_a_distributed_point_cannot_run(tmp_path):
    def reason(extra):
        points, _ = expand(BASE[:3] + extra + [f"results_dir={tmp_path}"])
        [case] = plan(points)[:1]
        return case.runnable, case.reason

    ok, why = reason(["format=hybrid", "scaling=current", "backend=torchao", "workload.train.nproc=2",
                      "workload.train.fp8_all_gather=true"])
    assert not ok and "needs GPUs" in why
    ok, why = reason(["format=bf16", "scaling=none", "backend=torch", "workload.train.fp8_all_gather=true"])
    assert not ok and "torch has no FP8 all-gather" in why  # the knob is torchao's
    ok, why = reason(["format=bf16", "scaling=none", "backend=torchao", "workload.train.fp8_all_gather=true"])
    assert not ok and "nproc > 1" in why
    ok, why = reason(["format=bf16", "scaling=none", "backend=te", "workload.train.nproc=2"])
    assert not ok  # TE needs a GPU; on one it would say fsdp2 runs torch/torchao only
    ok, why = reason(["format=bf16", "scaling=none", "backend=torch", "workload.train.nproc=3"])
    assert not ok and "split evenly" in why


@pytest.mark.slow
def test_a_failing_rank_fails_the_case_not_the_sweep(tmp_path):
    tiny = tmp_path / "corpus.txt"
    tiny.write_text("too short to hold one training window")  # exists (the config accepts it); ranks fail
    points, _ = expand(BASE + ["workload.train.nproc=2", f"workload.train.corpus={tiny}",
                               f"results_dir={tmp_path}"])
    records = execute(plan(points), tmp_path / "r", "r", detect_device(), progress=False)
    assert [r.status for r in records] == ["failed"]
    assert "torchrun with 2 ranks exited" in records[0].reason
    assert "CorpusError" in records[0].reason  # the ranks' own error, not only torchrun's closing summary
    shard = next((tmp_path / "r").glob("shard-*.jsonl"))
    assert json.loads(shard.read_text().splitlines()[0])["status"] == "failed"


@pytest.mark.gpu
@pytest.mark.parametrize("all_gather", [False, True])
def test_fsdp2_float8_on_two_gpus_tracks_bf16(tmp_path, all_gather):
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, {torch.cuda.device_count()} visible")
    common = ["workload=train", "model=tiny", "device=cuda", "workload.train.steps=60",
              "workload.train.eval_every=30", "workload.train.nproc=2", "backend=torchao"]
    bf16 = _run(tmp_path / "bf16", ["format=bf16", "scaling=none"], base=common)
    fp8 = _run(tmp_path / "fp8", ["format=hybrid", "scaling=current",
                                  f"workload.train.fp8_all_gather={str(all_gather).lower()}"], base=common)
    assert bf16.status == "ok" and fp8.status == "ok", (bf16.reason, fp8.reason)
    assert fp8.case_id.endswith(".torchao") and ("fp8ag" in fp8.case_id) == all_gather
    assert fp8.metric("loss_final") == pytest.approx(bf16.metric("loss_final"), rel=0.05)
    assert len(fp8.samples["peak_mem_rank_bytes"]) == 2 and fp8.metric("tokens_per_s") > 0


def test_a_rank_abort_reason_names_its_cause_and_the_root_rank():
    """The shape of torchrun's output when a gloo rank aborts (SIGABRT): the rank's C++ terminate message, a
    Python traceback of torchrun's own, then its summary; the reason keeps the first (with its what()) and the
    summary's rank and exit code, not the ChildFailedError lines or the source line."""
    from fp8bench.workloads.train.distributed import failure_lines

    output = "\n".join([
        "terminate called after throwing an instance of 'gloo::IoException'",
        "  what():  [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:45327",
        "Traceback (most recent call last):",
        '    raise ChildFailedError(',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "fp8bench.workloads.train.rank FAILED",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-12-03_15:01:02",
        "  host      : ci",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : -6 (pid: 29154)",
        "  error_file: <N/A>",
        "  traceback : Signal 6 (SIGABRT) received by PID 29154",
        "============================================================",
    ])
    reason = failure_lines(output)
    assert reason.splitlines() == [
        "terminate called after throwing an instance of 'gloo::IoException'",
        "what():  [gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:45327",
        "rank      : 1 (local_rank: 1)",
        "exitcode  : -6 (pid: 29154)",
    ]
