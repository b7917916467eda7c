"""Make `asv publish` output render offline: asv's pages load jQuery, flot, bootstrap and friends from CDNs;
copy the vendored copies (benchmarks/asv_vendor) next to the pages and point every page at them. Benchmarks
with no recorded results are left out of the index (asv would request their missing graphs).

Usage: python3 scripts/asv_offline.py [HTML_DIR]   (default: results/site/asv, asv.conf.json's html_dir)
Fails (exit 1) if a page still names an external script or stylesheet afterwards.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENDOR = ROOT / "benchmarks" / "asv_vendor"
CDN = {
    "https://code.jquery.com/jquery-3.3.1.min.js": "js/jquery-3.3.1.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js": "js/jquery.flot.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js": "js/jquery.flot.time.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.selection.min.js": "js/jquery.flot.selection.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.categories.min.js": "js/jquery.flot.categories.js",
    "https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js": "js/jquery.flot.orderBars.js",
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js": "js/stupidtable.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js": "js/md5.min.js",
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js": "js/bootstrap.min.js",
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css": "css/bootstrap.min.css",
}
EXTERNAL_ASSET = re.compile(r'<(?:script|link)[^>]+(?:src|href)="(https?://[^"]+)"')


def drop_benchmarks_without_results(html_dir: Path) -> list[str]:
    """asv lists every benchmark of benchmarks.json, recorded or not, and its summary page then requests a
    graph file that `publish` never wrote (a console error per benchmark). Keep only recorded ones."""
    index_path = html_dir / "index.json"
    index = json.loads(index_path.read_text())
    missing = [b for b in index["benchmarks"] if not (html_dir / "graphs" / "summary" / f"{b}.json").is_file()]
    for b in missing:
        del index["benchmarks"][b]
    index_path.write_text(json.dumps(index))
    return missing


def make_offline(html_dir: Path) -> list[str]:
    """Rewrite the pages; returns the external assets still referenced (none when it worked)."""
    shutil.copytree(VENDOR, html_dir / "vendor", dirs_exist_ok=True, ignore=shutil.ignore_patterns("README.md"))
    left = []
    for page in html_dir.rglob("*.html"):
        depth = len(page.relative_to(html_dir).parts) - 1
        text = page.read_text(encoding="utf-8")
        for url, local in CDN.items():
            text = text.replace(f'"{url}"', f'"{"../" * depth}vendor/{local}"')
        # Subresource-integrity hashes name the CDNs' minified builds; flot's are cdnjs's own minification,
        # which npm does not carry, so the vendored (unminified) files cannot match them. The copies are ours.
        text = re.sub(r'(<(?:script|link)[^>]*vendor/[^>]*?)\s+integrity="[^"]*"', r"\1", text)
        text = re.sub(r'(<(?:script|link)[^>]*vendor/[^>]*?)\s+crossorigin="[^"]*"', r"\1", text)
        page.write_text(text, encoding="utf-8")
        left += [f"{page.name}: {u}" for u in EXTERNAL_ASSET.findall(text)]
    return left


def main() -> int:
    html_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "results" / "site" / "asv"
    if not (html_dir / "index.html").is_file():
        print(f"error: {html_dir} has no index.html; run `asv publish` first", file=sys.stderr)
        return 2
    for name in drop_benchmarks_without_results(html_dir):
        print(f"no results recorded for {name}: left out of the index")
    left = make_offline(html_dir)
    for item in left:
        print(f"still external: {item}", file=sys.stderr)
    print(f"asv site ready offline: {html_dir / 'index.html'}")
    return 1 if left else 0


if __name__ == "__main__":
    raise SystemExit(main())
