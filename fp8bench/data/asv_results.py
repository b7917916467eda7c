"""Comparison of two commits recorded by asv (`fp8bench asv-compare`, the gate's second step), by the rule of
`fp8bench compare` (fp8bench.core.judging).

`asv compare` treats every number as lower-is-better and always exits 0. Here each series keeps its direction
(time and memory: lower is better; TFLOPS, speedup, SQNR: higher) and is judged against the variance between
runs: asv keeps one number per benchmark and commit, so that variance is the series' history (the commits
recorded before the head on the machine, same benchmark version) or, without one, the spread of its class
(same benchmark, bound label, workload and model) in this comparison. All series are judged at once by
Benjamini-Hochberg. Deterministic series (peak memory, SQNR and noise power) are compared by value. A series
that is another's inverse on a fixed case (TFLOPS of time, time vs BF16 of speedup) is one measurement with
it: it is judged there, once, and listed as its inverse, so that Benjamini-Hochberg does not count one
measurement twice.

Not judged, and listed with their count: the CPU suite's cases on a GPU machine (microsecond kernels whose time
is the host's launches), host-bound and unsettled series (the suite's `track_bound`: a host-bound series'
single number says what this box's CPU did), and series with no variance (too few like series and no
history). Results recorded before `track_bound` existed have the label `unknown` and are judged.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from fp8bench.core.bound import Bound
from fp8bench.core.judging import FDR, IMPROVEMENT, MIN_CHANGE, REGRESSION, UNCHANGED, judge_comparison
from fp8bench.core.records import METRICS, StoreError

CPU_MODEL = "tiny"
"""The model preset of the CPU suite (conf/sweep/asv-cpu.yaml): its cases run everywhere, in microseconds."""
BOUND_SERIES = "track_bound"
"""The suite's bound label per case (BOUND_CODES), recorded with every commit from measurement version 4 on."""
BOUND_CODES = {0.0: Bound.DEVICE, 1.0: Bound.HOST, 2.0: Bound.UNSETTLED, 3.0: Bound.UNKNOWN}
BY_VALUE = {"track_peak_mem_bytes": 0.01, "track_noise_power": 10 ** 0.05 - 1, "track_sqnr_db": None}
"""Deterministic series and the relative change that counts (SQNR: SQNR_TOLERANCE_DB in dB; noise power: the
same 0.5 dB)."""
SQNR_TOLERANCE_DB = 0.5
INVERSES = {"track_tflops": "track_time_ms", "track_time_vs_bf16": "track_speedup_vs_bf16"}
"""Series whose value is 1 / another's times a constant of the case (the case's FLOPs; 1): where both commits
recorded the other, the verdict is the other's."""
NOT_JUDGED = "not judged"
INVERSE = "inverse"


def direction(benchmark: str) -> str:
    """`track_<metric>` keeps its metric's direction (fp8bench.core.records.METRICS); asv's own default is lower."""
    name = benchmark.removeprefix("track_")
    return "higher" if name == "sqnr_db" else METRICS.get(name, ("", "lower"))[1]


@dataclass(frozen=True)
class AsvChange:
    benchmark: str
    case_id: str
    base: float
    head: float
    rel_change: float
    verdict: str
    """regression | improvement | unchanged | not judged | inverse (of a series judged in its place)"""
    versions: str = ""
    """'fp8bench-measurement-3 → fp8bench-measurement-4' when the commits' results come from different
    benchmark versions (asv-compare --across-versions)."""
    bound: str = ""
    reason: str = ""
    """Why it was not judged; for a judged one, where its variance came from."""
    p_value: float | None = None
    detectable: float | None = None
    """The smallest relative change this series could be caught at with 80% power."""


@dataclass
class AsvComparison:
    changes: list[AsvChange] = field(default_factory=list)
    class_changes: list[tuple[str, int, float, str]] = field(default_factory=list)
    """(class, series, relative shift, verdict) of classes whose series moved together."""

    @property
    def regressions(self) -> list:
        return [c for c in self.changes if c.verdict == REGRESSION] + [c for c in self.class_changes
                                                                       if c[3] == REGRESSION]

    def not_judged(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for c in self.changes:
            if c.verdict == NOT_JUDGED:
                out[c.reason] = out.get(c.reason, 0) + 1
        return dict(sorted(out.items()))

    def summary(self) -> str:
        counts = ", ".join(f"{sum(c.verdict == v for c in self.changes)} {v}" for v in (REGRESSION, IMPROVEMENT,
                                                                                         UNCHANGED))
        inverses = sum(c.verdict == INVERSE for c in self.changes)
        nj = self.not_judged()
        return (f"{counts} (BH at {FDR:.0%}); {inverses} inverses of judged series (judged once); "
                f"{sum(nj.values())} not judged" + (": " + ", ".join(f"{r} {n}" for r, n in nj.items()) if nj else ""))


@dataclass(frozen=True)
class _Result:
    commit: str
    date: int
    values: dict[tuple[str, str], float]
    versions: dict[str, str]


def _read(path: Path) -> _Result | None:
    data = json.loads(path.read_text())
    if "results" not in data:
        return None
    cols = data.get("result_columns", [])
    column = cols.index("version") if "version" in cols else None
    values, versions = {}, {}
    for bench, entry in data["results"].items():
        name = bench.rsplit(".", 1)[-1]
        if column is not None and len(entry) > column:
            versions[name] = entry[column]
        for param, value in zip(entry[1][0] if entry[1] else [], entry[0] or [], strict=False):
            if value is not None and not (isinstance(value, float) and math.isnan(value)):
                values[(name, param.strip("'"))] = float(value)
    return _Result(data.get("commit_hash", ""), int(data.get("date") or 0), values, versions)


def _results(results_dir: Path, machine: str) -> list[_Result]:
    folder = results_dir / machine
    if not folder.is_dir():
        machines = sorted(p.name for p in results_dir.glob("*") if (p / "machine.json").is_file())
        raise StoreError(f"--machine {machine!r} has no results in {results_dir}; choose one of {machines}")
    return [r for p in sorted(folder.glob("*.json")) if p.name != "machine.json" and (r := _read(p)) is not None]


def _pick(results: list[_Result], commit: str, machine: str) -> _Result:
    hits = [r for r in results if r.commit.startswith(commit)]
    if not hits:
        raise StoreError(f"commit {commit!r} has no asv result on {machine}; recorded commits: "
                         f"{sorted(r.commit[:8] for r in results)}")
    if len(hits) > 1:
        raise StoreError(f"commit {commit!r} matches {len(hits)} result files on {machine}; give more of the hash "
                         "or one environment")
    return hits[0]


def load_result(results_dir: Path, machine: str, commit: str,
                versions: dict[str, str] | None = None) -> dict[tuple[str, str], float]:
    """{(benchmark, case_id): value} of the result file of `commit` (a prefix) on `machine`; `versions`, when
    given, receives each benchmark's version (the suite's `version`: fp8bench-measurement-N)."""
    r = _pick(_results(results_dir, machine), commit, machine)
    if versions is not None:
        versions.update(r.versions)
    return r.values


def _label(r: _Result, case_id: str) -> Bound | None:
    code = r.values.get((BOUND_SERIES, case_id))
    return BOUND_CODES.get(code, Bound.UNKNOWN) if code is not None else None


def _why_not(bench: str, case_id: str, a: _Result, b: _Result, on_gpu: bool, differ: dict) -> tuple[str, str]:
    """(bound label, the reason a series is not judged or '')."""
    labels = [x for x in (_label(a, case_id), _label(b, case_id)) if x is not None]
    bound = (Bound.UNSETTLED if Bound.UNSETTLED in labels else Bound.HOST if Bound.HOST in labels
             else Bound.DEVICE if labels and set(labels) == {Bound.DEVICE} else Bound.UNKNOWN if on_gpu else None)
    model = case_id.split(".")[1] if case_id.count(".") >= 2 else ""
    if bench in differ:
        return "", f"benchmark versions {differ[bench]}"
    if on_gpu and model == CPU_MODEL:
        return "", "CPU suite on a GPU machine"
    if bound in (Bound.HOST, Bound.UNSETTLED):
        return bound.value, bound.value
    return bound.value if bound else "", ""


def _inverted(bench: str, case_id: str, a: _Result, b: _Result) -> str:
    """The series `bench` is the inverse of, where both commits recorded it, else ''."""
    other = INVERSES.get(bench, "")
    return other if other and all((other, case_id) in r.values for r in (a, b)) else ""


def _by_value(bench: str, base: float, head: float) -> str:
    limit = BY_VALUE[bench]
    worse_if_higher = direction(bench) == "lower"
    delta = head - base if limit is None else (head - base) / abs(base) if base else 0.0
    limit = SQNR_TOLERANCE_DB if limit is None else limit
    if abs(delta) <= limit:
        return UNCHANGED
    return REGRESSION if (delta > 0) == worse_if_higher else IMPROVEMENT


def compare_commits(results_dir: Path, machine: str, base: str, head: str, min_change: float = MIN_CHANGE,
                    across_versions: bool = False) -> AsvComparison:
    """Every series two commits share on `machine`, judged (module docstring). Results of different benchmark
    versions (a new measurement version starts new asv series) are refused, or with `across_versions` listed
    as not judged."""
    results = _results(results_dir, machine)
    a, b = _pick(results, base, machine), _pick(results, head, machine)
    differ = {k: f"{a.versions[k]} → {b.versions[k]}" for k in set(a.versions) & set(b.versions)
              if a.versions[k] != b.versions[k]}
    if differ and not across_versions:
        name, label = sorted(differ.items())[0]
        raise StoreError(f"refusing to compare asv results of different measurement versions: {name} is "
                         f"{label.replace(' → ', f' at {base} and ')} at {head}; pass --across-versions to list "
                         "the changes anyway (not judged)")
    on_gpu = any(k[1].split(".")[1:2] != [CPU_MODEL] for r in (a, b) for k in r.values if k[0] != BOUND_SERIES)
    earlier = [r for r in results if r.date < b.date and r.commit not in (a.commit, b.commit)
               and all(r.versions.get(k) == v for k, v in b.versions.items() if k in r.versions)]
    out = AsvComparison()
    judged, info = [], {}
    for key in sorted(k for k in set(a.values) & set(b.values) if k[0] != BOUND_SERIES):
        info[key] = _why_not(*key, a, b, on_gpu, differ)
        if (not info[key][1] and key[0] not in BY_VALUE and not _inverted(*key, a, b) and a.values[key] > 0
                and b.values[key] > 0):
            judged.append(key)
    d = [math.log(b.values[k] / a.values[k]) for k in judged]
    levels = [[(k[0], info[k][0], *k[1].split(".")[:2]) for k in judged]]
    levels.append([x[:3] for x in levels[0]])
    result = judge_comparison(d, [[r.values.get(k, math.nan) for r in earlier] for k in judged], levels,
                              [direction(k[0]) == "higher" for k in judged], min_change=min_change)
    where = {k: i for i, k in enumerate(judged)}
    for key, (bound, why) in info.items():
        va, vb = a.values[key], b.values[key]
        rel = (vb - va) / abs(va) if va else 0.0
        other = _inverted(*key, a, b)
        i = where.get((other, key[1]) if other else key)  # an inverse takes the verdict of the series it inverts
        if why:
            out.changes.append(AsvChange(*key, va, vb, rel, NOT_JUDGED, differ.get(key[0], ""), bound, why))
        elif key[0] in BY_VALUE:
            out.changes.append(AsvChange(*key, va, vb, rel, _by_value(key[0], va, vb), "", bound, "by value"))
        elif i is None or not result.verdict[i]:
            out.changes.append(AsvChange(*key, va, vb, rel, NOT_JUDGED, "", bound,
                                         "no variance (no history, and under 8 like series)"))
        elif other:
            out.changes.append(AsvChange(*key, va, vb, rel, INVERSE, "", bound, f"1 / {other}: judged there"))
        else:
            out.changes.append(AsvChange(*key, va, vb, rel, str(result.verdict[i]), "", bound, str(result.source[i]),
                                         float(result.p[i]), float(result.detectable[i])))
    out.class_changes = [(" · ".join(str(x) for x in c.key if x), c.members, math.expm1(c.shift), c.verdict)
                         for c in result.classes]
    return out
