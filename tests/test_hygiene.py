"""The software speaks of itself, not of how it was developed: no tracked file outside results/ mentions the
project's numbered or relative rounds of development (a numbered session, the next one, this one's run).
A result, a kernel or a docstring names the commit it came from instead.

What counts (case-insensitive; DEV_ROUND below, with examples in the tests at the end of this file):
- the word session, singular or plural, followed by a number, "#" and a number, "no." or "number" and one;
- the word session placed relative to now by one of the words in _RELATIVE right before it;
- its possessive, singular or plural.
A technical session is not a round of development: a match whose word right before "session" is in
TECHNICAL (HTTP, torch, tmux and the like) is left alone, and so is a bare "session" (`requests.Session()`,
a session object, a session id).

This file passes its own check: its examples are built from pieces. results/ is left out: a result file
records where and when it was measured, in the words of its day.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_RELATIVE = r"this|next|previous|prior|last|earlier|later|past|following|preceding"
DEV_ROUND = re.compile(
    r"\bsessions?(?:\s*#\s*|\s+(?:no\.\s*|number\s+)?)\d+"  # followed by a number
    rf"|\b(?:{_RELATIVE})\s+sessions?\b"  # placed relative to now
    r"|\bsession['\u2019]s\b|\bsessions['\u2019]",  # possessive
    re.IGNORECASE,
)
# The word right before "session" that makes it a technical session rather than a round of development.
TECHNICAL = frozenset(
    "http https requests aiohttp httpx urllib3 web browser cookie login user client server ssh tmux screen "
    "shell terminal torch onnx onnxruntime ort inference tf tensorflow keras jupyter ipython kernel debug gdb "
    "db database sql sqlalchemy duckdb spark playwright chromium selenium tls ssl".split()
)
# Left out of the scan: measured records (see the docstring), and third-party files copied in unchanged.
EXCLUDED_PREFIXES = ("results/", "benchmarks/asv_vendor/js/", "benchmarks/asv_vendor/css/",
                     "benchmarks/asv_vendor/fonts/")
BINARY_SUFFIXES = frozenset(".png .jpg .jpeg .gif .ico .pdf .gz .tgz .zip .parquet .duckdb .woff .woff2 .ttf "
                            ".eot .whl .pt .npy .npz".split())
# Files the check must always reach (it fails if an exclusion or a move ever drops them).
MUST_SCAN = (".ci/run", "README.md", "Makefile", "pyproject.toml")
MUST_SCAN_GLOBS = ("docs/*.md", "scripts/*.py")


def dev_round_mentions(text: str) -> list[tuple[int, str]]:
    """(line number, matched words) for every mention of a round of development in `text`."""
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for m in DEV_ROUND.finditer(line):
            at = line.lower().index("session", m.start())
            before = re.search(r"([A-Za-z][A-Za-z0-9]*)\W*$", line[:at])
            if before and before.group(1).lower() in TECHNICAL:
                continue
            found.append((lineno, m.group(0)))
    return found


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the check reads `git ls-files`")
    res = subprocess.run(["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, text=True, timeout=30)
    if res.returncode != 0:
        pytest.skip(f"git ls-files failed: {res.stderr.strip()}")
    return [p for p in res.stdout.split("\0") if p]


def scanned(paths: list[str]) -> list[str]:
    return [p for p in paths if not p.startswith(EXCLUDED_PREFIXES) and Path(p).suffix.lower() not in BINARY_SUFFIXES]


def read_text(path: Path) -> str | None:
    """The file's text, or None when it is binary (a NUL byte) or missing from the work tree."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None  # tracked but deleted in this work tree, or a submodule
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def test_tracked_files_do_not_mention_rounds_of_development():
    paths = scanned(tracked_files())
    offenders = []
    for rel in paths:
        text = read_text(ROOT / rel)
        if text is None:
            continue
        offenders += [f"{rel}:{lineno}: {words!r}" for lineno, words in dev_round_mentions(text)]
    assert not offenders, ("tracked files mention rounds of development; name the commit or say what was "
                           "measured instead:\n" + "\n".join(offenders))


def test_the_scan_reaches_ci_readme_docs_and_scripts():
    paths = set(scanned(tracked_files()))
    expected = [p for p in MUST_SCAN if (ROOT / p).exists()]
    expected += [p.relative_to(ROOT).as_posix() for g in MUST_SCAN_GLOBS for p in sorted(ROOT.glob(g))]
    assert ".ci/run" in expected and any(p.startswith("docs/") for p in expected)
    missing = [p for p in expected if p not in paths]
    assert not missing, f"left out of the scan (untracked, or excluded by mistake): {missing}"


S = "session"  # the examples are built from pieces so that this file passes its own check


@pytest.mark.parametrize("text", [
    f"measured in {S} 4 call D", f"{S.title()} 11 on the H200", f"{S} #7", f"{S}s 5 and 6",
    f"{S} no. 3", f"as this {S} found", f"left for the next {S}", f"the previous {S} timed it",
    f"since the last {S}", f"in earlier {S}s", f"THIS {S.upper()}", f"this {S}'s results",
    f"the {S}\u2019s commits", f"the {S}s' runs", f"a prior {S}",
])
def test_a_round_of_development_is_found(text):
    assert dev_round_mentions(text), text


@pytest.mark.parametrize("text", [
    f"s = requests.{S.title()}()", f"opens an HTTP {S}", f"the HTTP {S}'s cookies",
    f"ort.Inference{S.title()}(path)", f"a torch {S} object", f"tmux {S} 0", f"{S}_id = 4",
    f"{S}2 = make()", f"a {S} of the report", "possession 4", "obsession's", f"{S}_state", f"{S}.get(url)",
    f"professional {S}s",
])
def test_a_technical_session_is_left_alone(text):
    assert not dev_round_mentions(text), text


def test_a_mention_is_reported_with_its_line():
    text = f"first line\nsecond, from {S} 9\nthird: next {S}\n"
    assert dev_round_mentions(text) == [(2, f"{S} 9"), (3, f"next {S}")]
