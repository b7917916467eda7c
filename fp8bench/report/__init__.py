"""The static report site: `build_site(con, out)` writes one HTML page per question plus the shared
`assets/plotly.min.js` (written once; pages refer to it by relative path, so the site works from file://)."""

from __future__ import annotations

import shutil
from pathlib import Path

from fp8bench.report import data, pages

ASV_NAV = (("asv/index.html", "asv suite"),)
"""The navigation entry of asv's own site, where `asv publish` wrote it into the site's asv/ folder."""


def plotly_asset() -> Path:
    import plotly

    return Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


def _recommendation(con):
    """The decision fp8bench advise shows, as the front page's table."""
    import pandas as pd

    from fp8bench.report.recommendation import HEADERS, decide, rows

    table = pd.DataFrame(rows(decide(con)), columns=HEADERS)
    return table.assign(run=table["run"].str.strip("`"))  # markdown's code quotes, not part of the id


def build_site(con, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    (out / "assets").mkdir(exist_ok=True)
    asset = out / "assets" / "plotly.min.js"
    src = plotly_asset()
    if not asset.is_file() or asset.stat().st_size != src.stat().st_size:
        shutil.copyfile(src, asset)
    from fp8bench.analysis.compare import history_steps
    from fp8bench.report.published import for_the_site

    df, runs = for_the_site(con), data.runs(con)  # a speedup only with its interval, as the generated pages
    head = data.latest(df)  # one value per case: its latest run; every run stays in History
    asv = out / "asv" / "index.html"
    falls = data.waterfalls(con)
    roof, roof_quant = data.roofline(con), data.roofline(con, with_quant=True)
    built = [pages.overview(head, runs, falls, _recommendation(con)), pages.gemm_page(head, roof, roof_quant),
             pages.modules_page(head, falls), pages.training_page(head, data.train_curves(con), falls),
             pages.numerics_page(head), pages.history_page(df, asv if asv.is_file() else None, history_steps(con)),
             pages.runs_page(runs, data.batch_jobs(con), data.unfinished_by_jobs(con))]
    written = []
    for page in built:
        path = out / page.filename
        path.write_text(page.render(ASV_NAV if asv.is_file() else ()), encoding="utf-8")
        written.append(path)
    return written
