"""What the Gluon two-layout casts (`kernels/quantize_blockwise_gluon.py`) cost per thread in instructions,
compiled for sm_90 without a GPU, at one or more git revisions of `kernels/`.

The activation cast ran at ~60% of a same-bytes copy on the H200 where the weight cast, which moves the same
bytes through the same layouts, ran at ~88%; Nsight Compute's top stall was a fixed-latency dependency. This
counts, per kernel: the SASS instructions (static, from `cuobjdump -sass`, the slow paths of divisions
included), the float64 FMAs (DFMA), the divisions in the PTX (float32 `div.rn.f32`, float64 `div.rn.f64`),
`min.f32` (the ±448 clamp), and the registers and spills ptxas (`assemble_sm90`) reports with and without the
launch's cap of 128, and at a cap of 80 (the most that lets three 8-warp programs share an SM).

Each revision's `kernels/` is taken from git (`git archive`) into a temporary package, so the counts compare
revisions under one Triton; run it with the Triton the GPU box has (3.6) for its figures.

Usage (repository root): python3 research/cast_sass.py REV [REV...] > OUT.txt
"""

from __future__ import annotations

import collections
import importlib.util
import io
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import triton
from fp8bench_kernels.quantize_blockwise import assemble_sm90  # this checkout's, for every revision

NVIDIA_BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def kernels_at(rev: str, into: Path):
    """`kernels/` at git revision `rev` imported as a package of its own (`casts_<rev>`)."""
    archive = subprocess.run(["git", "archive", rev, "kernels"], capture_output=True, check=True).stdout
    tarfile.open(fileobj=io.BytesIO(archive)).extractall(into / rev, filter="data")
    package = into / rev / "kernels"
    name = "casts_" + re.sub(r"\W", "_", rev)
    spec = importlib.util.spec_from_file_location(name, package / "__init__.py",
                                                  submodule_search_locations=[str(package)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return importlib.import_module(f"{name}.quantize_blockwise_gluon")


def ptxas(ptx: str) -> str:
    """ptxas's registers and spill stores for `ptx` (its register cap, if any, is in the PTX)."""
    done = assemble_sm90(ptx)
    done.check_returncode()
    registers = re.search(r"Used (\d+) registers", done.stderr).group(1)
    spilled = re.search(r"(\d+) bytes spill stores", done.stderr).group(1)
    return f"{registers} registers, {spilled} B spilled"


def counts(kernel) -> dict:
    ptx = kernel.asm["ptx"]
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(kernel.asm["cubin"])
        cubin.flush()
        sass = subprocess.run([str(NVIDIA_BIN / "cuobjdump"), "-sass", cubin.name], capture_output=True, text=True,
                              check=True).stdout
    ops = collections.Counter(re.findall(r"^\s+/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", sass, re.M))
    return {"SASS": sum(ops.values()), "DFMA": ops["DFMA"], "BAR": ops["BAR"],
            "div.rn.f32": ptx.count("div.rn.f32"), "div.rn.f64": ptx.count("div.rn.f64"),
            "min.f32": len(re.findall(r"\bmin(?:\.\w+)*\.f32", ptx))}


def main(revs: list[str]) -> None:
    print(f"Triton {triton.__version__}; sm_90a; per thread, 8 warps, static SASS counts")
    print("| revision | cast | SASS | DFMA | BAR | div.rn.f32 | div.rn.f64 | min.f32 | ptxas, cap 128 | ptxas, no cap | "
          "ptxas, cap 80 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for rev in revs:
            qg = kernels_at(rev, Path(tmp))
            for weight in (False, True):
                for dtype in ("bf16", "fp32"):
                    kernel = qg.compile_sm90(weight, dtype, maxnreg=128)  # as launched
                    uncapped = qg.compile_sm90(weight, dtype)
                    three_per_sm = qg.compile_sm90(weight, dtype, maxnreg=80)  # registers are granted 8 at a time
                    c = counts(kernel)
                    cast = f"{'weight' if weight else 'activation'} {dtype}"
                    print(f"| {rev} | {cast} | {c['SASS']} | {c['DFMA']} | {c['BAR']} | {c['div.rn.f32']} | "
                          f"{c['div.rn.f64']} | {c['min.f32']} | {ptxas(kernel.asm['ptx'])} | "
                          f"{ptxas(uncapped.asm['ptx'])} | {ptxas(three_per_sm.asm['ptx'])} |", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
