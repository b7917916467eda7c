"""Regression detection trials on a GPU (issue: regression detection that engineers trust).

`record` (on the GPU box): TRIALS+1 processes, each running the `regression-trials` suite three times into
three runs: as is (A), with every torch-backend iteration stretched by 3% and by 10% (fp8bench's test-only
`slowdown` knob, inside the timed region; each slowed case records the fraction its filler added, measured
in its own process against the unslowed op). Separate processes, so process-to-process variation is
included.

`judge` (where DuckDB is): ingest the runs, then compare
- A/A: A of process i against A of process i+1 of the same batch: every regression verdict is false;
- injected: A of process i against the 3% (10%) run of process i+1: per case, is it called a regression?
Prints the counts per case with its median floor (the smallest change the comparison can call for it).

`table` prints the judged trials as the markdown table docs/regression.md holds (tests/test_docs.py checks it).

Usage: python3 scripts/regression_trials.py record --out DIR [--trials 20] [--batch NAME] [--budget-s S] [-- OVERRIDES...]
       python3 scripts/regression_trials.py judge DIR [DIR...] [--db PATH] [--json FILE]
       python3 scripts/regression_trials.py table FILE.json [FILE.json...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from fp8bench.report.probe_tables import regression_trials

LEVELS = {"A": None, "slow3": "torch:0.03", "slow10": "torch:0.10"}


def record(out: Path, trials: int, batch: str, overrides: list[str], budget_s: float | None = None) -> None:
    """`budget_s`: stop before a process that would not finish in time (judged by the longest so far), and
    stop a running one at the deadline (an incomplete process is left out by `judge`)."""
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + budget_s if budget_s else None
    longest = 0.0
    for i in range(trials + 1):
        if deadline is not None and time.monotonic() + longest > deadline:
            print(f"stopping before process {i}: the {budget_s:.0f} s budget would be exceeded", flush=True)
            return
        code = ("import sys; from fp8bench.cli import main; "
                "sys.exit(max(main(['run', *a]) for a in %r))") % [
            ["sweep=regression-trials", f"run_id={batch}trial{i:02d}-{name}", f"results_dir={out}",
             "store.ingest=false", *overrides]
            + ([f"slowdown={s}"] if s else []) for name, s in LEVELS.items()]
        start = time.monotonic()
        try:
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  timeout=deadline - start if deadline is not None else None)
        except subprocess.TimeoutExpired:
            print(f"process {i}: stopped at the budget's end", flush=True)
            return
        longest = max(longest, time.monotonic() - start)
        print(f"process {i}: rc={proc.returncode} in {time.monotonic() - start:.0f} s", flush=True)
        if proc.returncode:
            print(proc.stderr[-3000:])


def _complete_processes(folder: Path) -> list[str]:
    """Run-id prefixes ('<batch>trialNN') of the processes that recorded all three runs in `folder`."""
    names = {p.name for p in (folder / "runs").iterdir() if any(p.glob("shard-*.jsonl"))}
    prefixes = sorted({n.rsplit("-", 1)[0] for n in names})
    return [p for p in prefixes if all(f"{p}-{level}" in names for level in LEVELS)]


def judge(folders: list[Path], db: Path, json_out: Path | None) -> int:
    """Pairs are consecutive processes (in start order) on one physical GPU, which is one env_id (it holds the
    GPU's UUID): a chain goes on across batches recorded on a GPU and is never compared across GPUs. Counts
    are per timed case and over whole trials. Each comparison sees only runs that started before its head
    (fp8bench.analysis.compare), so the first pairs of a chain judge with little history, as they did when recorded."""
    from fp8bench.analysis.compare import compare_runs
    from fp8bench.data import store

    con = store.connect(db)
    store.ingest(con, folders)
    batches: dict[str, list[str]] = {}  # env_id -> processes in start order
    started = {}
    for f in folders:
        for prefix in _complete_processes(f):
            env_id, started[prefix] = con.execute("SELECT env_id, started_at FROM runs WHERE run_id = ?",
                                                  [f"{prefix}-A"]).fetchone()
            batches.setdefault(env_id, []).append(prefix)
    for chain in batches.values():
        chain.sort(key=started.get)
    pairs = [(a, b) for chain in batches.values() for a, b in zip(chain, chain[1:], strict=False)]
    result: dict = {"processes": sum(map(len, batches.values())), "chains": {f"{v[0].split('trial')[0]}.. on env {k}": len(v) for k, v in batches.items()},
                    "pairs": len(pairs), "aa_false_regressions": 0, "per_case": {}, "trials_all_cases_detected": {}}
    per_case = result["per_case"]

    def case(c):
        return per_case.setdefault(c.case_id, {"aa_pairs": 0, "aa_false_regressions": 0, "aa_false_improvements": 0,
                                               "aa_insufficient_data": 0, "detected_slow3": 0, "detected_slow10": 0,
                                               "insufficient_slow3": 0, "insufficient_slow10": 0, "floors_pct": []})
    for a, b in pairs:
        for c in compare_runs(con, f"{a}-A", f"{b}-A").changes:
            if c.metric != "time_ms":
                continue
            result["aa_false_regressions"] += c.verdict == "regression"
            case(c)["aa_pairs"] += 1
            case(c)["aa_false_regressions"] += c.verdict == "regression"
            case(c)["aa_false_improvements"] += c.verdict == "improvement"
            case(c)["aa_insufficient_data"] += c.verdict == "not comparable"
            if c.detectable is not None:  # the smallest change this comparison could catch for the case
                case(c)["floors_pct"].append(100 * c.detectable)
    for level in ("slow3", "slow10"):
        whole = 0
        for a, b in pairs:
            timed = [c for c in compare_runs(con, f"{a}-A", f"{b}-{level}").changes if c.metric == "time_ms"]
            injected = dict(con.execute(
                "SELECT case_id, value FROM measurements WHERE run_id = ? AND metric = 'injected_slowdown_pct'",
                [f"{b}-{level}"]).fetchall())
            for c in timed:
                if c.case_id in injected:  # what the filler added, measured in the slowed run's own process
                    case(c).setdefault(f"injected_{level}_pct", []).append(round(injected[c.case_id], 2))
                case(c)[f"detected_{level}"] += c.verdict == "regression"
                case(c)[f"insufficient_{level}"] += c.verdict == "not comparable"
                case(c)[f"compared_{level}"] = case(c).get(f"compared_{level}", 0) + 1
                case(c)[f"changes_{level}_pct"] = case(c).get(f"changes_{level}_pct", []) + [round(100 * c.rel_change, 2)]
            whole += bool(timed) and all(c.verdict == "regression" for c in timed)
        result["trials_all_cases_detected"][level] = whole
    for c in per_case.values():
        floors = c.pop("floors_pct")
        c["median_floor_pct"] = round(statistics.median(floors), 2) if floors else None
    print(json.dumps(result, indent=1))
    if json_out:
        json_out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--trials", type=int, default=20)
    r.add_argument("--batch", default="", help="run-id prefix of this batch (one per call and GPU)")
    r.add_argument("--budget-s", type=float, help="wall-clock budget: no process is started that would not fit")
    r.add_argument("overrides", nargs="*", help="fp8bench overrides for every run, e.g. format=bf16 scaling=none")
    j = sub.add_parser("judge")
    j.add_argument("folders", type=Path, nargs="+", help="one folder per batch (machine)")
    j.add_argument("--db", type=Path, default=Path("/tmp/regression-trials.duckdb"))
    j.add_argument("--json", type=Path)
    t = sub.add_parser("table")
    t.add_argument("files", type=Path, nargs="+")
    a = ap.parse_args()
    if a.cmd == "table":
        print(regression_trials(a.files), end="")
        return 0
    if a.cmd == "record":
        record(a.out, a.trials, a.batch, a.overrides, a.budget_s)
        return 0
    return judge(a.folders, a.db, a.json)


if __name__ == "__main__":
    sys.exit(main())
