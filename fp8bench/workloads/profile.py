"""Where a step's GPU time goes, from the kernels themselves (torch.profiler's CUDA activity), in the categories
the speedup waterfall needs (fp8bench.analysis.waterfall): the linears' GEMMs, FP8 casts/transposes/amax/scale
bookkeeping, attention, and, in a training step, collective communication (NCCL) and the optimizer step
(AdamW, gradient clipping: torch's multi-tensor kernels), and everything else (norms, RoPE, activations,
elementwise, copies, the loss).

Kernel names are matched, in this order, against the libraries' naming: NCCL's kernels, attention
(flash/fmha/cuDNN SDPA), cuBLAS/cuBLASLt (`sm90_xmma_gemm`, `nvjet`, `cutlass`) and Triton GEMMs
(`_gemm_kernel`, `_gemm_wgrad_kernel`), casts (TE's `cast_transpose`, `quantize`, `amax`, `scale` kernels, torch's FP8 conversions,
fp8bench's `_quantize_*`, `_current_cast` and `_cast_transpose` casts; TE's multi-tensor scale updates match here), then torch's multi-tensor and fused-Adam
kernels (AdamW, gradient clipping; torchao's FP8 all-gather scale precompute, a multi-tensor norm, lands here
too: names cannot tell it from clipping's). Unmatched kernels count as `other`, so the categories always sum to the kernels' total.
Kernels that torch.compile generates (`INDUCTOR_KERNEL`) are casts only when their name carries an FP8 cast's
clamp, amax or dtype (`INDUCTOR_CAST`), and its GEMM templates (`triton_tem_fused_mm_0`) are GEMMs.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch

from fp8bench.core.records import Metric

CATEGORIES: list[tuple[str, re.Pattern]] = [
    ("communication", re.compile(r"nccl|all_?reduce|all_?gather|reduce_?scatter", re.I)),  # ncclDevKernel_Broadcast
    ("attention", re.compile(r"flash|fmha|attn|attention|sdpa|cudnn", re.I)),
    ("gemm", re.compile(r"gemm|xmma|nvjet|cutlass|wgmma|matmul|_gemm_kernel|splitk|^triton_tem_fused_\w*mm", re.I)),
    # (?<!no)cast: torch's generic elementwise kernels are `gpu_kernel_impl_nocast<...>` (adds, copies, SiLU),
    # which are not casts to FP8
    ("quantize", re.compile(r"(?<!no)cast|transpose|quantiz|amax|scale|fp8|float8|e4m3|e5m2|_to_copy.*float8", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor_apply|foreach", re.I)),
]


INDUCTOR_KERNEL = re.compile(r"^triton_(poi|red|per|tem)_")
"""Kernels torch.compile's inductor generates, named after the aten ops fused into them
(`triton_poi_fused_clone_transpose_view_0`): a view op's name says nothing of FP8, so for these the cast
category takes only an FP8 cast's own steps: otherwise the RoPE and attention-reshape kernels of a compiled
BF16 block (`..._transpose_view_N`) land under quantize."""
INDUCTOR_CAST = re.compile(r"clamp|amax|abs_max|fp8|float8|e4m3|e5m2", re.I)
"""An inductor kernel that casts to FP8: the saturating clamp, the amax reduction, an FP8 dtype. torchao's
tensorwise linear under torch.compile fused its casts into `cpp_fused__to_copy_abs_clamp_clone_max_mul_reciprocal_t_0`
and `cpp_fused__to_copy_clamp_clone_mul_reciprocal_t_1` on CPU (torch 2.13; the names follow the fused aten ops,
and on a GPU the same fusions are `triton_poi_fused_...`: the GPU names in tests/test_waterfall.py are these
with the GPU's prefix, not names read off a GPU)."""


def category(kernel_name: str) -> str:
    inductor = INDUCTOR_KERNEL.search(kernel_name) is not None
    for name, pattern in CATEGORIES:
        if name == "quantize" and inductor:
            pattern = INDUCTOR_CAST
        if pattern.search(kernel_name):
            return name
    return "other"


def kernel_times(step: Callable[[], object], steps: int = 5) -> dict[str, float]:
    """Milliseconds per step of each category's kernels, plus `busy` (the union of kernel intervals: time
    the GPU was running anything), `profiled_step` (CUDA events around the profiled steps: the wall time
    the kernels were recorded in, which tracing itself lengthens) and `kernels` (launches per step), over
    `steps` profiled steps after one unprofiled warm-up."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    start_ev, end_ev = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start_ev.record()
        for _ in range(steps):
            step()
        end_ev.record()
        torch.cuda.synchronize()
    totals = dict.fromkeys([name for name, _ in CATEGORIES] + ["other"], 0.0)
    intervals = []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        start, end = e.time_range.start, e.time_range.end
        if end <= start:
            continue
        totals[category(e.name)] += (end - start) / 1000.0
        intervals.append((start, end))
    busy, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    out = {k: v / steps for k, v in totals.items()}
    out["busy"] = busy / 1000.0 / steps
    out["profiled_step"] = start_ev.elapsed_time(end_ev) / steps
    out["kernels"] = len(intervals) / steps
    return out


def kernel_metrics(step: Callable[[], object], device: torch.device, steps: int = 5) -> list[Metric]:
    """The per-step kernel breakdown as metrics (CUDA only: the CPU has no kernels to attribute)."""
    if device.type != "cuda":
        return []
    t = kernel_times(step, steps)
    kernels = t.pop("kernels")
    return [Metric.of(f"gpu_{k}_ms", v) for k, v in t.items()] + [Metric.of("gpu_kernels_per_step", kernels)]
