"""The shapes and recipes the kernel benchmarks time (`scripts/kernel_bench.py`'s tuning table and
`scripts/recipe_bench.py`'s recipe line), defined once so that every file they write measures the same set."""

from __future__ import annotations

from fp8bench.backends import Recipe, make_recipe

GEMMS = {  # name: (M, N, K), tokens 8192
    "8192^3": (8192, 8192, 8192),
    "llama2-7b fprop_qkv": (8192, 12288, 4096), "llama2-7b fprop_o": (8192, 4096, 4096),
    "llama2-7b fprop_gate_up": (8192, 22016, 4096), "llama2-7b fprop_down": (8192, 4096, 11008),
    "llama2-7b dgrad_gate_up": (8192, 4096, 22016),
    "llama3-70b fprop_qkv": (8192, 10240, 8192), "llama3-70b fprop_o": (8192, 8192, 8192),
    "llama3-70b fprop_gate_up": (8192, 57344, 8192), "llama3-70b fprop_down": (8192, 8192, 28672),
    "llama3-70b dgrad_gate_up": (8192, 8192, 57344),
}
"""The GEMM line's shapes: 8192³ and the fprop GEMMs (and the largest dgrad) of Llama-2-7B and Llama-3-70B at
8192 tokens."""


def e4m3_recipe(backend: str, scaling: str) -> Recipe:
    """E4M3 at `scaling` on `backend`, every knob at its default: the recipe the benchmarks time."""
    return make_recipe(backend, "e4m3", scaling)


def wgrad_shapes() -> dict[str, tuple[int, int, int]]:
    """dW = dYᵀ·X as the gemm workload shapes it (M output features, N input features, K tokens): every linear
    of Llama-2-7B at 8192 tokens (batch 2 × 4096), gpt-125m's qkv at 4096."""
    from fp8bench.config.compose import expand
    from fp8bench.models.shapes import shapes

    out = {}
    for model, tokens, linears in (("llama2-7b", 8192, "[qkv,o,gate_up,down]"), ("gpt-125m", 4096, "[qkv]")):
        [point], _ = expand(["workload=gemm", f"model={model}", "workload.roles=[wgrad]",
                             f"workload.tokens={tokens}", f"workload.linears={linears}"])
        out.update({f"{model} {name}": (s["m"], s["n"], s["k"]) for name, s in shapes(point)})
    return out
