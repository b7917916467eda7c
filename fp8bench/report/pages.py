"""The pages of the site, each answering one of the users' five questions (README.md: how much faster, does it
keep accuracy, does it save memory, which recipe, did this commit regress) from the wide case table."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

from fp8bench import backends
from fp8bench.core.records import NOT_TIMED
from fp8bench.report.data import bound_labels, interval, knob_suffix, not_measured, not_measured_by_reason
from fp8bench.report.html import Page, esc
from fp8bench.report.published import of_group

PLOT_H = 420
CURVE_H = 320
CURVE_POINTS = 200
"""Points drawn per training-loss curve at most (every k-th step of its 20-step running mean)."""
OPEN_RUNS_PER_MODEL = 2
"""The training page opens each device · model's newest loss runs that judged parity; the earlier ones, and
runs without a verdict, are one click away."""
"""Loss curves are drawn lower: a training page holds two per run."""


def _timed(df: pd.DataFrame) -> pd.Series:
    """Cases whose time is a kernel's (not the emulator's: fp8bench.core.records.is_timed)."""
    return df["method"].fillna("") != NOT_TIMED


def _real(df: pd.DataFrame) -> pd.DataFrame:
    return df[(df["status"] == "ok") & _timed(df)]


def _with_bf16(df: pd.DataFrame, cols: tuple[str, ...] = ("time_ms", "peak_mem_bytes"),
               shape: str = "shape_name") -> pd.DataFrame:
    """Each ok case joined with its BF16 twin (same run, workload, model, shape, backend, variant); `shape`:
    the column that says which shapes pair."""
    key = ["run_id", "workload", "model", shape, "backend", "variant"]
    ok = df[df["status"] == "ok"]
    base = ok[ok["format"] == "bf16"][key + list(cols)].rename(columns={c: f"bf16_{c}" for c in cols})
    return ok.merge(base, on=key, how="left")


# --------------------------------------------------------------------------- overview / advisor

SPEEDUP_OF = {"gemm": "the GEMM with its casts (quantization included; kernel_speedup: the kernel alone)",
              "linear": "fwd+bwd of one linear, casts included", "mlp": "fwd+bwd of the MLP, casts included",
              "layer": "fwd+bwd of the layer, casts included", "train": "a whole training step"}
"""What each workload's speedup_vs_bf16 times, as the advisor states it beside the figure."""


def advisor(df: pd.DataFrame) -> pd.DataFrame:
    """Per device × model × workload × recipe: speedup with its interval and what it times, whether host-bound,
    the numerics (SQNR, agreement with the emulator) and (training) the recipe's loss-parity pass rate, memory
    change; the recommended one marked."""
    real = _with_bf16(_real(df))
    real = real[real["workload"].isin(["linear", "mlp", "layer", "gemm", "train"]) & (real["format"] != "bf16")]
    if real.empty:
        return pd.DataFrame()
    lo, hi = interval(real)
    real = real.assign(mem_change=(real["peak_mem_bytes"] / real["bf16_peak_mem_bytes"] - 1) * 100,
                       s_lo=lo, s_hi=hi, hb=real["host_bound"], on_cpu=real["device_kind"] == "cpu")
    g = real.groupby(["device", "model", "workload", "recipe"], dropna=False).agg(
        speedup=("speedup", "median"), speedup_lo=("s_lo", "median"), speedup_hi=("s_hi", "median"),
        kernel_speedup=("speedup_kernel", "median"), host_bound_shapes=("hb", "sum"),
        labelled_shapes=("hb", "count"), sqnr_db=("sqnr_db", "median"), vs_emulator_db=("sqnr_vs_emulated_db", "min"),
        mem_change_pct=("mem_change", "median"), shapes=("shape_name", "nunique"), cpu=("on_cpu", "any")).reset_index()
    g["bound"] = g.apply(_bound_of_group, axis=1)
    g = g.drop(columns=["host_bound_shapes", "labelled_shapes"])
    g["speedup_of"] = g["workload"].map(SPEEDUP_OF)
    g["numerics_ok"] = g.apply(_numerics_ok, axis=1)
    g["numerics"] = g.apply(_numerics, axis=1)
    g = g.merge(_train_parity(df), how="left", on=["device", "model", "workload", "recipe"])
    unjudged = (g["workload"] == "train") & g["loss_parity"].isna()
    g["loss_parity"] = g["loss_parity"].mask(unjudged, "not judged (no BF16 band of 3 seeds beside it)").fillna("")
    g["recommended"] = ""
    g = pd.concat([_recommended(sub, workload) for (_, _, workload), sub in g.groupby(["device", "model", "workload"])])
    return g.sort_values(["device", "model", "workload", "speedup"], ascending=[True, True, True, False])


def _train_parity(df: pd.DataFrame) -> pd.DataFrame:
    """Per device × model × recipe of the training cases: each judged run's pass rate and verdict
    (`loss_parity`), and `parity_ok`: every run that judged it found it passing on three or more seeds."""
    from fp8bench.report.parity_view import recipe_rates

    rates = recipe_rates(df[df["workload"] == "train"])
    out = []
    for (device, model, recipe), d in rates.groupby(["device", "model", "recipe"]):
        where = len(d) > 1
        out.append({"device": device, "model": model, "workload": "train", "recipe": recipe,
                    "loss_parity": "; ".join(r["verdict"] + (f" ({r['setting']}, run {r['run_id']})" if where else "")
                                             for _, r in d.iterrows()),
                    "parity_ok": bool((d["recipe_pass"] == True).all())})  # noqa: E712 - None is not a pass
    return pd.DataFrame(out, columns=["device", "model", "workload", "recipe", "loss_parity", "parity_ok"])


def _recommended(sub: pd.DataFrame, workload: str) -> pd.DataFrame:
    """`sub` (one device × model × workload) with the `recommended` cell of its row to read set: a training
    step is recommended on its recipe's loss parity (three or more seeds, all passing); the one-step workloads,
    which have no loss, on their numerics."""
    sub = sub.copy()
    if sub["speedup"].isna().all():  # every speedup of the group withdrawn (published.for_the_site)
        sub.loc[sub.index[0], "recommended"] = "no recommendation: every speedup here is withdrawn (no interval)"
        return sub
    trusted = sub["parity_ok"].fillna(False).astype(bool) if workload == "train" else sub["numerics_ok"]
    good = sub[trusted & (sub["speedup_lo"] > 1.0)]  # faster than BF16: the interval above 1
    if good.empty:
        best = sub["speedup"].idxmax()
        b = sub.loc[best]
        fastest = f"fastest {b['speedup']:.2f}x ({b['speedup_lo']:.2f}-{b['speedup_hi']:.2f})"
        if workload == "train":
            sub.loc[best, "recommended"] = (f"no recommendation: no FP8 recipe faster than BF16 (its 95% interval "
                                            f"above 1) passes loss parity with 3 seeds here; {fastest}")
        else:
            why = "beat it" if b["speedup_lo"] <= 1.0 else "beat it with numerics that check out"
            sub.loc[best, "recommended"] = f"BF16: no FP8 recipe {why} ({fastest})"
        return sub
    r = sub.loc[good["speedup"].idxmax()]
    mem = "" if pd.isna(r["mem_change_pct"]) else f", peak memory {r['mem_change_pct']:+.0f}%"
    ci = f" [{r['speedup_lo']:.2f}-{r['speedup_hi']:.2f}]"
    host = ("; host-bound on this box: the GPU waited for the host, so the figure is the host CPU's as much "
            "as the GPU's" if r["bound"].startswith(("host", "partly")) else "")
    basis = "loss parity passed on 3+ seeds" if workload == "train" else "numerics that check out"
    sub.loc[r.name, "recommended"] = f"use this: fastest with {basis} ({r['speedup']:.2f}x{ci}{mem}){host}"
    return sub


def _bound_of_group(row) -> str:
    """A recipe's shapes: all host-bound, some (k of n), none (all labelled device-bound), or unmeasured."""
    hb, labelled = int(row["host_bound_shapes"] or 0), int(row["labelled_shapes"] or 0)
    if not labelled:
        return ""
    if hb == labelled == row["shapes"]:
        return "host-bound"
    if hb:
        return f"partly host-bound ({hb} of {row['shapes']} shapes)"
    return "device-bound" if labelled == row["shapes"] else ""


EMULATOR_AGREEMENT_DB = 30.0
"""Below this SQNR against the exact emulator on the same inputs, a real kernel does not compute the recipe."""
FP64_SQNR_FLOOR_DB = 15.0
"""Below this SQNR against FP64 (GEMM, linear), an FP8 output is suspect whatever the emulator says."""


def _numerics_ok(row) -> bool:
    """Do the recipe's kernels compute what they should? Agreement with the exact emulator is the check; the
    FP64 SQNR floor applies where sqnr_db is against FP64 (gemm, linear). A layer's sqnr_db is against the
    same module's BF16 output: informative, not a gate. Says nothing about training."""
    if pd.notna(row["vs_emulator_db"]) and row["vs_emulator_db"] < EMULATOR_AGREEMENT_DB:
        return False
    return not (row["workload"] in ("gemm", "linear") and pd.notna(row["sqnr_db"])
                and row["sqnr_db"] < FP64_SQNR_FLOOR_DB)


def _numerics(row) -> str:
    """The recipe's numerics as figures: SQNR against its reference and against the exact emulator."""
    ref = "FP64" if row["workload"] in ("gemm", "linear") else f"the BF16 {row['workload']}"
    parts = [] if pd.isna(row["sqnr_db"]) else [f"SQNR {row['sqnr_db']:.1f} dB vs {ref}"]
    if pd.notna(row["vs_emulator_db"]):
        parts.append(f"{row['vs_emulator_db']:.0f} dB vs the emulator")
    text = "; ".join(parts)
    return text if row["numerics_ok"] or not text else f"check: {text}"


def why_not_2x(adv: pd.DataFrame, df: pd.DataFrame, falls: pd.DataFrame | None) -> pd.DataFrame:
    """For each advisor row with measured waterfalls: where the speedup went, in the waterfall's own terms."""
    if falls is None or falls.empty or adv.empty:
        return adv.assign(why="")
    wide = falls.pivot_table(index="case_id", columns="stage", values="speedup").reset_index()
    wide = wide.merge(df[["case_id", "device", "model", "workload", "recipe"]].drop_duplicates("case_id"),
                      on="case_id")
    g = wide.groupby(["device", "model", "workload", "recipe"])[["ideal", "gemm", "+casts", "+non-gemm",
                                                                 "measured"]].median().reset_index()

    def text(r) -> str:
        return (f"GEMMs 2x would give {r['ideal']:.2f}x (Amdahl); its FP8 GEMMs give {r['gemm']:.2f}x; "
                f"casts take it to {r['+casts']:.2f}x, other kernels to {r['+non-gemm']:.2f}x; "
                f"measured {r['measured']:.2f}x")
    g["why"] = g.apply(text, axis=1)
    return adv.merge(g[["device", "model", "workload", "recipe", "why"]], how="left",
                     on=["device", "model", "workload", "recipe"]).fillna({"why": ""})


def memory_why(adv: pd.DataFrame, df: pd.DataFrame) -> pd.DataFrame:
    """For TE layer and training rows of the advisor: what the recipe saves for backward instead of BF16
    (fp8bench.analysis.memory_model), the reason its peak memory moves."""
    from fp8bench.analysis.memory_model import recipe_change

    if adv.empty:
        return adv

    def text(r) -> str:
        if r["workload"] not in ("layer", "train") or r["shapes"] != 1:
            return ""  # the model's shapes must be the row's one shape
        case = df[(df["device"] == r["device"]) & (df["model"] == r["model"]) & (df["workload"] == r["workload"])
                  & (df["recipe"] == r["recipe"]) & (df["status"] == "ok")]
        if case.empty or not backends.declared(case["backend"].iloc[0], "memory_modelled", False) \
                or case["variant"].iloc[0]:
            return ""  # the backend's saved tensors are what the memory model counts, launched plainly
        change = recipe_change(r["workload"], r["model"], json.loads(case["shape_json"].iloc[0]),
                               case["scaling"].iloc[0])
        return "" if change is None else change.explain()
    return adv.assign(why=[" ".join(t for t in (w, text(r)) if t) for w, (_, r) in
                           zip(adv["why"], adv.iterrows(), strict=True)])


ADVISOR_COLUMNS = ["device", "model", "workload", "recipe", "speedup", "speedup_lo", "speedup_hi", "speedup_of",
                   "kernel_speedup", "bound", "numerics", "loss_parity", "mem_change_pct", "recommended", "why"]
ADVISOR_DIGITS = {"speedup": 2, "speedup_lo": 2, "speedup_hi": 2, "kernel_speedup": 2, "sqnr_db": 1,
                  "vs_emulator_db": 1, "mem_change_pct": 0}


def overview(df: pd.DataFrame, runs: pd.DataFrame, falls: pd.DataFrame | None = None,
             recommendation: pd.DataFrame | None = None) -> Page:
    """The front page: the recommendation (`recommendation`: fp8bench.report.recommendation's rows under its
    HEADERS, what `fp8bench advise` and README's headline show), the headline chart, the advisor (accelerators
    open, the CPU folded), what was and was not measured."""
    p = Page("index.html", "Overview: which FP8 recipe pays here?")
    p.note("Every number on this site is a measurement from a recorded run (see Runs), each case from its latest "
           "run. Speedups: each recipe timed side by side with its BF16 twin, with a 95% interval; numerics: the "
           "real kernel's output against the exact emulator on the same inputs (and an FP64 reference); loss "
           "parity: FP8 training runs over several seeds against a band of BF16 seeds.")
    if recommendation is not None:
        p.h2("Which recipe to train with")
        p.note("The fastest FP8 recipe, at the size its whole training step was timed, that passes loss parity on "
               "at least three seeds at the largest size where it was judged and fails at no size; below it, every "
               "recipe faster than it with its verdict and pass rate (a FAIL names the rule). A recipe never judged "
               "reads 'not judged', one judged on fewer seeds 'too few seeds': neither is a pass. The same decision "
               "as `fp8bench advise` and README.md's headline; the Training page has each run's pass rates.")
        p.table(recommendation)
    head = headline(df)
    if not head.empty:
        from fp8bench.report.charts import speedup_panels

        p.h2("Headline: FP8 speedup over BF16 for a whole layer and a whole training step")
        p.figure(speedup_panels(head), "Speedup over BF16 per recipe and model (error bars: 95% interval where "
                 "measured; hover: the interval, host-bound or not, the run)", "device · model", "speedup vs BF16 (x)")
    _advisor_section(p, memory_why(why_not_2x(advisor(df), df, falls), df))
    p.h2("What was measured")
    p.table(df.groupby(["device", "status"]).size().unstack(fill_value=0).reset_index() if not df.empty else df)
    p.h2("Not measured, and why")
    missing = not_measured_by_reason(df)
    p.note("Skipped cases are recipes this device or installation cannot run (the reason says what would); "
           "failed cases raised or disagreed with the emulator. One row per reason.")
    p.raw(f"<details><summary>{int(missing['cases'].sum()) if not missing.empty else 0} cases not measured, for "
          f"{len(missing)} reasons</summary>")
    p.table(missing)
    p.raw("</details>")
    return p


def _advisor_section(p: Page, adv: pd.DataFrame) -> None:
    """The advisor: accelerators' rows first and open; a CPU's rows (its emulator and slow reference paths, no
    FP8 units) folded in a section of their own."""
    p.h2("Advisor: recipes per device × model × workload")
    if adv.empty:
        p.note("No real-kernel FP8 cases yet: run a sweep on a GPU (or `make run` for the CPU study).")
        return
    p.raw('<p class="note">The recommendation per row group: the fastest recipe that beats BF16 and can be '
          'trusted: for a training step, one whose recipe passed loss parity on three or more seeds (loss_parity: '
          'its pass rate; a FAIL names the rule); for a GEMM, linear or layer, one whose numerics check out '
          '(numerics: SQNR against FP64 or the BF16 module, and against the exact emulator on the same inputs), '
          'which says nothing about training. speedup_of says what each speedup times: a GEMM\'s includes the '
          'casts that quantize its operands (what training pays); kernel_speedup is the GEMM kernel alone on '
          'operands quantized up front. Each figure is the latest run of each case (median over the shapes of a '
          'model); speedup_lo-speedup_hi is its 95% interval: timed side by side with its BF16 twin in '
          'interleaved rounds, widened by how far speedups moved between two boxes of this GPU model where that '
          'was measured. <b>host-bound</b>: the GPU waited for the host for more than a tenth of each step, so the '
          'figure belongs to this box\'s CPU as much as to the GPU. Details: <a href="gemm.html">GEMMs</a>, '
          '<a href="modules.html">modules</a>, <a href="numerics.html">numerics</a>, '
          '<a href="training.html">training</a>.</p>')
    everything = ADVISOR_COLUMNS[:-2] + ["sqnr_db", "vs_emulator_db", "shapes"]
    gpu, cpu = adv[~adv["cpu"]], adv[adv["cpu"]]
    if gpu.empty:
        p.note("No accelerator rows: every real-kernel case here ran on a CPU (below).")
    else:
        p.table(gpu[gpu["recommended"] != ""][ADVISOR_COLUMNS], ADVISOR_DIGITS)
        p.raw("<details><summary>All recipes</summary>")
        p.table(gpu[everything], ADVISOR_DIGITS)
        p.raw("</details>")
    if not cpu.empty:
        p.raw(f"<details><summary>CPU rows: {len(cpu)} recipes on {cpu['device'].nunique()} CPU(s), which have no "
              "FP8 units (torch's CPU FP8 GEMM is a slow reference path): numerics, not speed</summary>")
        p.table(cpu[cpu["recommended"] != ""][ADVISOR_COLUMNS], ADVISOR_DIGITS)
        p.table(cpu[everything], ADVISOR_DIGITS)
        p.raw("</details>")


def headline(df: pd.DataFrame) -> pd.DataFrame:
    """The FP8 layer, MLP and training cases with a speedup, per device, model and recipe, with the interval, and
    `shown` where `df` has it (fp8bench.report.published.cases: the speedup as the generated pages show it)."""
    h = _real(df)
    h = h[h["workload"].isin(["mlp", "layer", "train"]) & (h["format"] != "bf16") & h["speedup"].notna()]
    if h.empty:
        return h
    lo, hi = interval(h)
    shown = {"shown": ("shown", of_group)} if "shown" in h else {}
    return (h.assign(s_lo=lo, s_hi=hi, bound=bound_labels(h["host_bound"]), label=h["device"] + " · " + h["model"])
            .groupby(["label", "workload", "recipe"], dropna=False)
            .agg(speedup=("speedup", "median"), lo=("s_lo", "median"), hi=("s_hi", "median"),
                 bound=("bound", "first"), run_id=("run_id", "first"), **shown).reset_index())


# --------------------------------------------------------------------------- GEMMs

ROOFLINE_SHORT = 0.85
"""A GEMM case reaching less than this share of its roofline speedup is flagged on the GEMM page."""


def gemm_page(df: pd.DataFrame, roof: pd.DataFrame | None = None, roof_quant: pd.DataFrame | None = None) -> Page:
    p = Page("gemm.html", "GEMMs: speedup per shape and recipe")
    g = _with_bf16(df[df["workload"] == "gemm"], ("time_ms",))
    g = g[_timed(g) & (g["format"] != "bf16")]
    if g.empty:
        p.note("No real-kernel GEMM cases recorded.")
    for device, d in g.groupby("device"):
        lo, hi = interval(d)
        klo, khi = interval(d, "speedup_kernel")
        d = d.assign(shape=d["model"] + " " + d["shape_name"],
                     kernel_speedup=d["speedup_kernel"],
                     speedup_lo=lo, speedup_hi=hi, kernel_lo=klo, kernel_hi=khi,
                     bound=bound_labels(d["host_bound"]))
        p.note("The latest run of each case. speedup_lo-speedup_hi (kernel_lo-kernel_hi): the 95% interval of "
               "each speedup, timed side by side with its BF16 twin in interleaved rounds and widened by how far "
               "speedups moved between two boxes of this GPU model where that was measured. bound: host-bound "
               "cases (the GPU waited for the host for more than a tenth of each iteration) measure this box's "
               "CPU as much as its GPU; their cells in the heatmaps carry an h.")
        p.h2(f"{device}: speedup vs BF16 with quantization (what training pays)")
        p.figure(_heatmap(d, "speedup"), f"{device}: FP8 GEMM speedup vs BF16, casts included (x)", "recipe",
                 "model and GEMM")
        if d["kernel_speedup"].notna().any():
            p.h2(f"{device}: speedup of the GEMM kernel alone (operands quantized up front)")
            p.figure(_heatmap(d, "kernel_speedup"), f"{device}: FP8 GEMM kernel speedup vs BF16 (x)", "recipe",
                     "model and GEMM")
        p.h2(f"{device}: TFLOPS and speedups with their 95% intervals, kernel only and with quantization")
        cols = ["shape", "recipe", "run_id", "tflops", "tflops_kernel", "pct_of_peak", "pct_of_ceiling", "speedup",
                "speedup_lo", "speedup_hi", "kernel_speedup", "kernel_lo", "kernel_hi", "bound"]
        p.note("pct_of_peak: of the spec sheet's dense peak for the format; pct_of_ceiling: of the best GEMM "
               "`fp8bench calibrate` measured on this machine (empty until it has run there).")
        p.table(d.sort_values(["shape", "tflops_kernel"], ascending=[True, False])[cols],
                {"tflops": 0, "tflops_kernel": 0, "pct_of_peak": 1, "pct_of_ceiling": 1, "speedup": 2,
                 "speedup_lo": 2, "speedup_hi": 2, "kernel_speedup": 2, "kernel_lo": 2, "kernel_hi": 2})
    if roof is not None and not roof.empty:
        for device, r in roof.groupby("device"):
            p.h2(f"{device}: roofline expected vs measured kernel speedup")
            p.note("Expected: max(compute, memory) + launch floor per GEMM on the ceilings `fp8bench calibrate` "
                   f"measured (fp8bench.analysis.roofline). Median |error| {r['rel_error'].abs().median():.1%} over "
                   f"{len(r)} cases; cases under {ROOFLINE_SHORT:.0%} of their expected speedup are listed.")
            lo, hi = float(min(r["expected"].min(), r["measured"].min())), float(max(r["expected"].max(),
                                                                                    r["measured"].max()))
            p.figure(_expected_vs_measured(r, lo, hi), f"{device}: kernel speedup, roofline vs measured",
                     "expected speedup (x)", "measured speedup (x)")
            short = r[r["measured"] < ROOFLINE_SHORT * r["expected"]]
            p.table(short.sort_values("rel_error")[["case_id", "expected", "measured", "rel_error"]],
                    {"expected": 2, "measured": 2, "rel_error": 2})
    if roof_quant is not None and not roof_quant.empty:
        for device, r in roof_quant.groupby("device"):
            p.h2(f"{device}: roofline expected vs measured speedup with quantization")
            p.note("Each case modelled with the casts its backend runs: eager torch ops (the torch backend: ~39 "
                   "bytes moved per BF16 element over 11-13 kernels) or fused kernels (5 bytes, one or two "
                   f"passes). Median |error| {r['rel_error'].abs().median():.1%} over {len(r)} cases. The table "
                   "lists the cases that lose most to their casts: measured against what fused casts would give.")
            hi = float(max(r["expected"].max(), r["measured"].max(), r["expected_fused"].max()))
            p.figure(_expected_vs_measured(r, 0.0, hi, color="cast"),
                     f"{device}: speedup with quantization, roofline vs measured", "expected speedup (x)",
                     "measured speedup (x)")
            lost = r.assign(share_of_fused=r["measured"] / r["expected_fused"]).sort_values("share_of_fused")
            p.table(lost.head(15)[["case_id", "cast", "measured", "expected", "expected_fused", "share_of_fused"]],
                    {"measured": 2, "expected": 2, "expected_fused": 2, "share_of_fused": 2})
    p.h2("Not measured, and why")
    p.table(not_measured(df, ("gemm",)))
    return p


def _expected_vs_measured(r: pd.DataFrame, lo: float, hi: float, color: str | None = None) -> go.Figure:
    """Roofline scatter: each case's expected speedup against its measured one, with the identity line."""
    fig = px.scatter(r, x="expected", y="measured", color=color, hover_name="case_id", height=PLOT_H)
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="measured = expected"))
    return fig


def _heatmap(d: pd.DataFrame, col: str) -> go.Figure:
    """Speedup per shape × recipe; a host-bound case's cell text carries an 'h'."""
    pivot = d.pivot_table(index="shape", columns="recipe", values=col, aggfunc="median")
    marks = d.assign(h=d["bound"].eq("host-bound")).pivot_table(index="shape", columns="recipe", values="h",
                                                                 aggfunc="max").reindex_like(pivot)
    text = [[("" if pd.isna(v) else f"{v:.2f}" + (" h" if not pd.isna(m) and bool(m) else "")) for v, m in zip(row_v, row_m, strict=True)]
            for row_v, row_m in zip(pivot.values, marks.values, strict=True)]
    fig = go.Figure(go.Heatmap(z=pivot.values, x=list(pivot.columns), y=list(pivot.index), colorscale="RdYlGn",
                               zmid=1.0, text=text, texttemplate="%{text}", colorbar={"title": "x vs BF16"}))
    fig.update_layout(height=max(PLOT_H, 22 * len(pivot.index) + 160), margin={"l": 200, "b": 160})
    return fig


# --------------------------------------------------------------------------- modules and layers

WATERFALL_LINES = 24
"""A workload's waterfall is drawn as a chart up to this many cases; beyond, its table carries them."""


def modules_page(df: pd.DataFrame, falls: pd.DataFrame | None = None) -> Page:
    p = Page("modules.html", "Modules and layers: fwd+bwd time per backend and recipe")
    if falls is not None and not falls.empty:  # a training step's waterfall is on the Training page
        _waterfall_section(p, falls[~falls["case_id"].str.startswith("train.")])
    _module_sections(p, df)
    _gemm_casts_section(p, df)
    p.h2("Not measured, and why")
    p.table(not_measured(df, ("linear", "mlp", "layer")))
    return p


def _waterfall_section(p: Page, falls: pd.DataFrame) -> None:
    from fp8bench.report.charts import style_traces

    if falls.empty:
        return
    p.h2("Why not 2x: the speedup waterfall, from measured kernel times")
    p.note("Each stage swaps one more measured BF16 component for its FP8 one (fp8bench.analysis.waterfall): the 2x "
           "promise; GEMMs 2x with everything else as BF16 (Amdahl); the FP8 GEMM kernels as measured; plus "
           "the casts/transposes; plus the other kernels; plus idle time, which lands on the measured "
           "speedup. kernels% is the FP8 step's kernel time over its separately timed step. Above 100% means the "
           "profiled steps ran slower than the timed ones: runs timed before fp8bench settled the clocks "
           "(MEASUREMENT_VERSION 2) read 109-115% for TE's Current and Block layers on the H200.")
    f = falls.sort_values(["case_id", "order"])
    for workload, fw in f.groupby(f["case_id"].str.split(".").str[0]):
        n = fw["case_id"].nunique()
        if n > WATERFALL_LINES:  # a chart of that many lines reads as noise: the table has each case
            p.note(f"{workload}: {n} cases, each in the table below (unfold it)")
            continue
        p.figure(style_traces(px.line(fw, x="stage", y="speedup", color="case_id", markers=True,
                                      height=min(700, max(PLOT_H, 14 * n + 200)))),
                 f"{workload}: speedup after each stage of the waterfall", "stage", "speedup vs BF16 (x)")
    # a long reference of every case, one click away: the page's sections stay within reach of each other
    cases = f["case_id"].nunique()
    fold = cases > WATERFALL_LINES
    if fold:
        p.raw(f"<details><summary>Each case's waterfall ({cases} cases)</summary>")
    p.table(f.pivot_table(index="case_id", columns="stage", values="speedup")
            .reindex(columns=list(f.drop_duplicates("stage").sort_values("order")["stage"]))
            .join(f.groupby("case_id")["kernels_pct"].first()).reset_index(),
            {c: 2 for c in f["stage"].unique()} | {"kernels_pct": 1})
    if fold:
        p.raw("</details>")


def _module_sections(p: Page, df: pd.DataFrame) -> None:
    from fp8bench.report.charts import style_traces

    mods = _with_bf16(df[df["workload"].isin(["linear", "mlp", "layer"])])
    mods = mods[_timed(mods)]
    for (device, workload), d in mods.groupby(["device", "workload"]):
        d = d.assign(shape=d["model"] + " " + d["shape_name"])
        p.h2(f"{device}: {workload} fwd+bwd time (ms)")
        fig = style_traces(px.bar(d.sort_values("recipe"), x="shape", y="time_ms", color="recipe", barmode="group",
                                  height=PLOT_H))
        p.figure(fig, f"{device}: {workload} forward + backward time, latest run of each case", "model and shape",
                 "time (ms)")
        if workload == "layer" and d["peak_mem_bytes"].notna().any():
            p.h2(f"{device}: layer peak memory (GiB): FP8 often raises it")
            p.figure(style_traces(px.bar(d.assign(peak_gib=d["peak_mem_bytes"] / 2**30).sort_values("recipe"),
                                         x="shape", y="peak_gib", color="recipe", barmode="group", height=PLOT_H)),
                     f"{device}: layer peak memory per recipe", "model and shape", "peak memory (GiB)")
            b = d[d["mem_step_peak_bytes"].notna()]
            if not b.empty:
                p.note("Where one fwd+bwd step's peak goes, measured: resident before the forward, saved by the "
                       "forward for backward (FP8 part from the saved tensors' dtypes), the backward's transient.")
                p.figure(_memory_bars(b.assign(label=b["shape"] + " · " + b["recipe"])),
                         f"{device}: where a layer step's peak memory goes", "memory (GiB)", "")
        cols = ["shape", "recipe", "time_ms", "tflops", "speedup", "peak_mem_bytes", "sqnr_db"]
        if workload == "layer" and d["reference_sqnr_db"].notna().any():
            p.note("reference_sqnr_db: TE's BF16 layer against the FP32 reference its FP8 layers are scored against "
                   "(at least 48 dB, near BF16 rounding's cap, or the case records no sqnr_db: it would measure the "
                   "reference, not the recipe).")
            cols.append("reference_sqnr_db")
        p.table(d.sort_values(["shape", "time_ms"])[cols],
                {"time_ms": 3, "tflops": 0, "speedup": 2, "peak_mem_bytes": 0, "sqnr_db": 1, "reference_sqnr_db": 1})
    expect = memory_vs_model(df)
    if not expect.empty:
        p.h2("Saved for backward: measured vs the analytic expectation (TE)")
        p.note("fp8bench.analysis.memory_model counts what each TE recipe saves from the shapes alone: FP8 weights in both "
               "layouts, each linear's input in the layouts its module keeps, the BF16 copies that drop out, block "
               "scales. Layer cases are predicted outright; training cases add the recipe's change to the BF16 run's "
               "census. error: expected over measured total, in percent.")
        p.table(expect, {"saved_fp8_mib": 1, "expected_fp8_mib": 1, "saved_other_mib": 1, "expected_other_mib": 1,
                         "error_pct": 2})


def _gemm_casts_section(p: Page, df: pd.DataFrame) -> None:
    g = df[(df["workload"] == "gemm") & (df["status"] == "ok") & df["time_ms_kernel"].notna()]
    if not g.empty:
        p.h2("Where an FP8 GEMM's time goes: the kernel vs the casts around it")
        p.note("Per recipe, summed over each model's GEMMs: time of the GEMM on pre-quantized operands, and the "
               "rest of the with-quantization time (amax, scale, cast, transposed copies).")
        s = g.groupby(["device", "model", "recipe"])[["time_ms", "time_ms_kernel"]].sum().reset_index()
        s["casts_ms"] = s["time_ms"] - s["time_ms_kernel"]
        long = s.melt(id_vars=["device", "model", "recipe"], value_vars=["time_ms_kernel", "casts_ms"],
                      var_name="part", value_name="ms")
        long["label"] = long["device"] + " · " + long["model"] + " · " + long["recipe"]
        p.figure(px.bar(long, x="ms", y="label", color="part", orientation="h",
                        height=min(900, max(PLOT_H, 18 * long["label"].nunique() + 120))),
                 "FP8 GEMM time: the kernel and the casts around it, summed over each model's GEMMs", "time (ms)", "")



# --------------------------------------------------------------------------- training

MEM_PARTS = [("mem_weights_bytes", "weights (master copy)"), ("mem_optimizer_bytes", "optimizer state"),
             ("mem_persistent_other_bytes", "other persistent (data, workspaces, FP8 state)"),
             ("mem_saved_fp8_bytes", "saved for backward: FP8"), ("saved_rest", "saved for backward: other"),
             ("mem_transient_bytes", "backward transient (grads, temporaries)")]


def memory_vs_model(df: pd.DataFrame) -> pd.DataFrame:
    """TE layer and training cases: what the census measured as saved for backward next to what
    fp8bench.analysis.memory_model expects from the shapes (training cases from their BF16 twin's census)."""
    from fp8bench.analysis.memory_model import expected_saved

    modelled = df["backend"].map(lambda b: bool(backends.declared(b, "memory_modelled", False)))
    te = df[modelled & (df["status"] == "ok") & df["mem_saved_hp_bytes"].notna()
            & df["workload"].isin(["layer", "train"])]
    if te.empty:
        return pd.DataFrame()
    shapes = te["shape_json"].map(json.loads)
    te = te.assign(shape=shapes, batch=shapes.str["batch"], seq=shapes.str["seq"], seed=shapes.str.get("seed"))
    key = ["run_id", "workload", "model", "batch", "seq"]
    base = te[(te["format"] == "bf16") & (te["seed"].fillna(0) == 0)][key + ["mem_saved_hp_bytes"]]
    te = te.merge(base.rename(columns={"mem_saved_hp_bytes": "bf16_saved_hp"}), on=key, how="left")
    rows = []
    for r in te.itertuples():
        if r.format == "bf16" and r.workload == "train":
            continue  # its own census is the training expectation's baseline
        want = expected_saved(r.workload, r.model, r.shape, r.scaling, r.format,
                              None if pd.isna(r.bf16_saved_hp) else r.bf16_saved_hp)
        if want is None:
            continue
        rows.append({"run_id": r.run_id, "case_id": r.case_id, "saved_fp8_mib": r.mem_saved_fp8_bytes / 2**20,
                     "expected_fp8_mib": want[0] / 2**20, "saved_other_mib": r.mem_saved_hp_bytes / 2**20,
                     "expected_other_mib": want[1] / 2**20,
                     "error_pct": 100 * (sum(want) / (r.mem_saved_fp8_bytes + r.mem_saved_hp_bytes) - 1)})
    return pd.DataFrame(rows)


def _memory_bars(m: pd.DataFrame) -> go.Figure:
    m = m.assign(saved_rest=m["mem_activations_bytes"] - m["mem_saved_fp8_bytes"].fillna(0))
    parts = [(k, name) for k, name in MEM_PARTS if k in m.columns and m[k].notna().any()]
    long = m.melt(id_vars=["label"], value_vars=[k for k, _ in parts], var_name="part", value_name="bytes")
    long["GiB"] = long["bytes"] / 2**30
    long["part"] = long["part"].map(dict(parts))
    return px.bar(long, x="GiB", y="label", color="part", orientation="h",
                  height=min(700, max(PLOT_H, 26 * m["label"].nunique() + 140)))


def _parity(row) -> str:
    """A training case's parity cell: 'pass', or 'FAIL: ' with the rule it failed, its figure and allowance."""
    from fp8bench.report.parity_view import run_verdict

    return run_verdict(row)


def direct_of(backend: str, params_json: object, variant: str) -> tuple[str, str] | None:
    """(backend, variant) of the direct run a framework integration's case sets its step beside: the backend
    it hands FP8 to, run the same way (its adapter's `direct`, from the knobs the case recorded); None for a
    case of no integration, or of a backend this checkout does not have."""
    params = json.loads(params_json) if isinstance(params_json, str) else {}
    knobs = backends.recorded_knobs(backend, params, variant)
    found = None if knobs is None else backends.get_backend(backend).direct(knobs)
    return None if found is None else (found[0], found[1].variant())


def integration_overhead(t: pd.DataFrame) -> pd.DataFrame:
    """Each integration's training case next to the direct run of the same recipe, shape and run: what the
    framework costs in tokens/s and memory, and whether it quantizes the same linears."""
    ok = t[t["status"] == "ok"]
    key = ["run_id", "model", "shape_name", "format", "scaling"]
    direct = {i: d for i, b, p, v in zip(ok.index, ok["backend"], ok["params_json"], ok["variant"], strict=True)
              if (d := direct_of(b, p, v)) is not None}
    by_direct: dict[tuple[str, str], list] = {}
    for i, d in direct.items():
        by_direct.setdefault(d, []).append(i)
    both = pd.concat([ok.loc[[]].merge(ok.loc[[]], on=key, suffixes=("", "_direct"))] + [ok.loc[rows].merge(
        ok[(ok["backend"] == name) & (ok["variant"] == variant)], on=key, suffixes=("", "_direct"))
        for (name, variant), rows in by_direct.items()], ignore_index=True)
    if both.empty:
        return both

    def share(fp8: pd.Series, total: pd.Series) -> pd.Series:
        return fp8.map(lambda v: "" if pd.isna(v) else f"{v:.0f}") + "/" + total.map(
            lambda v: "" if pd.isna(v) else f"{v:.0f}")
    return both.assign(
        integration=both["recipe"], direct=both["recipe_direct"],
        overhead_pct=(both["tokens_per_s_direct"] / both["tokens_per_s"] - 1) * 100,
        peak_gib=both["peak_mem_bytes"] / 2**30, peak_gib_direct=both["peak_mem_bytes_direct"] / 2**30,
        fp8_linears=share(both["linears_fp8"], both["linears_total"]),
        fp8_linears_direct=share(both["linears_fp8_direct"], both["linears_total_direct"]),
        verdict=both.apply(_parity, axis=1),
        verdict_direct=both[[c for c in both.columns if c.endswith("_direct")]]
        .rename(columns=lambda c: c.removesuffix("_direct")).assign(format=both["format"]).apply(_parity, axis=1))


def integration_summary(fw: pd.DataFrame) -> pd.DataFrame:
    """integration_overhead over repeated runs: a small model's training step is host-bound and its tokens/s
    moves from one run to the next by more than most integrations cost (docs/integrations.md), so one pair of
    runs says little; the median and range do."""
    fw = fw.assign(passes=fw["verdict"] == "pass",
                   judged=(fw["verdict"] == "pass") | fw["verdict"].str.startswith("FAIL"))
    g = fw.groupby(["device", "model", "integration", "direct"]).agg(
        runs=("run_id", "nunique"), overhead_median_pct=("overhead_pct", "median"),
        overhead_min_pct=("overhead_pct", "min"), overhead_max_pct=("overhead_pct", "max"),
        parity_passes=("passes", "sum"), parity_judged=("judged", "sum")).reset_index()
    g["parity"] = g.apply(lambda r: f"{r['parity_passes']:.0f}/{r['parity_judged']:.0f} pass"
                          if r["parity_judged"] else "BF16", axis=1)
    return g.drop(columns=["parity_passes", "parity_judged"])


LLAMA_SCALE_HIDDEN = 4096
"""Training cases of models at least this wide (Llama-2-7B, Llama-3-8B and their layer subsets) are the
whole-step study of the Training page: depth, sequence length, TE path, the published figures."""


def llama_steps(train: pd.DataFrame) -> pd.DataFrame:
    """Each FP8 training case of a Llama-scale model with its BF16 twin (same run, model, shape, backend and
    variant; an FP8 all-gather run's twin is BF16 FSDP2 on as many GPUs), and what the step depends on: layers
    and master weights as the case recorded them (older records: the model's preset, the run's config), the
    width of the preset (`dims`), batch, seq and processes from the shape, the path (backend and variant)."""
    from fp8bench.config.compose import model_preset

    ok = _real(train)
    if ok.empty:
        return ok
    presets = {m: model_preset(m) or {} for m in ok["model"].unique()}
    params = ok["params_json"].map(lambda j: json.loads(j) if isinstance(j, str) else {})
    shape = ok["shape_json"].map(lambda j: json.loads(j) if isinstance(j, str) else {})
    ok = ok.assign(
        layers=[p.get("model.layers", presets[m].get("layers")) for p, m in zip(params, ok["model"], strict=True)],
        master_weights=[p.get("workload.train.master_weights", r)
                        for p, r in zip(params, ok["run_master_weights"], strict=True)],
        hidden=ok["model"].map(lambda m: presets[m].get("hidden")),
        dims=ok["model"].map(lambda m: "hidden {hidden}, ffn {ffn}, {heads}/{kv_heads} heads".format(**presets[m])
                             if presets[m] else m),
        batch=shape.map(lambda s: s.get("batch")), seq=shape.map(lambda s: s.get("seq")),
        nproc=shape.map(lambda s: s.get("nproc", 1)),
        twin_shape=_twin_shape(ok["shape_name"]),
        path=_path(ok) + shape.map(lambda s: f" · {layout}" if (layout := distributed_layout(s)) else ""))
    ok["master_weights"] = ok["master_weights"].fillna("?")  # a record that says neither
    t = _with_bf16(ok, ("time_ms", "peak_mem_bytes", "tokens_per_s"), shape="twin_shape")
    had = t["speedup"].notna() | (t["withdrawn"].fillna("") != "" if "withdrawn" in t else False)  # withdrawn too
    t = t[(t["format"] != "bf16") & had & (t["hidden"].fillna(0) >= LLAMA_SCALE_HIDDEN)]
    return t.assign(recipe_only=_recipe_only(t), peak_gib=t["peak_mem_bytes"] / 2**30,
                    bf16_peak_gib=t["bf16_peak_mem_bytes"] / 2**30,
                    mem_change_pct=(t["peak_mem_bytes"] / t["bf16_peak_mem_bytes"] - 1) * 100,
                    setting=t["batch"].astype(str) + "x" + t["seq"].astype(str) + " "
                    + t["master_weights"].str.upper() + "-master " + t["nproc"].astype(str) + "GPU")


def _recipe_only(d: pd.DataFrame) -> pd.Series:
    """format/scaling with the scaling knobs away from the defaults (data.cases' `knobs`), without the path."""
    return d["format"] + "/" + d["scaling"] + knob_suffix(d["knobs"])


def distributed_layout(shape: dict) -> str:
    """How a training case's shape spread it over GPUs ("fsdp2 x2 FP8 all-gather"), or "" for one process."""
    if shape.get("nproc", 1) <= 1:
        return ""
    return f"{shape['strategy']} x{shape['nproc']}" + (" FP8 all-gather" if shape.get("fp8_all_gather") else "")


def _twin_shape(shape_name: pd.Series) -> pd.Series:
    """The shape a case's BF16 twin has: its own, less the FP8 all-gather tag (BF16 gathers in BF16), as
    fp8bench.core.records.derive_speedups pairs them."""
    from fp8bench.core.types import FP8_ALL_GATHER_TAG

    return shape_name.str.replace(FP8_ALL_GATHER_TAG, "", regex=False)


def _path(df: pd.DataFrame) -> pd.Series:
    """How a training case ran its recipe: the backend and variant, or in words where the backend declares
    its path (`Backend.path`: TE's two paths)."""
    return pd.Series([(v and f"{b}+{v}") or backends.declared(b, "path", "") or b
                      for b, v in zip(df["backend"], df["variant"], strict=True)], index=df.index, dtype=object)


def fastest_per_path(steps: pd.DataFrame) -> pd.DataFrame:
    """One FP8 recipe of each path per device, model and setting: the fastest of those whose speedup the pages
    show with an interval (`published`: fp8bench.report.published.cases; else any with a speedup); where none
    has one, the first by name: a withdrawn point estimate ranks nothing."""
    ranked = steps["published"].astype(bool) if "published" in steps else steps["speedup"].notna()
    picked = []
    for _, g in steps.groupby(["device", "model", "setting", "path"], sort=False):
        shown = g[ranked[g.index]]
        picked.append(shown["speedup"].idxmax() if not shown.empty
                      else g.sort_values(["recipe_only", "case_id"]).index[0])
    return steps.loc[picked]


STEP_GROUP = ["device", "dims", "batch", "master_weights", "nproc"]
"""What a depth or sequence-length line holds fixed besides the other axis: one study's setting."""


def _llama_steps_section(p: Page, steps: pd.DataFrame) -> None:
    p.h2("Whole training steps at Llama scale: depth, sequence length and the TE path")
    p.note("Whole steps (forward, backward, AdamW) of the decoder at Llama-2-7B / Llama-3-8B dimensions, each FP8 "
           "recipe against the BF16 run of the same path in the same run: TE per linear (each block linear a "
           "te.Linear; norms, RoPE and attention torch's), TE per block (each block a te.TransformerLayer, as "
           "Megatron-Core builds it) and compiled torchao. Setting: batch x seq, master weights' precision, GPUs.")
    cols = ["device", "model", "layers", "seq", "setting", "path", "recipe_only", "tokens_per_s", "bf16_tokens_per_s",
            "speedup", "speedup_lo", "speedup_hi", "twin_drift", "withdrawn", "peak_gib", "bf16_peak_gib",
            "mem_change_pct", "run_id"]
    p.table(steps.sort_values(["device", "dims", "layers", "seq", "setting", "path", "speedup"])[cols],
            {"tokens_per_s": 0, "bf16_tokens_per_s": 0, "speedup": 2, "speedup_lo": 2, "speedup_hi": 2,
             "twin_drift": 3, "peak_gib": 1, "bf16_peak_gib": 1, "mem_change_pct": 0})
    fig = _scaling_figure(steps)
    if fig is not None:
        p.figure(fig, "Step speedup over BF16 by depth (left, at the setting's seq) and by sequence length (right), "
                 "one line per recipe, path and setting", None, "speedup vs BF16 (x)")


def _scaling_figure(steps: pd.DataFrame) -> go.Figure | None:
    """Depth and sequence-length lines side by side: a line per recipe, path and setting (the width, batch,
    master weights and GPUs held; the other axis held too), where the study varies the axis."""
    from plotly.subplots import make_subplots

    steps = steps[steps["speedup"].notna()]  # a withdrawn speedup has no point to draw
    d0 = steps.assign(label=steps["recipe_only"] + " · " + steps["path"] + " · "
                      + steps["dims"].str.split(",").str[0] + ", batch " + steps["batch"].astype(str))
    panels = []
    for key, other in (("layers", "seq"), ("seq", "layers")):
        group = [*STEP_GROUP, other, "label"]
        n = d0.groupby(group)[key].transform("nunique")
        panels.append((key, other, d0[n >= 2].sort_values(key)))
    if all(d.empty for _, _, d in panels):
        return None
    fig = make_subplots(rows=1, cols=2, subplot_titles=("by depth (layers)", "by sequence length"))
    shown: set[str] = set()
    colors = px.colors.qualitative.Dark24
    palette = {lab: colors[i % len(colors)] for i, lab in enumerate(sorted(d0["label"].unique()))}
    for col, (key, other, d) in enumerate(panels, start=1):
        for keys, line in d.groupby([*STEP_GROUP, other, "label"]):
            label = keys[-1]
            name = f"{label}, {other} {keys[-2]}"
            fig.add_trace(go.Scatter(x=line[key], y=line["speedup"], mode="lines+markers", name=label,
                                     legendgroup=label, showlegend=label not in shown, hovertext=name,
                                     line={"color": palette[label]}), row=1, col=col)
            shown.add(label)
    fig.update_xaxes(type="log", title="layers", row=1, col=1)
    fig.update_xaxes(type="log", title="sequence length (tokens)", row=1, col=2)
    fig.update_layout(height=PLOT_H + 60)
    return fig


def _anchors_section(p: Page, steps: pd.DataFrame) -> None:
    from fp8bench.report.anchors import ANCHORS, CLAIM

    p.h2("Against the published figures")
    p.note(f"The claim under test: FP8 training +30-40% end to end, Llama-2-7B {CLAIM:.2f}x. fp8bench's rows: the "
           "fastest FP8 recipe of each path at the deepest model of each setting (byte-level vocabulary: the "
           "output head is negligible here, a 32k-128k head is not); every depth is in the table above. The "
           "published rows keep their own settings; 'derived' is our ratio of the two throughputs a source gives.")
    best = fastest_per_path(deepest_steps(steps))
    ours = pd.DataFrame({
        "source": "fp8bench, run " + best["run_id"], "model": best["model"] + " (" + best["layers"].astype(str) + " layers)",
        "setting": best["device"] + ", " + best["setting"],
        "recipe": best["recipe_only"] + " · " + best["path"], "baseline": "BF16, same path", "speedup": best["speedup"],
        "how": "measured", "url": ""})
    theirs = pd.DataFrame([{"source": a.source, "model": a.model, "setting": a.setting, "recipe": a.recipe,
                            "baseline": a.baseline, "speedup": a.speedup, "how": a.how,
                            "url": a.url.removeprefix("https://")}  # the site links nothing outside itself
                           for a in ANCHORS])
    p.table(pd.concat([ours.sort_values("speedup", ascending=False), theirs], ignore_index=True), {"speedup": 2})


def step_parts(train: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Where each step of `steps` (FP8 cases, llama_steps) and of its BF16 twin goes, in ms per step, from the
    kernels of the steps profiled after the run: the categories of fp8bench.workloads.profile; idle = the
    measured step minus the time any kernel ran; overlap = the categories' sum minus that time (kernels running
    at once: communication beside compute); and the profiled steps' wall time over the measured step."""
    key = ["run_id", "model", "twin_shape", "backend", "variant"]
    twins = _real(train)
    twins = twins[twins["gpu_busy_ms"].notna()].assign(twin_shape=lambda x: _twin_shape(x["shape_name"]))
    d = twins.merge(steps[key].drop_duplicates(), on=key)
    d = d[d["case_id"].isin(steps["case_id"]) | (d["format"] == "bf16")]
    if d.empty:
        return d
    ms = {"gemm": "gpu_gemm_ms", "casts": "gpu_quantize_ms", "attention": "gpu_attention_ms",
          "optimizer": "gpu_optimizer_ms", "communication": "gpu_communication_ms", "other": "gpu_other_ms"}
    parts = sum(d[v].fillna(0) for v in ms.values())
    return d.assign(**{k: d[v] for k, v in ms.items()}, idle=d["time_ms"] - d["gpu_busy_ms"],
                    overlap=(parts - d["gpu_busy_ms"]).round(3).clip(lower=0) + 0.0, profiled_pct=100 * d["gpu_profiled_step_ms"] / d["time_ms"],
                    path=_path(d), recipe_only=_recipe_only(d)).sort_values(
        ["device", "model", "shape_name", "path", "time_ms"], ascending=[True, True, True, True, False])


def deepest_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The cases of `steps` at the most layers of their setting (STEP_GROUP)."""
    return steps[steps["layers"] == steps.groupby(STEP_GROUP)["layers"].transform("max")]


def _step_time_section(p: Page, train: pd.DataFrame, steps: pd.DataFrame, falls: pd.DataFrame | None) -> None:
    """Where a whole step's time goes, BF16 and FP8 side by side, from the kernels of profiled steps: the
    deepest model of each setting here (`fp8bench waterfall` lists every case)."""
    d = step_parts(train, deepest_steps(steps))
    if d.empty:
        return
    p.h2("Where a whole step's time goes: the step's waterfall")
    p.note("From the kernels of 3 steps profiled after each run's timed steps (fp8bench.workloads.profile): GEMMs, "
           "FP8 casts and scale updates, attention, the optimizer (AdamW and gradient clipping), communication "
           "(NCCL), everything else (norms, activations, RoPE, elementwise, loss), and idle = the measured step "
           "minus the time any kernel ran (host gaps). The parts plus idle, minus overlap (kernels running at "
           "once, e.g. communication beside compute), are the measured step; 'profiled / measured' says whether "
           "the profiled steps ran like the timed ones (100% = alike). "
           "Kernel names decide the category: BF16 steps show 'casts' too (dtype conversions and transposes "
           "of RoPE and attention match the same names), so the waterfall's +casts stage is the difference.")
    cols = ["model", "shape_name", "path", "recipe_only", "time_ms", "gemm", "casts", "attention", "optimizer",
            "communication", "other", "idle", "overlap", "profiled_pct"]
    p.table(d[cols], {c: 1 for c in cols[4:]})
    if falls is not None and not falls.empty:
        _waterfall_section(p, falls[falls["case_id"].isin(set(steps["case_id"]))])


def _loss_figure(c: pd.DataFrame) -> go.Figure:
    """A run's curves side by side, one colour per recipe in both: validation points, and the training loss
    as a 20-step running mean."""
    from plotly.subplots import make_subplots

    from fp8bench.report.charts import line_dash, recipe_styles

    fig = make_subplots(rows=1, cols=2, subplot_titles=("validation", "training, 20-step mean"))
    styles = recipe_styles(c["label"])
    for label, lc in c.sort_values("step").groupby("label", sort=True):
        color, symbol = styles[label]
        val, tr = lc[lc["kind"] == "validation"], lc[lc["kind"] == "train"]
        fig.add_trace(go.Scatter(x=val["step"], y=val["loss"], mode="lines+markers", name=label, legendgroup=label,
                                 line={"color": color}, marker={"symbol": symbol, "size": 7}), row=1, col=1)
        mean = tr.assign(loss=tr["loss"].rolling(20, min_periods=1).mean())
        mean = mean.iloc[::max(1, len(mean) // CURVE_POINTS)]  # a running mean loses nothing drawn this thinned
        fig.add_trace(go.Scatter(x=mean["step"], y=mean["loss"], mode="lines", name=label, legendgroup=label,
                                 showlegend=False, line={"color": color, "dash": line_dash(label, styles)}),
                      row=1, col=2)
    fig.update_layout(height=CURVE_H + 40)
    return fig


def _loss_run_section(p: Page, device: str, model: str, run_id: str, d: pd.DataFrame, curves: pd.DataFrame,
                      cols: list[str], digits: dict) -> None:
    """One training run of the loss study: its cases' table, their loss curves and the memory breakdown."""
    from fp8bench.report.parity_view import recipe_rates

    p.h2(f"{device}: {model} (run {run_id})")
    rates = recipe_rates(d)
    if not rates.empty:
        p.note("Pass rate per recipe over the seeds this run trained it on: a recipe passes with at least three "
               "seeds, every one passing, and the paired test not finding it worse.")
        p.table(rates[["recipe", "setting", "pass_rate", "verdict", "band_exit", "curves", "quality_speedup"]])
    p.table(d.sort_values(["format", "label"])[cols], digits)
    c = curves[curves["case_id"].isin(d["case_id"]) & (curves["run_id"] == run_id)]
    if not c.empty:
        c = c.merge(d[["case_id", "label"]], on="case_id")
        p.figure(_loss_figure(c), f"{model}: validation loss per recipe (left) and training loss, 20-step mean "
                 f"(right), run {run_id}", "step", "loss (nats/byte)")
    m = d[d["mem_step_peak_bytes"].notna()]
    if not m.empty:  # the table has each peak and its change: the breakdown is one click away
        p.raw(f"<details><summary>{esc(model)}: where a training step's peak memory goes (run "
              f"{esc(run_id)})</summary>")
        p.note("Memory at the peak of one training step, measured: resident before its forward, saved by the "
               "forward for backward (FP8 part from the saved tensors' dtypes), then the backward's transient.")
        p.figure(_memory_bars(m), f"{model}: where a training step's peak memory goes (run {run_id})",
                 "memory (GiB)", "")
        p.raw("</details>")


def training_page(df: pd.DataFrame, curves: pd.DataFrame, falls: pd.DataFrame | None = None) -> Page:
    p = Page("training.html", "Training: does FP8 keep BF16's loss, and what does it buy?")
    p.note("Each run trains the same Llama-style decoder from the same initialisation per seed, on the same "
           "byte-level corpus. A run passes parity when its final validation loss and its training-loss curve's "
           "area each lie inside the one-sided 97.5% prediction interval of the BF16 seeds (a FAIL names the rule, "
           "its figure and the allowance); a recipe passes on three or more seeds, every one passing, when the "
           "paired test against the BF16 run of each seed does not find it worse (docs/training.md). band exit: "
           "the step from which the smoothed training loss stays above the band to the end. curve: ok, plateau, "
           "spike or diverged, from the step where it began (curves under 100 steps are not read). "
           "Quality-adjusted speedup: BF16's time to its final loss over the recipe's time to reach that loss.")
    train = df[df["workload"] == "train"]
    t = pd.concat([_with_bf16(train), train[train["status"] == "diverged"]], ignore_index=True)
    if t.empty:
        p.note("No training runs recorded: `fp8bench run -m sweep=train-tiny` (CPU) or `sweep=hopper-train` (GPU).")
        return p
    steps = llama_steps(train)
    if not steps.empty:
        _llama_steps_section(p, steps)
        _anchors_section(p, steps)
        _step_time_section(p, train, steps, falls)
    from fp8bench.report.parity_view import band_exit, curve

    t = t.assign(verdict=t.apply(_parity, axis=1), curve=t.apply(curve, axis=1), band_exit=t.apply(band_exit, axis=1),
                 mem_change_pct=(t["peak_mem_bytes"] / t["bf16_peak_mem_bytes"] - 1) * 100,
                 peak_gib=t["peak_mem_bytes"] / 2**30, label=t["recipe"] + " · " + t["shape_name"].str.split(".").str[-1])
    study_runs: list = []
    loss_runs: dict[tuple, list] = {}
    cols = ["label", "verdict", "band_exit", "curve", "tokens_per_s", "speedup", "quality_speedup", "peak_gib",
            "mem_change_pct", "loss_final", "loss_gap_vs_bf16", "loss_gap_allowed", "loss_area_gap_pct",
            "loss_area_gap_allowed_pct"]
    digits = {"tokens_per_s": 0, "speedup": 2, "quality_speedup": 2, "peak_gib": 2, "mem_change_pct": 0,
              "loss_final": 4, "loss_gap_vs_bf16": 4, "loss_gap_allowed": 4, "loss_area_gap_pct": 2,
              "loss_area_gap_allowed_pct": 2}
    for (device, model, run_id), d in t.groupby(["device", "model", "run_id"]):
        if (model, run_id) in set(zip(steps["model"], steps["run_id"], strict=True)):
            # a whole-step speed run (tens of steps): the study above holds its figures; its loss says nothing
            study_runs.append((device, model, run_id, d))
            continue
        loss_runs.setdefault((device, model), []).append((d["started_at"].min(), run_id, d))
    for (device, model), runs in loss_runs.items():
        runs.sort(key=lambda r: (r[0], r[1]), reverse=True)  # newest first
        # open: the newest runs that judged parity; folded: earlier ones, and runs without a verdict (fewer
        # than three BF16 seeds: their curves are shown, but they decide nothing)
        judged = [r for r in runs if r[2]["parity_seeds"].notna().any()]
        shown = judged[:OPEN_RUNS_PER_MODEL]
        folded = [r for r in runs if not any(r is j for j in shown)]
        for _, run_id, d in shown:
            _loss_run_section(p, device, model, run_id, d, curves, cols, digits)
        if folded:
            p.raw(f"<details><summary>{len(folded)} more runs of {esc(model)} on {esc(device)} (earlier, or "
                  "without a parity verdict)</summary>")
            for _, run_id, d in folded:
                _loss_run_section(p, device, model, run_id, d, curves, cols, digits)
            p.raw("</details>")
    if study_runs:
        p.raw(f"<details><summary>Each case of the whole-step study's {len(study_runs)} run sections "
              "(speed runs of tens of steps: their loss says nothing)</summary>")
        for device, model, run_id, d in study_runs:
            p.note(f"{device}: {model} (run {run_id})")
            p.table(d.sort_values(["format", "label"])[cols], digits)
        p.raw("</details>")
    fw = integration_overhead(t)
    if not fw.empty:
        p.h2("Framework integrations: what Lightning and Accelerate add")
        p.note("Each integration's run next to the direct TE / torchao run of the same recipe, seed and run. "
               "Overhead: how much faster the direct run trains (tokens/s), in percent. FP8 linears: how many of "
               "the model's linears each quantizes (Lightning's and Accelerate's TE conversion include the output "
               "head; Accelerate's torchao filter leaves the first and last linear in high precision).")
        p.table(fw.sort_values(["run_id", "integration"])[[
            "run_id", "integration", "direct", "verdict", "verdict_direct", "tokens_per_s", "tokens_per_s_direct", "overhead_pct", "peak_gib",
            "peak_gib_direct", "fp8_linears", "fp8_linears_direct", "loss_final", "loss_final_direct"]],
            {"tokens_per_s": 0, "tokens_per_s_direct": 0, "overhead_pct": 1, "peak_gib": 2, "peak_gib_direct": 2,
             "loss_final": 4, "loss_final_direct": 4})
        if fw["run_id"].nunique() > 1:
            p.note("Over repeated runs (median and range of the overhead; parity verdicts counted):")
            p.table(integration_summary(fw), {"overhead_median_pct": 1, "overhead_min_pct": 1, "overhead_max_pct": 1})
    p.h2("Not measured, and why")
    missing = not_measured(df, ("train",))
    p.raw(f"<details><summary>{len(missing)} training cases not measured, each with its reason</summary>")
    p.table(missing)
    p.raw("</details>")
    return p


# --------------------------------------------------------------------------- numerics

def numerics_page(df: pd.DataFrame) -> Page:
    p = Page("numerics.html", "Numerics: SQNR and relative error per format × scaling")
    p.note("SQNR (dB) of each GEMM output against an FP64 reference on Gaussian inputs; higher is better, +6 dB "
           "per extra mantissa bit. MXFP8 and NVFP4 come from the exact emulator where the GPU cannot run them.")
    g = df[(df["workload"] == "gemm") & (df["status"] == "ok") & df["sqnr_db"].notna()]
    g = g.assign(fmt_scaling=g["format"] + "/" + g["scaling"])
    if g.empty:
        p.note("No GEMM numerics recorded.")
        return p
    fig = px.box(g, x="fmt_scaling", y="sqnr_db", color="backend", points=False, height=PLOT_H)
    p.figure(fig, "GEMM output SQNR against FP64, per format and scaling", "format / scaling", "SQNR (dB)")
    t = (g.groupby(["fmt_scaling", "backend"]).agg(sqnr_db=("sqnr_db", "median"), rel_err=("rel_err", "median"),
                                                   vs_emulator_db=("sqnr_vs_emulated_db", "min"),
                                                   cases=("case_id", "count")).reset_index())
    p.table(t, {"sqnr_db": 1, "rel_err": 4, "vs_emulator_db": 1})
    q = df[(df["workload"] == "quantize") & (df["status"] == "ok")]
    if not q.empty:
        p.h2("Casts: SQNR of the quantized tensor, and cast bandwidth")
        p.table(q.groupby(["device", "format", "scaling", "backend"]).agg(
            sqnr_db=("sqnr_db", "median"), gbps=("gbps", "median")).reset_index(), {"sqnr_db": 1, "gbps": 1})
    return p


# --------------------------------------------------------------------------- history and runs

def history_page(df: pd.DataFrame, asv_index: Path | None, steps: list | None = None) -> Page:
    p = Page("history.html", "History: tracked series across runs")
    p.h2("Persistent steps (fp8bench history)")
    p.note("Each series of per-run medians is segmented; a step that persists is reported once, at the first "
           "commit of the new level. Time going up is a regression.")
    p.table(pd.DataFrame([{"series": s.series, "commit": s.commit, "run": s.run_id, "before_ms": s.before,
                           "after_ms": s.after, "change_pct": 100 * s.rel_change,
                           "verdict": "regression" if s.after > s.before else "improvement"} for s in steps or []]),
            {"before_ms": 4, "after_ms": 4, "change_pct": 1})
    if asv_index is not None:
        p.raw('<p class="note">asv\'s own history of the curated suite: <a href="asv/index.html">asv site</a>.</p>')
    else:
        p.note("No asv results are published into this site yet (results/site/asv).")
    ok = df[(df["status"] == "ok") & df["time_ms"].notna() & _timed(df)]
    counts = ok.groupby(["device", "case_id"])["run_id"].nunique()
    tracked = counts[counts >= 2].sort_values(ascending=False).head(24)
    if tracked.empty:
        p.note("Every case so far was measured in a single run; a series appears once a case has two or more "
               "runs on the same device (e.g. a re-run after a commit or a dependency bump).")
        return p
    sub = ok.set_index(["device", "case_id"]).loc[tracked.index].reset_index()
    sub["series"] = sub["device"] + " · " + sub["case_id"]
    from fp8bench.report.charts import style_traces

    fig = style_traces(px.line(sub.sort_values("started_at"), x="started_at", y="time_ms", color="series",
                               markers=True, hover_data=["git_commit", "run_id", "measurement_version"],
                               height=PLOT_H + 80, log_y=True))
    p.figure(fig, "Median time per run of the cases measured in several runs (log scale: series from 0.01 to 100 "
             "ms share one axis)", "run start", "time (ms, log)")
    return p


def runs_page(runs: pd.DataFrame, jobs: pd.DataFrame | None = None, unfinished: pd.DataFrame | None = None) -> Page:
    p = Page("runs.html", "Runs: every run with its environment and config")
    cols = ["run_id", "started_at", "git_commit", "git_dirty", "device_name", "torch", "cuda", "driver",
            "transformer_engine", "torchao", "triton", "n_cases", "n_ok", "n_failed", "source"]
    if not runs.empty:  # where the run was ingested from, without the machine's own folders
        runs = runs.assign(source=runs["source"].map(lambda s: "/".join(Path(s).parts[-2:]) if isinstance(s, str) else s))
    p.table(runs[cols] if not runs.empty else runs)
    for _, r in runs.iterrows():
        cfg = r["config"]
        try:
            cfg = json.dumps(json.loads(cfg), indent=1, sort_keys=True) if isinstance(cfg, str) else str(cfg)
        except json.JSONDecodeError:
            cfg = str(cfg)
        env = r["details"] if isinstance(r["details"], str) else ""
        p.raw(f"<details><summary>{esc(r['run_id'])}: config and environment</summary>"
              f"<pre>{esc(cfg)}</pre><pre>{esc(env)}</pre></details>")
    if jobs is not None and not jobs.empty:
        p.h2("Batch jobs")
        p.note("Every Slurm job that ran cases of a run, as its records name it: node, partition, and the state "
               "Slurm's accounting gave a job that ended before some of its cases did (CANCELLED, TIMEOUT, "
               "NODE_FAIL); those cases are recorded failed until a resume runs them.")
        p.table(jobs)
        if unfinished is not None and not unfinished.empty:
            p.raw(f"<details><summary>{len(unfinished)} case(s) a batch job did not finish</summary>")
            p.table(unfinished)
            p.raw("</details>")
    return p
