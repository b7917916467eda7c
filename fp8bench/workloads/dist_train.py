"""Distributed `train` (`workload.train.nproc` > 1): the same model, corpus, schedule and metrics as
fp8bench.workloads.train, on `nproc` processes launched with torchrun (NCCL, one GPU each; gloo on a CPU).

- `fsdp2`: `fully_shard` on every block and on the root, parameters gathered in BF16 and gradients reduced in
  FP32 (MixedPrecisionPolicy: torchtitan's FSDP2 recipe). With torchao float8 the blocks' linears are converted
  first (and compiled per block with `backend.compile`); `workload.train.fp8_all_gather` all-gathers the
  sharded weights already cast to FP8 (torchao's `enable_fsdp_float8_all_gather`, with
  `precompute_float8_dynamic_scale_for_fsdp` after each optimizer step, as torchao prescribes).
- `ddp`: DistributedDataParallel around the backend's prepared model (TE: te.Linear under te.autocast).

Each step's global batch is the one-GPU run's own (the same windows of the same corpus, `workload.batch`
rows), split across ranks, and validation splits each batch the same way and averages over ranks: the loss
curve is directly comparable with the one-GPU BF16 band (fp8bench.analysis.parity judges it against that band).

The parent (`run`, inside the sweep process) launches torchrun and turns rank 0's result file into the case's
record; a rank that fails fails the case, never the sweep.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from fp8bench.core.records import Metric
from fp8bench.workloads.common import CaseInput, CaseOutput, Diverged

STRATEGIES = {"fsdp2": ("torch", "torchao"), "ddp": ("torch", "te")}
"""Which backends each strategy runs: FP8 through torchao under FSDP2, through TE under DDP; the torch backend
is the BF16 baseline of both."""


def distributed_verdict(config, device) -> tuple[bool, str]:
    """Can this machine run the distributed point (nproc > 1, or an FSDP2 option)? The planner records the
    reason when not."""
    t, b, fmt = config.workload.train, config.backend.name, config.format.name
    if t.nproc == 1:
        return False, "fp8_all_gather is an FSDP2 option: it needs workload.train.nproc > 1"
    if b not in STRATEGIES[t.strategy]:
        return False, f"strategy={t.strategy} runs backends {list(STRATEGIES[t.strategy])}, not {b}"
    if b == "torch" and fmt != "bf16":
        return False, "distributed torch-backend runs are the BF16 baseline; FP8 runs through torchao or te"
    if t.fp8_all_gather and not (b == "torchao" and t.strategy == "fsdp2" and fmt != "bf16"
                                 and config.scaling.name == "current"):
        return False, "fp8_all_gather is torchao tensorwise float8 (hybrid/current) under FSDP2 only"
    if config.workload.batch % t.nproc:
        return False, f"workload.batch={config.workload.batch} must split evenly over nproc={t.nproc} ranks"
    if device.is_cuda:
        have = torch.cuda.device_count()
        if have < t.nproc:
            return False, f"nproc={t.nproc} needs {t.nproc} GPUs, one per rank; {have} visible here"
    elif fmt != "bf16":
        return False, "distributed FP8 needs GPUs (gloo on a CPU runs the BF16 baseline only)"
    return True, ""


# --------------------------------------------------------------------------- parent: launch and collect

def run(case: CaseInput) -> CaseOutput:
    t = case.config.workload.train
    with tempfile.TemporaryDirectory(prefix="fp8bench-dist-") as tmp:
        payload, result = Path(tmp) / "case.pkl", Path(tmp) / "result.json"
        payload.write_bytes(pickle.dumps({"config": case.config, "shape": case.shape, "recipe": case.recipe,
                                          "backend": case.backend.name, "device": case.device.type,
                                          "result": str(result)}))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={t.nproc}",
               "-m", "fp8bench.workloads.dist_train", str(payload)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0 or not result.is_file():
            tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-12:])
            raise RuntimeError(f"torchrun with {t.nproc} ranks exited {proc.returncode}: {tail}")
        res = json.loads(result.read_text())
    out = CaseOutput([Metric.of(k, v) for k, v in res["metrics"].items()], res["samples"])
    if res.get("diverged_at") is not None:
        raise Diverged(f"loss became non-finite at step {res['diverged_at']} (all ranks agree)", out)
    return out


# --------------------------------------------------------------------------- ranks

def _prepare(model, p: dict, dev: torch.device):
    """The model under the strategy: (model, forward context, autocast?, after-step hook). The backend
    prepares it exactly as for one GPU; then DDP wraps it, or FSDP2 shards it."""
    from fp8bench.backends import get_backend

    t, recipe, backend = p["config"].workload.train, p["recipe"], get_backend(p["backend"])
    if t.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        setup = backend.prepare_training(model, recipe)
        ddp = DistributedDataParallel(setup.model, device_ids=[dev.index] if dev.type == "cuda" else None)
        return ddp, setup.forward_context, True, lambda: None
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    after_step = lambda: None  # noqa: E731
    if t.fp8_all_gather:  # torchao tensorwise (distributed_verdict): scales precomputed after each step
        from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

        setup = backend.prepare_training(model, recipe, fp8_all_gather=True)
        after_step = lambda: precompute_float8_dynamic_scale_for_fsdp(setup.model)  # noqa: E731
    else:
        setup = backend.prepare_training(model, recipe)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in setup.model.blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(setup.model, mp_policy=mp)
    return setup.model, setup.forward_context, False, after_step


def _train(p: dict, rank: int, world: int, dev: torch.device) -> dict:
    import torch.distributed as dist

    from fp8bench.models import corpus as corpus_mod
    from fp8bench.models.decoder import LlamaDecoder, lm_loss, model_flops
    from fp8bench.workloads.train import (
        FINITE_CHECK_EVERY,
        StepTimer,
        load_data,
        lr_at,
        optimizer,
        steady_steps,
    )

    config, shape = p["config"], p["shape"]
    t = config.workload.train
    batch, seq, steps, seed = shape["batch"], shape["seq"], shape["steps"], shape["seed"]
    rows = slice(rank * batch // world, (rank + 1) * batch // world)  # this rank's share of the global batch
    data = load_data(t, shape, dev)
    val = [b[rows] for b in data.val]

    torch.manual_seed(seed)  # every rank builds the same initial weights (FSDP2 then keeps its shard)
    model, fwd_ctx, autocast, after_step = _prepare(LlamaDecoder(config.model, corpus_mod.VOCAB, device=dev), p,
                                                    dev)
    opt = optimizer(model, t, foreach=True)

    def forward_loss(tok: torch.Tensor) -> torch.Tensor:
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=autocast), fwd_ctx():
            logits = model(tok[:, :-1])
        return lm_loss(logits, tok[:, 1:])

    def evaluate() -> float:
        with torch.no_grad():
            loss = torch.stack([forward_loss(b).float() for b in val]).mean()
        dist.all_reduce(loss, op=dist.ReduceOp.SUM)
        return float(loss) / world

    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    val_steps, val_losses, losses = [0], [evaluate()], []
    timer, diverged_at = StepTimer(dev), None
    for step in range(steps):
        tok = data.batch_at(step)[rows]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, t)
        begin = timer.start()
        loss = forward_loss(tok)
        loss.backward()
        if t.grad_clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.grad_clip, foreach=True)
        opt.step()
        after_step()
        opt.zero_grad(set_to_none=True)
        timer.stop(begin)
        losses.append(loss.detach().float())
        if (step + 1) % FINITE_CHECK_EVERY == 0 or step + 1 == steps:
            flag = torch.tensor([0.0 if bool(torch.isfinite(torch.stack(losses[-FINITE_CHECK_EVERY:])).all())
                                 else 1.0], device=dev)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            if flag.item():
                diverged_at = step
                break
        if (step + 1) % t.eval_every == 0 or step + 1 == steps:
            val_steps.append(step + 1)
            val_losses.append(evaluate())
    step_ms = torch.tensor(timer.drain(), device=dev)
    curve = torch.stack(losses)
    dist.all_reduce(curve, op=dist.ReduceOp.SUM)
    gathered = [torch.zeros_like(step_ms) for _ in range(world)]
    dist.all_gather(gathered, step_ms)
    peak = torch.tensor([float(torch.cuda.max_memory_allocated(dev)) if dev.type == "cuda" else 0.0], device=dev)
    peaks = [torch.zeros_like(peak) for _ in range(world)]
    dist.all_gather(peaks, peak)
    # a step ends when its slowest rank does
    timed = steady_steps(torch.stack(gathered).max(dim=0).values.tolist(), config.measure.warmup)
    median_ms = statistics.median(timed)
    tokens = batch * seq
    metrics = {"time_ms": median_ms, "tokens_per_s": tokens / (median_ms / 1e3),
               "tokens_per_s_per_rank": tokens / world / (median_ms / 1e3),
               "tflops": model_flops(config.model, shape["vocab"], batch, seq) / median_ms / 1e9,
               "loss_initial": val_losses[0], "loss_final": val_losses[-1]}
    if dev.type == "cuda":
        metrics["peak_mem_bytes"] = max(float(x) for x in peaks)
    if not all(math.isfinite(v) for v in (val_losses[-1],)):
        diverged_at = diverged_at if diverged_at is not None else len(losses) - 1
    samples = {"loss": [v / world for v in curve.tolist()], "val_step": [float(s) for s in val_steps],
               "val_loss": val_losses, "time_ms": timed, "peak_mem_rank_bytes": [float(x) for x in peaks]}
    return {"metrics": metrics, "samples": samples, "diverged_at": diverged_at}


def main(argv: list[str]) -> int:
    import torch.distributed as dist

    p = pickle.loads(Path(argv[0]).read_bytes())
    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if p["device"] == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    try:
        res = _train(p, rank, world, dev)
        if rank == 0:
            Path(p["result"]).write_text(json.dumps(res))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
