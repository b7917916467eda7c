"""The tables docs/ quotes are generated from the committed results: each test regenerates one and fails
when the committed page is stale."""

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from fp8bench.data import store

ROOT = Path(__file__).resolve().parents[1]
TRIALS = ["regression_trials.json", "regression_trials_feedback.json", "regression_trials_settled.json",
          "regression_trials_s6.json", "regression_trials_s7.json"]


def generated_block(doc: str, command: str = "") -> str:
    """The generated block of docs/`doc` whose header command contains `command` (the first one if empty)."""
    m = re.search(r"<!-- generated: [^>]*" + re.escape(command) + r"[^>]*-->\n(.*?)<!-- end generated -->",
                  (ROOT / "docs" / doc).read_text(), re.S)
    assert m, f"docs/{doc} has no generated block for {command!r}"
    return m.group(1)


@pytest.mark.parametrize("result_set,runs", [("h200-hopper", ("hopper-a", "hopper-b")),
                                             ("h200-hopper-labelled", ("hopper-c", "hopper-e"))])
def test_the_reproducibility_table_is_the_committed_runs(tmp_path, result_set, runs):
    from fp8bench.analysis import reproducibility

    con = store.connect(tmp_path / "db.duckdb")
    store.ingest(con, [ROOT / "results" / result_set, ROOT / "results" / "spread"])
    rows = reproducibility.tally(reproducibility.run_metrics(con, runs[0]), reproducibility.run_metrics(con, runs[1]))
    assert generated_block("reproducibility.md", " ".join(runs)) == reproducibility.markdown(rows, runs)


def test_the_regression_trials_table_is_the_committed_judgements():
    res = subprocess.run([sys.executable, str(ROOT / "scripts" / "regression_trials.py"), "table",
                          *(str(ROOT / "results" / "h200-checks" / f) for f in TRIALS)],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert res.returncode == 0, res.stderr
    assert generated_block("regression.md", "regression_trials.py table") == res.stdout


@pytest.fixture(scope="module")
def committed_db(tmp_path_factory):
    """A DuckDB file of the committed result sets only (what `make results-page` ingests), built once here."""
    path = tmp_path_factory.mktemp("committed") / "committed.duckdb"
    con = store.connect(path)
    store.ingest(con, store.committed_result_sets(ROOT / "results"))
    con.close()
    return path


@pytest.mark.parametrize("page", ["README.md", "docs/results.md", "docs/training.md", "docs/why-not-2x.md"])
def test_the_generated_results_tables_are_the_committed_results(committed_db, page):
    from fp8bench.report import markdown

    text = (ROOT / page).read_text()
    assert markdown.BLOCK.search(text), f"{page} has no generated block"
    with store.connect(committed_db, read_only=True) as con:
        assert markdown.render(text, con) == text, f"{page} is stale: run `make results-page`"


def test_a_stale_generated_block_is_told_apart(committed_db):
    from fp8bench.report import markdown

    text = (ROOT / "README.md").read_text().replace("| layer |", "| layer (typed) |", 1)
    with store.connect(committed_db, read_only=True) as con:
        assert markdown.render(text, con) != text


def test_markdown_without_a_generated_block_is_a_clear_error(committed_db, tmp_path, capsys):
    from fp8bench.cli import main

    page = tmp_path / "page.md"
    page.write_text("# no block here\n")
    assert main(["report", "--markdown", str(page), "--db", str(committed_db)]) == 2
    assert "has no generated block" in capsys.readouterr().err
    assert page.read_text() == "# no block here\n"


@pytest.mark.slow
def test_the_headline_says_what_each_fastest_training_recipe_did_to_the_loss(committed_db):
    """A speed run's fastest recipe carries the parity verdicts of every run that judged it, by model: E4M3
    Delayed on the te-layer path at TE's defaults lost BF16's loss at llama-350m in every run, while the same
    recipe with a 16-step amax history, a recipe of its own, passed; torchao's compiled hybrid/current was judged at
    gpt-125m in seven runs, which a count of each case's latest run alone would hide; one-step workloads have
    no loss to judge; where no speedup has an interval, no recipe is named and no verdict shown."""
    from fp8bench.report import markdown

    with store.connect(committed_db, read_only=True) as con:
        parity = markdown.parity_where_judged(con)
        block = markdown.headline_block(con)
    assert parity["e4m3/delayed · te-layer"] == "FAIL at llama-350m (4 verdicts)"
    assert parity["e4m3/delayed · te-layer · amax history len 16"] == "pass at llama-350m (3 verdicts)"
    assert parity["hybrid/delayed · te-layer"] == "pass at llama-350m (4 verdicts)"
    assert parity["hybrid/current · torchao+compile"] == "pass at gpt-125m (7 verdicts)"
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in block.splitlines()[2:]]
    by_key = {(r[0], r[1]): r for r in rows}
    # no whole step at Llama-2-7B dims has an interval: no recipe is named fastest, so none carries a verdict
    assert by_key[("NVIDIA H200 · llama2-7b", "train")][2:6] == [
        "none of 14 with an interval", "withdrawn: one timing of each side, apart: no interval", "", ""]
    assert by_key[("NVIDIA H200 · gpt-125m", "train")][5] == "pass at gpt-125m (6 verdicts)"
    assert all(r[5] == "" for r in rows if r[1] in ("layer", "mlp"))
    assert all(r[5] for r in rows if r[1] == "train" and not r[2].startswith("none of"))


def _kernel_tables(doc: str = "kernels.md") -> list[str]:
    """The commands behind a page's probe tables (each prints its block from a committed file)."""
    return re.findall(r"<!-- generated: python3 (\S+ --markdown \S+(?: \S+)*) -->", (ROOT / "docs" / doc).read_text())


@pytest.mark.slow
@pytest.mark.parametrize("doc,command", [(doc, c) for doc in ("kernels.md",) for c in _kernel_tables(doc)])
def test_the_kernel_tables_are_the_committed_measurements(doc, command, monkeypatch, capsys):
    # the command as its header gives it, run as __main__ in this process (a new interpreter per table
    # cost ~3 s of importing torch each)
    script, *args = command.split()
    monkeypatch.chdir(ROOT)
    monkeypatch.setattr(sys, "argv", [script, *args])
    try:
        runpy.run_path(str(ROOT / script), run_name="__main__")
    except SystemExit as exc:
        assert exc.code in (0, None), exc.code
    assert generated_block(doc, command) == capsys.readouterr().out


def test_every_kernel_table_is_checked():
    """Every generated block of kernels.md is a script's `--markdown` table, regenerated above; regression.md's
    one generated block is the trials table its own test regenerates. Tables printed by probes that left the
    tree stand as printed (docs/probes.md), each naming its file and the probe at its last commit."""
    assert len(_kernel_tables()) == (ROOT / "docs" / "kernels.md").read_text().count("<!-- generated:") >= 3
    assert not _kernel_tables("regression.md")
    assert (ROOT / "docs" / "regression.md").read_text().count("<!-- generated:") == 1


def test_a_failed_wgrad_shape_is_a_row_of_its_own():
    """The recipe bench records a weight-gradient shape whose kernel failed with its error; its table says so and
    still lists the shapes that ran."""
    from fp8bench.report import kernel_tables

    ran = {"shape": "llama2-7b wgrad_o", "mnk": [4096, 4096, 8192], "ratio_to_triton": 1.5,
           "gluon": {"median_tflops": 900.0, "median_over_best": 1.01, "sqnr_db": 55.2},
           "triton": {"median_tflops": 600.0, "sqnr_db": 55.0}}
    failed = {"shape": "gpt-125m wgrad_qkv", "mnk": [2304, 768, 4096], "error": "RuntimeError: out of resources"}
    rows = kernel_tables.markdown({"wgrad": [ran, failed]}).splitlines()
    assert rows[2] == "| llama2-7b wgrad_o (4096×4096×8192) | 900 | 1.010 | 55.2 | 600 | 55.0 | 1.500 |"
    assert rows[3].startswith("| gpt-125m wgrad_qkv (2304×768×4096) | failed: RuntimeError: out of resources |")


def test_a_host_paced_cast_cell_is_marked_and_counted_apart():
    """A cast cell whose eager loop the host paced (its time per iteration as long as the GPU's) is marked in
    the table, and the 80% count is given again over the cells the host did not pace."""
    from fp8bench.report import kernel_tables

    def cell(shape, eager_same, host_us, gpu_us):
        return {"kernel": "blockwise 1x128 both", "shape": shape, "eager_pct_of_copy": eager_same * 0.8,
                "eager_pct_of_same_bytes_copy": eager_same, "graph_pct_of_copy": 70.0, "same_bytes_copy_gbps": 3000.0,
                "loop_host_us": host_us, "loop_gpu_us": gpu_us,
                "host_paced": host_us >= kernel_tables.HOST_PACED * gpu_us}

    casts = [cell([4096, 4096], 58.2, 91.7, 91.7), cell([8192, 4096], 86.9, 76.5, 104.6),
             cell([8192, 8192], 79.0, 120.0, 160.0)]
    assert [c["host_paced"] for c in casts] == [True, False, False]
    lines = kernel_tables.markdown({"casts": casts, "copy_gbps": 4248.0}).splitlines()
    assert lines[2] == "| blockwise 1x128 both | 47%; 58%; 70% (host-paced) | 70%; 87%; 70% | 63%; 79%; 70% |"
    assert lines[-1] == ("Host-paced (the eager loop's host as slow as its GPU, so the eager figure may hold host time): "
                         "1 of 3 cells. Of the 2 others, 1 reach 80% of a same-bytes copy; lowest 79.0%.")


def test_the_casts_device_only_table_counts_its_cells_and_names_those_not_measured():
    """A file with device-only timings gets a second table: GB/s and % of a same-bytes copy timed the same way
    per cell, a cell where the host could not get ahead said so in words, and the 80% count over them all."""
    from fp8bench.report import kernel_tables

    def cell(kernel, shape, gbps, pct):
        return {"kernel": kernel, "shape": shape, "eager_pct_of_copy": 60.0, "eager_pct_of_same_bytes_copy": 75.0,
                "graph_pct_of_copy": 62.0, "same_bytes_copy_gbps": 3000.0, "loop_host_us": 90.0,
                "loop_gpu_us": 90.0, "host_paced": True, "device_only_gbps": gbps,
                "device_only_pct_of_same_bytes_copy": pct}

    casts = [cell("current+transpose", [4096, 4096], 2600.0, 81.3), cell("current+transpose", [8192, 4096], 3100.0, 79.6),
             cell("mx", [4096, 4096], None, None), cell("mx", [8192, 4096], 3500.0, 90.2)]
    lines = kernel_tables.markdown({"casts": casts, "copy_gbps": 4248.0}).splitlines()
    head = lines.index("| cast, device-only (GB/s, % of a same-bytes copy timed so) | 4096×4096 | 8192×4096 |")
    assert lines[head + 2:head + 4] == ["| current+transpose | 2600 GB/s, 81% | 3100 GB/s, 80% |",
                                        "| mx | host not ahead | 3500 GB/s, 90% |"]
    assert lines[head + 5] == ("Device-only cells at 80% or more of a same-bytes copy timed so: 2 of 4; lowest 79.6% "
                               "(current+transpose at 8192×4096); 1 without a figure (the host could not get ahead "
                               "of the cast or of its copy).")


def test_the_gemm_rounds_timed_device_only_get_a_table_of_their_own():
    """A GEMM file whose rounds were also timed device-only lists them in a second table with their own median
    ratio, lowest shape and widest spread; the do_bench table above it is unchanged."""
    from fp8bench.report import kernel_tables

    def row(shape, ours_ms, cublas_ms, dev_ours_ms, dev_cublas_ms):
        flops = 2.0 * 2048**3

        def side(rounds, dev):
            return {"median_tflops": flops / sorted(rounds)[1] / 1e9, "best_tflops": flops / min(rounds) / 1e9,
                    "median_over_best": sorted(rounds)[1] / min(rounds),
                    "device_only_median_tflops": flops / sorted(dev)[1] / 1e9,
                    "device_only_median_over_best": sorted(dev)[1] / min(dev)}
        return {"shape": shape, "mnk": [2048, 2048, 2048], "ours": side(ours_ms, dev_ours_ms),
                "cublas": side(cublas_ms, dev_cublas_ms),
                "ratio_to_cublas": sorted(cublas_ms)[1] / sorted(ours_ms)[1],
                "device_only_ratio_to_cublas": sorted(dev_cublas_ms)[1] / sorted(dev_ours_ms)[1]}

    rows = [row("a", [0.060, 0.055, 0.058], [0.030, 0.028, 0.029], [0.020, 0.0202, 0.0205], [0.0205, 0.021, 0.0208]),
            row("b", [0.020, 0.020, 0.020], [0.021, 0.021, 0.021], [0.020, 0.0206, 0.020], [0.0212, 0.021, 0.0211])]
    lines = kernel_tables.markdown({"gemm": rows}).splitlines()
    assert lines[5] == "Median ratio over the 2 shapes 0.775, lowest 0.500; widest median / best 1.055."
    head = lines.index("| shape, device-only rounds | ours: median TFLOPS | median / best | cuBLAS blockwise: median | "
                       "median / best | cuBLAS / ours (medians) |")
    assert lines[head + 2] == "| a | 850 | 1.010 | 826 | 1.015 | 1.030 |"
    assert lines[head + 5] == ("Device-only: median ratio over the 2 shapes 1.042, lowest 1.030; widest median / best "
                               "1.010.")

    failed = row("c", [0.020, 0.020, 0.020], [0.021, 0.021, 0.021], [0.020, 0.020, 0.020], [0.021, 0.021, 0.021])
    failed["ours"] |= {"device_only_median_tflops": None, "device_only_median_over_best": None}
    failed["device_only_ratio_to_cublas"] = None
    lines = kernel_tables.markdown({"gemm": [*rows, failed]}).splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("| shape, device-only rounds"))
    assert lines[head + 4] == "| c | host not ahead | | 818 | 1.000 | — |"
    assert lines[head + 6] == ("Device-only: median ratio over the 2 shapes 1.042, lowest 1.030; widest median / best "
                               "1.010; 1 shapes not measured (the host could not get ahead).")


def test_a_gemm_side_whose_device_only_rounds_partly_failed_is_summarized_over_the_rest():
    """Rounds where the host could not get ahead are None: the median and spread come from the others (a NaN
    in statistics.median gave an order-dependent answer), and a side with none measured has no figure."""
    from fp8bench.report import kernel_tables

    flops = 2.0e12  # 2 TFLOP a call: 1 ms is 2000 TFLOPS
    summary = kernel_tables.device_only_summary([None, 1.0, 2.0, None, 1.6], flops)
    assert summary["device_only_rounds_not_measured"] == 2
    assert summary["device_only_median_tflops"] == pytest.approx(1250.0)
    assert summary["device_only_median_over_best"] == 1.6
    none = kernel_tables.device_only_summary([None, None], flops)
    assert none["device_only_median_tflops"] is None and none["device_only_median_over_best"] is None


def test_recipe_bench_times_the_weight_gradients_it_recorded():
    """The recipe bench's weight-gradient shapes come from the gemm workload's own shape rules: a run now measures
    what the committed file measured (the same names and M×N×K)."""
    import json

    from fp8bench.workloads.kernel_bench import wgrad_shapes

    recorded = json.loads((ROOT / "results" / "h200-recipe-blockwise" / "recipe_bench_wgrad_7c8a8fb.json").read_text())
    assert {r["shape"]: tuple(r["mnk"]) for r in recorded["wgrad"]} == wgrad_shapes()
