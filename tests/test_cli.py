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
    (["run", "model=tiny,gpt-125m"], "run -m"),  # a sweep of one key without -m
]


@pytest.mark.parametrize("args,field", BAD_INPUTS, ids=[" ".join(a) for a, _ in BAD_INPUTS])
def test_bad_input_exits_2_with_field_and_no_traceback(args, field, tmp_path, monkeypatch, capfd):
    """The CLI's main in this process (what `fp8bench` runs after its imports): an exception that escaped it
    would fail the test as its traceback would the user's; test_bad_input_from_the_shell_exits_2 runs a few of
    these as the installed command."""
    from fp8bench.cli import main

    monkeypatch.chdir(tmp_path)
    code = main(list(args))
    captured = capfd.readouterr()
    text = captured.out + captured.err
    assert code == 2, text
    assert field in text
    assert "Traceback" not in text
    assert text.count("error:") == 1


@pytest.mark.slow
def test_bad_input_from_the_shell_exits_2(cli_many, tmp_path):
    shell = [BAD_INPUTS[0], BAD_INPUTS[6], BAD_INPUTS[16]]  # a run, a plan and an unknown command
    # new interpreters (`python -m fp8bench`): entry()'s exit status is what a shell sees
    for (_, field), res in zip(shell, cli_many([{"args": args, "cwd": tmp_path, "fresh": True} for args, _ in shell]),
                                  strict=True):
        text = res.stdout + res.stderr
        assert res.returncode == 2 and field in text and "Traceback" not in text and text.count("error:") == 1, text


@pytest.mark.slow
def test_bad_input_leaves_recorded_results_alone(cli, tmp_path):
    ok = cli("run", "workload=quantize", "format=e4m3", "scaling=current", f"results_dir={tmp_path}",
             "measure.iters=3", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    before = sorted(p.name for p in (tmp_path / "runs").iterdir())
    bad = cli("run", "model=nope", f"results_dir={tmp_path}", cwd=tmp_path)
    assert bad.returncode == 2
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == before
    assert (tmp_path / "fp8bench.duckdb").is_file()


@pytest.mark.slow
def test_plan_lists_runnable_and_skipped(cli, tmp_path):
    res = cli("plan", "sweep=quick", "model=tiny", "workload=gemm", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "runnable" in res.stdout and "skipped: " in res.stdout
    assert "transformer" in res.stdout.lower()  # te's reason names what is missing


@pytest.mark.slow
def test_memory_prints_each_te_recipes_expected_saved_bytes(cli, tmp_path):
    res = cli("memory", "llama2-7b", cwd=tmp_path)  # the Llama-2-7B layer measured on the H200: 386 + 214 MiB
    assert res.returncode == 0, res.stderr
    delayed = next(line for line in res.stdout.splitlines() if "e4m3/delayed" in line)
    assert [cell.strip() for cell in delayed.split("│")[2:6]] == ["386", "214", "-300", "+300"]
    bad = cli("memory", "llama9", cwd=tmp_path)
    assert bad.returncode == 2 and "llama2-7b" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_doctor_prints_device_and_matrix(cli, tmp_path):
    res = cli("doctor", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "capability matrix" in res.stdout and "torch" in res.stdout


def test_help(cli):
    res = cli("--help", fresh=True)  # a new interpreter: `--help` imports neither torch nor the forked server's list
    assert res.returncode == 0 and "plan" in res.stdout


COMMANDS = ["run", "plan", "ingest", "export", "report", "compare", "asv-compare", "history", "calibrate", "roofline",
            "waterfall", "memory", "doctor"]


def _main(args, capsys) -> tuple[int, str]:
    """The CLI's entry point in this process (argparse's --help exits through SystemExit(0))."""
    from fp8bench.cli import main

    try:
        code = main(args)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help_and_version(capsys, command):
    code, text = _main([command, "--help"], capsys)
    assert code == 0 and "usage" in text.lower(), text
    code, text = _main([command, "--version"], capsys)
    assert code == 0 and text.startswith("fp8bench ") and "measurement version" in text


@pytest.mark.slow
def test_run_prints_each_cases_figures_and_groups_skip_reasons(cli, tmp_path):
    res = cli("run", "workload=gemm", "backend=torch", "workload.linears=[o]", "format=e4m3", "scaling=blockwise",
              f"results_dir={tmp_path}", cwd=tmp_path)  # blockwise needs sm_90: skipped on a CPU, with the reason
    assert res.returncode == 0, res.stderr
    assert "skipped, by reason:" in res.stdout and "3 × " in res.stdout and "compute capability 9.0" in res.stdout
    ok = cli("run", "workload=gemm", "backend=torch", "workload.linears=[o]", f"results_dir={tmp_path}", cwd=tmp_path)
    assert ok.returncode == 0, ok.stderr
    rows = [line for line in ok.stdout.splitlines() if "gemm.tiny." in line and ".e4m3.current.torch" in line]
    assert len(rows) == 3  # fprop, dgrad, wgrad: time, speedup, its interval, SQNR
    assert all(row.count("x") >= 1 and "28." in row for row in rows)


@pytest.mark.slow
def test_resume_with_other_overrides_is_refused(cli, tmp_path):
    first = cli("run", "workload=quantize", "format=e4m3", "scaling=current", "run_id=q", f"results_dir={tmp_path}",
                "store.ingest=false", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    other = cli("run", "sweep=train-tiny", "resume=q", f"results_dir={tmp_path}", cwd=tmp_path)
    assert other.returncode == 2 and "resume='q' was a run of" in other.stderr and "Traceback" not in other.stderr
    same = cli("run", "workload=quantize", "format=e4m3", "scaling=current", "resume=q", f"results_dir={tmp_path}",
               "store.ingest=false", cwd=tmp_path)
    assert same.returncode == 0 and "already recorded" in same.stderr


@pytest.mark.slow
def test_piped_tables_keep_every_cell_whole(cli, tmp_path):
    """Piped (no terminal), rich would cut cells to 80 columns ('e4m…'): they stay whole."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    res = subprocess.run([sys.executable, "-m", "fp8bench", "doctor"], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=300)
    assert res.returncode == 0 and "…" not in res.stdout and "e4m3/blockwise" in res.stdout


@pytest.mark.parametrize("args", [["run", "workload=quantize", "results_dir=/proc/fp8bench"],
                                  ["ingest", ".", "--db", "/proc/fp8bench/x.duckdb"],
                                  ["report", "--db", "DB", "--out", "/proc/fp8bench-site"]])
@pytest.mark.slow
def test_paths_that_cannot_be_used_exit_2_with_one_line(cli, tmp_path, args):
    if "DB" in args:
        made = cli("run", "workload=quantize", "format=e4m3", "scaling=current", f"results_dir={tmp_path}",
                   cwd=tmp_path)
        assert made.returncode == 0, made.stderr
        args = [str(tmp_path / "fp8bench.duckdb") if a == "DB" else a for a in args]
    res = cli(*args, cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and res.stderr.count("error:") == 1 and "/proc/fp8bench" in res.stderr


@pytest.mark.slow
def test_third_party_noise_is_hidden_unless_asked_for(cli_many, tmp_path):
    args = ["run", "workload=linear", "model=tiny", "backend=torchao", "format=hybrid", "scaling=current",
            "workload.linears=[o]", f"results_dir={tmp_path}", "store.ingest=false"]
    # new interpreters: much of the noise is printed while torch, torchao and TE are imported
    quiet, loud = cli_many([{"args": args, "fresh": True}, {"args": args, "env": {"FP8BENCH_VERBOSE": "1"}, "fresh": True}])
    assert quiet.returncode == 0, quiet.stderr
    for noise in ("Failed to load", "UserWarning", "is deprecated", "_pytree"):
        assert noise not in quiet.stderr, quiet.stderr
    assert loud.returncode == 0
    # what is hidden depends on the machine (torchao's CUDA extensions, oneDNN); on this one something was
    assert len(loud.stderr.splitlines()) > len(quiet.stderr.splitlines())
