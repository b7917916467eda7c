"""The ablation of E4M3 with delayed scaling (`sweep=accuracy-ablation`) as a table: per configuration, one
factor changed from TE's defaults (E4M3 forward and backward, amax history 1024, `max`, margin 0, one
te.TransformerLayer per block), its parity pass rate over the seeds of the BF16 band, the earliest step a seed's
curve left the band, what each curve did (fp8bench.analysis.taxonomy) and the final validation loss over the
seeds. Rebuilt from the stored metrics by fp8bench.report.parity_view, as the training page reads them.
"""

from __future__ import annotations

import json

import pandas as pd

from fp8bench.config.compose import preset_values
from fp8bench.core.markdown import table
from fp8bench.core.records import seedless
from fp8bench.report import data
from fp8bench.report.parity_view import _counted, _recipe_verdict, curve

SWEEP = "accuracy-ablation"
REFERENCE_VARIANT = "e4m3-delayed"
"""The variant of conf/ablation/ at TE's defaults, which every other variant changes in one factor."""
FORMATS = {"hybrid": "E5M2 gradients (HYBRID)"}


def reference() -> dict[str, str]:
    """{'format': ..., 'scaling': ..., 'backend': ...} of the reference variant, as conf/ablation/ declares it."""
    values = preset_values("ablation", REFERENCE_VARIANT) or {}
    return {k: str((values.get(k) or {}).get("name", "")) for k in ("format", "scaling", "backend")}


def factor(row) -> str:
    """What a configuration changes from TE's defaults ('' for the defaults themselves)."""
    if row["format"] == "bf16":
        return "BF16 (the band)"
    ref = reference()
    changes = [FORMATS.get(row["format"], f"format {row['format']}")] if row["format"] != ref["format"] else []
    changes += [f"{row['scaling']} scaling"] if row["scaling"] != ref["scaling"] else []
    changes += [f"backend {row['backend']} instead of {ref['backend']}"] if row["backend"] != ref["backend"] else []
    changes += [row["knobs"]] if row["knobs"] else []
    return ", ".join(changes) or "TE's defaults"


def _spread(values: pd.Series) -> str:
    v = values.dropna()
    if v.empty:
        return ""
    return f"{v.median():.3f}" + (f" ({v.min():.3f}–{v.max():.3f})" if len(v) > 1 else "")


def rows(con) -> pd.DataFrame:
    """One row per configuration of every ablation run (its BF16 band first)."""
    runs = data.runs(con)
    ids = [r["run_id"] for _, r in runs.iterrows()
           if json.loads(r["config"] or "{}").get("sweep_name") == SWEEP]
    t = data.cases(con)
    t = t[t["run_id"].isin(ids) & (t["workload"] == "train") & t["status"].isin(["ok", "diverged"])]
    out = []
    for (run_id, _), d in t.sort_values("case_id").groupby(["run_id", t["case_id"].map(seedless)]):
        r = d.iloc[0]
        bf16 = r["format"] == "bf16"
        judged = not bf16 and d["parity_seeds"].notna().any()
        rv = _recipe_verdict(d[d["parity_seeds"].notna()]) if judged else None
        changed = factor(r)
        # the configuration's path and recipe; its knobs are what `factor` names
        path = r["recipe"].removesuffix(f" · {r['knobs']}") if r["knobs"] else r["recipe"]
        out.append({"run": run_id, "device": r["device"], "configuration": path,
                    "factor": changed, "seeds": len(d),
                    "parity": "" if bf16 else (rv.text() if rv else "no verdict (fewer than 3 BF16 seeds)"),
                    "leaves the band": "" if rv is None else ("stays in the band" if rv.exit_step is None
                                                              else f"step {rv.exit_step}"),
                    "curve": _counted([curve(row) for _, row in d.iterrows()]),
                    "final val loss": _spread(d.loc[d["status"] == "ok", "loss_final"]),
                    "_order": (not bf16, changed != "TE's defaults", changed)})
    df = pd.DataFrame(out)
    return df.sort_values(["run", "_order"]).drop(columns="_order") if not df.empty else df


def markdown(con) -> str:
    df = rows(con)
    if df.empty:
        return f"No `{SWEEP}` run is recorded yet (docs/gpu-runs.md gives its command).\n"
    return table(["run", "device", "configuration", "changed from TE's defaults", "seeds", "parity over seeds",
                  "leaves the BF16 band", "curve", "final val loss: median (range over seeds)"],
                 [[f"`{r['run']}`", r["device"], r["configuration"], r["factor"], str(r["seeds"]), r["parity"],
                   r["leaves the band"], r["curve"], r["final val loss"]] for _, r in df.iterrows()])
