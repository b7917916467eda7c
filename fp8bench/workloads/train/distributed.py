"""Distributed `train` (`workload.train.nproc` > 1): the one-process run's model, corpus, schedule, settings
and record, on `nproc` processes launched with torchrun (NCCL, one GPU each; gloo on a CPU). Each rank runs
the shared loop (fp8bench.workloads.train.loop.fit) with an Engine that wraps the model and averages over ranks.

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
import os
import pickle
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from fp8bench.backends import get_backend
from fp8bench.backends.base import is_compiled
from fp8bench.core.measure import reset_peak_memory
from fp8bench.core.records import Metric
from fp8bench.workloads.common import CaseInput, CaseOutput, Diverged
from fp8bench.workloads.train.loop import Engine, World, fit, load_data, master_dtype, new_decoder, optimizer


def distributed_verdict(config, device) -> tuple[bool, str]:
    """Can this machine run the distributed point (nproc > 1)? What each backend runs distributed is its own
    declaration (`Backend.strategies`, `supports_train`); this is what every distributed run needs."""
    t, fmt = config.workload.train, config.format.name
    if t.nproc == 1:
        return True, ""
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
        payload.write_bytes(pickle.dumps({"config": case.config, "shape_name": case.shape_name, "shape": case.shape,
                                          "recipe": case.recipe, "backend": case.backend.name,
                                          "device": case.device.type, "work_dir": case.work_dir,
                                          "result": str(result)}))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={t.nproc}",
               "-m", "fp8bench.workloads.train.rank", str(payload)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                              preexec_fn=die_with_parent)  # resolved before the fork
        if proc.returncode != 0 or not result.is_file():
            raise RuntimeError(f"torchrun with {t.nproc} ranks exited {proc.returncode}: "
                               f"{failure_lines(proc.stderr or proc.stdout)}")
        res = json.loads(result.read_text())
    out = CaseOutput([Metric.of(k, v) for k, v in res["metrics"].items()], res["samples"],
                     ran=case.backend.kernels("train", case.recipe, case.device), compiled=res.get("compiled", False))
    if res.get("diverged") is not None:
        raise Diverged(f"{res['diverged']} (the mean over {t.nproc} ranks)", out)
    return out


_CAUSE = re.compile(r"(Error|Exception|terminate called|what\(\)|Signal \d+|signal \d+)")
_RANK = re.compile(r"^\[rank\d+\]:\s?")
_ROOT = re.compile(r"^\s*(rank|exitcode)\s*:")


def failure_lines(output: str, causes: int = 3, tail: int = 4) -> str:
    """What a failed torchrun printed that says why, short enough for a record's reason: the ranks' own error
    lines (their exceptions, a C++ `terminate called ... what(): ...` before a SIGABRT), each message once
    whichever rank printed it, which torchrun's closing summary pushes out of a plain tail; then that summary's
    root cause (rank and exit code). Traceback source lines and torchrun's own ChildFailedError are left out."""
    lines = [line for line in output.strip().splitlines() if line.strip()]
    seen, cause = set(), []
    for line in lines[:-tail]:
        message = _RANK.sub("", line)
        source = message[:1].isspace() and "what()" not in message  # a traceback's source line, not a message
        if not _CAUSE.search(message) or source or "ChildFailedError" in message or message in seen:
            continue
        seen.add(message)
        cause.append(line.strip())
    # the summary's root cause: which rank, with what exit code or signal (else its last lines)
    root = [line.strip() for line in lines[-12:] if _ROOT.match(line)] or lines[-tail:]
    return "\n".join([*cause[-causes:], *root])


def _parent_death_signal():
    """prctl(PR_SET_PDEATHSIG, SIGKILL) as a callable, looked up here in the parent: the child between fork and
    exec runs only what was resolved before the fork (Linux; None elsewhere)."""
    try:
        import ctypes

        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGKILL)


die_with_parent = _parent_death_signal()
"""Run in a child (preexec_fn, or first thing in a rank): the kernel kills it when its parent dies. torchrun
starts its ranks in sessions of their own: without this, a sweep killed mid-case leaves its ranks training on,
and they would finish and remove the checkpoint a resumed run is about to read."""


# --------------------------------------------------------------------------- ranks

class RankWorld(World):
    """Losses and validation averaged over ranks, step times the slowest rank's, memory the largest's."""

    def __init__(self, world: int, device: torch.device) -> None:
        self.size, self.device = world, device  # World.size: how many processes share a step

    def mean(self, t: torch.Tensor) -> torch.Tensor:
        t = t.detach().float().clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t / self.size

    def slowest(self, values: list[float]) -> list[float]:
        if not values:  # every rank has the same count: none of them reduces an empty tensor
            return []
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # every rank timed the same steps
        return t.tolist()

    def largest(self, value: float) -> float:
        return max(self.gather(value))

    def gather(self, value: float) -> list[float]:
        t = torch.tensor([float(value)], dtype=torch.float64, device=self.device)
        out = [torch.zeros_like(t) for _ in range(self.size)]
        dist.all_gather(out, t)
        return [float(x) for x in out]


def _engine(case: CaseInput, rank: int, world: RankWorld) -> Engine:
    """The model under the strategy. The backend prepares it exactly as for one process; then DDP wraps it,
    or FSDP2 shards it (parameters gathered in BF16, gradients reduced in FP32)."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    t, dev, recipe, backend = case.config.workload.train, case.device, case.recipe, case.backend
    batch = case.shape["batch"]
    mixed = master_dtype(case) == torch.float32
    after_step = lambda: None  # noqa: E731
    if t.strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel

        setup = backend.prepare_training(new_decoder(case), recipe)
        model = DistributedDataParallel(setup.model, device_ids=[dev.index] if dev.type == "cuda" else None)
        autocast = mixed
    else:
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        if t.fp8_all_gather:  # torchao tensorwise (TorchaoBackend.supports_train): scales precomputed after each step
            from torchao.float8 import precompute_float8_dynamic_scale_for_fsdp

            setup = backend.prepare_training(new_decoder(case), recipe, fp8_all_gather=True)
            after_step = lambda: precompute_float8_dynamic_scale_for_fsdp(setup.model)  # noqa: E731
        else:
            setup = backend.prepare_training(new_decoder(case), recipe)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in setup.model.blocks:
            fully_shard(block, mp_policy=mp)
        model = fully_shard(setup.model, mp_policy=mp)
        autocast = False  # the policy computes in BF16 from FP32 (or BF16) master shards
    opt = optimizer(model, t, foreach=True)
    full = StateDictOptions(full_state_dict=True, cpu_offload=True)

    def state() -> dict:  # collective: every rank calls it, rank 0 writes it
        return {"model": get_model_state_dict(model, options=full),
                "optimizer": get_optimizer_state_dict(model, opt, options=full)}

    def load_state(s: dict) -> None:
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, s["model"], options=options)
        set_optimizer_state_dict(model, opt, s["optimizer"], options=options)

    rows = slice(rank * batch // world.size, (rank + 1) * batch // world.size)
    return Engine(model, opt, autocast=autocast, forward_context=setup.forward_context, after_step=after_step,
                  rows=rows, world=world, census=False, weights_and_state=False, state=state,
                  load_state=load_state, writes_checkpoint=rank == 0, coverage_model=setup.model,
                  compiled=is_compiled(setup.model))


def train_rank(p: dict, rank: int, world_size: int, dev: torch.device) -> dict:
    """One rank's part of the case in payload `p`: the shared loop on this rank's engine."""
    case = CaseInput(config=p["config"], shape_name=p["shape_name"], shape=p["shape"], recipe=p["recipe"],
                     backend=get_backend(p["backend"]), device=dev, work_dir=p["work_dir"])
    world = RankWorld(world_size, dev)
    data = load_data(case.config.workload.train, case.shape, dev)
    engine = _engine(case, rank, world)  # built, wrapped and sharded before the peak is reset, as in one process:
    reset_peak_memory(dev)  # under FSDP2 each rank first builds the whole model, which training never holds
    diverged = None
    try:
        out = fit(case, engine, data)
    except Diverged as e:
        out, diverged = e.output, str(e)
    tokens_per_s = next((m.value for m in out.metrics if m.name == "tokens_per_s"), None)
    if tokens_per_s is not None:
        out.metrics.append(Metric.of("tokens_per_s_per_rank", tokens_per_s / world_size))
    if dev.type == "cuda":
        out.samples["peak_mem_rank_bytes"] = world.gather(torch.cuda.max_memory_allocated(dev))
    return {"metrics": {m.name: m.value for m in out.metrics}, "samples": out.samples, "diverged": diverged,
            "compiled": out.compiled}
