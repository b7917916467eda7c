"""Compiling a kernel for Hopper (sm_90) on a machine without a GPU, and assembling its PTX with ptxas: how CI
checks what the compiled kernels look like (registers, spills, serialized wgmmas) where nothing can run them."""

from __future__ import annotations

import subprocess

import triton


def compile_cast_sm90(fn, signature: dict, constants: dict, num_warps: int, gluon: bool = False, **options):
    """A cast kernel (`fn`: a Triton or, `gluon`, a Gluon JIT function) compiled for sm_90 without a GPU
    (tests/kernels/ run ptxas on it), specialized as a launch specializes it: the unit strides in `constants`
    are constexpr 1 and every other integer and pointer is 16-divisible (Triton's specializations). Left
    unspecialized, its loads and stores would be 1-2 bytes wide and ptxas would report about twice the
    registers of the kernel a launch runs."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from triton.experimental.gluon._runtime import GluonASTSource

    signature = {**signature, **dict.fromkeys(constants, "constexpr")}
    aligned = [name for name, kind in signature.items() if kind != "constexpr"]
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    source = (GluonASTSource if gluon else ASTSource)(fn, signature, constants, attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps, **options})


def assemble_sm90(ptx: str) -> subprocess.CompletedProcess:
    """ptxas's verbose assembly of `ptx` for sm_90a with the ptxas Triton uses (a CompletedProcess: registers,
    spills and warnings on its stderr). A launch's register cap travels in the PTX (`.maxnreg`)."""
    from triton.backends.nvidia.compiler import get_ptxas

    return subprocess.run([get_ptxas(90).path, "-arch=sm_90a", "-v", "-o", "/dev/null", "-"], input=ptx,
                          capture_output=True, text=True)
