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
COMMANDS = ("run", "plan", "advise", "ingest", "export", "report", "audit", "compare", "asv-compare", "history", "calibrate",
            "roofline", "waterfall", "memory", "doctor")
USAGE = """usage: fp8bench COMMAND [ARGS]

  run [-m] [hydra overrides]   run a point or a sweep preset (sweep=quick); -m uses Hydra's multirun
  plan [hydra overrides]       list the cases with runnable / skipped: reason; runs nothing
  advise [--db DB]             the recipe to train with: the fastest that passes loss parity (3+ seeds)
  ingest [PATHS...] [--db DB] [--wait S]
                               load run folders, shards or Parquet exports into DuckDB (idempotent); waits
                               up to S seconds (300) while another process holds the file, then exits 1
  export RUN_ID... --out DIR   write runs as Parquet (one file per table) to commit under results/
  report [--db DB] [--out DIR] build the static site (plotly, offline) from DuckDB
  report --markdown FILE...     rewrite the generated results tables of Markdown files (make results-page)
  audit [PAGE...] [--root DIR] [--db DB] [--verbose]
                               rebuild every figure README.md and docs/ publish from the committed samples;
                               exit 1 naming each that differs or cannot be rebuilt
  compare BASE HEAD [--db DB] [--markdown FILE]
                               judge two runs (each a run id, git commit or 'latest') against the
                               variance between runs; exit 1 if anything regressed
  asv-compare BASE HEAD [--machine M] [--results results/asv]
                               two commits recorded by asv, judged as compare judges runs;
                               exit 1 if anything regressed
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
device=auto|cpu|cuda, measure.* (warmup, rounds, block_ms, settle_ms, flush_l2, iters, max_time_s, processes,
sandwich_blocks, sandwich_steps), workload.* (tokens, linears, roles, shapes, batch, seq, train.*), store.ingest=, store.db=.
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
    from fp8bench.config.compose import expand_request
    from fp8bench.core.records import read_run, write_manifest
    from fp8bench.run.plan import execution_order, job_groups, plan, resolve_device
    from fp8bench.run.runner import check_resume, execute, manifest_for, new_run_id, run_dir_for, write_plan

    started = time.monotonic()
    is_multi = any(a in ("-m", "--multirun") for a in args)
    overrides = [a for a in args if a not in ("-m", "--multirun")]
    request = expand_request(overrides, multirun=is_multi)
    points = list(request.points)
    first = points[0]
    check_resume(first, overrides)
    device = resolve_device(first)
    run_id = first.resume or first.run_id or new_run_id()
    cases = plan(points, device, strict=len(points) == 1)
    groups = job_groups(execution_order(cases))
    run_dir = run_dir_for(first, run_id)
    if not (run_dir / "manifest.json").is_file():
        write_manifest(run_dir, manifest_for(first, run_id, overrides, len(cases)))
    write_plan(run_dir, groups)
    _say_what_was_added(cases, request.dropped)
    try:
        if is_multi:
            code = _launch(request.hydra_overrides, first, run_id, len(groups), device)
            if code:
                return code
        else:
            execute(execution_order(cases), run_dir, run_id, device, resume=bool(first.resume), console=console)
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


def _say_what_was_added(cases: list, dropped: int) -> None:
    if dropped:
        console.print(f"dropped {dropped} impossible format×scaling combinations of the sweep")
    added = [c for c in cases if c.added and c.runnable]
    if added:
        console.print(f"added {len(added)} BF16 twin case(s) the request did not name (every speedup divides by a "
                      f"recorded twin of the same run): {', '.join(sorted({c.label for c in added})[:6])}"
                      + (" ..." if len(added) > 6 else ""), highlight=False, soft_wrap=True)


def _launch(hydra_overrides: tuple[str, ...], first, run_id: str, n_groups: int, device) -> int:
    """One Hydra job per twin group, through the launcher the overrides choose; each job plans its group's
    points on the device it runs on and runs them in one process."""
    from fp8bench.config.compose import launch_jobs

    parent = os.getpid()

    def job(config, index: int) -> None:
        # Runs in the launcher's process: this one (basic launcher) or a worker (local-gpus, slurm, ...).
        from rich.console import Console

        from fp8bench.core.hardware import detect_device
        from fp8bench.run.launch import prepare_worker
        from fp8bench.run.plan import execution_order, plan
        from fp8bench.run.runner import execute, group_points, run_dir_for
        from fp8bench.run.scheduler import slurm_context

        gpu = prepare_worker(parent)
        where = f"job{index}" + (f"-gpu{gpu}" if gpu is not None else "")
        run_dir = run_dir_for(config, run_id)
        points = group_points(run_dir, index)
        here = device if os.getpid() == parent else detect_device()
        job_console = Console(stderr=True)  # per job: a worker process cannot share the parent's
        cases = plan(points, here)
        job_console.print(f"{where}: pid {os.getpid()}, {len(cases)} case(s) of {cases[0].label}"
                          + (" ..." if len(cases) > 1 else ""), highlight=False)
        # a job Slurm requeued runs again from the start: what its first run recorded is kept, not measured twice
        again = bool(first.resume) or slurm_context().get("restart_count", 0) > 0
        execute(execution_order(cases), run_dir, run_id, here, job=where, resume=again, console=job_console,
                progress=False)

    fixed = [f"results_dir={first.results_dir}", f"run_id={run_id}"]
    return launch_jobs(list(hydra_overrides), fixed, n_groups, job)


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
    from fp8bench.config.compose import expand_request
    from fp8bench.core.hardware import DESCRIBED_DEVICES, detect_device
    from fp8bench.run.plan import plan

    on = None
    if "--on" in args:
        at = args.index("--on")
        if at + 1 >= len(args) or args[at + 1] not in DESCRIBED_DEVICES:
            given = args[at + 1] if at + 1 < len(args) else ""
            raise UsageError(f"--on {given!r} names no described device; choose one of {sorted(DESCRIBED_DEVICES)}")
        on = DESCRIBED_DEVICES[args[at + 1]]
        args = args[:at] + args[at + 2:]
    db = None
    if "--db" in args:
        at = args.index("--db")
        if at + 1 >= len(args):
            raise UsageError("--db needs a DuckDB file (fp8bench ingest makes one)")
        db = Path(args[at + 1])
        args = args[:at] + args[at + 2:]
    elif Path("results/fp8bench.duckdb").is_file():
        db = Path("results/fp8bench.duckdb")
    is_multi = any(a in ("-m", "--multirun") for a in args)
    request = expand_request([a for a in args if a not in ("-m", "--multirun")], multirun=is_multi)
    device = on or detect_device()
    cases = plan(list(request.points), device, installed=on is None, strict=len(request.points) == 1)
    width = max((len(c.case_id) for c in cases), default=0)
    for c in cases:  # one line per case, so it greps and never truncates a case id
        state = "runnable" if c.runnable else f"skipped: {c.reason}"
        out.print(f"{c.case_id:<{width}}  {state}" + (" (BF16 twin added)" if c.added else ""),
                  soft_wrap=True, highlight=False, markup=False)
    n_ok = sum(c.runnable for c in cases)
    models = sorted({c.config.model.name for c in cases})
    formats = sorted({c.config.format.name for c in cases})
    scalings = sorted({c.config.scaling.name for c in cases})
    where = f" on a described {device.name}" if on else ""
    expected = _expected_time(cases, device, db)
    out.print(f"{len(cases)} cases{where}: {n_ok} runnable, {len(cases) - n_ok} skipped; models {models}; "
              f"formats {formats}; scalings {scalings}"
              + (f"; dropped {request.dropped} impossible format×scaling combinations" if request.dropped else "")
              + (f"; {sum(c.added for c in cases)} BF16 twins added" if any(c.added for c in cases) else ""),
              highlight=False)
    if expected:
        out.print(expected, highlight=False)
    return 0


def _expected_time(cases: list, device, db: Path | None) -> str:
    """The device time the runnable cases are expected to take, from the stored history of like cases."""
    if db is None or not db.is_file() or not device.is_cuda:
        return ""
    from fp8bench.data.estimate import expected_seconds

    with _reading(str(db)) as con:
        est = expected_seconds(con, cases, device.name.replace("NVIDIA ", "").split()[0])
    left = f" ({est.missing} runnable case(s) have no history to go by)" if est.missing else ""
    return (f"expected device time: {est.total / 60:.1f} min for {len(est.seconds)} case(s) from the history in "
            f"{db}{left}")


def cmd_advise(args: list[str]) -> int:
    from fp8bench.report.recommendation import HEADERS, decide, rows

    p = _Parser(prog="fp8bench advise", description="The FP8 recipe to train with, from the stored runs: the "
                "fastest whole-step speedup over BF16 (at the largest size timed) among recipes that pass loss "
                "parity with at least three seeds at the largest size judged; faster recipes that fail, or were "
                "judged on too few seeds, are listed below it with their verdicts.")
    p.add_argument("--db", default=None)
    ns = p.parse_args(args)
    with _reading(ns.db) as con:
        rec = decide(con)
    table = Table(title="which FP8 recipe to train with")
    for col in HEADERS:
        table.add_column(col, overflow="fold")
    for row in rows(rec):
        table.add_row(*row)
    out.print(table)
    out.print(rec.text(), highlight=False, markup=False, soft_wrap=True)
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


def cmd_audit(args: list[str]) -> int:
    p = _Parser(prog="fp8bench audit", description="Rebuild every figure README.md and docs/*.md publish from the "
                "committed samples alone (results/: the sets `make results-page` ingests): every generated block "
                "cell by cell, every speedup from its record's and its BF16 twin's samples, every figure in prose "
                "that carries a marker (<!-- figure: run=RUN case=CASE metric=METRIC -->1.23x), and that every "
                "speedup shown carries its interval and measurement version or is withdrawn with the reason. "
                "Exit 1 naming each figure that differs beyond its printed rounding, cannot be rebuilt or is a "
                "speedup shown bare; untagged figures in prose are counted as unverifiable. "
                "docs/reproducibility.md, 'What fp8bench audit checks'.")
    p.add_argument("pages", nargs="*", type=Path, metavar="PAGE",
                   help="Markdown files to check (default: README.md and docs/*.md under --root)")
    p.add_argument("--root", type=Path, default=Path("."), help="the repository: its results/ and pages (default .)")
    p.add_argument("--db", type=Path, default=None,
                   help="a DuckDB file of the committed result sets to read instead of ingesting results/ (never "
                        "written)")
    p.add_argument("--verbose", action="store_true", help="list the withdrawn and the unverifiable figures")
    ns = p.parse_args(args)
    from fp8bench.report.audit import audit, summary

    result = audit(ns.root, ns.pages or None, ns.db)
    for problem in result.problems:
        out.print(problem.text(), highlight=False, markup=False, soft_wrap=True)
    for line in summary(result, ns.verbose):
        out.print(line, highlight=False, markup=False, soft_wrap=True)
    verdict = (f"{len(result.problems)} figure(s) differ, cannot be rebuilt or are speedups shown bare"
               if result.problems else "every checked figure is rebuilt from the committed samples")
    out.print(verdict, highlight=False, markup=False)
    return 1 if result.problems else 0


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
    from fp8bench.data.asv_results import NOT_JUDGED, compare_commits

    p = _Parser(prog="fp8bench asv-compare", description="Judge every series two commits recorded by asv share on "
                "a machine, direction-aware, against the variance between runs (the machine's earlier commits, "
                "else the spread of like series), all at once (Benjamini-Hochberg); memory and SQNR by value; "
                "TFLOPS and time vs BF16 take the verdict of the time and speedup they invert. "
                "The CPU suite on a GPU machine, host-bound and unsettled series are listed as not judged. "
                "Exit 1 if anything regressed.")
    p.add_argument("base", metavar="BASE", help="a commit (a prefix of its hash) with results on the machine")
    p.add_argument("head", metavar="HEAD", help="a commit (a prefix of its hash) with results on the machine")
    p.add_argument("--machine", default="h200")
    p.add_argument("--results", type=Path, default=Path("results/asv"))
    p.add_argument("--threshold", type=float, default=0.01,
                   help="the smallest relative change called, however significant (default 0.01)")
    p.add_argument("--all", action="store_true", help="list unchanged and not judged series too")
    p.add_argument("--across-versions", action="store_true",
                   help="list the changes between results of different measurement versions (not judged)")
    ns = p.parse_args(args)
    if not 0 < ns.threshold < 1:
        raise UsageError(f"--threshold={ns.threshold!r} must be between 0 and 1 (e.g. 0.01 for 1%)")
    cmp = compare_commits(ns.results, ns.machine, ns.base, ns.head, ns.threshold, ns.across_versions)
    across = any(c.versions for c in cmp.changes)
    table = Table(title=f"asv {ns.base} → {ns.head} on {ns.machine}")
    for col in ("series", "case", "bound", "base", "head", "change", "p", "detectable", "verdict",
                "variance / reason") + (("versions",) if across else ()):
        table.add_column(col, overflow="fold")
    for c in cmp.changes:
        if ns.all or c.verdict in ("regression", "improvement"):
            table.add_row(c.benchmark, c.case_id, c.bound, f"{c.base:.4g}", f"{c.head:.4g}", f"{c.rel_change:+.1%}",
                          "" if c.p_value is None else f"{c.p_value:.2g}", _pct(c.detectable), c.verdict, c.reason,
                          *((c.versions,) if across else ()))
    out.print(table)
    for name, members, shift, verdict in cmp.class_changes:
        if verdict in ("regression", "improvement"):
            out.print(f"class {name} ({members} series) moved {shift:+.2%} together: {verdict}", markup=False)
    out.print(cmp.summary(), highlight=False, markup=False)
    if any(c.verdict == NOT_JUDGED for c in cmp.changes) and not ns.all:
        out.print("--all lists the series not judged, each with its reason", highlight=False)
    return 1 if cmp.regressions else 0


def _pct(x: float | None) -> str:
    return "" if x is None or x != x else (">100%" if x > 1 else f"{x:.1%}")


COMPARE_WHAT = """Judge every timing and speedup two runs share, at once, against the variance between runs (earlier runs
of the same GPU model and measurement version; never a run started after HEAD), Benjamini-Hochberg over all of
them; numerics by value. BASE and HEAD are each a run id, a git commit (a prefix: its latest run) or 'latest'.
Exit 1 if anything regressed (host-bound regressions included), 2 on bad input. docs/regression.md says how."""


def cmd_compare(args: list[str]) -> int:
    from fp8bench.analysis.compare import NOT_COMPARABLE, compare_runs, to_markdown

    p = _Parser(prog="fp8bench compare", description=COMPARE_WHAT)
    p.add_argument("base", metavar="BASE", help="a run id, a git commit (prefix; its latest run) or 'latest'")
    p.add_argument("head", metavar="HEAD", help="a run id, a git commit (prefix; its latest run) or 'latest'")
    p.add_argument("--db", default=None, help="the DuckDB file (default results/fp8bench.duckdb)")
    p.add_argument("--markdown", type=Path, default=None, help="also write the verdicts as Markdown here")
    p.add_argument("--all", action="store_true", help="list unchanged and not comparable series too")
    p.add_argument("--across-versions", action="store_true",
                   help="list the changes between runs of different measurement versions (not judged)")
    ns = p.parse_args(args)
    with _reading(ns.db) as con:
        cmp = compare_runs(con, ns.base, ns.head, across_versions=ns.across_versions)
    across = cmp.base_version != cmp.head_version
    table = Table(title=f"{cmp.base_run} → {cmp.head_run} on {cmp.device}")
    for col in ("case", "metric", "bound", "base", "head", "change", "beyond class", "p", "detectable", "verdict",
                "variance / reason") + (("versions",) if across else ()):
        table.add_column(col)
    style = {"regression": "red", "improvement": "green"}
    for c in cmp.changes:
        if ns.all or c.verdict in style:
            verdict = f"[{style[c.verdict]}]{c.verdict}[/]" if c.verdict in style else c.verdict
            table.add_row(c.case_id, c.metric, c.bound, f"{c.base:.4g}", f"{c.head:.4g}", f"{c.rel_change:+.2%}",
                          "" if c.beyond_class is None else f"{c.beyond_class:+.2%}",
                          "" if c.p_value is None else f"{c.p_value:.2g}", _pct(c.detectable), verdict, c.reason,
                          *((c.versions,) if across else ()))
    out.print(table)
    for c in cmp.class_changes:
        if c.verdict in style or (ns.all and abs(c.rel_change) >= 0.01):
            out.print(f"class {c.name} ({c.members} series) moved {c.rel_change:+.2%} together: "
                      + (c.verdict or "not judged (no history of this class's shifts: a box's difference or a "
                                       "change)"), highlight=False, markup=False)
    if across:
        out.print(f"across measurement versions {cmp.base_version} → {cmp.head_version}: changes listed, not judged",
                  highlight=False)
    if cmp.env_changes:
        out.print("environment changed (likely cause): " + "; ".join(cmp.env_changes), markup=False)
    out.print(cmp.summary(), highlight=False, markup=False)
    by_bound: dict[str, list[float]] = defaultdict(list)
    for c in cmp.changes:
        if c.detectable is not None and c.verdict != NOT_COMPARABLE:
            by_bound[c.bound or "cpu"].append(c.detectable)
    if by_bound:
        out.print("smallest change caught with 80% power (median over the judged series): " + ", ".join(
            f"{_pct(sorted(v)[len(v) // 2])} {b} ({len(v)})" for b, v in sorted(by_bound.items())), highlight=False)
    if ns.markdown:
        ns.markdown.write_text(to_markdown(cmp))
    return 1 if cmp.regressions else 0


def cmd_history(args: list[str]) -> int:
    from fp8bench.analysis.history import judge_history

    p = _Parser(prog="fp8bench history", description="Persistent steps in every case's series of runs, each "
                "tested against the series' own run-to-run spread, all at once (Benjamini-Hochberg).")
    p.add_argument("--db", default=None, help="the DuckDB file (default results/fp8bench.duckdb)")
    p.add_argument("--metric", default="time_ms")
    p.add_argument("--across-versions", action="store_true",
                   help="let a series span measurement versions (each step says which it joins)")
    ns = p.parse_args(args)
    with _reading(ns.db) as con:
        found = judge_history(con, ns.metric, across_versions=ns.across_versions)
    for s in found.steps:
        out.print(f"{s.series}: {s.before:.4g} → {s.after:.4g} ({s.rel_change:+.1%}, p {s.p_value:.2g}"
                  + (f", {s.bound}" if s.bound else "") + f") at commit {s.commit} (run {s.run_id})"
                  + (f" [across versions {s.versions}]" if s.versions else ""), highlight=False, markup=False)
    out.print(f"{len(found.steps)} change point(s) in {ns.metric}: {len(found.steps)} of {found.candidates} candidate "
              f"steps in {found.series} series held (Benjamini-Hochberg at 1%)"
              + (f"; {found.unsettled_points} unsettled run(s) left out of their series" if found.unsettled_points
                 else ""), highlight=False)
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
    # Hydra's plugin scan, on a box without the joblib or submitit plugin our launchers extend (those launchers
    # are unavailable there, and choosing one is a clear error: fp8bench.config.compose.chosen_launcher_missing)
    ("warnings", r"\s*Error importing 'hydra_plugins\.fp8bench_launchers\."),
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
        out.print(USAGE, highlight=False, markup=False)  # markup would eat "[hydra overrides]"
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
    handlers = {"run": cmd_run, "plan": cmd_plan, "advise": cmd_advise, "ingest": cmd_ingest, "export": cmd_export, "report": cmd_report, "audit": cmd_audit,
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
