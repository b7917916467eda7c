"""What `fp8bench audit` reads in a Markdown page: its generated blocks, its figure markers and the figures its
prose states without one, and how a block differs, cell by cell, from its rebuild.

A figure in hand-written prose names its source with a marker just before it:

    <!-- figure: run=hopper-e case=layer.llama2-7b.b2s4096.e4m3.delayed.te metric=speedup_vs_bf16 -->1.46x (1.44–1.50, v4)

`run`, `case` (a case id, or a label that names one case of the run) and `metric` (a stored measurement) are
required; `scale=` multiplies the stored value before it is compared (`scale=100` for a fraction printed in
percent). The figure is the number right after the marker (a unit may follow it); it must equal the stored
value to the digits it prints; a speedup's interval and measurement version follow it, as
fp8bench.report.audit_speedups reads them. Markers, figures and tables inside code (fenced or inline) are never
read.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field

BLOCK = re.compile(r"<!-- generated: (?P<command>.*?) -->\n(?P<body>.*?)<!-- end generated -->", re.S)
"""A generated block: the command that writes it in its header, its body up to the closing comment."""

NUMBER = r"[+\-−±]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
UNITS = r"(?:TFLOPS|GB/s|TB/s|GiB|GB|ms|µs|us|%)"
FIGURE = re.compile(rf"(?P<number>{NUMBER})(?:\s?(?P<unit>{UNITS})|(?P<times>x|×))?(?![\w/])")
"""A figure as prose prints it: a number, and a unit where it has one."""
UNTAGGED = re.compile(rf"(?<![\w.\-/+−±]){NUMBER}(?:[–-]\d+(?:\.\d+)?)?(?:\s?{UNITS}|[x×])(?![\w/])")
"""A number with a unit (x, ms, TFLOPS, GB/s, %...) in prose: a figure that, without a marker, nothing checks."""
MARKER = re.compile(r"<!-- figure: (?P<spec>[^>]*?) -->")
MARKER_KEYS = {"run", "case", "metric", "scale"}
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+\1")
COMMENT = re.compile(r"<!--.*?-->")
LINK_TARGET = re.compile(r"\]\([^)]*\)|https?://\S+")
SPEEDUP_CELL = re.compile(r"\d+\.\d+x")


@dataclass(frozen=True)
class Block:
    """A generated block of a page."""

    command: str
    body: str
    line: int
    """The line of its header comment (1-based)."""


@dataclass(frozen=True)
class Marker:
    """A figure marker in prose and the figure printed after it."""

    line: int
    spec: dict[str, str]
    figure: str
    """The printed figure ('' when none follows the marker)."""
    after: str = ""
    """The rest of the line after the figure (a speedup's interval is read there)."""
    problem: str = ""
    """What is wrong with the marker itself ('' when it can be looked up)."""


@dataclass(frozen=True)
class Untagged:
    line: int
    figure: str
    context: str


@dataclass
class Page:
    """What the audit reads in one page."""

    name: str
    text: str
    blocks: list[Block] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    untagged: list[Untagged] = field(default_factory=list)


def read_page(name: str, text: str) -> Page:
    """The page's generated blocks, its markers and its untagged prose figures."""
    page = Page(name, text)
    for m in BLOCK.finditer(text):
        page.blocks.append(Block(m.group("command").strip(), m.group("body"), text.count("\n", 0, m.start()) + 1))
    for number, line in _prose_lines(text):
        spans = []
        for m in MARKER.finditer(line):
            marker, end = _marker(number, m, line)
            page.markers.append(marker)
            spans.append((m.start(), end))
        for start, end in spans:  # a marker and its figure are checked: not prose figures
            line = line[:start] + " " * (end - start) + line[end:]
        for m in UNTAGGED.finditer(_blank(line)):
            page.untagged.append(Untagged(number, m.group(0), line.strip()[:160]))
    return page


def _prose_lines(text: str):
    """(line number, line) of the lines outside fenced code and generated blocks, markers kept, the rest of
    each line as written."""
    fenced = generated = False
    for number, line in enumerate(text.split("\n"), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            continue
        if line.startswith("<!-- generated:"):
            generated = True
        if generated:
            generated = "<!-- end generated -->" not in line
            continue
        yield number, INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)


def _blank(line: str) -> str:
    """The line with comments and link targets blanked (their digits are not prose figures)."""
    for pattern in (COMMENT, LINK_TARGET):
        line = pattern.sub(lambda m: " " * len(m.group(0)), line)
    return line


def _marker(line: int, m: re.Match, text: str) -> tuple[Marker, int]:
    """The marker `m` found in `text` (one line), and where its figure ends."""
    spec, problems = {}, []
    for token in m.group("spec").split():
        key, eq, value = token.partition("=")
        if not eq or key not in MARKER_KEYS:
            problems.append(f"{token!r} is not one of {sorted(MARKER_KEYS)} as key=value")
        else:
            spec[key] = value
    missing = sorted({"run", "case", "metric"} - set(spec))
    if missing:
        problems.append(f"it lacks {missing}")
    if "scale" in spec:
        try:
            float(spec["scale"])
        except ValueError:
            problems.append(f"scale={spec['scale']!r} is not a number")
    start = m.end() + len(text[m.end():]) - len(text[m.end():].lstrip())
    f = FIGURE.match(text, start)
    if not f:
        problems.append("no figure follows it")
    return (Marker(line, spec, f.group(0) if f else "", text[f.end():] if f else "", "; ".join(problems)),
            f.end() if f else m.end())


def printed(figure: str) -> tuple[float, int]:
    """(value, decimals) of a printed figure ('1,234.5 ms' -> (1234.5, 1))."""
    number = FIGURE.match(figure).group("number").replace(",", "").replace("−", "-").replace("±", "")
    return float(number), len(number.partition(".")[2])


def matches(value: float, figure: str) -> bool:
    """Does `value` print as `figure` to the digits the figure shows?"""
    got, decimals = printed(figure)
    return abs(value - got) <= 0.5 * 10 ** -decimals * (1 + 1e-9)


# --------------------------------------------------------------------------- comparing a block with its rebuild

@dataclass(frozen=True)
class CellDiff:
    """One cell (or line) of a generated block that its rebuild does not reproduce."""

    row: str
    column: str
    page: str
    rebuilt: str


def cells(line: str) -> list[str] | None:
    """The cells of a table row (None for a line that is not one)."""
    s = line.strip()
    if not (s.startswith("|") and s.endswith("|")) or len(s) < 2:
        return None
    return [c.strip() for c in s[1:-1].split("|")]


def _rows(lines: list[str]) -> list[tuple[list[str] | None, str]]:
    """Per line: (the header cells of its table, how to name the line)."""
    out: list[tuple[list[str] | None, str]] = []
    header: list[str] | None = None
    n = 0
    for i, line in enumerate(lines):
        c = cells(line)
        separator = c is not None and all(set(x) <= set("-:") and x for x in c)
        if c is not None and not separator and i + 1 < len(lines) and re.match(r"^\|[-:|\s]+\|$", lines[i + 1].strip()):
            header, n = c, 0
            out.append((None, "the header row"))
        elif separator:
            out.append((None, "the header separator"))
        elif c is not None and header is not None:
            n += 1
            out.append((header, f"row {n} ({c[0][:60]})" if c[0] else f"row {n}"))
        else:
            header = None
            out.append((None, f"line {i + 1} of the block"))
    return out


def diff(page: str, rebuilt: str) -> list[CellDiff]:
    """The cells of `page` (a block's body) that `rebuilt` does not reproduce, named by row and column."""
    a, b = page.split("\n"), rebuilt.split("\n")
    names_a, names_b = _rows(a), _rows(b)
    out = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            continue
        pairs = min(i2 - i1, j2 - j1)
        for k in range(pairs):
            out += _line_diff(a[i1 + k], b[j1 + k], names_a[i1 + k])
        for i in range(i1 + pairs, i2):
            out.append(CellDiff(names_a[i][1], "(whole row)", a[i], "(no such row)"))
        for j in range(j1 + pairs, j2):
            out.append(CellDiff(names_b[j][1], "(whole row)", "(no such row)", b[j]))
    return out


def _line_diff(line_a: str, line_b: str, name: tuple[list[str] | None, str]) -> list[CellDiff]:
    header, row = name
    ca, cb = cells(line_a), cells(line_b)
    if header is None or ca is None or cb is None or len(ca) != len(cb):
        return [CellDiff(row, "(whole line)", line_a, line_b)]
    return [CellDiff(row, header[k] if k < len(header) else f"cell {k + 1}", x, y)
            for k, (x, y) in enumerate(zip(ca, cb, strict=True)) if x != y]


def table_rows(body: str):
    """(header cells, how to name the row, cells) of each data row of the tables in a block's body."""
    lines = body.split("\n")
    for (header, name), line in zip(_rows(lines), lines, strict=True):
        c = cells(line)
        if header is not None and c is not None:
            yield header, name, c


SPEEDUP_HEADER = re.compile(r"(?:\w[\w-]* )*speedup(?: vs BF16)?|vs BF16")
"""A header that names a speedup over BF16 and nothing else ('speedup', 'measured speedup', 'vs BF16')."""


def is_speedup_column(header: str) -> bool:
    """A column of speedups over BF16: its header names its interval (`(95% interval)`), as every generated
    table heads one ('speedup vs BF16 (95% interval)'), or is SPEEDUP_HEADER."""
    return "(95% interval)" in header or bool(SPEEDUP_HEADER.fullmatch(header))


def table_cells(body: str) -> tuple[int, int]:
    """(data cells, speedup cells: a speedup in a speedup column) of the tables in a block's body."""
    n = speedups = 0
    for (header, _), line in zip(_rows(body.split("\n")), body.split("\n"), strict=True):
        c = cells(line)
        if header is not None and c is not None:
            n += len(c)
            speedups += sum(bool(SPEEDUP_CELL.search(x)) and is_speedup_column(h)
                            for h, x in zip(header, c, strict=False))
    return n, speedups
