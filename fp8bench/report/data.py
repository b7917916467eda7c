"""The report's queries. Each takes an open store connection (fp8bench.store.connect) and returns a pandas
DataFrame; the report never imports duckdb itself."""

from __future__ import annotations

import pandas as pd

WIDE = """
WITH m AS (
  SELECT run_id, case_id,
    max(value) FILTER (WHERE metric = 'time_ms') AS time_ms,
    max(value) FILTER (WHERE metric = 'time_ms_kernel') AS time_ms_kernel,
    max(value) FILTER (WHERE metric = 'tflops') AS tflops,
    max(value) FILTER (WHERE metric = 'tflops_kernel') AS tflops_kernel,
    max(value) FILTER (WHERE metric = 'speedup_vs_bf16') AS speedup,
    max(value) FILTER (WHERE metric = 'pct_of_peak') AS pct_of_peak,
    max(value) FILTER (WHERE metric = 'gbps') AS gbps,
    max(value) FILTER (WHERE metric = 'peak_mem_bytes') AS peak_mem_bytes,
    max(value) FILTER (WHERE metric = 'sqnr_db') AS sqnr_db,
    max(value) FILTER (WHERE metric = 'rel_err') AS rel_err,
    max(value) FILTER (WHERE metric = 'sqnr_vs_emulated_db') AS sqnr_vs_emulated_db
  FROM measurements GROUP BY run_id, case_id)
SELECT c.run_id, c.case_id, c.workload, c.model, c.format, c.scaling, c.backend, c.shape_name, c.status,
       c.reason, r.device_name, r.started_at, r.git_commit,
       CASE WHEN position('+' IN c.case_id) > 0 THEN split_part(c.case_id, '+', 2) ELSE '' END AS variant,
       m.* EXCLUDE (run_id, case_id)
FROM cases c JOIN runs r USING (run_id) LEFT JOIN m USING (run_id, case_id)
"""


def cases(con) -> pd.DataFrame:
    """Every case of every run, measurements pivoted wide, with a `recipe` label."""
    df = con.execute(WIDE).fetchdf()
    if df.empty:
        return df.assign(recipe=pd.Series(dtype=str), device=pd.Series(dtype=str))
    df["device"] = df["device_name"].fillna("unknown device")
    backend = df["backend"] + df["variant"].map(lambda v: f"+{v}" if v else "")
    df["recipe"] = df["format"] + "/" + df["scaling"] + " · " + backend
    return df


def runs(con) -> pd.DataFrame:
    return con.execute("""
        SELECT r.run_id, r.started_at, r.git_commit, r.git_dirty, r.device_name, r.env_id, r.config, r.source,
               e.torch, e.cuda, e.driver, e.transformer_engine, e.torchao, e.triton, e.python, e.details,
               (SELECT count(*) FROM cases c WHERE c.run_id = r.run_id) AS n_cases,
               (SELECT count(*) FROM cases c WHERE c.run_id = r.run_id AND c.status = 'ok') AS n_ok,
               (SELECT count(*) FROM cases c WHERE c.run_id = r.run_id AND c.status = 'failed') AS n_failed
        FROM runs r LEFT JOIN environments e USING (env_id) ORDER BY r.started_at DESC""").fetchdf()


def not_measured(df: pd.DataFrame, workloads: tuple[str, ...] | None = None) -> pd.DataFrame:
    """Skipped and failed cases grouped by what and why (a table, not thousands of rows)."""
    sub = df[df["status"] != "ok"]
    if workloads:
        sub = sub[sub["workload"].isin(workloads)]
    if sub.empty:
        return pd.DataFrame(columns=["device", "status", "workload", "backend", "format", "scaling", "reason", "cases"])
    return (sub.groupby(["device", "status", "workload", "backend", "format", "scaling", "reason"], dropna=False)
            .size().reset_index(name="cases").sort_values(["status", "cases"], ascending=[True, False]))
