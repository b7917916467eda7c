"""The results tables that README.md, docs/results.md and docs/training.md quote, generated from a DuckDB of recorded runs
(`fp8bench report --markdown FILE`): every figure with the run it comes from and that run's commit.

A file holds one or more blocks between `<!-- generated: fp8bench report --markdown KIND -->` and
`<!-- end generated -->`; the command rewrites each block's body and leaves the prose around it alone.
tests/test_docs.py regenerates them from the committed results and fails when a page is stale.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd

from fp8bench.analysis.parity import MIN_SEEDS
from fp8bench.core.markdown import table
from fp8bench.report import data, published
from fp8bench.report.pages import (
    deepest_steps,
    distributed_layout,
    fastest_per_path,
    headline,
    llama_steps,
    step_parts,
)

BLOCK = re.compile(r"(<!-- generated: fp8bench report --markdown (?P<kind>[a-z-]+) -->\n)(.*?)(<!-- end generated -->)",
                   re.S)


def _text(v) -> str:
    return "" if v is None or (isinstance(v, float) and pd.isna(v)) else str(v)


def _versions(runs: pd.DataFrame) -> pd.Series:
    """Each run's measurement version as the tables print it (`v4`), by run id (`runs`: data.runs)."""
    return runs.set_index("run_id")["measurement_version"].map(lambda v: "" if pd.isna(v) else f"v{int(v)}")


def _headline(con, runs: pd.DataFrame) -> pd.DataFrame:
    """headline() of the latest run of each case, run by run, so that each row's figure comes from the one run
    it names, with that run's commit and measurement version (from `runs`: data.runs)."""
    latest = data.latest(published.cases(con))
    h = pd.concat([headline(d) for _, d in latest.groupby("run_id")]) if not latest.empty else latest
    if h.empty:
        return h
    commits = runs.set_index("run_id")["git_commit"].fillna("").str[:7]
    return h.assign(commit=h["run_id"].map(commits).fillna(""), version=h["run_id"].map(_versions(runs)).fillna("")
                    ).sort_values(["workload", "label", "recipe", "run_id"]).reset_index(drop=True)


def parity_where_judged(con) -> dict[str, str]:
    """Per training recipe (format/scaling · backend, and any scaling knob away from the defaults), the
    loss-parity verdicts of every run that judged it, by model: what the fastest recipe of a speed run is known
    to do to the loss, and at which size. Every verdict counts, not only each case's latest: a recipe that
    passed once and failed when run again is "1 of 2"."""
    t = data.cases(con)
    t = t[(t["workload"] == "train") & t["parity_pass"].notna()]
    out: dict[str, str] = {}
    for recipe, d in t.groupby("recipe"):
        parts = []
        for model, m in d.groupby("model"):
            passed, judged = int((m["parity_pass"] == 1.0).sum()), len(m)
            verdict = "pass" if passed == judged else "FAIL" if passed == 0 else f"{passed} of {judged} pass"
            parts.append(f"{verdict} at {model}" + (f" ({judged} verdicts)" if judged > 1 and passed in (0, judged)
                                                     else ""))
        out[recipe] = "; ".join(parts)
    return out


def headline_block(con) -> str:
    """The fastest FP8 recipe per device · model and workload (whole layers, MLPs, whole training steps) among
    those shown with an interval; where none has one, no recipe is named (a withdrawn point estimate ranks
    nothing); for a training step, what that recipe did to the loss where a run judged it."""
    h = _headline(con, data.runs(con))
    if h.empty:
        return "No FP8 layer or training case with a speedup is recorded.\n"
    parity = parity_where_judged(con)
    shown = h["shown"].map(lambda s: s.published)
    rows = []
    for (label, workload), g in sorted(h.groupby(["label", "workload"]), key=lambda x: (x[0][1], x[0][0])):
        pub = g[shown[g.index]]
        if pub.empty:  # a withdrawn point estimate ranks nothing: no recipe is named fastest
            runs = sorted(set(g["run_id"]))
            rows.append([label, workload, f"none of {len(g)} with an interval", g["shown"].iloc[0].text(), "", "",
                         ", ".join(f"`{r}`" for r in runs), ", ".join(sorted(set(g["version"]))), ""])
            continue
        r = pub.loc[pub["speedup"].idxmax()]
        rows.append([label, workload, r["recipe"], r["shown"].text(), r["bound"] or "",
                     parity.get(r["recipe"], "not judged") if workload == "train" else "", f"`{r['run_id']}`",
                     r["version"], r["commit"]])
    return table(["device · model", "workload", "fastest FP8 recipe with an interval",
                  "speedup vs BF16 (95% interval)", "bound",
                  "loss parity where judged", "run", "measurement version", "commit"], rows)


def results_block(con) -> str:
    """Every FP8 layer, MLP and training recipe's speedup, then the runs they come from."""
    runs = data.runs(con)
    h = _headline(con, runs)
    rows = [[r["label"], r["workload"], r["recipe"], r["shown"].text(), r["bound"] or "", f"`{r['run_id']}`",
             r["version"], r["commit"]] for _, r in h.iterrows()]
    out = "### Speedup over BF16 per recipe (whole layers, MLPs and training steps)\n\n"
    out += table(["device · model", "workload", "recipe", "speedup (95% interval)", "bound", "run",
                  "measurement version", "commit"], rows)
    runs = runs.sort_values(["started_at", "run_id"])  # run id breaks ties: runs recorded in the same minute
    out += "\n### The runs\n\n"
    versions = _versions(runs)
    out += table(["run", "started (UTC)", "commit", "measurement version", "device", "cases", "ok", "failed"], [
        [f"`{r['run_id']}`", pd.Timestamp(r["started_at"]).strftime("%Y-%m-%d %H:%M") if pd.notna(r["started_at"])
         else "", _text(r["git_commit"])[:7] + ("+dirty" if r["git_dirty"] is True else ""), versions[r["run_id"]],
         _text(r["device_name"]), int(r["n_cases"]), int(r["n_ok"]), int(r["n_failed"])] for _, r in runs.iterrows()])
    return out


def steps_block(con) -> str:
    """The whole-step study at Llama scale: the fastest FP8 recipe of each path per model and sequence length,
    then where the deepest model's step goes, BF16 against that recipe, per path."""
    runs = data.runs(con)
    head = data.latest(published.cases(con))
    steps = llama_steps(head[head["workload"] == "train"])
    if steps.empty:
        return "No Llama-scale training step is recorded.\n"
    commits = runs.set_index("run_id")["git_commit"].fillna("").str[:7]
    versions = _versions(runs)
    best = fastest_per_path(steps).sort_values(["device", "hidden", "layers", "seq", "speedup", "case_id"],
                                               ascending=[True, True, True, True, False, True], kind="stable")
    out = table(["device · model", "layers", "batch x seq, master weights, GPUs", "path",
                 "fastest FP8 recipe (else the first by name)",
                 "speedup vs BF16 (95% interval)", "BF16 drift", "tokens/s", "BF16 tokens/s", "peak GiB (vs BF16)",
                 "run", "measurement version", "commit"],
                [[f"{r['device']} · {r['model']}", int(r["layers"]), r["setting"], r["path"], r["recipe_only"],
                  r["shown"].text(), _drift(r.get("twin_drift")), f"{r['tokens_per_s']:,.0f}", f"{r['bf16_tokens_per_s']:,.0f}",
                  f"{r['peak_gib']:.1f} ({r['mem_change_pct']:+.0f}%)", f"`{r['run_id']}`", versions[r["run_id"]],
                  commits.get(r["run_id"], "")]
                 for _, r in best.iterrows()])
    parts = step_parts(head[head["workload"] == "train"], deepest_steps(best))
    if not parts.empty:
        out += ("\nWhere the deepest model's step goes (ms per step; idle: the step minus the time any kernel ran; "
                "overlap: kernels running at once; parts + idle - overlap = the step):\n\n")
        cols = ["time_ms", "gemm", "casts", "attention", "optimizer", "communication", "other", "idle", "overlap"]
        out += table(["device · model", "path", "recipe", *cols, "profiled / measured"],
                     [[f"{r['device']} · {r['model']}", r["path"], r["recipe_only"], *(f"{r[c]:.1f}" for c in cols),
                       f"{r['profiled_pct']:.1f}%"] for _, r in parts.iterrows()])
    return out


def _drift(value) -> str:
    """The BF16 twin's drift over a training sandwich (its last block against its first), or '' where the
    speedup was not timed as one."""
    return "" if value is None or pd.isna(value) else f"{value:+.1%}"


def parity_block(con) -> str:
    """Every training run that judged loss parity (a BF16 band of seeds beside FP8 recipes): each case's speed,
    peak memory, final validation loss and verdict, per model and run. A recipe that diverged in such a run is
    listed with the step it diverged at (its verdict, as plain as a failed band). Each case comes from its
    latest run among the judging ones: a later run of the same case without a band beside it does not hide
    the verdict."""
    runs = data.runs(con)
    commits = runs.set_index("run_id")["git_commit"].fillna("").str[:7]
    versions = _versions(runs)
    none = "No training run with a loss-parity verdict is recorded.\n"
    t = published.cases(con)
    t = t[(t["workload"] == "train") & t["status"].isin(["ok", "diverged"])]
    if t.empty:
        return none
    shapes = t["shape_json"].map(json.loads)
    t = t.assign(nproc=shapes.str.get("nproc").fillna(1), seed=shapes.str.get("seed"),
                 setting=[f"{s['batch']}x{s['seq']}, {s['steps']} steps"
                          + (f", {layout}" if (layout := distributed_layout(s)) else "") for s in shapes])
    # BF16 seeds per run and implementation (one process each); MIN_SEEDS of them beside an FP8 recipe make a
    # run a judging one, whether or not its FP8 recipes lived to a verdict
    bf16 = t[(t["format"] == "bf16") & (t["status"] == "ok") & (t["nproc"] == 1)]
    band = bf16.groupby(["run_id", "model", "backend", "variant"])["seed"].nunique()
    banded = {run for (run, *_), n in band.items() if n >= MIN_SEEDS} & set(t.loc[t["format"] != "bf16", "run_id"])
    judged = set(t.loc[t["parity_pass"].notna(), "run_id"]) | banded
    t = data.latest(t[t["run_id"].isin(judged)])
    if t.empty:
        return none

    def verdict(r) -> str:
        if r["status"] == "diverged":
            return f"diverged: {r['reason']}"
        if r["format"] == "bf16":
            if r["nproc"] > 1:
                return "(the distributed runs' speed twin)"
            seeds = band.get((r["run_id"], r["model"], r["backend"], r["variant"]), 0)
            return "the band" if seeds >= MIN_SEEDS else f"({seeds} seed{'s' if seeds > 1 else ''}: no band)"
        if pd.isna(r["parity_pass"]):
            return "no verdict"
        area = "" if pd.isna(r["loss_area_gap_pct"]) else f", curve area {r['loss_area_gap_pct']:+.1f}%"
        return (("pass" if r["parity_pass"] == 1.0 else "FAIL")
                + f" (gap {r['loss_gap_vs_bf16']:+.3f}, allowed {r['loss_gap_allowed']:.3f}{area})")

    def number(value, spec: str) -> str:
        return "" if pd.isna(value) else format(value, spec)

    # a BF16 row is one seed of the band; an FP8 row says its seed where its run trained that recipe on several
    seeds_of = t.groupby(["run_id", "model", "setting", "recipe"])["seed"].transform("nunique")
    t = t.assign(seed_label=[f" seed {r['seed']}" if r["format"] == "bf16" or n > 1 else ""
                             for (_, r), n in zip(t.iterrows(), seeds_of, strict=True)])
    rows = [[f"{r['device']} · {r['model']}", r["setting"], r["recipe"] + r["seed_label"],
             number(r["tokens_per_s"], ",.0f"), r["shown"].text(),
             number(r["peak_mem_bytes"] / 2**30, ".2f"),
             "" if r["status"] == "diverged" else number(r["loss_final"], ".4f"), verdict(r),
             f"`{r['run_id']}`", versions[r["run_id"]], commits.get(r["run_id"], "")]
            for _, r in t.sort_values(["model", "run_id", "backend", "format", "scaling", "shape_name", "label",
                                       "case_id"]).iterrows()]
    return table(["device · model", "batch x seq, steps", "recipe", "tokens/s", "vs BF16 (95% interval)",
                  "peak GiB", "final val loss", "parity", "run", "measurement version", "commit"], rows)


WATERFALL_STAGES = ("ideal", "GEMM kernels", "+ casts", "+ non-GEMM")
"""The waterfall's modelled columns (fp8bench.analysis.waterfall.Waterfall: ideal, gemm_only, with_casts,
with_non_gemm), each headed with published.MODELLED."""


def layer_waterfall_block(con) -> str:
    """Every FP8 layer's speedup waterfall (fp8bench.analysis.waterfall, latest run per case). The columns
    marked (model) are step-time ratios modelled from the profiled steps' kernel times: the ideal (GEMMs 2x,
    the rest as BF16) is the ceiling a recipe meets in that backend's block, and each later column adds one
    more measured FP8 component. They attribute the step; they are not timed speedups and carry no interval.
    The measured speedup is the case's own, timed beside its BF16 twin, as every page shows it
    (fp8bench.report.published)."""
    from fp8bench.analysis.waterfall import from_db

    falls = [f for f in from_db(con) if f.case_id.startswith("layer.")]
    if not falls:
        return "No FP8 layer with kernel times is recorded.\n"
    cases = published.cases(con).set_index(["run_id", "case_id"])
    runs = data.runs(con)
    commits, versions = runs.set_index("run_id")["git_commit"].fillna("").str[:7], _versions(runs)
    rows = []
    for f in falls:
        c = cases.loc[(f.run_id, f.case_id)]
        w = f.waterfall
        rows.append((c["device"], c["model"], -w.measured, [
            f"{c['device']} · {c['model']}", c["recipe"], *(f"{v:.2f}" for v in (
                w.ideal, w.gemm_only, w.with_casts, w.with_non_gemm)), c["shown"].text(),
            f"{w.explained_pct:.1f}%", f"`{f.run_id}`", versions[f.run_id], commits.get(f.run_id, "")]))
    return table(["device · model", "recipe", *(f"{stage} {published.MODELLED}" for stage in WATERFALL_STAGES),
                  "measured speedup (95% interval)", "kernels / step", "run", "measurement version", "commit"],
                 [r[-1] for r in sorted(rows, key=lambda r: r[:3])])



def recommendation_block(con) -> str:
    from fp8bench.report.recommendation import markdown

    return markdown(con)


def ablation_block(con) -> str:
    from fp8bench.report.ablation import markdown

    return markdown(con)


def withdrawn_block(con) -> str:
    from fp8bench.report.withdrawn import markdown

    return markdown(con)


KINDS = {"withdrawn": withdrawn_block, "recommendation": recommendation_block, "headline": headline_block, "results": results_block, "steps": steps_block, "parity": parity_block,
         "layer-waterfall": layer_waterfall_block, "ablation": ablation_block}


def render(text: str, con) -> str:
    """`text` with the body of each generated block rewritten from `con`."""
    cache: dict[str, str] = {}

    def body(m: re.Match) -> str:
        kind = m.group("kind")
        if kind not in KINDS:
            raise ValueError(f"generated block kind {kind!r} is unknown; choose one of {sorted(KINDS)}")
        if kind not in cache:
            cache[kind] = KINDS[kind](con)
        return m.group(1) + cache[kind] + m.group(4)

    return BLOCK.sub(body, text)


def update(path: Path, con) -> int:
    """Rewrite the generated blocks of `path`; the number of blocks (0: the file has none)."""
    text = path.read_text(encoding="utf-8")
    n = len(BLOCK.findall(text))
    if n:
        path.write_text(render(text, con), encoding="utf-8")
    return n
