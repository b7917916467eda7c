"""`mlp`: the MLP half of a transformer block forward + backward at (batch, seq) of the model preset.

RMSNorm, the fused gate/up linear, SwiGLU, the down linear, no residual: what Transformer Engine's
`LayerNormMLP` computes in fused kernels (the norm fused with fc1's input cast, the activation with fc2's),
against the plain-torch LlamaMLP whose linears the other backends swap. Scored like `layer`: TE's module
against our FP32 LlamaMLP carrying its weights (MLP_REFERENCE_MIN_DB), the others against their own BF16
module.
"""

from __future__ import annotations

from fp8bench.backends.base import MLP_REFERENCE_MIN_DB
from fp8bench.models.block import mlp_flops
from fp8bench.workloads.common import CaseInput, CaseOutput, Prepared, run_alone
from fp8bench.workloads.layer import prepare_module


def prepare(case: CaseInput) -> Prepared:
    flops = mlp_flops(case.config.model, case.shape["batch"], case.shape["seq"])
    return prepare_module(case, case.backend.mlp, flops, MLP_REFERENCE_MIN_DB)


def run(case: CaseInput) -> CaseOutput:
    return run_alone(case, prepare)
