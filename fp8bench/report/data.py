"""The report's queries. Each takes an open store connection (fp8bench.data.store.connect) and returns a pandas
DataFrame; the report never imports duckdb itself."""

from __future__ import annotations

import numpy as np
import pandas as pd

from fp8bench.analysis.rebuild import withdrawn
from fp8bench.cases.identity import knob_text
from fp8bench.core.records import VARIANT_SQL
from fp8bench.core.speedup import bound_label

WIDE_METRICS = (
    "time_ms", "time_ms_kernel", "tflops", "tflops_kernel", "speedup_vs_bf16", "pct_of_peak", "gbps",
    "peak_mem_bytes", "sqnr_db", "reference_sqnr_db", "rel_err", "sqnr_vs_emulated_db", "tokens_per_s", "loss_initial", "loss_final",
    "loss_gap_vs_bf16", "loss_gap_allowed", "loss_area_gap_pct", "parity_pass", "quality_speedup",
    "mem_weights_bytes", "mem_optimizer_bytes", "mem_persistent_other_bytes", "mem_activations_bytes",
    "mem_saved_fp8_bytes", "mem_saved_hp_bytes", "mem_transient_bytes", "mem_step_peak_bytes", "linears_fp8",
    "linears_total", "speedup_vs_bf16_lo", "speedup_vs_bf16_hi", "speedup_vs_bf16_box_lo", "speedup_vs_bf16_box_hi",
    "speedup_vs_bf16_kernel", "speedup_vs_bf16_kernel_lo", "speedup_vs_bf16_kernel_hi",
    "speedup_vs_bf16_kernel_box_lo", "speedup_vs_bf16_kernel_box_hi", "gpu_busy_pct", "host_bound",
    "gpu_gemm_ms", "gpu_quantize_ms", "gpu_attention_ms", "gpu_optimizer_ms", "gpu_communication_ms", "gpu_other_ms",
    "gpu_busy_ms", "gpu_profiled_step_ms", "loss_area_gap_allowed_pct", "loss_band_exit_step", "loss_gap_same_seed",
    "loss_area_gap_same_seed_pct", "parity_seeds", "parity_passes", "parity_recipe_pass", "parity_band_exit_step",
    "parity_paired_area_gap_pct", "parity_paired_area_allowed_pct", "quality_speedup_seeds", "quality_speedup_lo",
    "quality_speedup_hi", "quality_never_seeds", "loss_curve_class", "loss_curve_class_step", "twin_drift",
    "speedup_vs_bf16_processes")
"""The measurements the report reads, one column each (named after the metric, speedup_vs_bf16... as
speedup...: speedup, speedup_lo, speedup_box_hi, speedup_kernel, ...)."""
_COLUMNS = ",\n".join(f"    max(value) FILTER (WHERE metric = '{m}') AS {m.replace('speedup_vs_bf16', 'speedup')}"
                       for m in WIDE_METRICS)

WIDE = """
WITH m AS (
  SELECT run_id, case_id,
""" + _COLUMNS + """
  FROM measurements GROUP BY run_id, case_id)
SELECT c.run_id, c.case_id, coalesce(c.label, c.case_id) AS label, c.twin_id,
       coalesce(json_extract_string(c.measurement, '$.method'), '') = 'once' AS emulation, c.workload, c.model, c.format, c.scaling, c.backend, c.shape_name, c.shape AS shape_json,
       c.params AS params_json, json_extract_string(r.config, '$.base.workload.train.master_weights') AS run_master_weights,
       json_extract_string(c.measurement, '$.method') AS method,
       c.status,
       c.reason, r.device_name, e.device_kind, r.started_at, r.git_commit, r.measurement_version,
       CASE WHEN m.tflops IS NOT NULL
            THEN 100 * m.tflops / CASE WHEN c.format = 'bf16' THEN k.bf16_tflops ELSE k.fp8_tflops END
            WHEN m.gbps IS NOT NULL THEN 100 * m.gbps / k.copy_gbps END AS pct_of_ceiling,
       """ + VARIANT_SQL + """ AS variant,
       m.* EXCLUDE (run_id, case_id)
FROM cases c JOIN runs r USING (run_id) LEFT JOIN environments e ON e.env_id = r.env_id
LEFT JOIN m USING (run_id, case_id)
LEFT JOIN {ceilings} k ON k.device_name = r.device_name
"""
NO_CEILINGS = "(SELECT NULL::VARCHAR AS device_name, NULL::DOUBLE AS bf16_tflops, NULL::DOUBLE AS fp8_tflops, " \
              "NULL::DOUBLE AS copy_gbps WHERE false)"


def _has_ceilings(con) -> bool:
    """A database written before `fp8bench calibrate` existed has no ceilings table."""
    return bool(con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'ceilings'")
                .fetchone()[0])


def cases(con) -> pd.DataFrame:
    """Every case of every run, measurements pivoted wide, with a `recipe` label (format/scaling · backend, and
    the scaling knobs away from the defaults, `knobs`: cases.identity.knob_text); speedups that cannot be
    rebuilt from the committed samples are withdrawn (`withdraw`)."""
    df = con.execute(WIDE.format(ceilings="ceilings" if _has_ceilings(con) else NO_CEILINGS)).fetchdf()
    if df.empty:
        return df.assign(recipe=pd.Series(dtype=str), knobs=pd.Series(dtype=str), device=pd.Series(dtype=str),
                         withdrawn=pd.Series(dtype=str))
    df["device"] = df["device_name"].fillna("unknown device")
    backend = df["backend"] + df["variant"].map(lambda v: f"+{v}" if v else "")
    df["knobs"] = [knob_text(s, p) for s, p in zip(df["scaling"], df["params_json"], strict=True)]
    df["recipe"] = df["format"] + "/" + df["scaling"] + " · " + backend + knob_suffix(df["knobs"])
    return withdraw(df, withdrawn(con))


def knob_suffix(knobs: pd.Series) -> pd.Series:
    """' · amax history len 16' where a case sets a scaling knob away from the defaults, else '': how every
    recipe label of the report names one."""
    return knobs.map(lambda k: f" · {k}" if k else "")


WITHDRAWN_COLUMNS = {"speedup_vs_bf16": ("speedup", "speedup_lo", "speedup_hi", "speedup_box_lo", "speedup_box_hi"),
                     "speedup_vs_bf16_kernel": ("speedup_kernel", "speedup_kernel_lo", "speedup_kernel_hi",
                                                "speedup_kernel_box_lo", "speedup_kernel_box_hi")}
"""The columns of a speedup, and of its intervals, that go when it is withdrawn."""


def withdraw(df: pd.DataFrame, gone: dict[tuple[str, str, str], str]) -> pd.DataFrame:
    """`df` with each speedup in `gone` ({(run_id, case_id, metric): why}: fp8bench.analysis.rebuild.withdrawn)
    blanked, with its intervals, and why in `withdrawn`: a figure the committed samples cannot rebuild is not
    published (`fp8bench audit` lists them)."""
    keys = list(zip(df["run_id"], df["case_id"], strict=True))
    reasons = []
    df = df.copy()
    for metric, cols in WITHDRAWN_COLUMNS.items():
        why = pd.Series([gone.get((r, c, metric), "") for r, c in keys], index=df.index, dtype=object)
        df.loc[why != "", [c for c in cols if c in df]] = np.nan
        reasons.append(why)
    df["withdrawn"] = reasons[0].where(reasons[0] != "", reasons[1])
    return df


def latest(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (device, case): the case from its newest measurement version's latest run. Repeated runs
    of a case are history, not more evidence to pool: a headline figure names one run."""
    if df.empty:
        return df
    order = df.assign(_v=df["measurement_version"].fillna(0)).sort_values(["_v", "started_at"])
    return order.drop_duplicates(["device", "case_id"], keep="last").drop(columns="_v")


def interval(df: pd.DataFrame, prefix: str = "speedup") -> tuple[pd.Series, pd.Series]:
    """(lo, hi) of each case's 95% speedup interval: what another box of its GPU model measures where the
    device's between-box spread is known (`_box_`), else the run's own interval over its rounds."""
    return df[f"{prefix}_box_lo"].fillna(df[f"{prefix}_lo"]), df[f"{prefix}_box_hi"].fillna(df[f"{prefix}_hi"])


def bound_labels(host_bound: pd.Series) -> pd.Series:
    """speedup.bound_label of each case's `host_bound`."""
    return host_bound.map(lambda v: bound_label(None if pd.isna(v) else float(v)))


def train_curves(con) -> pd.DataFrame:
    """Loss curves of the training cases: one row per (run, case, step) with the training loss, and the
    validation points (val_step, val_loss) as their own rows."""
    return con.execute("""
        WITH s AS (SELECT run_id, case_id, metric, i, value FROM samples
                   WHERE metric IN ('loss', 'val_loss', 'val_step') AND case_id LIKE 'train.%'),
             v AS (SELECT a.run_id, a.case_id, b.value AS step, a.value AS val_loss FROM s a JOIN s b
                   ON a.run_id = b.run_id AND a.case_id = b.case_id AND a.i = b.i
                   WHERE a.metric = 'val_loss' AND b.metric = 'val_step')
        SELECT run_id, case_id, 'train' AS kind, i AS step, value AS loss FROM s WHERE metric = 'loss'
        UNION ALL SELECT run_id, case_id, 'validation', step, val_loss FROM v
        ORDER BY run_id, case_id, kind, step""").fetchdf()


def runs(con) -> pd.DataFrame:
    return con.execute("""
        SELECT r.run_id, r.started_at, r.git_commit, r.git_dirty, r.device_name, r.env_id, r.config, r.source,
               r.measurement_version,
               e.torch, e.cuda, e.driver, e.transformer_engine, e.torchao, e.triton, e.python, e.details,
               (SELECT count(*) FROM cases c WHERE c.run_id = r.run_id) AS n_cases,
               (SELECT count(*) FROM cases c WHERE c.run_id = r.run_id AND c.status = 'ok') AS n_ok,
               (SELECT count(*) FROM cases c WHERE c.run_id = r.run_id AND c.status = 'failed') AS n_failed
        FROM runs r LEFT JOIN environments e USING (env_id) ORDER BY r.started_at DESC, r.run_id""").fetchdf()



def batch_jobs(con) -> pd.DataFrame:
    """One row per batch job that ran cases of a run (a record's `scheduler`): its id, node and partition, the
    state the scheduler ended it in where it ended before some of its cases did, and its cases by status."""
    return con.execute("""
        WITH s AS (SELECT c.run_id, c.status, json_extract_string(c.scheduler, '$.job_id') AS job_id,
                          json_extract_string(c.scheduler, '$.node') AS node,
                          json_extract_string(c.scheduler, '$.partition') AS partition,
                          json_extract_string(c.scheduler, '$.state') AS state
                   FROM cases c WHERE c.scheduler IS NOT NULL)
        SELECT run_id, job_id, any_value(node) AS node, any_value(partition) AS partition,
               coalesce(string_agg(DISTINCT state, ', '), '') AS state, count(*) AS cases,
               count(*) FILTER (WHERE status = 'ok') AS n_ok, count(*) FILTER (WHERE status = 'failed') AS n_failed
        FROM s WHERE job_id IS NOT NULL GROUP BY run_id, job_id ORDER BY run_id, job_id""").fetchdf()


def unfinished_by_jobs(con) -> pd.DataFrame:
    """The cases a batch job did not finish: each with its job's id and the state the scheduler ended it in."""
    return con.execute("""
        SELECT c.run_id, coalesce(c.label, c.case_id) AS label, json_extract_string(c.scheduler, '$.job_id') AS job_id,
               json_extract_string(c.scheduler, '$.state') AS state, c.reason
        FROM cases c WHERE json_extract_string(c.scheduler, '$.state') IS NOT NULL
        ORDER BY c.run_id, job_id, c.case_id""").fetchdf()

def not_measured(df: pd.DataFrame, workloads: tuple[str, ...] | None = None) -> pd.DataFrame:
    """Skipped and failed cases grouped by what and why (a table, not thousands of rows)."""
    sub = df[df["status"] != "ok"]
    if workloads:
        sub = sub[sub["workload"].isin(workloads)]
    if sub.empty:
        return pd.DataFrame(columns=["device", "status", "workload", "backend", "format", "scaling", "reason", "cases"])
    return (sub.groupby(["device", "status", "workload", "backend", "format", "scaling", "reason"], dropna=False)
            .size().reset_index(name="cases").sort_values(["status", "cases"], ascending=[True, False]))


def not_measured_by_reason(df: pd.DataFrame) -> pd.DataFrame:
    """Skipped and failed cases, one row per (status, reason): how many, and which workloads, backends and
    devices they span (the Overview's collapsed list)."""
    sub = df[df["status"] != "ok"]
    if sub.empty:
        return pd.DataFrame(columns=["status", "reason", "cases", "workloads", "backends", "devices"])

    def joined(s: pd.Series) -> str:
        return ", ".join(sorted(set(s.dropna().astype(str))))
    return (sub.groupby(["status", "reason"], dropna=False)
            .agg(cases=("case_id", "count"), workloads=("workload", joined), backends=("backend", joined),
                 devices=("device", joined))
            .reset_index().sort_values(["status", "cases"], ascending=[True, False]))


def waterfalls(con) -> pd.DataFrame:
    """One row per (FP8 linear/layer/train case, waterfall stage): the speedup after that stage
    (fp8bench.analysis.waterfall), and how much of the FP8 step its kernels explain."""
    from fp8bench.analysis.waterfall import from_db

    rows = [{"case_id": case, "stage": name, "speedup": value, "kernels_pct": w.explained_pct, "order": i}
            for case, _, _, _, w, _ in from_db(con) for i, (name, value) in enumerate(w.stages())]
    return pd.DataFrame(rows, columns=["case_id", "stage", "speedup", "kernels_pct", "order"])


def roofline(con, with_quant: bool = False) -> pd.DataFrame:
    """Expected (roofline on the measured ceilings) vs measured speedup of each FP8 GEMM case: the kernel
    alone, or with quantization (each backend's own casts, and `expected_fused`)."""
    from fp8bench.analysis.roofline import expected_vs_measured

    df = expected_vs_measured(con, with_quant) if _has_ceilings(con) else pd.DataFrame()
    return df if not df.empty else pd.DataFrame(columns=["run_id", "device", "case_id", "cast", "expected",
                                                         "expected_fused", "measured", "rel_error"])
