"""Does Triton's warp specialization (`tl.range(..., warp_specialize=True)` on the K loop, the kernel's `WS`
switch) make fp8bench's blockwise GEMM faster on this GPU? Times WS tiles next to the best non-WS configs and
cuBLAS blockwise (F.scaled_mm) at 8192³ and Llama shapes; a config that fails to compile or returns a wrong
result (checked against the autotuned kernel) is recorded as such. Re-run it after a Triton upgrade: with
Triton 3.6 on the H200, WS was slower and some tiles returned NaN (results/h200-kernels/gemm_ws_probe.json).

    python3 scripts/gemm_ws_probe.py OUT.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).parent))
from fp8bench_kernels._tune import steady_do_bench  # noqa: E402
from fp8bench_kernels.gemm_blockwise import _set_block_shapes, gemm_blockwise  # noqa: E402
from fp8bench_kernels.quantize_blockwise import quantize_blockwise  # noqa: E402
from kernel_bench import recipe  # noqa: E402

from fp8bench.backends import get_backend  # noqa: E402
from fp8bench.types import GemmRole  # noqa: E402

SHAPES = {"8192^3": (8192, 8192, 8192), "l2-7b gate_up": (8192, 22016, 4096), "l3-70b o": (8192, 8192, 8192),
          "l3-70b down fprop": (8192, 8192, 28672)}
TILES = [(128, 1, 4, 3), (128, 1, 4, 4), (128, 1, 8, 3), (128, 1, 8, 4), (128, 2, 8, 3), (64, 1, 4, 4),
         (64, 2, 4, 3), (128, 2, 4, 3), (256, 1, 8, 3)]
"""(BLOCK_M, NSUB, warps, stages) tried with WS, for both the promote and rescale variants."""
BASELINES = [(True, 64, 1, 4, 4, False), (True, 128, 1, 8, 4, False)]


def probe_shape(name: str, m: int, n: int, k: int) -> dict:
    grid = [(p, bm, nsub, w, st, True) for p in (True, False) for bm, nsub, w, st in TILES] + BASELINES
    a = torch.randn(m, k, device="cuda").bfloat16()
    b = torch.randn(n, k, device="cuda").bfloat16()
    qa, sa = quantize_blockwise(a, (1, 128), True)
    qb, sb = quantize_blockwise(b, (128, 128), True)
    ref = gemm_blockwise(qa, sa, qb, sb).float()
    flops = 2.0 * m * n * k
    row: dict = {"shape": name, "mnk": [m, n, k]}
    op = get_backend("torch").gemm(a, b, GemmRole.FPROP, recipe("torch", "blockwise"))
    row["cublas_blockwise"] = flops / steady_do_bench(op.kernel_only) / 1e9
    row["triton_autotuned"] = flops / steady_do_bench(lambda: gemm_blockwise(qa, sa, qb, sb)) / 1e9
    for p, bm, nsub, w, st, ws in grid:
        c = triton.Config({"BLOCK_M": bm, "NSUB": nsub, "GROUP_M": 8, "PROMOTE": p, "WS": ws}, num_warps=w,
                          num_stages=st, pre_hook=_set_block_shapes)
        label = f"{'promote' if p else 'rescale'} {bm}x{128 * nsub} w{w} s{st}{' WS' if ws else ''}"
        try:
            err = ((gemm_blockwise(qa, sa, qb, sb, c).float() - ref).norm() / ref.norm()).item()
            row[label] = (round(flops / steady_do_bench(lambda c=c: gemm_blockwise(qa, sa, qb, sb, c)) / 1e9, 1)
                          if err < 1e-2 else f"wrong: rel err {err:.3g}")
        except Exception as e:  # noqa: BLE001 - a config that fails to compile is a result here
            row[label] = f"failed: {type(e).__name__}: {str(e)[:200]}"
        print(name, label, row[label], flush=True)
    return row


def main() -> int:
    out = []
    for name, (m, n, k) in SHAPES.items():
        out.append(probe_shape(name, m, n, k))
        torch.cuda.empty_cache()
    Path(sys.argv[1]).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
