"""Loss parity as the pages show it, rebuilt from the stored metrics by fp8bench.analysis.parity's own types: a
run's verdict naming the rule it failed with figure and allowance, a recipe's pass rate over its seeds, where
its curve left the BF16 band, and what the curve did (fp8bench.analysis.taxonomy)."""

from __future__ import annotations

import pandas as pd

from fp8bench.analysis.parity import (
    PAIRED_RULE,
    Criterion,
    QualitySpeedup,
    RecipeVerdict,
    verdict_from_metrics,
)
from fp8bench.analysis.taxonomy import CurveClass, CurveReading
from fp8bench.core.records import seedless


def _metrics(row) -> dict:
    return {k: (None if isinstance(v, float) and pd.isna(v) else v) for k, v in dict(row).items()}


def run_verdict(row) -> str:
    """One training case's parity: 'pass', or 'FAIL: ' and each failed rule with its figure and allowance."""
    if row["status"] == "diverged":
        return verdict_from_metrics({}, diverged=row["reason"] or "loss became non-finite").text()
    if row["format"] == "bf16":
        return "BF16 (the band)"
    v = verdict_from_metrics(_metrics(row))
    return "no verdict (fewer than 3 BF16 seeds)" if v is None else v.text()


def curve(row) -> str:
    """What the case's training curve did ('ok', 'plateau from step 113', ...); '' where it was not read (a
    curve under taxonomy.MIN_STEPS steps)."""
    code = row.get("loss_curve_class")
    if code is None or pd.isna(code):
        return ""
    step = row.get("loss_curve_class_step")
    return CurveReading(kind=CurveClass.from_code(code), step=None if step is None or pd.isna(step) else int(step)).text()


def band_exit(row) -> str:
    step = row.get("loss_band_exit_step")
    return "" if step is None or pd.isna(step) else f"step {int(step)}"


def _recipe_verdict(d: pd.DataFrame) -> RecipeVerdict:
    """The recipe's verdict over the seeds of one run, from what derive_parity stored on each of its cases."""
    r = d.iloc[0]
    paired = None
    if pd.notna(r.get("parity_paired_area_gap_pct")) and pd.notna(r.get("parity_paired_area_allowed_pct")):
        paired = Criterion(rule=PAIRED_RULE, gap=float(r["parity_paired_area_gap_pct"]),
                           allowed=float(r["parity_paired_area_allowed_pct"]), unit="%")
    failed = []
    for _, row in d.iterrows():
        v = verdict_from_metrics(_metrics(row), diverged=(row["reason"] or "loss became non-finite")
                                 if row["status"] == "diverged" else "")
        failed += list(v.failed) if v is not None else []
    if paired is not None and not paired.passed:
        failed.append(PAIRED_RULE)
    exit_step = r.get("parity_band_exit_step")
    return RecipeVerdict(seeds=int(r["parity_seeds"]), passes=int(r["parity_passes"]),
                         exit_step=None if pd.isna(exit_step) else int(exit_step), paired=paired,
                         failed_rules=tuple(dict.fromkeys(failed)))


def _number(r, name: str) -> float | None:
    v = r.get(name)
    return None if v is None or pd.isna(v) else float(v)


def _quality(r, seeds: int) -> QualitySpeedup:
    """Time to quality over the recipe's seeds (one seed: that run's own figure)."""
    value = _number(r, "quality_speedup_seeds") if seeds > 1 else _number(r, "quality_speedup")
    return QualitySpeedup(value=value, lo=_number(r, "quality_speedup_lo"), hi=_number(r, "quality_speedup_hi"),
                          seeds=seeds, never=int(_number(r, "quality_never_seeds") or 0))


def _counted(texts: list[str]) -> str:
    counts = pd.Series([t for t in texts if t]).value_counts(sort=False)
    return "; ".join(f"{t} ({n} seeds)" if n > 1 else t for t, n in counts.items())


def recipe_rates(train: pd.DataFrame) -> pd.DataFrame:
    """One row per FP8 recipe per run and setting with a stored pass rate: `pass_rate` ('2/3'), `verdict`
    (RecipeVerdict.text: 'passes 3/3', 'FAIL 2/3 pass: <rules>'), `recipe_pass` (True, False, or None for too
    few seeds), the earliest band exit over its seeds, its curves' readings, and time to quality."""
    cols = ["device", "model", "run_id", "setting", "recipe", "seeds", "pass_rate", "verdict", "recipe_pass",
            "band_exit", "curves", "quality_speedup"]
    fp8 = train[(train["format"] != "bf16") & train["parity_seeds"].notna()]
    if fp8.empty:
        return pd.DataFrame(columns=cols)
    # a configuration is the seeds of one case id: two cases of one recipe label with other scaling knobs (an
    # ablation's amax history, say) are two configurations, each with its own pass rate
    fp8 = fp8.assign(setting=fp8["shape_name"].map(seedless), configuration=fp8["case_id"].map(seedless))
    rows = []
    for (device, model, run_id, setting, _), d in fp8.groupby(["device", "model", "run_id", "setting", "configuration"]):
        rv, r = _recipe_verdict(d), d.iloc[0]
        recipe = r["recipe"]  # with its scaling knobs away from the defaults (data.cases)
        q = _quality(r, rv.seeds)
        rows.append({"device": device, "model": model, "run_id": run_id, "setting": setting, "recipe": recipe,
                     "seeds": rv.seeds, "pass_rate": f"{rv.passes}/{rv.seeds}", "verdict": rv.text(),
                     "recipe_pass": rv.passed,
                     "band_exit": "stays in the band" if rv.exit_step is None else f"step {rv.exit_step}",
                     "curves": _counted([curve(row) for _, row in d.iterrows()]),
                     "quality_speedup": q.text()})
    return pd.DataFrame(rows, columns=cols)
