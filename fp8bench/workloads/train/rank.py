"""A torchrun rank of a distributed `train` case (`python -m fp8bench.workloads.train.rank PAYLOAD`): reads the
case the sweep pickled, joins the process group, trains (fp8bench.workloads.train.distributed) and, on rank
0, writes the result file the sweep turns into the case's record. A module of its own, so that `-m` does not
run a module the package has already imported."""

from __future__ import annotations

import json
import os
import pickle
import sys
from pathlib import Path

import torch

from fp8bench.workloads.train.distributed import die_with_parent, train_rank


def main(argv: list[str]) -> int:
    import torch.distributed as dist

    if die_with_parent is not None:
        die_with_parent()
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
        res = train_rank(p, rank, world, dev)
        if rank == 0:
            Path(p["result"]).write_text(json.dumps(res))
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
