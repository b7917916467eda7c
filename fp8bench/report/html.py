"""HTML building blocks: page shell, escaped tables, plotly figures that load the one shared asset.

Every string that came from a config or a record goes through `esc` (text) or `_json` (inside scripts);
nothing is ever interpolated raw.
"""

from __future__ import annotations

import html
import json
import math

import pandas as pd

PAGES = [("index.html", "Overview"), ("gemm.html", "GEMMs"), ("modules.html", "Modules & layers"),
         ("training.html", "Training"),
         ("numerics.html", "Numerics"), ("history.html", "History"), ("runs.html", "Runs")]

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1d2330;background:#fafbfc}
header{background:#1d2330;color:#fff;padding:10px 24px;display:flex;gap:22px;align-items:center;flex-wrap:wrap}
header a{color:#cfd8e3;text-decoration:none}header a.on{color:#fff;font-weight:600}
header .brand{font-weight:700;font-size:18px;color:#7fd1ff}
main{padding:16px 24px;max-width:1400px}
h1{font-size:22px}h2{font-size:18px;margin-top:28px}
table{border-collapse:collapse;font-size:13px;margin:8px 0;background:#fff}
th,td{border:1px solid #dde2ea;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eef2f7}td.num{text-align:right;font-variant-numeric:tabular-nums}
.note{color:#55606e;font-size:13px;max-width:1000px}.bad{color:#b3261e}.good{color:#1b7f3b}
.plot{width:100%;min-height:360px}pre{white-space:pre-wrap;font-size:12px;max-width:1200px}
details{margin:6px 0}
.tbl{max-width:100%;max-height:520px;overflow:auto;margin:8px 0}.tbl table{margin:0}
.tbl thead th{position:sticky;top:0}
"""


def esc(value: object) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return html.escape(str(value), quote=True)


def _json(obj: object) -> str:
    """JSON safe to place inside <script>: no '<', '>' or '&' survive literally."""
    text = json.dumps(obj, default=_default, allow_nan=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _default(o: object):
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "isoformat"):
        return o.isoformat()
    return str(o)


def _clean(obj):
    """NaN/inf → None, recursively (JSON has neither)."""
    if isinstance(obj, float):
        return None if math.isnan(obj) or math.isinf(obj) else obj
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "tolist"):
        return _clean(obj.tolist())
    return obj


class Page:
    """One page: sections appended in order, plots numbered."""

    def __init__(self, filename: str, title: str) -> None:
        self.filename, self.title = filename, title
        self.parts: list[str] = []
        self._plots = 0

    def h2(self, text: str) -> None:
        self.parts.append(f"<h2>{esc(text)}</h2>")

    def note(self, text: str) -> None:
        self.parts.append(f'<p class="note">{esc(text)}</p>')

    def raw(self, trusted_html: str) -> None:
        """Markup built by this module only (never record text)."""
        self.parts.append(trusted_html)

    def figure(self, fig, title: str, x_title: str | None = None, y_title: str | None = None) -> None:
        """A plotly figure, drawn by the shared assets/plotly.min.js, with its title and (cartesian plots) the
        axes' titles with units: every plot says what it shows."""
        fig.update_layout(title={"text": title, "x": 0.0, "xanchor": "left"}, margin={"t": 60})
        if x_title is not None:
            fig.update_xaxes(title=x_title)
        if y_title is not None:
            fig.update_yaxes(title=y_title)
        self._plots += 1
        div = f"plot-{self._plots}"
        spec = fig.to_plotly_json()
        data, layout = _clean(spec.get("data", [])), _clean(spec.get("layout", {}))
        self.parts.append(f'<div class="plot" id="{div}"></div><script>Plotly.newPlot("{div}",{_json(data)},'
                          f'{_json(layout)},{{"responsive":true,"displaylogo":false}});</script>')

    def table(self, df: pd.DataFrame, numeric_digits: dict[str, int] | None = None, max_rows: int = 400) -> None:
        if df.empty:
            self.note("(nothing recorded)")
            return
        digits = numeric_digits or {}
        head = "".join(f"<th>{esc(c)}</th>" for c in df.columns)
        rows = []
        for _, row in df.head(max_rows).iterrows():
            cells = []
            for c in df.columns:
                v = row[c]
                if isinstance(v, float):
                    d = digits.get(c, 2)
                    # small values (a CPU's TFLOPS) keep two significant digits instead of rounding to 0
                    txt = "" if math.isnan(v) else f"{v:.{d}f}" if v == 0 or abs(v) >= 10**-d else f"{v:.2g}"
                    cells.append(f'<td class="num">{txt}</td>')
                else:
                    cells.append(f"<td>{esc(v)}</td>")
            rows.append("<tr>" + "".join(cells) + "</tr>")
        more = f'<p class="note">{len(df) - max_rows} more rows not shown</p>' if len(df) > max_rows else ""
        # a wide or long table scrolls inside its box instead of stretching the page
        self.parts.append(f'<div class="tbl"><table><thead><tr>{head}</tr></thead><tbody>{"".join(rows)}</tbody>'
                          f"</table></div>{more}")

    def render(self, extra_nav: tuple[tuple[str, str], ...] = ()) -> str:
        """The page; `extra_nav` (href, title) pairs join the navigation (asv's site, where it is inside)."""
        nav = "".join(f'<a href="{f}"{" class=on" if f == self.filename else ""}>{esc(t)}</a>'
                      for f, t in (*PAGES, *extra_nav))
        return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>fp8bench · {esc(self.title)}'
                f'</title><meta name="viewport" content="width=device-width, initial-scale=1">'
                f'<style>{CSS}</style><script src="assets/plotly.min.js"></script></head><body><header>'
                f'<span class="brand">fp8bench</span>{nav}</header><main><h1>{esc(self.title)}</h1>'
                f'{"".join(self.parts)}</main></body></html>')
