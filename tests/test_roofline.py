"""`fp8bench calibrate` measures real ceilings here; the roofline model's arithmetic; `fp8bench roofline` joins
them with recorded GEMM cases."""

import json

import pytest

from fp8bench.analysis.calibrate import calibrate, read, write
from fp8bench.analysis.roofline import LAUNCH_US, Ceiling, expected_speedup, gemm_time_ms
from fp8bench.core.hardware import detect_device
from fp8bench.core.records import StoreError
from fp8bench.data import store

H200_LIKE = Ceiling(bf16_tflops=700.0, fp8_tflops=1400.0, copy_gbps=4000.0)


def test_compute_bound_gemm_expects_the_ceiling_ratio_and_casts_cost_extra():
    big = expected_speedup(8192, 8192, 8192, "e4m3", "current", H200_LIKE, with_quant=False)
    assert big == pytest.approx(2.0, rel=0.01)  # 2·M·N·K dominates: the FP8/BF16 ceiling ratio
    with_casts = expected_speedup(8192, 8192, 8192, "e4m3", "current", H200_LIKE, with_quant=True)
    one_pass = expected_speedup(8192, 8192, 8192, "e4m3", "rowwise", H200_LIKE, with_quant=True)
    assert with_casts < one_pass < big  # tensorwise reads each operand twice (amax, then cast)


def test_memory_bound_gemm_expects_the_byte_ratio():
    # M = 16 tokens: reading the 8192x8192 weight dominates; FP8 halves those bytes
    launch = LAUNCH_US / 1000  # the per-kernel floor both pay
    t_bf16 = gemm_time_ms(16, 8192, 8192, "bf16", "none", H200_LIKE) - launch
    t_fp8 = gemm_time_ms(16, 8192, 8192, "e4m3", "current", H200_LIKE, with_quant=False) - launch
    assert t_bf16 / t_fp8 == pytest.approx(2.0, rel=0.05)
    nvfp4 = gemm_time_ms(16, 8192, 8192, "nvfp4", "nvfp4", H200_LIKE, with_quant=False) - launch
    assert t_fp8 / nvfp4 == pytest.approx(2.0, rel=0.05)


@pytest.mark.slow
def test_calibrate_measures_this_machine_and_round_trips(tmp_path):
    c = calibrate(detect_device(), budget_s=0.05, shapes=[(128, 128, 128), (256, 128, 128)])
    assert c.bf16_tflops > 0 and c.fp8_tflops > 0 and c.copy_gbps > 0
    assert set(c.details["shapes"]) == {"128x128x128", "256x128x128"}
    assert c.bf16_tflops == max(v["bf16_tflops"] for v in c.details["shapes"].values())
    path = write(c, tmp_path / "calibration")
    assert read(path) == c


def _ceilings_file(folder, name, measured_at, bf16):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{measured_at}.json"
    path.write_text(json.dumps({"device_name": name, "device_kind": "cuda", "measured_at": measured_at,
                                "bf16_tflops": bf16, "fp8_tflops": 2 * bf16, "copy_gbps": 4000.0}))
    return path


def test_ingest_keeps_the_newest_ceilings_per_device_and_rejects_bad_files(tmp_path):
    cal = tmp_path / "calibration"
    _ceilings_file(cal, "GPU X", 2000.0, 700.0)
    _ceilings_file(cal, "GPU X", 1000.0, 600.0)  # older: ignored whatever the order
    con = store.connect(tmp_path / "db.duckdb")
    rep = store.ingest(con, [tmp_path])
    assert rep.ceilings and con.execute("SELECT bf16_tflops FROM ceilings").fetchall() == [(700.0,)]
    (cal / "broken.json").write_text("{not json")
    with pytest.raises(StoreError, match="broken.json"):
        store.ingest(con, [cal / "broken.json"])


@pytest.mark.slow
def test_roofline_command_joins_cases_with_ceilings(cli, tmp_path):
    r = cli("run", "-m", "workload=gemm", "model=tiny", "backend=torch", "format=bf16,e4m3", "scaling=none,current",
            "workload.linears=[o]", "workload.roles=[fprop]", "workload.tokens=64", "measure.iters=5",
            f"results_dir={tmp_path}")
    assert r.returncode == 0, r.stderr[-2000:]
    db = tmp_path / "fp8bench.duckdb"
    none = cli("roofline", "--db", str(db))
    assert none.returncode == 0 and "fp8bench calibrate" in none.stdout
    cal = cli("calibrate", "--out", str(tmp_path / "calibration"), "--budget", "0.05")
    assert cal.returncode == 0, cal.stderr[-2000:]
    assert cli("ingest", str(tmp_path / "calibration"), "--db", str(db)).returncode == 0
    res = cli("roofline", "--db", str(db))
    assert res.returncode == 0 and "median |error|" in res.stdout and "gemm.tiny.fprop_o.e4m3.current.torch" in res.stdout
    bad = cli("calibrate", "--budget", "-1")
    assert bad.returncode == 2 and "--budget" in bad.stderr


def test_roofline_on_the_committed_h200_gemm_sweep(tmp_path):
    """The model against real data: the hopper sweep's GEMMs (torch backend) and the H200's calibration file."""
    from pathlib import Path

    from fp8bench.analysis.roofline import expected_vs_measured, median_abs_error

    root = Path(__file__).resolve().parents[1] / "results"
    cal = tmp_path / "calibration"
    cal.mkdir()
    (cal / "nvidia-h200.json").write_text((root / "calibration" / "nvidia-h200.json").read_text())
    con = store.connect(tmp_path / "db.duckdb")
    store.ingest(con, [root / "h200-hopper", tmp_path])
    df = expected_vs_measured(con)
    assert len(df) == len(set(df["case_id"])) > 200 and set(df["device"]) == {"NVIDIA H200"}  # one row per case
    assert median_abs_error(df) < 0.15  # issue acceptance: kernel-only roofline within 15% (median)
    assert df["expected"].between(1.0, 2.6).all()  # compute-bound FP8 vs BF16: near the ceilings' ratio
    # with quantization, modelled with the eager casts the torch backend runs: also within 15%; FP8 with eager
    # casts is slower than BF16 on most of these shapes, while fused casts would keep most of the gain
    wq = expected_vs_measured(con, with_quant=True)
    assert len(wq) == len(df) and set(wq["cast"]) == {"eager"}
    assert median_abs_error(wq) < 0.15
    assert wq["measured"].median() < 1.0 < wq["expected_fused"].median()


@pytest.mark.parametrize("scaling", ["current", "delayed", "rowwise", "blockwise"])
@pytest.mark.parametrize("is_weight", [False, True])
def test_eager_cast_table_matches_the_torch_backends_casts(scaling, is_weight):
    """EAGER_CAST is recounted from the torch backend's own cast: every aten op that is not a view moves its
    inputs and outputs; kernels are those ops."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    from fp8bench.analysis.roofline import EAGER_CAST
    from fp8bench.backends import make_recipe
    from fp8bench.backends.scaled_mm import quantize_operand

    views = {"view", "_unsafe_view", "t", "transpose", "reshape", "expand", "as_strided", "slice", "alias",
             "detach", "permute", "unsqueeze", "squeeze", "lift_fresh"}

    class Traffic(TorchDispatchMode):
        moved, kernels = 0, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func._schema.name.split("::")[1] not in views:
                tensors = [a for a in tree_flatten((args, kwargs, out))[0] if isinstance(a, torch.Tensor)]
                self.moved += sum(a.numel() * a.element_size() for a in tensors)
                self.kernels += 1
            return out

    recipe = make_recipe("torch", "e4m3", scaling)
    x = torch.randn(512, 1024).bfloat16()
    with Traffic() as t:
        quantize_operand(x, recipe, recipe.options(is_weight=is_weight))
    per_elem, kernels_act, kernels_weight = EAGER_CAST[scaling]
    assert t.moved / x.numel() == pytest.approx(per_elem, rel=0.02)  # scales and scalars are the 2%
    assert t.kernels == (kernels_weight if is_weight else kernels_act)
