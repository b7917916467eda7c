"""Screenshot the overview page of a built site in headless Chromium (for docs/overview.png).

Usage: python scripts/screenshot.py [SITE_DIR] [OUT_PNG]   (defaults: results/site docs/overview.png)
"""

import sys
from pathlib import Path

from fp8bench.report.browser import check_site

site = Path(sys.argv[1] if len(sys.argv) > 1 else "results/site")
out = Path(sys.argv[2] if len(sys.argv) > 2 else "docs/overview.png")
out.parent.mkdir(parents=True, exist_ok=True)
for check in check_site(site, screenshot=out):
    print(f"{check.page}: {check.drawn_plots}/{check.plots} plots drawn, {len(check.errors)} console errors")
print(f"screenshot: {out}")
