"""Builders the kernel tests share: the inputs (`data`: BF16 spread over six decades, with exact zeros), the
shapes for the interpreter and for a GPU, blockwise GEMM operands, and kernels compiled for sm_90 in a process
of their own. On CPU the kernels run under Triton's interpreter (small shapes); on a GPU compiled, at real
shapes (`pytest -m gpu`)."""

import os

import pytest
import torch

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
MODULES = ("_fp8", "quantize_current", "quantize_blockwise", "quantize_blockwise_gluon", "quantize_mx", "gemm_blockwise",
           "gemm_blockwise_gluon", "gemm_blockwise_wgrad", "tensor_core_load")


def bits(t):
    return t.view(torch.uint8)


def data(m, n, seed=0, spread=True):
    """BF16 with magnitudes over six decades along the columns (scales differ per block), plus exact zeros."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, n, generator=g)
    if spread:
        x = x * torch.logspace(-3, 3, n)
    x[0, :5] = 0.0
    return x.bfloat16().to(DEV)


SMALL = [(200, 300), (128, 256), (1, 129)]
LARGE = [(8192, 8192), (8192, 4096)]
SHAPES = [pytest.param(*s, marks=pytest.mark.gpu) for s in LARGE] if CUDA else SMALL
GEMMS = ([pytest.param(8192, 8192, 8192, marks=pytest.mark.gpu), pytest.param(8192, 4096, 11008, marks=pytest.mark.gpu)]
         if CUDA else [(64, 128, 256), (100, 136, 304)])


def gemm_operands(k, m, n, kk):
    """A [m, kk] with 1x128 scales and B [n, kk] with 128x128 scales, quantized from spread-out data: scales
    over six decades along K, so each group's scale must land on its own product."""
    a, sa = k.quantize_blockwise.quantize_blockwise(data(m, kk, 1), (1, 128))
    b, sb = k.quantize_blockwise.quantize_blockwise(data(n, kk, 2), (128, 128))
    return a, sa, b, sb


def _compiled_elsewhere(script: str, stdin: str = "") -> dict:
    """{name: {"ptx", "shared"}} for the kernels `script` compiles into its dict `builds` ({name: compiled
    kernel}), compiled for sm_90 in a process of its own without TRITON_INTERPRET: after the interpreter has run
    kernels in this one, Triton's language functions still hold the interpreter's builder."""
    import json
    import subprocess
    import sys

    script += ("\nimport json as _json\nprint(_json.dumps({name: {'ptx': kernel.asm['ptx'], 'shared': "
               "kernel.metadata.shared} for name, kernel in builds.items()}))")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", script], input=stdin, capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _compiled_for_sm90(script: str) -> dict:
    """`_compiled_elsewhere(script)`, each kernel also assembled here by ptxas (`assemble_sm90`; "ptxas": its
    stderr, "rc")."""
    from fp8bench_kernels._sm90 import assemble_sm90

    builds = _compiled_elsewhere(script)
    for build in builds.values():
        assembled = assemble_sm90(build["ptx"])
        build.update(ptxas=assembled.stderr, rc=assembled.returncode)
    return builds
