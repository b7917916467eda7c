"""Charts whose series are recipes: each recipe drawn in its own colour and marker, each panel holding only the
models it has data for, and panels spaced so that no axis label reaches into the next one (tests/test_report.py
checks both in Chromium)."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go

COLORS = px.colors.qualitative.Plotly
"""Ten colours."""
SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "triangle-down", "cross", "star", "pentagon",
           "hexagon", "hourglass")
"""Eleven markers: with ten colours, recipe i gets colour i mod 10 and marker i mod 11, a pair no other of the
first 110 recipes shares (10 and 11 are coprime), and neighbours in the legend differ in both."""

DASHES = ("solid", "dash", "dot", "dashdot", "longdash", "longdashdot")
"""Line dashes, for lines drawn without markers: recipe i's line is colour i mod 10, dash i // 10 (unique for
the first 60)."""

PATTERNS = ("", "/", "\\", "x", "-", "|", "+", ".")
"""Bar fills: recipe i's bars are colour i mod 10, pattern i // 10 (unique for the first 80)."""

PANEL_H = 260
"""Pixels of one panel's plot area."""
TOP = 60
"""Pixels above the first panel: the figure's title (html.Page.figure sets this top margin)."""
LINE_H = 15
"""Pixels per line of a tick label (12-pixel font)."""
LABEL_WIDTH = 18
"""Characters per line of a tick label: longer labels wrap at spaces, so that labels stay horizontal."""


def recipe_styles(recipes) -> dict[str, tuple[str, str]]:
    """Each recipe's (colour, marker symbol), in sorted order; beyond 110 recipes the open markers follow."""
    out = {}
    for i, recipe in enumerate(sorted(set(recipes))):
        symbol = SYMBOLS[i % len(SYMBOLS)] + ("-open" if (i // (len(COLORS) * len(SYMBOLS))) % 2 else "")
        out[recipe] = (COLORS[i % len(COLORS)], symbol)
    return out


def line_dash(recipe: str, recipes) -> str:
    """The dash of `recipe`'s line among `recipes` (beside its recipe_styles colour)."""
    return DASHES[(sorted(set(recipes)).index(recipe) // len(COLORS)) % len(DASHES)]


def style_traces(fig: go.Figure) -> go.Figure:
    """Each distinct trace name of `fig` in its own look: its recipe_styles colour, and its marker (a line's
    colour too) or, for bars, a fill pattern (PATTERNS)."""
    names = sorted({t.name for t in fig.data})
    styles = recipe_styles(names)
    for t in fig.data:
        color, symbol = styles[t.name]
        if t.type == "bar":
            shape = PATTERNS[(names.index(t.name) // len(COLORS)) % len(PATTERNS)]
            t.update(marker={"color": color, "pattern": {"shape": shape}})
        else:
            t.update(marker={"color": color, "symbol": symbol}, line={"color": color})
    return fig


def wrap(text: str, width: int = LABEL_WIDTH) -> str:
    """`text` in lines of at most `width` characters where spaces allow, joined by <br> (plotly's line break)."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "<br>".join(lines)


def speedup_panels(h: pd.DataFrame, panel: str = "workload", x: str = "label") -> go.Figure:
    """Speedup per recipe (markers with their 95% interval as error bars) and model, one panel per `panel`
    value, stacked: `h` has columns `panel`, `x`, recipe, speedup, lo, hi, bound and run_id. Each panel's x axis
    holds its own models only; each recipe has one colour and marker in every panel and one legend entry."""
    from plotly.subplots import make_subplots

    panels = sorted(h[panel].unique())
    h = h.assign(tick=h[x].map(wrap), plus=(h["hi"] - h["speedup"]).clip(lower=0),
                 minus=(h["speedup"] - h["lo"]).clip(lower=0))
    h = h.assign(hover=[_hover(r) for _, r in h.iterrows()])
    lines = int(h["tick"].str.count("<br>").max()) + 1
    # between two panels: the upper one's tick labels and axis title, then the lower one's title
    gap = lines * LINE_H + 90
    area = len(panels) * PANEL_H + (len(panels) - 1) * gap
    fig = make_subplots(rows=len(panels), cols=1, subplot_titles=panels,
                        vertical_spacing=gap / area if len(panels) > 1 else 0.0)
    styles = recipe_styles(h["recipe"])
    rank = {recipe: 1000 + i for i, recipe in enumerate(sorted(styles))}
    shown: set[str] = set()
    for row, name in enumerate(panels, start=1):
        d = h[h[panel] == name].sort_values([x, "recipe"])
        for recipe, r in d.groupby("recipe", sort=True):
            color, symbol = styles[recipe]
            fig.add_trace(go.Scatter(
                x=r["tick"], y=r["speedup"], mode="markers", name=recipe, legendgroup=recipe,
                showlegend=recipe not in shown, legendrank=rank[recipe], marker={"color": color, "symbol": symbol, "size": 9},
                error_y={"type": "data", "array": r["plus"].fillna(0), "arrayminus": r["minus"].fillna(0),
                         "color": color, "thickness": 1.2, "width": 3},
                hovertext=r["hover"], hoverinfo="text"), row=row, col=1)
            shown.add(recipe)
        fig.add_hline(y=1.0, line_dash="dot", line_color="#888", row=row, col=1)
        fig.update_xaxes(categoryorder="array", categoryarray=sorted(d["tick"].unique()), row=row, col=1)
    fig.update_xaxes(tickangle=0, automargin=True)
    bottom = lines * LINE_H + 60
    fig.update_layout(scattermode="group", scattergap=0.3, height=TOP + area + bottom, margin={"b": bottom},
                      legend={"title": {"text": "recipe"}})
    return fig


def _hover(r) -> str:
    ci = f" ({r['lo']:.2f}-{r['hi']:.2f})" if pd.notna(r["lo"]) and pd.notna(r["hi"]) else ""
    bound = f"<br>{r['bound']}" if isinstance(r["bound"], str) and r["bound"] else ""
    return f"{r['recipe']}<br>{r['speedup']:.2f}x{ci}{bound}<br>run {r['run_id']}"
