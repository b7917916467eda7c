"""The CLI contract: bad input exits 2 with one message naming the field, and no traceback."""

import pytest

BAD_INPUTS = [
    (["run", "model=llama9"], "model"),
    (["run", "workload.tokns=5"], "tokns"),
    (["run", "workload.tokens=-5"], "workload.tokens"),
    (["run", "workload.tokens=abc"], "workload.tokens"),
    (["run", "format=nvfp4"], "scaling"),
    (["run", "backend=cuda"], "backend"),
    (["plan", "format=fp9"], "format"),
    (["plan", "scaling.amax_compute_algo=min"], "scaling.amax_compute_algo"),
    (["plan", "workload.linears=[qkv,ffn]"], "workload.linears"),
    (["plan", "measure.iters=0"], "measure.iters"),
    (["plan", "device=tpu"], "device"),
    (["plan", "model"], "model"),
    (["plan", "bogus_key=1"], "bogus_key"),
    (["run", "resume=no-such-run"], "resume"),
    (["ingest", "/no/such/path"], "path"),
    (["export", "nope", "--out", "x", "--db", "/no/such.duckdb"], "--db"),
    (["frobnicate"], "command"),
    (["run", "model.hidden=0"], "model.hidden"),
]


@pytest.mark.parametrize("args,field", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_field_and_no_traceback(cli, tmp_path, args, field):
    res = cli(*args, cwd=tmp_path)
    text = res.stdout + res.stderr
    assert res.returncode == 2, text
    assert field in text
    assert "Traceback" not in text
    assert text.count("error:") == 1


def test_bad_input_leaves_recorded_results_alone(cli, tmp_path):
    ok = cli("run", "workload=quantize", "format=e4m3", "scaling=current", f"results_dir={tmp_path}",
             "measure.iters=3", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    before = sorted(p.name for p in (tmp_path / "runs").iterdir())
    bad = cli("run", "model=nope", f"results_dir={tmp_path}", cwd=tmp_path)
    assert bad.returncode == 2
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == before
    assert (tmp_path / "fp8bench.duckdb").is_file()


def test_plan_lists_runnable_and_skipped(cli, tmp_path):
    res = cli("plan", "sweep=quick", "model=tiny", "workload=gemm", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "runnable" in res.stdout and "skipped: " in res.stdout
    assert "transformer" in res.stdout.lower()  # te's reason names what is missing


def test_memory_prints_each_te_recipes_expected_saved_bytes(cli, tmp_path):
    res = cli("memory", "llama2-7b", cwd=tmp_path)  # the Llama-2-7B layer measured on the H200: 386 + 214 MiB
    assert res.returncode == 0, res.stderr
    delayed = next(line for line in res.stdout.splitlines() if "e4m3/delayed" in line)
    assert [cell.strip() for cell in delayed.split("│")[2:6]] == ["386", "214", "-300", "+300"]
    bad = cli("memory", "llama9", cwd=tmp_path)
    assert bad.returncode == 2 and "llama2-7b" in bad.stderr and "Traceback" not in bad.stderr


def test_doctor_prints_device_and_matrix(cli, tmp_path):
    res = cli("doctor", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "capability matrix" in res.stdout and "torch" in res.stdout


def test_help(cli):
    res = cli("--help")
    assert res.returncode == 0 and "plan" in res.stdout
