"""The `fp8bench` command: run, plan, ingest, export, doctor.

Bad input exits with code 2 and one message naming the field, the value and the valid choices; never a
traceback, and never at the cost of anything already recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from fp8bench.config.schema import ConfigError


def _console(stderr: bool = False) -> Console:
    """A terminal gets rich's own width; a pipe or a file gets lines as long as their content, so a table's
    cells are never cut to fit 80 columns."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 100_000)


console = _console(stderr=True)
out = _console()
COMMANDS = ("run", "plan", "ingest", "export", "report", "compare", "asv-compare", "history", "calibrate",
            "roofline", "waterfall", "memory", "doctor")
USAGE = """usage: fp8bench COMMAND [ARGS]

  run [-m] [hydra overrides]   run a point or a sweep preset (sweep=quick); -m uses Hydra's multirun
  plan [hydra overrides]       list the cases with runnable / skipped: reason; runs nothing
  ingest [PATHS...] [--db DB] [--wait S]
                               load run folders, shards or Parquet exports into DuckDB (idempotent); waits
                               up to S seconds (300) while another process holds the file, then exits 1
  export RUN_ID... --out DIR   write runs as Parquet (one file per table) to commit under results/
  report [--db DB] [--out DIR] build the static site (plotly, offline) from DuckDB
  report --markdown FILE...     rewrite the generated results tables of Markdown files (make results-page)
  compare BASE HEAD [--db DB] [--markdown FILE]
                               statistical A/B of two runs (run id, git commit or 'latest');
                               exit 1 if anything regressed
  asv-compare BASE HEAD [--machine M] [--threshold 0.05] [--results results/asv]
                               two commits recorded by asv, direction-aware; exit 1 if anything regressed
  history [--db DB]            change points of every tracked series, with the commit that made them
  calibrate [--out DIR] [--budget S]
                               measure this machine's BF16/FP8 GEMM and copy ceilings (results/calibration)
  roofline [--db DB] [--with-quant]
                               expected (roofline, measured ceilings) vs measured GEMM speedups
  waterfall [--db DB]          why FP8 is not 2x: linear/layer speedup stage by stage from measured kernel times
  memory MODEL [--workload layer|train] [--batch B] [--seq S]
                               what each TE recipe is expected to save for backward (fp8bench.analysis.memory_model)
  doctor                       device, versions, backends and the capability matrix

Every command takes --help; fp8bench --version prints the version and the measurement version.
"""
RUN_HELP = """usage: fp8bench {cmd} [-m] [KEY=VALUE ...]

{what}

Overrides are Hydra's (KEY=VALUE). Config groups and their presets (conf/):
{groups}
Other keys: results_dir= (where runs/, the DuckDB file and the site go), run_id=, resume=<run_id>, seed=,
device=auto|cpu|cuda, measure.* (warmup, rounds, block_ms, settle_ms, flush_l2, iters, max_time_s),
workload.* (tokens, linears, roles, shapes, batch, seq, train.*), store.ingest=, store.db=.
A value a,b,c with -m (or a sweep preset's axes) sweeps that key.

examples:
  fp8bench {cmd} sweep=quick                      the CPU study (sweep=hopper: the H200 study)
  fp8bench {cmd} model=llama2-7b workload=gemm format=e4m3 scaling=rowwise backend=torch
  fp8bench {cmd} -m workload=linear model=llama2-7b backend=te format=bf16,e4m3 scaling=none,delayed
"""
RUN_WHAT = {"run": "Run one point or a sweep preset; every case's record is written as soon as it exists.",
            "plan": "List the cases a run would make, each runnable or skipped with the reason; runs nothing."}
DOCTOR_HELP = """usage: fp8bench doctor

The device, the installed versions, each backend's availability (and why not) and the capability matrix:
which format/scaling pairs each backend runs on this device. `fp8bench plan ...` gives the reason per case.
"""


class UsageError(ValueError):
    """Bad command-line usage: exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit 2 itself; keep one message format
        raise UsageError(f"{self.prog}: {message}")


def _db_path(arg: str | None, results_dir: str = "results") -> Path:
    return Path(arg) if arg else Path(results_dir) / "fp8bench.duckdb"


def _waiting(db: Path):
    """What `store.connect` says when another process holds the DuckDB file."""
    def say(holder: str, wait_s: float) -> None:
        console.print(f"{db} is held by {holder} (DuckDB allows one process at a time): waiting up to "
                      f"{wait_s:.0f} s for it", highlight=False, soft_wrap=True)
    return say


@contextlib.contextmanager
def _reading(db_arg: str | None):
    """A read-only connection to the DuckDB file, closed afterwards; exit 1 when another process holds the
    file for longer than the store's wait."""
    from fp8bench.data import store

    db = _db_path(db_arg)
    try:
        con = store.connect(db, read_only=True, on_wait=_waiting(db))
    except store.DatabaseBusy as exc:
        console.print(f"[red]error:[/] {exc}; try again when it is free", highlight=False, soft_wrap=True)
        raise SystemExit(1) from None
    try:
        yield con
    finally:
        con.close()


def _ingest_into(db: Path, paths: list[Path], wait_s: float | None = None) -> bool:
    """Ingest `paths` into `db`, waiting for the file while another process holds it (two sweeps ending at
    once into one results folder). False when it stayed held: the records stay in their run folders and the
    message says how to load them later."""
    from fp8bench.data import store

    try:
        con = store.connect(db, wait_s=store.LOCK_WAIT_S if wait_s is None else wait_s, on_wait=_waiting(db))
    except store.DatabaseBusy as exc:
        where = " ".join(str(p) for p in paths)
        console.print(f"[yellow]not ingested:[/] {exc}. Everything is recorded in {where}; load it with "
                      f"`fp8bench ingest {where} --db {db}`", highlight=False, soft_wrap=True)
        return False
    try:
        rep = store.ingest(con, paths)
    finally:
        con.close()
    for p in rep.problems:
        console.print(f"[yellow]warning:[/] skipped {p.path}" + (f" line {p.line}" if p.line else "") + f": {p.error}")
    console.print(f"ingested {len(rep.runs)} run(s), {rep.cases} case record(s)"
                  + (f", ceilings of {rep.ceilings}" if rep.ceilings else "")
                  + (f", between-box spreads of {rep.spreads}" if rep.spreads else "") + f" into {db}")
    return True


def _help(cmd: str) -> str:
    if cmd == "doctor":
        return DOCTOR_HELP
    from fp8bench.config.compose import GROUPS, group_options

    groups = "".join(f"  {g:<9} {', '.join(group_options(g))}\n" for g in GROUPS)
    return RUN_HELP.format(cmd=cmd, what=RUN_WHAT[cmd], groups=groups)


def cmd_run(args: list[str]) -> int:
    from fp8bench.config.compose import check_combination, expand, multirun
    from fp8bench.core.records import read_run, write_manifest
    from fp8bench.run.plan import execution_order, plan, resolve_device
    from fp8bench.run.runner import check_resume, execute, manifest_for, new_run_id, run_dir_for

    started = time.monotonic()
    is_multi = any(a in ("-m", "--multirun") for a in args)
    overrides = [a for a in args if a not in ("-m", "--multirun")]
    points, dropped = expand(overrides, multirun=is_multi)
    first = points[0]
    check_resume(first, overrides)
    device = resolve_device(first)
    run_id = first.resume or first.run_id or new_run_id()
    run_dir = run_dir_for(first, run_id)
    if not (run_dir / "manifest.json").is_file():
        write_manifest(run_dir, manifest_for(first, run_id, overrides, len(plan(points, device))))
    if dropped:
        console.print(f"dropped {dropped} impossible format×scaling combinations of the sweep")
    if is_multi:
        parent = os.getpid()

        def job(point, num: str) -> None:
            # Runs in the launcher's process: this one (basic launcher) or a worker (local-gpus, slurm, ...).
            from rich.console import Console

            from fp8bench.run.launch import prepare_worker

            try:
                check_combination(point)
            except ConfigError:
                return  # an impossible pair of the preset's cartesian product: nothing to measure
            gpu = prepare_worker(parent)
            where = f"job{num}" + (f"-gpu{gpu}" if gpu is not None else "")
            job_console = Console(stderr=True)  # per job: a worker process cannot share the parent's
            job_console.print(f"{where}: pid {os.getpid()}, {point.workload.name} {point.model.name} "
                              f"{point.format.name}/{point.scaling.name} {point.backend.name}")
            execute(plan([point], device), run_dir, run_id, device, job=where, resume=bool(first.resume),
                    console=job_console, progress=False)
    try:
        if is_multi:
            code = multirun(overrides + [f"run_id={run_id}"], job)
            if code:
                return code
        else:
            execute(execution_order(plan(points, device)), run_dir, run_id, device, resume=bool(first.resume),
                    console=console)
    except KeyboardInterrupt:
        again = ["-m"] * is_multi + [o for o in overrides if not o.startswith(("resume=", "run_id="))]
        console.print(f"interrupted: every finished case is recorded in {run_dir}; continue with "
                      f"`fp8bench run {' '.join(again + [f'resume={run_id}'])}`", highlight=False, soft_wrap=True)
        return 130
    _, records, _ = read_run(run_dir)
    _print_summary(records, run_id, run_dir, time.monotonic() - started)
    if first.store.ingest:
        try:
            import duckdb  # noqa: F401
        except ImportError:
            console.print("duckdb is not installed here: shards kept; run `fp8bench ingest` where it is")
            return 0
        db = _db_path(first.store.db, first.results_dir)
        if _ingest_into(db, [run_dir]):
            out.print(f"DuckDB file: {db.resolve()}")
    return 0


def _print_summary(records: list, run_id: str, run_dir: Path, seconds: float) -> None:
    from fp8bench.analysis.parity import derive_parity
    from fp8bench.run.runner import format_duration
    from fp8bench.run.summary import not_run, results_table, skip_reasons, summary_table

    derived: dict[str, dict[str, float]] = defaultdict(dict)
    for rec, metrics, _ in derive_parity(records):  # the loss-parity verdicts `fp8bench ingest` also derives
        derived[rec.case_id].update({m.name: m.value for m in metrics})
    per_case = results_table(records, derived)
    # A few cases, all ok or skipped: their own rows say it all, and the closing line has the counts.
    if any(r.status != "skipped" for r in records) and (
            not per_case or any(r.status not in ("ok", "skipped") for r in records)):
        out.print(summary_table(records))
    whole = not_run(records)
    if whole:
        out.print(whole, highlight=False, markup=False, soft_wrap=True)
    for table in per_case:
        out.print(table)
    reasons = skip_reasons(records)
    if reasons:
        out.print("skipped, by reason:", highlight=False)
        for line in reasons:
            out.print(line, highlight=False, markup=False, soft_wrap=True)
    statuses = ", ".join(f"{s} {n}" for s, n in sorted(Counter(r.status for r in records).items()))
    out.print(f"run {run_id}: {len(records)} cases ({statuses}) in {format_duration(seconds)} wall time",
              highlight=False)
    out.print(f"run folder: {run_dir}")


def cmd_plan(args: list[str]) -> int:
    from fp8bench.config.compose import expand
    from fp8bench.core.hardware import detect_device
    from fp8bench.run.plan import plan

    points, dropped = expand(args)
    cases = plan(points, detect_device())  # a device=cuda point on a CPU is listed as skipped, with why
    width = max((len(c.case_id) for c in cases), default=0)
    for c in cases:  # one line per case, so it greps and never truncates a case id
        out.print(f"{c.case_id:<{width}}  " + ("runnable" if c.runnable else f"skipped: {c.reason}"),
                  soft_wrap=True, highlight=False, markup=False)
    n_ok = sum(c.runnable for c in cases)
    models = sorted({c.config.model.name for c in cases})
    formats = sorted({c.config.format.name for c in cases})
    scalings = sorted({c.config.scaling.name for c in cases})
    out.print(f"{len(cases)} cases: {n_ok} runnable, {len(cases) - n_ok} skipped; models {models}; "
              f"formats {formats}; scalings {scalings}"
              + (f"; dropped {dropped} impossible format×scaling combinations" if dropped else ""))
    return 0


def cmd_ingest(args: list[str]) -> int:
    from fp8bench.data.store import LOCK_WAIT_S

    p = _Parser(prog="fp8bench ingest")
    p.add_argument("paths", nargs="*", type=Path, default=[Path("results")])
    p.add_argument("--db", default=None)
    p.add_argument("--wait", type=float, default=LOCK_WAIT_S, metavar="S",
                   help=f"seconds to wait while another process holds the DuckDB file (default {LOCK_WAIT_S:.0f})")
    ns = p.parse_args(args)
    if not ns.wait >= 0:
        raise UsageError(f"--wait={ns.wait!r} must be a number of seconds >= 0")
    return 0 if _ingest_into(_db_path(ns.db), ns.paths, wait_s=ns.wait) else 1


def cmd_export(args: list[str]) -> int:
    from fp8bench.data import store

    p = _Parser(prog="fp8bench export")
    p.add_argument("run_ids", nargs="+")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--db", default=None)
    ns = p.parse_args(args)
    with _reading(ns.db) as con:
        files = store.export(con, ns.run_ids, ns.out)
    out.print(f"exported {len(ns.run_ids)} run(s) to {ns.out}: {', '.join(f.name for f in files)}")
    return 0


def cmd_report(args: list[str]) -> int:

    p = _Parser(prog="fp8bench report")
    p.add_argument("--db", default=None)
    p.add_argument("--out", type=Path, default=Path("results/site"))
    p.add_argument("--markdown", type=Path, nargs="+", default=None, metavar="FILE",
                   help="rewrite the generated results blocks of these Markdown files instead of building the site")
    ns = p.parse_args(args)
    try:
        from fp8bench.report import build_site, markdown
    except ImportError as exc:
        raise UsageError(f"fp8bench report needs plotly and pandas ({exc}); pip install plotly pandas") from None
    if ns.markdown:
        with _reading(ns.db) as con:
            for path in ns.markdown:
                n = markdown.update(path, con)
                if not n:
                    raise UsageError(f"{path} has no generated block: add '<!-- generated: fp8bench report "
                                     f"--markdown KIND -->' and '<!-- end generated -->' (KIND one of "
                                     f"{sorted(markdown.KINDS)})")
                out.print(f"{path}: {n} generated block(s) rewritten", highlight=False)
        return 0
    with _reading(ns.db) as con:
        pages = build_site(con, ns.out)
    out.print(f"site: {len(pages)} pages in {ns.out.resolve()} (open {(ns.out / 'index.html').resolve()})")
    return 0


def cmd_calibrate(args: list[str]) -> int:
    from fp8bench.analysis.calibrate import calibrate, write
    from fp8bench.core.hardware import detect_device

    p = _Parser(prog="fp8bench calibrate")
    p.add_argument("--out", type=Path, default=Path("results/calibration"))
    p.add_argument("--budget", type=float, default=0.15, help="seconds of timing per GEMM shape and format")
    ns = p.parse_args(args)
    if not ns.budget > 0:
        raise UsageError(f"--budget={ns.budget!r} must be a positive number of seconds")
    dev = detect_device()
    c = calibrate(dev, budget_s=ns.budget)
    path = write(c, ns.out)
    spec = (f" (spec {c.spec_bf16_tflops:.0f} / {c.spec_fp8_tflops:.0f} TFLOPS, {c.spec_gbps:.0f} GB/s)"
            if c.spec_bf16_tflops else " (no spec sheet for this device)")
    out.print(f"{c.device_name}: BF16 {c.bf16_tflops:.1f} TFLOPS, FP8 {c.fp8_tflops:.1f} TFLOPS, copy "
              f"{c.copy_gbps:.0f} GB/s{spec}")
    out.print(f"written: {path} (fp8bench ingest loads it)")
    return 0


def cmd_roofline(args: list[str]) -> int:
    from fp8bench.analysis.roofline import expected_vs_measured, median_abs_error

    p = _Parser(prog="fp8bench roofline")
    p.add_argument("--db", default=None)
    p.add_argument("--with-quant", action="store_true", help="the with-quantization time (default: kernel only)")
    ns = p.parse_args(args)
    with _reading(ns.db) as con:
        df = expected_vs_measured(con, with_quant=ns.with_quant)
    if df.empty:
        out.print("no GEMM case has a BF16 twin and ceilings for its device: run `fp8bench calibrate` there, "
                  "then ingest its results/calibration file")
        return 0
    for device, d in df.groupby("device"):
        table = Table(title=f"roofline vs measured speedup on {device} ({'with quantization' if ns.with_quant else 'kernel only'})")
        cols = ("case", "run", "casts", "expected", "measured", "error", "with fused casts") if ns.with_quant else \
            ("case", "run", "expected", "measured", "error")
        for col in cols:
            table.add_column(col, overflow="fold")
        for r in d.sort_values("rel_error").itertuples():
            row = [r.case_id, r.run_id, f"{r.expected:.2f}x", f"{r.measured:.2f}x", f"{r.rel_error:+.0%}"]
            table.add_row(*([*row[:2], r.cast, *row[2:], f"{r.expected_fused:.2f}x"] if ns.with_quant else row))
        out.print(table)
        out.print(f"{device}: median |error| {median_abs_error(d):.1%} over {len(d)} cases")
    return 0


def cmd_memory(args: list[str]) -> int:
    from fp8bench.analysis.memory_model import model_preset, recipe_change, te_layer_bf16_saved
    from fp8bench.config.compose import group_options

    p = _Parser(prog="fp8bench memory")
    p.add_argument("model")
    p.add_argument("--workload", choices=["layer", "train"], default="layer")
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=4096)
    ns = p.parse_args(args)
    if ns.model not in group_options("model"):
        raise UsageError(f"model={ns.model!r} is not a preset; choose one of {group_options('model')}")
    if ns.batch < 1 or ns.seq < 1:
        raise UsageError(f"--batch={ns.batch} and --seq={ns.seq} must be positive")
    shape, mib = {"batch": ns.batch, "seq": ns.seq}, 2**20
    what = ("TE TransformerLayer" if ns.workload == "layer" else
            f"{model_preset(ns.model).layers} blocks of te.Linear, FP32 master weights under autocast")
    table = Table(title=f"{ns.model}, {what}, {ns.batch}x{ns.seq} tokens: saved for backward (MiB), expected")
    for col in ("recipe", "FP8 weights", "FP8 inputs", "high precision vs BF16", "total vs BF16"):
        table.add_column(col)
    if ns.workload == "layer":
        bf16 = te_layer_bf16_saved(model_preset(ns.model), ns.batch * ns.seq)
        table.add_row("bf16", "0", "0", f"{bf16 / mib:.0f}", "")
    for scaling in ("delayed", "current", "blockwise"):
        c = recipe_change(ns.workload, ns.model, shape, scaling)
        table.add_row(f"e4m3/{scaling}", f"{c.fp8_weights / mib:.0f}", f"{(c.saved_fp8 - c.fp8_weights) / mib:.0f}",
                      f"{c.saved_hp_change / mib:+.0f}", f"{(c.saved_fp8 + c.saved_hp_change) / mib:+.0f}")
    out.print(table)
    out.print("the backward's transient (gradient casts, FP8 transposes) is not in this model; measured cases "
              "show it on the report's Modules and Training pages")
    return 0


def cmd_waterfall(args: list[str]) -> int:
    from fp8bench.analysis.waterfall import from_db

    p = _Parser(prog="fp8bench waterfall")
    p.add_argument("--db", default=None)
    ns = p.parse_args(args)
    with _reading(ns.db) as con:
        rows = from_db(con)
    if not rows:
        out.print("no linear/layer/train case has per-kernel times and a BF16 twin in its run: run those "
                  "workloads on a GPU (the kernel breakdown is CUDA-only)")
        return 0
    table = Table(title="speedup waterfall vs BF16: promise 2x; ideal = GEMMs 2x, rest as BF16; then the measured "
                        "FP8 GEMMs, + casts, + non-GEMM kernels, + idle (= measured); kernels% = FP8 kernel time "
                        "/ measured step")
    table.add_column("case", overflow="fold")
    table.add_column("run")
    stage_names = [name for name, _ in rows[0].waterfall.stages()]
    for name in stage_names:
        table.add_column(name, justify="right")
    table.add_column("kernels%", justify="right")
    for r in rows:
        w = r.waterfall
        table.add_row(r.case_id, r.run_id, *(f"{v:.2f}x" for _, v in w.stages()), f"{w.explained_pct:.1f}%")
    out.print(table)
    return 0


def cmd_asv_compare(args: list[str]) -> int:
    from fp8bench.data.asv_results import compare_commits

    p = _Parser(prog="fp8bench asv-compare")
    p.add_argument("base")
    p.add_argument("head")
    p.add_argument("--machine", default="h200")
    p.add_argument("--results", type=Path, default=Path("results/asv"))
    p.add_argument("--threshold", type=float, default=0.05, help="relative change that counts (default 0.05)")
    p.add_argument("--all", action="store_true", help="list unchanged series too")
    p.add_argument("--across-versions", action="store_true",
                   help="compare results of different measurement versions (every row is labelled)")
    ns = p.parse_args(args)
    if not 0 < ns.threshold < 1:
        raise UsageError(f"--threshold={ns.threshold!r} must be between 0 and 1 (e.g. 0.05 for 5%)")
    changes = compare_commits(ns.results, ns.machine, ns.base, ns.head, ns.threshold, ns.across_versions)
    across = any(c.versions for c in changes)
    table = Table(title=f"asv {ns.base} → {ns.head} on {ns.machine} (threshold {ns.threshold:.0%})")
    for col in ("series", "case", "base", "head", "change", "verdict") + (("versions",) if across else ()):
        table.add_column(col, overflow="fold")
    for c in changes:
        if ns.all or c.verdict != "unchanged":
            table.add_row(c.benchmark, c.case_id, f"{c.base:.4g}", f"{c.head:.4g}", f"{c.rel_change:+.1%}", c.verdict,
                          *((c.versions,) if across else ()))
    out.print(table)
    counts = {v: sum(c.verdict == v for c in changes) for v in ("regression", "improvement", "unchanged")}
    out.print(", ".join(f"{n} {v}" for v, n in counts.items()))
    return 1 if counts["regression"] else 0


def cmd_compare(args: list[str]) -> int:
    from fp8bench.analysis.compare import compare_runs, to_markdown

    p = _Parser(prog="fp8bench compare")
    p.add_argument("base")
    p.add_argument("head")
    p.add_argument("--db", default=None)
    p.add_argument("--markdown", type=Path, default=None)
    p.add_argument("--all", action="store_true", help="list unchanged series too")
    p.add_argument("--across-versions", action="store_true",
                   help="compare runs timed by different measurement versions (every row is labelled)")
    ns = p.parse_args(args)
    with _reading(ns.db) as con:
        cmp = compare_runs(con, ns.base, ns.head, across_versions=ns.across_versions)
    across = cmp.base_version != cmp.head_version
    table = Table(title=f"{cmp.base_run} → {cmp.head_run} on {cmp.device}")
    for col in ("case", "metric", "base", "usual", "head", "change", "p", "floor", "verdict") + (("versions",) if across else ()):
        table.add_column(col)
    style = {"regression": "red", "improvement": "green"}
    for c in cmp.changes:
        if ns.all or c.verdict in style:
            table.add_row(c.case_id, c.metric, f"{c.base:.4g}", "" if c.level is None else f"{c.level:.4g}",
                          f"{c.head:.4g}", f"{c.rel_change:+.2%}",
                          "" if c.p_value is None else f"{c.p_value:.2g}",
                          "" if c.floor is None else f"{c.floor:.1%}", f"[{style.get(c.verdict, '')}]{c.verdict}"
                          if c.verdict in style else c.verdict, *((c.versions,) if across else ()))
    out.print(table)
    if across:
        out.print(f"across measurement versions {cmp.base_version} → {cmp.head_version}: a change can be the "
                  "timing method's", highlight=False)
    if cmp.env_changes:
        out.print("environment changed (likely cause): " + "; ".join(cmp.env_changes))
    out.print(cmp.summary())
    if any(c.verdict == "insufficient data" for c in cmp.changes):
        out.print("insufficient data: the samples moved, but with one run per side and under 5 earlier runs of "
                  "the case on this device the spread between processes is unknown; record the base or head commit "
                  "twice (or keep a history) to judge them", highlight=False)
    if ns.markdown:
        ns.markdown.write_text(to_markdown(cmp))
    return 1 if cmp.regressions else 0


def cmd_history(args: list[str]) -> int:
    from fp8bench.analysis.compare import history_steps

    p = _Parser(prog="fp8bench history")
    p.add_argument("--db", default=None)
    p.add_argument("--metric", default="time_ms")
    p.add_argument("--across-versions", action="store_true",
                   help="let a series span measurement versions (each step says which it joins)")
    ns = p.parse_args(args)
    with _reading(ns.db) as con:
        steps = history_steps(con, ns.metric, across_versions=ns.across_versions)
    for s in steps:
        out.print(f"{s.series}: {s.before:.4g} → {s.after:.4g} ({s.rel_change:+.1%}) at commit {s.commit} "
                  f"(run {s.run_id})" + (f" [across versions {s.versions}]" if s.versions else ""),
                  highlight=False, markup=False)
    out.print(f"{len(steps)} change point(s) in {ns.metric}")
    return 0


def cmd_doctor(args: list[str]) -> int:
    from fp8bench import backends
    from fp8bench.core.hardware import describe, environment
    from fp8bench.core.types import VALID_SCALINGS, Format

    if args:
        raise UsageError(f"fp8bench doctor takes no arguments (got {args})")
    info, env = describe(), environment()
    out.print(f"device: {info['device']['name']} ({info['device']['kind']}, {env['capability']}, CUDA {env['cuda']})")
    out.print(f"spec sheet: {info['spec_sheet']}")
    out.print("versions: " + ", ".join(f"{k[:-8]} {v}" for k, v in env.items() if k.endswith("_version")))
    from fp8bench.core.hardware import detect_device

    dev = detect_device()
    table = Table(title="capability matrix on this device (a backend unavailable here is explained below)")
    table.add_column("format/scaling")
    available = {b: backends.available(b) for b in backends.names()}
    for b, (ok, _) in available.items():
        table.add_column(b + ("" if ok else " (unavailable)"))
    for fmt in Format:
        for sc in sorted(VALID_SCALINGS[fmt], key=lambda s: s.value):
            cells = ["yes" if ok and backends.capability(b, fmt.value, sc.value, dev)[0] else "no"
                     for b, (ok, _) in available.items()]
            table.add_row(f"{fmt.value}/{sc.value}", *cells)
    out.print(table)
    for b, (ok, why) in available.items():
        if not ok:
            out.print(f"{b} unavailable here: {why}", highlight=False, markup=False, soft_wrap=True)
    out.print("why a cell is 'no': `fp8bench plan backend=B format=F scaling=S` gives the reason per case")
    return 0


THIRD_PARTY_NOISE = (
    # torchao tries its optional prebuilt CUDA extensions (_C_mxfp8, _C_cutlass_90a) and logs each it cannot load
    # here; its warning that it skips *all* its C++ extensions (a torch it was not built for) is kept
    ("torchao", "Failed to load "),
    # torch's pytree note on libraries that register enums (torchao's KernelPreference)
    ("torch.utils._pytree", "is an Enum subclass and is now natively supported"),
    # torch on a CPU without an Intel GPU, at every oneDNN TF32 setting
    ("warnings", "TF32 acceleration on top of oneDNN"),
    # Lightning's own use of torch's pytree API
    ("warnings", ".*treespec.*deprecated"),
)
"""Messages of the libraries fp8bench drives that say nothing about a measurement, by logger (or `warnings`)
and a text they contain (for `warnings`, a regular expression their start matches); FP8BENCH_VERBOSE=1 shows
them."""


class _DropMessages:
    """A logging filter dropping the records whose message contains one of `texts`."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts

    def filter(self, record) -> bool:
        message = record.getMessage()
        return not any(t in message for t in self.texts)


def quiet_third_party() -> None:
    if os.environ.get("FP8BENCH_VERBOSE"):
        return
    import logging
    import warnings

    by_logger: dict[str, list[str]] = {}
    for where, text in THIRD_PARTY_NOISE:
        if where == "warnings":
            warnings.filterwarnings("ignore", message=text)
        else:
            by_logger.setdefault(where, []).append(text)
    for name, texts in by_logger.items():
        logging.getLogger(name).addFilter(_DropMessages(texts))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    quiet_third_party()
    if not argv or argv[0] in ("-h", "--help", "help"):
        out.print(USAGE, highlight=False)
        return 0
    if "--version" in argv or argv[0] == "-V":
        from fp8bench import __version__
        from fp8bench.core.records import MEASUREMENT_VERSION

        out.print(f"fp8bench {__version__} (measurement version {MEASUREMENT_VERSION})", highlight=False)
        return 0
    cmd, rest = argv[0], argv[1:]
    if cmd in ("run", "plan", "doctor") and any(a in ("-h", "--help") for a in rest):
        out.print(_help(cmd), highlight=False, markup=False)
        return 0
    handlers = {"run": cmd_run, "plan": cmd_plan, "ingest": cmd_ingest, "export": cmd_export, "report": cmd_report,
                "compare": cmd_compare, "asv-compare": cmd_asv_compare, "history": cmd_history,
                "calibrate": cmd_calibrate, "roofline": cmd_roofline, "waterfall": cmd_waterfall, "memory": cmd_memory,
                "doctor": cmd_doctor}
    from fp8bench.core.records import StoreError

    try:
        if cmd not in handlers:
            raise UsageError(f"command {cmd!r} is unknown; choose one of {list(COMMANDS)}")
        return handlers[cmd](rest)
    except (ConfigError, UsageError, StoreError) as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2
    except OSError as exc:  # a path the user gave (results_dir, --db, --out, an input) cannot be used
        where = exc.filename if exc.filename is not None else ""
        console.print(f"[red]error:[/] path {str(where)!r} cannot be used: {exc.strerror or exc}; give a "
                      "folder or file this user can read and write", highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        console.print("interrupted: what was finished is recorded")
        return 130


def entry() -> None:
    sys.exit(main())
