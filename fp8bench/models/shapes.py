"""The shapes of every workload, from config alone (no torch import): what a sweep point expands to (the case
of each shape, its identity and id: fp8bench.cases)."""

from __future__ import annotations

from fp8bench.config.schema import Config
from fp8bench.core.types import FP8_ALL_GATHER_TAG, GemmRole


def role_shape(role: GemmRole, tokens: int, in_f: int, out_f: int) -> tuple[int, int, int]:
    """(M, N, K) of one GEMM of Y[tokens, out] = X[tokens, in] · W[out, in]ᵀ."""
    return {GemmRole.FPROP: (tokens, out_f, in_f), GemmRole.DGRAD: (tokens, in_f, out_f),
            GemmRole.WGRAD: (out_f, in_f, tokens)}[role]


def gemm(config: Config) -> list[tuple[str, dict]]:
    out = []
    for lin in config.workload.linears:
        in_f, out_f = config.model.linear_dims(lin)
        for role in config.workload.roles:
            m, n, k = role_shape(GemmRole(role), config.workload.tokens, in_f, out_f)
            out.append((f"{role}_{lin}", {"m": m, "n": n, "k": k, "role": role, "linear": lin}))
    for m, n, k in config.workload.shapes:
        out.append((f"{m}x{n}x{k}", {"m": m, "n": n, "k": k, "role": "fprop", "linear": None}))
    return out


def quantize(config: Config) -> list[tuple[str, dict]]:
    m = config.model
    rows = {"activation": (config.workload.tokens, m.hidden), "weight": m.linear_dims("gate_up")[::-1]}
    return [(t, {"rows": rows[t][0], "cols": rows[t][1], "tensor": t}) for t in config.workload.tensors]


def linear(config: Config) -> list[tuple[str, dict]]:
    """The model's linears at `tokens`, plus `workload.shapes` entries read as [tokens, out, in] (M, N, K)."""
    out = []
    for lin in config.workload.linears:
        in_f, out_f = config.model.linear_dims(lin)
        out.append((lin, {"tokens": config.workload.tokens, "in": in_f, "out": out_f}))
    for m, n, k in config.workload.shapes:
        out.append((f"{k}to{n}x{m}", {"tokens": m, "in": k, "out": n}))
    return out


def layer(config: Config) -> list[tuple[str, dict]]:
    w = config.workload
    return [(f"b{w.batch}s{w.seq}", {"batch": w.batch, "seq": w.seq, "hidden": config.model.hidden})]


TRAIN_VOCAB = 256
"""The `train` workload's byte-level vocabulary (fp8bench.models.corpus); defined here, where case ids are
built without torch."""


def train(config: Config) -> list[tuple[str, dict]]:
    """One training run per seed: BF16 points train `train.bf16_seeds` seeds (the band FP8 is judged
    against), other formats `train.fp8_seeds` (parity is a pass rate over them); a distributed run one."""
    w, t = config.workload, config.workload.train
    # the BF16 band comes from one-GPU runs; a distributed BF16 run is one seed, for its speed
    n_seeds = (t.bf16_seeds if config.format.name == "bf16" else t.fp8_seeds) if t.nproc == 1 else 1
    out = []
    dist = ""
    if t.nproc > 1 or t.fp8_all_gather:  # e.g. ".fsdp2x2fp8ag": a distributed run of the same global batch
        dist = f".{t.strategy}x{t.nproc}" + (FP8_ALL_GATHER_TAG if t.fp8_all_gather else "")
    for seed in range(config.seed, config.seed + n_seeds):
        shape = {"batch": w.batch, "seq": w.seq, "steps": t.steps, "seed": seed, "vocab": TRAIN_VOCAB,
                 "tokens_per_step": w.batch * w.seq}
        if t.nproc > 1:
            shape |= {"nproc": t.nproc, "strategy": t.strategy, "fp8_all_gather": t.fp8_all_gather}
        out.append((f"b{w.batch}s{w.seq}n{t.steps}.seed{seed}{dist}", shape))
    return out


def shapes(config: Config) -> list[tuple[str, dict]]:
    """(shape name, shape) of every case of one sweep point."""
    return {"gemm": gemm, "quantize": quantize, "linear": linear, "mlp": layer, "layer": layer,
            "train": train}[config.workload.name](config)
