"""The speedup waterfall's arithmetic, the kernel-name categories it rests on, and `fp8bench waterfall` on the
committed H200 layer runs (results/h200-layer)."""

from pathlib import Path

import pytest
import torch

from fp8bench.analysis.waterfall import Step, from_db, waterfall
from fp8bench.data import store
from fp8bench.workloads.profile import category, kernel_metrics

ROOT = Path(__file__).resolve().parents[1]


def test_stages_swap_one_measured_component_at_a_time():
    bf16 = Step(time_ms=20.0, gemm=12.0, quantize=0.0, attention=3.0, other=3.0, busy=18.0)
    fp8 = Step(time_ms=14.0, gemm=7.0, quantize=2.0, attention=3.0, other=2.0, busy=14.0)
    w = waterfall(bf16, fp8)
    assert w.ideal == pytest.approx(20 / (20 - 6))            # GEMMs twice as fast, the rest unchanged
    assert w.gemm_only == pytest.approx(20 / (20 - 12 + 7))   # the measured FP8 GEMMs
    assert w.with_casts == pytest.approx(20 / (15 + 2))       # + the casts BF16 does not pay
    assert w.with_non_gemm == pytest.approx(20 / (17 - 1))    # + cheaper non-GEMM kernels
    assert w.measured == pytest.approx(20 / 14)               # + idle: BF16 idled 2 ms, FP8 none
    assert w.explained_pct == pytest.approx(100.0)
    assert [name for name, _ in w.stages()][0] == "promise" and w.stages()[-1][1] == w.measured


def test_the_last_stage_is_the_measured_speedup_whatever_the_components():
    bf16 = Step(time_ms=10.0, gemm=5.0, quantize=0.1, attention=1.0, other=2.0, busy=8.1)
    fp8 = Step(time_ms=9.0, gemm=3.0, quantize=1.5, attention=1.0, other=2.5, busy=8.0)
    w = waterfall(bf16, fp8)
    # the non-GEMM stage plus the change in idle time lands exactly on T16 / T8
    after_other = 10.0 / w.with_non_gemm
    assert after_other + (fp8.idle - bf16.idle) == pytest.approx(fp8.time_ms)


@pytest.mark.parametrize("name,expected", [
    ("sm90_xmma_gemm_e4m3bf16_e4m3f32_f32_tn_n_tilesize128x128x128_warpgroupsize2x1x1", "gemm"),
    ("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_TNT", "gemm"),
    ("cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_128x256x64_1x2x1_0_tnn_align8_warpspecialized", "gemm"),
    ("_gemm_kernel", "gemm"),
    ("_gemm_wgrad_kernel", "gemm"),
    ("_quantize_1x128_kernel", "quantize"),
    ("_quantize_along_m_kernel", "quantize"),
    ("flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>", "attention"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1", "attention"),
    ("void transformer_engine::detail::cast_transpose_kernel<4, float, __nv_bfloat16, unsigned char>", "quantize"),
    ("_current_cast_kernel", "quantize"),
    ("_cast_transpose_kernel", "quantize"),  # the two-launch form's kernels, in profiles recorded before it went
    ("_amax_kernel", "quantize"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>", "other"),
    # torch's generic elementwise path is named `..._nocast`: adds, copies and SiLU of a block, not casts (on the
    # H200 at c63aa78 they had put 2.9 ms of the triton recipe's Llama-2-7B layer under quantize)
    ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<"
     "float, float, float, at::native::binary_internal::MulFunctor<float>>>", "other"),
    ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_"
     "kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#10}::operator()() const", "other"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::"
     "{lambda()#3}::operator()() const::{lambda()#14}::operator()() const::{lambda(c10::Float8_e4m3fn)#1}>",
     "quantize"),
    ("void transformer_engine::normalization::rmsnorm_fwd_tuned_kernel<__nv_bfloat16>", "other"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, "
     "(at::native::ADAM_MODE)1, false>>", "optimizer"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::"
     "TensorListMetadata<1>, at::native::(anonymous namespace)::LpNormFunctor<float, 2>>", "optimizer"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),  # not a cast
    ("void multi_tensor_apply_kernel<TensorListMetadata<3>, ComputeScaleAndScaleInvFunctor>", "quantize"),
    # torch.compile's kernels, named after their aten ops: RoPE and the attention's reshapes in a compiled block
    # (names from the H200 breakdown at e8025a8) are not casts; a clamp or amax (torchao compiled) is
    ("triton_poi_fused__to_copy__unsafe_view_add_cat_clone_transpose_view_2", "other"),
    ("triton_poi_fused__to_copy_add_arange_cos_div_mul_pow_reciprocal_sin_slice_split_with_sizes_stack_sub_"
     "transpose_view_0", "other"),
    ("triton_poi_fused_clone_transpose_3", "other"),
    ("triton_poi_fused_cat_mul_silu_silu_backward_split_0", "other"),
    ("triton_per_fused__fused_rms_norm__fused_rms_norm_backward_0", "other"),
    # torchao's compiled casts, as inductor named them on CPU (cpp_fused_...) with the GPU's prefix
    ("triton_poi_fused__to_copy_abs_clamp_clone_max_mul_reciprocal_t_0", "quantize"),
    ("triton_poi_fused__to_copy_clamp_clone_mul_reciprocal_t_1", "quantize"),
    ("triton_red_fused_abs_amax_0", "quantize"),
    # inductor's GEMM templates (max-autotune); a flex-attention template stays attention
    ("triton_tem_fused_mm_0", "gemm"),
    ("triton_tem_fused_addmm_relu_1", "gemm"),
    ("triton_tem_fused_flex_attention_0", "attention"),
])
def test_kernel_names_fall_in_their_category(name, expected):
    assert category(name) == expected


def test_the_kernel_breakdown_is_cuda_only():
    assert kernel_metrics(lambda: None, torch.device("cpu")) == []


def test_waterfall_of_the_committed_h200_layer_runs(tmp_path):
    con = store.connect(tmp_path / "db.duckdb")
    store.ingest(con, [ROOT / "results" / "h200-layer"])
    rows = {case: (fp8, bf16, w) for case, _, fp8, bf16, w, _ in from_db(con)}
    delayed = rows["layer.llama2-7b.b2s4096.e4m3.delayed.te"]
    fp8, bf16, w = delayed
    assert w.measured == pytest.approx(bf16.time_ms / fp8.time_ms)
    assert 1.0 < w.measured < 2.0 and w.ideal < 2.0  # attention and norms stay BF16: Amdahl caps the ideal
    assert w.with_casts < w.gemm_only  # the casts are a cost BF16 does not pay
    assert 80.0 < w.explained_pct <= 110.0


def test_every_fp8bench_cast_and_gemm_kernel_falls_in_its_category():
    """A kernel of ours named outside the patterns would count as `other` and misplace the waterfall's time."""
    import importlib

    import triton

    for module, expected in [("quantize_current", "quantize"), ("quantize_blockwise", "quantize"),
                             ("quantize_mx", "quantize"), ("gemm_blockwise", "gemm"), ("gemm_blockwise_gluon", "gemm"),
                             ("gemm_blockwise_wgrad", "gemm")]:
        mod = importlib.import_module(f"fp8bench_kernels.{module}")
        kernel_types = (triton.runtime.Autotuner, triton.runtime.JITFunction)
        names = [name for name, obj in vars(mod).items() if name.endswith("_kernel") and (
            isinstance(obj, kernel_types) or type(obj).__name__ in ("GluonJITFunction", "InterpretedFunction"))]
        assert names, module
        for name in names:
            assert category(name) == expected, (module, name)
