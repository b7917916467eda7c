"""How the generated pages show a speedup: with its 95% interval, or withdrawn with the reason. The pages'
generators write every speedup through `Shown.text`, and `fp8bench audit` reads the cells back by the
patterns here (fp8bench.report.audit_speedups).

A speedup is shown as `1.46x (1.44–1.50)`, in a row that names its run and that run's measurement version;
over the seeds of a training recipe, `0.94x (0.93–0.95 over 3 seeds)` (fp8bench.analysis.seeds). Where the
committed data hold no interval for it, the cell reads `withdrawn: <why>` and no figure: one that the
committed samples cannot rebuild (fp8bench.report.data.withdraw), or one whose sides were each timed once,
apart from each other (whole training steps on one seed, runs before side-by-side timing).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from fp8bench.analysis.seeds import over_seeds
from fp8bench.core.records import seedless
from fp8bench.report import data

NO_INTERVAL = "one timing of each side, apart: no interval"
"""Why a speedup rebuilt without an interval is withdrawn: one ratio of two medians, timed at different times,
says nothing of how far a second measurement would land."""

SPEEDUP = re.compile(r"(?<![\w.])(?P<value>\d+\.\d+)x(?!\w)")
"""A figure printed as a speedup over BF16."""
INTERVAL = re.compile(r" \((?P<lo>\d+\.\d+)–(?P<hi>\d+\.\d+)(?: over (?P<seeds>\d+) seeds)?(?:, v(?P<version>\d+))?\)")
"""The interval printed right after a speedup (and, in prose, the measurement version inside it)."""
WITHDRAWN = re.compile(r"^withdrawn: \S")
"""A cell whose speedup is withdrawn, with the reason."""
VERSION = re.compile(r"^v\d+$")
"""A measurement version as the tables print it."""
MODELLED = "(model)"
"""Ends the header of a column of ratios modelled from kernel times (the waterfall's stages): an attribution
of a measured step to its parts, printed without `x`, not a speedup."""


@dataclass(frozen=True)
class Shown:
    """A speedup as the pages show it: value and interval, or why it is withdrawn (neither: no speedup)."""

    value: float | None = None
    lo: float | None = None
    hi: float | None = None
    seeds: int = 0
    """Seeds the interval is over (0: the run's own interval, or the across-box one)."""
    withdrawn: str = ""

    @property
    def published(self) -> bool:
        return not self.withdrawn and self.value is not None

    def text(self, at: str = "") -> str:
        """The cell: `1.46x (1.44–1.50)`, `withdrawn: why`, or '' for no speedup; `at` names where it was timed
        (`at llama2-7b`)."""
        where = f" at {at}" if at else ""
        if self.withdrawn:
            return f"withdrawn: {self.withdrawn}" + (f" ({where.strip()})" if at else "")
        if self.value is None:
            return ""
        over = f" over {self.seeds} seeds" if self.seeds else ""
        return f"{self.value:.2f}x ({self.lo:.2f}–{self.hi:.2f}{over}){where}"


def _number(v) -> float | None:
    return None if v is None or pd.isna(v) else float(v)


def shown(df: pd.DataFrame) -> pd.Series:
    """Per case of `df` (data.cases: every run, so that a recipe's seeds are all there), its speedup as the
    pages show it (`Shown`)."""
    lo, hi = data.interval(df)
    bare = df["speedup"].notna() & (lo.isna() | hi.isna()) & (df["withdrawn"].fillna("") == "")
    seeded: dict[object, Shown] = {}
    train = df[bare & (df["workload"] == "train")]
    for _, g in train.groupby([train["run_id"], train["case_id"].map(seedless)]):
        iv = over_seeds(g["speedup"].tolist(), g["twin_id"].fillna("").tolist())
        if iv is not None:
            seeded.update({i: Shown(iv.value, iv.lo, iv.hi, seeds=len(g)) for i in g.index})

    def one(i) -> Shown:
        why = df.at[i, "withdrawn"]
        if isinstance(why, str) and why:
            return Shown(withdrawn=why)
        value = _number(df.at[i, "speedup"])
        if value is None:
            return Shown()
        if _number(lo[i]) is not None and _number(hi[i]) is not None:
            return Shown(value, float(lo[i]), float(hi[i]))
        return seeded.get(i, Shown(withdrawn=NO_INTERVAL))

    return pd.Series([one(i) for i in df.index], index=df.index, dtype=object)


def cases(con) -> pd.DataFrame:
    """data.cases with each case's `shown` speedup and `published`: whether it is shown with an interval."""
    df = data.cases(con)
    if df.empty:
        return df.assign(shown=pd.Series(dtype=object), published=pd.Series(dtype=bool))
    s = shown(df)
    return df.assign(shown=s, published=s.map(lambda x: x.published).astype(bool))


def for_the_site(con) -> pd.DataFrame:
    """`cases` as the site's pages read them: each speedup in `speedup`, `speedup_lo`, `speedup_hi` only as the
    generated pages show it (its own or across-box interval, or its recipe's over seeds), blank where withdrawn,
    with why in `withdrawn`; a kernel-only speedup kept only with an interval of its own. Tables, charts and
    the advisor then have nothing to show that the generated pages would not."""
    df = cases(con)
    if df.empty:
        return df
    df = df.copy()
    s = df["shown"]
    df["speedup"] = [x.value if x.published else np.nan for x in s]
    df["speedup_lo"] = [x.lo if x.published else np.nan for x in s]
    df["speedup_hi"] = [x.hi if x.published else np.nan for x in s]
    df[["speedup_box_lo", "speedup_box_hi"]] = np.nan  # what `shown` took as the interval is in _lo/_hi now
    df["withdrawn"] = [x.withdrawn or (w if isinstance(w, str) else "") for x, w in zip(s, df["withdrawn"], strict=True)]
    klo, khi = data.interval(df, "speedup_kernel")
    kept = klo.notna() & khi.notna()
    df["speedup_kernel"] = df["speedup_kernel"].where(kept)
    df["speedup_kernel_lo"], df["speedup_kernel_hi"] = klo.where(kept), khi.where(kept)
    df[["speedup_kernel_box_lo", "speedup_kernel_box_hi"]] = np.nan
    return df


def of_group(values: pd.Series) -> Shown:
    """One row's speedup from the cases it stands for (each a `Shown`): the median of the published ones
    (value and interval ends; the seeds of one recipe share theirs), else the first reason they are withdrawn."""
    pub = [s for s in values if s.published]
    if pub:
        if len({(s.value, s.lo, s.hi) for s in pub}) == 1:
            return pub[0]
        med = pd.DataFrame([(s.value, s.lo, s.hi) for s in pub]).median()
        return Shown(float(med[0]), float(med[1]), float(med[2]))
    return next((s for s in values if s.withdrawn), Shown())
