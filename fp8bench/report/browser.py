"""Load the built site in headless Chromium (Debian's, driven by Playwright): console errors, drawn plots,
links, and any request that is not a local file. Used by the tests and by `scripts/screenshot.py`."""

from __future__ import annotations

import atexit
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


_drivers = threading.local()


def _playwright():
    """This thread's one Playwright, started on first use (the main thread's is stopped at exit). Its sync API
    refuses to start a second one while one runs in the thread: a PageReader held open (the tests' `page_text`
    fixture keeps one for the whole pytest run) made a later check_site or check_asv_site fail with "Sync API
    inside the asyncio loop". A Playwright serves only the thread that started it, hence one per thread; while it runs, that
    thread counts as running an asyncio loop (asyncio.run fails there). Each check launches and closes its
    own browser in it."""
    driver = getattr(_drivers, "driver", None)
    if driver is None:
        from playwright.sync_api import sync_playwright

        driver = _drivers.driver = sync_playwright().start()
        if threading.current_thread() is threading.main_thread():
            atexit.register(driver.stop)
    return driver


@dataclass
class PageCheck:
    page: str
    errors: list[str] = field(default_factory=list)
    plots: int = 0
    drawn_plots: int = 0
    broken_links: list[str] = field(default_factory=list)
    external_requests: list[str] = field(default_factory=list)
    untitled_plots: int = 0
    height: int = 0
    """The page's height in pixels at the 1400-pixel-wide viewport."""
    scroll_width: int = 0
    """The page's width: above the viewport's, something (a table) spills past it."""
    look_alikes: list[tuple[str, list[str]]] = field(default_factory=list)
    """(plot title, series names) for each look (colour, marker, dash, bar pattern) that two or more differently
    named series of one plot share."""
    overlapping_labels: list[tuple[str, list]] = field(default_factory=list)
    """(plot title, overlap) for each tick label or axis title of one subplot whose box intersects another
    subplot's tick label, axis title or plot area."""


TRACE_LOOKS = r"""
Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => ({
  title: (gd.layout.title && gd.layout.title.text) || '',
  traces: (gd._fullData || []).filter(t => t.name).map(t => {
    const mode = t.mode || '', m = t.marker || {}, line = t.line || {};
    const color = String(m.color || line.color || '').toLowerCase();
    const scatter = t.type === 'scatter' || t.type === 'scattergl';
    return {name: t.name, look: JSON.stringify([t.type, color,
      scatter && mode.includes('markers') ? String(m.symbol) : null,
      scatter && mode.includes('lines') ? String(line.dash || 'solid') : null,
      t.type === 'bar' ? String((m.pattern && m.pattern.shape) || '') : null])};
  })}))
"""
"""Every plot's series with how each is drawn: its colour, and the marker, line dash or bar pattern it shows."""

LABEL_OVERLAPS = r"""
Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => {
  const subplots = ((gd._fullLayout || {})._subplots || {}).cartesian || [];
  const boxes = [];
  const add = (ids, el, what) => {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.height > 0)
      boxes.push({ids, what, text: el.textContent, l: r.left, r: r.right, t: r.top, b: r.bottom});
  };
  gd.querySelectorAll('.cartesianlayer > g.subplot').forEach(sp => {
    const id = Array.from(sp.classList).find(c => c !== 'subplot');
    sp.querySelectorAll('.xaxislayer-above text, .yaxislayer-above text').forEach(el => add([id], el, 'tick'));
  });
  gd.querySelectorAll('.draglayer > g').forEach(g => {
    const id = Array.from(g.classList).find(c => /^x\d*y\d*$/.test(c));
    const rect = g.querySelector('rect.nsewdrag');
    if (id && rect) add([id], rect, 'plot area');
  });
  gd.querySelectorAll('.infolayer > g').forEach(g => {
    for (const c of g.classList) {
      const m = c.match(/^g-([xy])(\d*)title$/);
      if (!m) continue;
      const ids = subplots.filter(s => { const p = s.match(/^(x\d*)(y\d*)$/);
                                         return p && p[m[1] === 'x' ? 1 : 2] === m[1] + m[2]; });
      add(ids, g, 'axis title');
    }
  });
  const hits = [];
  for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
    const a = boxes[i], b = boxes[j];
    if (a.ids.some(id => b.ids.includes(id)) || (a.what === 'plot area' && b.what === 'plot area')) continue;
    if (a.l < b.r - 0.5 && b.l < a.r - 0.5 && a.t < b.b - 0.5 && b.t < a.b - 0.5)
      hits.push([a.ids.join(','), a.what, a.text, b.ids.join(','), b.what, b.text]);
  }
  return {title: (gd.layout.title && gd.layout.title.text) || '', hits};
})
"""
"""Per plot, each pair of boxes of different subplots that intersect: tick labels (every axis's, `.xtick`,
`.x2tick`, ...), axis titles (`.g-xtitle`, `.g-x2title`, ...) and plot areas, by getBoundingClientRect."""


def look_alikes(plots: list[dict]) -> list[tuple[str, list[str]]]:
    """From TRACE_LOOKS' answer: each look that differently named series of one plot share."""
    out = []
    for plot in plots:
        names: dict[str, set[str]] = {}
        for t in plot["traces"]:
            names.setdefault(t["look"], set()).add(t["name"])
        out += [(plot["title"], sorted(n)) for n in names.values() if len(n) > 1]
    return out


def check_site(site: Path, screenshot: Path | None = None) -> list[PageCheck]:
    results = []
    browser = _playwright().chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        current: list[PageCheck] = []
        page.on("console", lambda m: current[-1].errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: current[-1].errors.append(str(e)))

        def route(r):  # the network is off: anything but a local file is recorded and refused
            if r.request.url.startswith("file://"):
                r.continue_()
            else:
                current[-1].external_requests.append(r.request.url)
                r.abort()

        page.route("**/*", route)
        for html_file in sorted(site.glob("*.html")):
            current.append(PageCheck(html_file.name))
            page.goto(html_file.resolve().as_uri())
            page.wait_for_load_state("load")
            drawn = page.eval_on_selector_all(
                ".plot", "els => els.map(e => { const s = e.querySelector('svg.main-svg');"
                         " return s !== null && s.childElementCount > 0; })")
            current[-1].plots, current[-1].drawn_plots = len(drawn), sum(drawn)
            current[-1].untitled_plots = page.eval_on_selector_all(
                ".plot", "els => els.filter(e => !(e.layout && e.layout.title && e.layout.title.text)).length")
            current[-1].height = page.evaluate("document.documentElement.scrollHeight")
            current[-1].scroll_width = page.evaluate("document.documentElement.scrollWidth")
            current[-1].look_alikes = look_alikes(page.evaluate(TRACE_LOOKS))
            current[-1].overlapping_labels = [(plot["title"], hit) for plot in page.evaluate(LABEL_OVERLAPS)
                                              for hit in plot["hits"]]
            for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)"):
                url = urlparse(href)
                if url.scheme == "file" and not Path(unquote(url.path)).is_file():
                    current[-1].broken_links.append(href)
                elif url.scheme not in ("file", ""):
                    current[-1].broken_links.append(href)
            results.append(current[-1])
        if screenshot is not None:
            page.goto((site / "index.html").resolve().as_uri())
            page.wait_for_load_state("load")
            page.screenshot(path=str(screenshot), full_page=False)
    finally:
        browser.close()
    return results


def page_text(site: Path, name: str, script: str = "document.body.innerText") -> object:
    """Evaluate `script` in a loaded page (e.g. read its text, or a global a planted script would set)."""
    with PageReader() as read:
        return read(site, name, script)


class PageReader:
    """`page_text` for many reads from one Chromium: each read loads its page in a fresh page of the same
    browser (a launch costs seconds; the tests read a site dozens of times)."""

    def __enter__(self) -> PageReader:
        self._browser = _playwright().chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        return self

    def __call__(self, site: Path, name: str, script: str = "document.body.innerText") -> object:
        page = self._browser.new_page()
        try:
            page.goto((site / name).resolve().as_uri())
            page.wait_for_load_state("load")
            return page.evaluate(script)
        finally:
            page.close()

    def __exit__(self, *exc) -> None:
        self._browser.close()


@dataclass
class AsvCheck:
    errors: list[str] = field(default_factory=list)
    benchmarks: int = 0
    """Benchmarks listed on asv's index page."""
    graph_drawn: bool = False
    """The graph page of one benchmark drew its plot (flot's canvas)."""
    external_requests: list[str] = field(default_factory=list)


def check_asv_site(html_dir: Path, benchmark: str, params: str = "") -> AsvCheck:
    """Open asv's published site from file:// (its pages read JSON next to them, which Chromium allows from
    files only with --allow-file-access-from-files: the offline way to view `asv publish` output), then one
    benchmark's graph page; collect console errors."""
    check = AsvCheck()
    browser = _playwright().chromium.launch(executable_path=chromium_path(),
                                            args=[*CHROMIUM_ARGS, "--allow-file-access-from-files"])
    try:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("console", lambda m: check.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: check.errors.append(str(e)))

        def route(r):
            if r.request.url.startswith("file://"):
                r.continue_()
            else:
                check.external_requests.append(r.request.url)
                r.abort()

        page.route("**/*", route)
        index = (html_dir / "index.html").resolve().as_uri()
        page.goto(index)
        page.wait_for_selector("#summarygrid-display .benchmark-plot", timeout=20_000)
        page.wait_for_timeout(1500)
        check.benchmarks = page.evaluate("document.querySelectorAll('#summarygrid-display .benchmark-plot').length")
        page.goto(f"{index}#{benchmark}{'?' + params if params else ''}")
        try:
            page.wait_for_selector("#main-graph canvas", timeout=20_000)
            check.graph_drawn = True
        except Exception:  # noqa: BLE001 - a missing graph is the finding, reported as graph_drawn=False
            check.graph_drawn = False
        page.wait_for_timeout(1000)
    finally:
        browser.close()
    return check
