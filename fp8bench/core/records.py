"""Result records and their on-disk shards (no torch, no duckdb: every machine can read and write them).

A run lives in `<results_dir>/runs/<run_id>/`: `manifest.json` (config, git state, environment) and one
or more `shard-*.jsonl` files holding one JSON record per case. Each record is appended, flushed and
fsync'ed as soon as its case ends, so a crash or SIGKILL loses at most the case in flight.
"""

from __future__ import annotations

import json
import math
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

MANIFEST = "manifest.json"
SHARD_GLOB = "shard-*.jsonl"
RECORD_VERSION = 2
"""2: a case's id is derived from its whole identity (fp8bench.cases.identity), stated in `params`; a record
carries its `label`, its BF16 twin's id (`twin_id`) and what ran (`ran`). Records of version 1 are re-keyed to
version 2 ids at ingest (fp8bench.data.legacy)."""
MEASUREMENT_VERSION = 4
"""How fp8bench times (fp8bench.core.measure); a change starts new asv series on purpose, and `compare`, `history`
and `asv-compare` refuse to judge across versions unless asked to.
2: CUDA samples queued back to back and read after one sync (1: a sync per iteration).
3: CUDA samples follow `measure.settle_ms` of untimed load (sustained clocks, not the first steps down).
4: gemm, linear and layer cases are timed side by side with their BF16 twin, interleaved in rounds
   (fp8bench.run.groups); speedup_vs_bf16 is measured from those rounds, with a 95% interval, not derived from
   two cases timed apart; each timing also records the GPU's busy share (host-bound cases).
A training recipe's speedup_vs_bf16 timed as a sandwich against its BF16 twin (fp8bench.run.train_sandwich)
says so in its `measurement.method` ('sandwich'); its timings are the version's, and `compare` and `history`
never judge one speedup against another of a different method."""
LEGACY_VERSION_SQL = """CASE WHEN json_extract(config, '$.base.measure.settle_ms') IS NOT NULL THEN 3
     WHEN started_at >= TIMESTAMP '2026-11-30 03:53:01' THEN 2 ELSE 1 END"""
"""The measurement version of a run recorded before versions travelled with the data (a `runs` row without
one), from what its manifest does hold: `measure.settle_ms` exists from version 3 (commit e1dc016), and
version 2 began with commit 0ef419b (2026-11-30 03:53:01 UTC)."""

# metric name → (unit, direction: "higher" or "lower" is better, "none" for a signed figure neither way is
# better, such as a drift). Names carry their unit (DESIGN.md "Contract").
METRICS: dict[str, tuple[str, str]] = {
    "time_ms": ("ms", "lower"),
    "time_ms_kernel": ("ms", "lower"),
    "injected_slowdown_pct": ("%", "lower"),
    "tflops": ("TFLOPS", "higher"),
    "tflops_kernel": ("TFLOPS", "higher"),
    "speedup_vs_bf16": ("x", "higher"),
    "speedup_vs_bf16_lo": ("x", "higher"),
    "speedup_vs_bf16_hi": ("x", "higher"),
    "speedup_vs_bf16_kernel": ("x", "higher"),
    "speedup_vs_bf16_kernel_lo": ("x", "higher"),
    "speedup_vs_bf16_kernel_hi": ("x", "higher"),
    "speedup_vs_bf16_processes": ("count", "higher"),
    "speedup_vs_bf16_kernel_processes": ("count", "higher"),
    "speedup_vs_bf16_box_lo": ("x", "higher"),
    "speedup_vs_bf16_box_hi": ("x", "higher"),
    "speedup_vs_bf16_kernel_box_lo": ("x", "higher"),
    "speedup_vs_bf16_kernel_box_hi": ("x", "higher"),
    "gpu_busy_pct": ("%", "higher"),
    "host_bound": ("1", "lower"),
    "twin_drift": ("1", "none"),
    "pct_of_peak": ("%", "higher"),
    "gbps": ("GB/s", "higher"),
    "peak_mem_bytes": ("bytes", "lower"),
    "peak_mem_first_step_bytes": ("bytes", "lower"),
    "gpu_gemm_ms": ("ms", "lower"),
    "gpu_quantize_ms": ("ms", "lower"),
    "gpu_attention_ms": ("ms", "lower"),
    "gpu_other_ms": ("ms", "lower"),
    "gpu_communication_ms": ("ms", "lower"),
    "gpu_optimizer_ms": ("ms", "lower"),
    "gpu_busy_ms": ("ms", "lower"),
    "gpu_profiled_step_ms": ("ms", "lower"),
    "gpu_kernels_per_step": ("1", "lower"),
    "sqnr_db": ("dB", "higher"),
    "reference_sqnr_db": ("dB", "higher"),
    "dgrad_sqnr_db": ("dB", "higher"),
    "wgrad_sqnr_db": ("dB", "higher"),
    "rel_err": ("1", "lower"),
    "sqnr_vs_emulated_db": ("dB", "higher"),
    "loss_final": ("nats", "lower"),
    "loss_initial": ("nats", "lower"),
    "loss_gap_vs_bf16": ("nats", "lower"),
    "loss_gap_allowed": ("nats", "higher"),
    "loss_area_gap_pct": ("%", "lower"),
    "parity_pass": ("1", "higher"),
    "quality_speedup": ("x", "higher"),
    "loss_area_gap_allowed_pct": ("%", "higher"),
    "parity_final_pass": ("1", "higher"),
    "parity_area_pass": ("1", "higher"),
    "loss_gap_same_seed": ("nats", "lower"),
    "loss_area_gap_same_seed_pct": ("%", "lower"),
    "loss_band_exit_step": ("step", "higher"),
    "quality_reached": ("1", "higher"),
    "parity_seeds": ("count", "higher"),
    "parity_passes": ("count", "higher"),
    "parity_recipe_pass": ("1", "higher"),
    "parity_worst_gap": ("nats", "lower"),
    "parity_worst_area_gap_pct": ("%", "lower"),
    "parity_band_exit_step": ("step", "higher"),
    "parity_paired_area_gap_pct": ("%", "lower"),
    "parity_paired_area_allowed_pct": ("%", "higher"),
    "quality_speedup_seeds": ("x", "higher"),
    "quality_speedup_lo": ("x", "higher"),
    "quality_speedup_hi": ("x", "higher"),
    "quality_never_seeds": ("count", "lower"),
    "loss_curve_class": ("code", "lower"),
    "loss_curve_class_step": ("step", "higher"),
    "tokens_per_s": ("tokens/s", "higher"),
    "tokens_per_s_per_rank": ("tokens/s", "higher"),
    "mem_weights_bytes": ("bytes", "lower"),
    "mem_grads_bytes": ("bytes", "lower"),
    "mem_optimizer_bytes": ("bytes", "lower"),
    "mem_persistent_other_bytes": ("bytes", "lower"),
    "mem_activations_bytes": ("bytes", "lower"),
    "mem_saved_fp8_bytes": ("bytes", "lower"),
    "mem_saved_hp_bytes": ("bytes", "lower"),
    "mem_transient_bytes": ("bytes", "lower"),
    "mem_step_peak_bytes": ("bytes", "lower"),
    "linears_fp8": ("count", "higher"),
    "linears_total": ("count", "higher"),
}


class StoreError(ValueError):
    """Bad input to ingest/export (missing path, unreadable database): exit code 2 at the CLI.
    Defined here, not in store.py, so that catching it never imports duckdb."""


@dataclass(frozen=True)
class Metric:
    name: str
    value: float
    unit: str
    direction: str

    @classmethod
    def of(cls, name: str, value: float) -> Metric:
        unit, direction = METRICS[name]
        return cls(name, float(value), unit, direction)


@dataclass(frozen=True, kw_only=True)
class CaseRecord:
    """Everything known about one case after it ran (or was skipped, or failed)."""

    run_id: str
    case_id: str
    label: str = ""
    """The id's readable prefix (workload.model.shape.format.scaling.backend[+knobs]): what plots show."""
    twin_id: str = ""
    """The BF16 case this case's speedup divides by (its own id for a BF16 case; '' where there is none)."""
    workload: str
    model: str
    format: str
    scaling: str
    backend: str
    shape_name: str
    shape: dict
    params: dict = field(default_factory=dict)
    """What the case is: its identity (every setting that can change what it measures), by dotted key."""
    ran: dict = field(default_factory=dict)
    """What ran, as the workload and backend report it: `device`, `graphs` (CUDA-graph replays), `compiled`
    (torch.compile), and the kernels a backend chose."""
    scheduler: dict = field(default_factory=dict)
    """The batch job that ran the case (a Slurm job's id, node, partition, restart count; its state where the
    job ended before the case did); {} outside a scheduler."""
    status: str
    reason: str = ""
    metrics: list[Metric] = field(default_factory=list)
    samples: dict[str, list[float]] = field(default_factory=dict)
    started_at: float = 0.0
    duration_s: float = 0.0
    measurement: dict = field(default_factory=dict)
    """How this case was timed: `version` (MEASUREMENT_VERSION), `method` (interleaved with its BF16 twin,
    alone, or once for the emulator), the timer settings that ran, and for interleaved cases the twin and the
    rounds. Empty in records written before it existed."""
    record_version: int = RECORD_VERSION

    def to_json(self) -> str:
        return json.dumps(asdict(self), allow_nan=True, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict) -> CaseRecord:
        d = dict(d)
        d["metrics"] = [Metric(**m) for m in d.get("metrics", [])]
        return cls(**d)

    def metric(self, name: str) -> float | None:
        return next((m.value for m in self.metrics if m.name == name), None)


class ShardWriter:
    """Append-only JSONL shard; every record is flushed and fsync'ed before `write` returns."""

    def __init__(self, run_dir: Path, job: str = "") -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        suffix = f"-{job}" if job else ""
        self.path = run_dir / f"shard-{stamp}-{os.getpid()}{suffix}.jsonl"
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, record: CaseRecord) -> None:
        self._f.write(record.to_json() + "\n")
        self._f.flush()
        os.fsync(self._f.fileno())

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class ShardProblem:
    """A line or file that could not be read; reported, never fatal."""

    path: str
    line: int
    error: str


def read_shard(path: Path) -> tuple[list[CaseRecord], list[ShardProblem]]:
    """Records of one shard; a corrupt or truncated line is reported and skipped, the rest kept."""
    records: list[CaseRecord] = []
    problems: list[ShardProblem] = []
    try:
        text = path.read_text(encoding="utf-8", errors="strict")
    except (OSError, UnicodeDecodeError) as exc:
        return [], [ShardProblem(str(path), 0, f"unreadable: {exc}")]
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(CaseRecord.from_dict(json.loads(line)))
        except (json.JSONDecodeError, TypeError, KeyError) as exc:
            problems.append(ShardProblem(str(path), i, f"corrupt record: {str(exc)[:120]}"))
    return records, problems


def read_manifest(run_dir: Path, problems: list[ShardProblem] | None = None) -> dict | None:
    """The run folder's manifest, None when it has none or it is corrupt (then reported to `problems`)."""
    mpath = run_dir / MANIFEST
    if not mpath.is_file():
        return None
    try:
        return json.loads(mpath.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        if problems is not None:
            problems.append(ShardProblem(str(mpath), 0, f"corrupt manifest: {exc}"))
        return None


def read_run(run_dir: Path) -> tuple[dict | None, list[CaseRecord], list[ShardProblem]]:
    """(manifest, records, problems) of one run folder; a later record of the same case wins."""
    problems: list[ShardProblem] = []
    manifest = read_manifest(run_dir, problems)
    by_case: dict[str, CaseRecord] = {}
    for shard in sorted(run_dir.glob(SHARD_GLOB)):
        recs, probs = read_shard(shard)
        problems += probs
        for r in recs:
            kept = by_case.get(r.case_id)
            if kept is not None and r.status == "skipped" and kept.status != "skipped":
                # two sweep points that map to one case id (a resumed run re-runs nothing it recorded): a
                # skip verdict never overwrites a measurement
                problems.append(ShardProblem(str(shard), 0, f"{r.case_id} recorded twice; kept the {kept.status} "
                                                            f"record over a later skip ({r.reason})"))
                continue
            by_case[r.case_id] = r
    return manifest, list(by_case.values()), problems


def write_manifest(run_dir: Path, manifest: dict) -> None:
    """Atomic write (tmp + rename), so a reader never sees half a manifest."""
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / f".{MANIFEST}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True, default=str))
    os.replace(tmp, run_dir / MANIFEST)


def done_case_ids(run_dir: Path) -> set[str]:
    """Cases a run already finished (ok or skipped): what `resume=` skips. Failed cases run again."""
    _, records, _ = read_run(run_dir)
    return {r.case_id for r in records if r.status != "failed"}


def variant_of(case_id: str) -> str:
    """The backend knobs a case id names ('compile' in '...torchao+compile~1a2b3c4d'), '' when none."""
    return case_id.split("+", 1)[1].split("~", 1)[0] if "+" in case_id else ""


VARIANT_SQL = ("CASE WHEN position('+' IN c.label) > 0 THEN substr(c.label, position('+' IN c.label) + 1) "
               "ELSE '' END")
"""variant_of in SQL, over the `label` of a `cases` table aliased `c` (all of the suffix: 'torchao+compile' of
accelerate)."""


NOT_TIMED = "once"
"""The `measurement.method` of a case whose time is not a kernel's: the emulator's, run once (what emulation
costs). Speedups, roofline and reproducibility figures leave such cases out."""


def is_timed(record: CaseRecord) -> bool:
    """Its time is a kernel's (its `measurement.method` is not NOT_TIMED)."""
    return record.measurement.get("method") != NOT_TIMED


TIMED_SQL = f"coalesce(json_extract_string(c.measurement, '$.method'), '') != '{NOT_TIMED}'"
"""is_timed in SQL, over a `cases` table aliased `c`."""


def pairs(records: list[CaseRecord]) -> list[tuple[CaseRecord, CaseRecord]]:
    """(recipe, its BF16 twin) for every ok recipe of one run whose twin is an ok case of the same run: the one
    pairing every speedup, parity verdict and comparison uses (a record names its twin: `twin_id`)."""
    by_id = {r.case_id: r for r in records if r.status == "ok"}
    return [(r, by_id[r.twin_id]) for r in records
            if r.status == "ok" and r.format != "bf16" and r.twin_id and r.twin_id in by_id]


SEED = re.compile(r"\.seed\d+")
"""The seed's part of a training case id or shape name (`.seed2`)."""


def seedless(case_id: str) -> str:
    """A case id (or shape name) with its seed taken out: what the seeds of one training recipe share."""
    return SEED.sub("", case_id)


def derive_speedups(records: list[CaseRecord]) -> list[tuple[CaseRecord, list[Metric], bool]]:
    """speedup_vs_bf16 = its twin's time / this case's time, for the cases whose run did not time it side by
    side with their twin (train cases: whole runs). Cases whose time is not a kernel's (`measurement.method`
    'once': the emulator) get none."""
    out = []
    for r, twin in pairs(records):
        t, b = r.metric("time_ms"), twin.metric("time_ms")
        if not is_timed(r) or r.metric("speedup_vs_bf16") is not None or not t or not b:
            continue
        out.append((r, [Metric.of("speedup_vs_bf16", b / t)], True))
    return out


def derive_box_intervals(records: list[CaseRecord], spread: dict[str, float]) -> list[tuple[CaseRecord, list[Metric], bool]]:
    """speedup_vs_bf16[_kernel]_box_lo/hi: the 95% interval of what another box of this GPU model measures
    for a speedup. The run's own interval over its rounds (speedup_vs_bf16_lo/hi) says how well this box
    pinned its ratio; boxes differ by more (power-capped clocks, memory bandwidth against SM clock), so the
    half-width on a log scale is sqrt(own² + spread²), with `spread` the 95th percentile of |log ratio| of
    the same cases measured on two boxes (results/spread/<device>.json, by workload and 'kernel' for
    kernel-only speedups; fp8bench.data.store loads it)."""
    out = []
    for r in records:
        metrics = []
        for suffix in ("", "_kernel"):
            name = f"speedup_vs_bf16{suffix}"
            value, lo, hi = r.metric(name), r.metric(f"{name}_lo"), r.metric(f"{name}_hi")
            between = spread.get(r.workload + suffix)
            if (r.status != "ok" or r.metric("host_bound") == 1.0 or None in (value, lo, hi, between)
                    or min(value, lo, hi) <= 0):
                continue  # a host-bound figure moves with the host CPU: no GPU model's spread bounds it
            own = max(math.log(hi / value), math.log(value / lo))
            half = math.hypot(own, between)
            metrics += [Metric.of(f"{name}_box_lo", value * math.exp(-half)),
                        Metric.of(f"{name}_box_hi", value * math.exp(half))]
        if metrics:
            out.append((r, metrics, True))
    return out
