"""The recipe to train with, from the stored runs: whole-step speeds and loss-parity verdicts read from DuckDB
and decided by fp8bench.analysis.recommend (the fastest recipe that passes parity at the largest size judged
with enough seeds; faster ones that fail, or are judged on too few seeds, listed below it). `fp8bench advise`,
README.md's headline block and the site's front page all show this one decision.
"""

from __future__ import annotations

import dataclasses
import json
import statistics

from fp8bench.analysis.parity import verdict_from_metrics
from fp8bench.analysis.rebuild import withdrawn
from fp8bench.analysis.recommend import (
    UNESTABLISHED,
    Recipe,
    Recommendation,
    SeedVerdict,
    Size,
    SpeedResult,
    model_params,
    pool_parity,
    recommend,
)
from fp8bench.analysis.seeds import over_seeds
from fp8bench.cases.identity import knob_text
from fp8bench.config.compose import model_preset
from fp8bench.core.markdown import table
from fp8bench.core.records import seedless, variant_of
from fp8bench.report.published import NO_INTERVAL, Shown

SPEEDS = """
SELECT c.model, c.format, c.scaling, c.backend, c.label, c.params, c.twin_id, m.value AS speedup,
       coalesce(lo_box.value, lo.value) AS lo, coalesce(hi_box.value, hi.value) AS hi,
       100 * (mem.value / bmem.value - 1) AS mem_change_pct, c.run_id, c.case_id, r.measurement_version
FROM cases c JOIN runs r USING (run_id) JOIN measurements m ON m.run_id = c.run_id AND m.case_id = c.case_id AND m.metric = 'speedup_vs_bf16'
LEFT JOIN measurements lo ON lo.run_id = c.run_id AND lo.case_id = c.case_id AND lo.metric = 'speedup_vs_bf16_lo'
LEFT JOIN measurements hi ON hi.run_id = c.run_id AND hi.case_id = c.case_id AND hi.metric = 'speedup_vs_bf16_hi'
LEFT JOIN measurements lo_box ON lo_box.run_id = c.run_id AND lo_box.case_id = c.case_id
     AND lo_box.metric = 'speedup_vs_bf16_box_lo'
LEFT JOIN measurements hi_box ON hi_box.run_id = c.run_id AND hi_box.case_id = c.case_id
     AND hi_box.metric = 'speedup_vs_bf16_box_hi'
LEFT JOIN measurements mem ON mem.run_id = c.run_id AND mem.case_id = c.case_id AND mem.metric = 'peak_mem_bytes'
LEFT JOIN measurements bmem ON bmem.run_id = c.run_id AND bmem.case_id = c.twin_id AND bmem.metric = 'peak_mem_bytes'
WHERE c.workload = 'train' AND c.status = 'ok' AND c.format != 'bf16'
  AND coalesce(json_extract_string(c.measurement, '$.method'), '') != 'once'"""
"""Every whole-step speedup of a training case with its interval, its peak memory against its BF16 twin's, and the
run and measurement version it comes from."""

VERDICTS = """
SELECT c.run_id, c.case_id, c.label, c.params, c.model, c.format, c.scaling, c.backend, c.shape, c.status, c.reason,
       map_from_entries(list({'k': m.metric, 'v': m.value}))
FROM cases c JOIN measurements m USING (run_id, case_id)
WHERE c.workload = 'train' AND c.format != 'bf16' GROUP BY ALL"""


def _recipe(fmt: str, scaling: str, backend: str, label: str, params: str | None) -> Recipe:
    return Recipe.of(fmt, scaling, backend, variant_of(label), knob_text(scaling, params))


def _size(model: str) -> Size | None:
    preset = model_preset(model)
    return Size(params=model_params(preset), model=model) if preset else None


def _speeds(con) -> list[SpeedResult]:
    """Every whole-step speed the committed samples rebuild (fp8bench.analysis.rebuild.withdrawn), one per case;
    where a run timed a recipe on several seeds without an interval of each, one over its seeds
    (fp8bench.analysis.seeds)."""
    gone = withdrawn(con)
    bare: dict[tuple[str, str], list[tuple[SpeedResult, str]]] = {}
    out = []
    for (model, f, s, b, label, params, twin, sp, lo, hi, mem, run_id, case_id,
         version) in con.execute(SPEEDS).fetchall():
        size = _size(model)
        if size is None or (run_id, case_id, "speedup_vs_bf16") in gone:
            continue
        r = SpeedResult(recipe=_recipe(f, s, b, label, params), size=size, speedup=sp, lo=lo, hi=hi, mem_change_pct=mem,
                        run_id=run_id, measurement_version=version)
        if lo is None or hi is None:
            bare.setdefault((run_id, seedless(case_id)), []).append((r, twin or ""))
        else:
            out.append(r)
    for group in bare.values():
        iv = over_seeds([r.speedup for r, _ in group], [t for _, t in group])
        if iv is None:
            out += [r for r, _ in group]
            continue
        mems = [r.mem_change_pct for r, _ in group if r.mem_change_pct is not None]
        out.append(dataclasses.replace(group[0][0], speedup=iv.value, lo=iv.lo, hi=iv.hi, seeds=len(group),
                                       mem_change_pct=statistics.median(mems) if mems else None))
    return out


def inputs(con) -> tuple[list[SpeedResult], list[SeedVerdict]]:
    """Whole-step speeds (_speeds) and per-run parity verdicts of the stored training cases (models without a
    preset here cannot be placed by size and are left out)."""
    speeds = _speeds(con)
    verdicts = []
    for _, _, label, params, model, f, s, b, shape, status, reason, metrics in con.execute(VERDICTS).fetchall():
        v = verdict_from_metrics(metrics, diverged=reason if status == "diverged" else "")
        size = _size(model)
        if v is None or size is None or not (status == "diverged" or "parity_pass" in metrics):
            continue
        verdicts.append(SeedVerdict(recipe=_recipe(f, s, b, label, params), size=size, seed=json.loads(shape)["seed"],
                                    passed=v.passed, failed_rules=v.failed,
                                    same_seed_area_gap_pct=v.same_seed_area_gap_pct))
    return speeds, verdicts


def decide(con) -> Recommendation:
    speeds, verdicts = inputs(con)
    return recommend(speeds, pool_parity(verdicts))


def rows(rec: Recommendation) -> list[list[str]]:
    """The decision as table rows: the recommended recipe first (or a row saying none passes), then every faster
    recipe with its verdict, the slower ones that beat BF16, then the recipes whose speed has no interval;
    each speed with its interval, or withdrawn (_shown)."""
    out = []
    if rec.chosen is None:
        out.append(["no recommendation", "", "", "", "no FP8 recipe faster than BF16 (its 95% interval above 1) "
                    "passes loss parity with at least three seeds", "", ""])
    faster = "faster" if rec.chosen else "faster than BF16"
    listed = ([("recommended", rec.chosen)] if rec.chosen else []) + [(f"{faster}; {c.status}", c) for c in rec.faster]
    listed += [(f"slower; {c.status}", c) for c in rec.slower]
    listed += [(f"{UNESTABLISHED}; {c.status}", c) for c in rec.unestablished]
    for role, c in listed:
        s = c.speed
        mem = "" if s.mem_change_pct is None else f"{s.mem_change_pct:+.0f}%"
        verdict = c.parity.text() if c.parity else "not judged"
        verdict += "".join(f"; {p.text()}" for p in c.failed_elsewhere)
        version = "" if s.measurement_version is None else f"v{s.measurement_version}"
        out.append([role, c.recipe.label(), _shown(s).text(at=s.size.model), mem, verdict,
                    f"`{s.run_id}`" if s.run_id else "", version])
    return out


def _shown(s: SpeedResult) -> Shown:
    """A speed as the pages show it: with its interval, or withdrawn for want of one (those the committed samples
    cannot rebuild never get here: _speeds)."""
    if not s.established:
        return Shown(withdrawn=NO_INTERVAL)
    return Shown(s.speedup, s.lo, s.hi, seeds=s.seeds)


HEADERS = ["", "recipe", "whole-step speedup vs BF16 (95% interval), where timed", "peak memory vs BF16",
           "loss parity where judged", "run", "measurement version"]


def markdown(con) -> str:
    return table(HEADERS, rows(decide(con)))
