"""Where does a gpt-125m training step under the `triton` backend's blockwise recipe spend its host time? The
`train-bw2` run (results/h200-recipe-blockwise) stepped in 118 ms with 15 ms of GPU work, its BF16 twin in
35-48 ms with 12.6 ms: both wait on the CPU, ours by ~75 ms more per step.

The model, recipe and optimizer are the `train` workload's (`sweep=hopper-train-blockwise`: gpt-125m, batch 8 x
512, FP32 master weights under BF16 autocast, AdamW). Per recipe (BF16 twin, then e4m3/blockwise): the wall time
of a synchronised step, and the host time of the same step without the sync (Python's own time to enqueue
it), medians over `--steps`; then cProfile over `--profile-steps` steps of the FP8 recipe, its top functions
by own time and by cumulative time, and how many of the Gluon GEMMs' operand descriptors those steps found
kept and how many they built.

Usage on the GPU box: python3 research/train_host_profile.py [--steps 30] [--profile-steps 10] [--top 30]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import torch

from fp8bench.backends import get_backend
from fp8bench.config.compose import expand
from fp8bench.models.decoder import LlamaDecoder, lm_loss
from fp8bench.run.plan import plan
from fp8bench.workloads.train.loop import optimizer

OVERRIDES = ["workload=train", "model=gpt-125m", "backend=triton", "workload.batch=8", "workload.seq=512"]
SCALING = {"bf16": "none", "e4m3": "blockwise"}


def trainer(fmt: str):
    """(one training step, the case's recipe) for format `fmt` at gpt-125m, as the train workload builds it."""
    [point], _ = expand([*OVERRIDES, f"format={fmt}", f"scaling={SCALING[fmt]}"])
    case = plan([point])[0]  # BF16: the first of its seeds
    torch.manual_seed(0)
    model = LlamaDecoder(point.model, 256, device="cuda")
    model = get_backend("triton").prepare_training(model, case.recipe).model
    opt = optimizer(model, point.workload.train, fused=True)
    tokens = torch.randint(0, 256, (point.workload.batch, point.workload.seq + 1), device="cuda")

    def step() -> None:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens[:, :-1])
        lm_loss(logits, tokens[:, 1:]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step, case


def times(step, steps: int) -> tuple[float, float]:
    """(median wall ms of a synchronised step, median host ms to enqueue one)."""
    wall, host = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append((t1 - t0) * 1e3)
        wall.append((t2 - t0) * 1e3)
    return statistics.median(wall), statistics.median(host)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--profile-steps", type=int, default=10)
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()
    for fmt in ("bf16", "e4m3"):
        step, case = trainer(fmt)
        for _ in range(5):  # compile, tune, settle the allocator
            step()
        wall, host = times(step, args.steps)
        print(f"{case.case_id}: step {wall:.1f} ms wall, {host:.1f} ms host to enqueue (median of {args.steps})",
              flush=True)
    from fp8bench_kernels.gemm_blockwise_gluon import _cached_descriptor

    before = _cached_descriptor.cache_info()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.profile_steps):
        step()
    torch.cuda.synchronize()
    prof.disable()
    after = _cached_descriptor.cache_info()
    print(f"GEMM operand descriptors over {args.profile_steps} FP8 steps: {after.hits - before.hits} kept, "
          f"{after.misses - before.misses} built (cache of {after.maxsize}, {after.currsize} held)", flush=True)
    for key in ("tottime", "cumulative"):
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(args.top)
        print(f"--- cProfile of {args.profile_steps} FP8 steps, by {key} ---\n{out.getvalue()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
