"""`train`: a Llama-style decoder trained for N steps on real text, under one recipe.

Loss per step, validation loss, step time, tokens/s, peak memory and its breakdown go into the record; the
verdict against the BF16 seeds (fp8bench.analysis.parity) is derived at ingest, where every case of the run
is known.

Mixed precision by default: FP32 master weights and AdamW state, forward under torch.autocast(bf16), the
recipe's FP8 (or the emulator's fake-quant) inside the blocks' linears. Checkpoints (every
`train.ckpt_every` steps) hold model, optimiser, loss-scaler and curve state; batches are a function of
(seed, step), so a resumed run continues exactly where the killed one would have gone.

Modes, all on the one loop of `loop.py`: one process (`local`), torchrun ranks under DDP or FSDP2
(`distributed`, `workload.train.nproc` > 1), and the frameworks' loops (`frameworks`: Lightning, Accelerate).
"""

from __future__ import annotations

from fp8bench.workloads.common import CaseInput, CaseOutput
from fp8bench.workloads.train import distributed, frameworks, local


def run(case: CaseInput) -> CaseOutput:
    if case.config.workload.train.nproc > 1:
        return distributed.run(case)
    if case.backend.loop != "fp8bench":
        return frameworks.run(case)
    return local.run(case)
