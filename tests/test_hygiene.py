"""The software speaks of itself, not of how it was developed: no tracked file outside results/ numbers the
project's rounds of development or places one relative to now. A result, a kernel or a docstring names the
commit it came from instead.

What counts (case-insensitive; `dev_round_pattern`, with WORD, the word for such a round):
- WORD, singular or plural, followed by a number, "#" and a number, "no." or "number" and one;
- WORD placed relative to now by one of the words in _RELATIVE right before it;
- its possessive, singular or plural.
A technical use is not a round of development: a match whose word right before WORD is in TECHNICAL (HTTP,
torch, tmux and the like) is left alone, and so is the bare word (a client object, an id).

The rules are tested on a stand-in word (the examples would otherwise be what they test). results/ is left out:
a result file records where and when it was measured, in the words of its day.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_RELATIVE = r"this|next|previous|prior|last|earlier|later|past|following|preceding"
WORD = "session"


def dev_round_pattern(word: str) -> re.Pattern:
    """`word` followed by a number, placed relative to now, or in the possessive (case-insensitive)."""
    return re.compile(
        rf"\b{word}s?(?:\s*#\s*|\s+(?:no\.\s*|number\s+)?)\d+"  # followed by a number
        rf"|\b(?:{_RELATIVE})\s+{word}s?\b"  # placed relative to now
        rf"|\b{word}['\u2019]s\b|\b{word}s['\u2019]",  # possessive
        re.IGNORECASE,
    )


DEV_ROUND = dev_round_pattern(WORD)
# The word right before WORD that makes it a technical use rather than a round of development.
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


def dev_round_mentions(text: str, word: str = WORD) -> list[tuple[int, str]]:
    """(line number, matched words) for every mention of a round of development in `text`."""
    pattern = DEV_ROUND if word == WORD else dev_round_pattern(word)
    found = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for m in pattern.finditer(line):
            at = line.lower().index(word, m.start())
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


# The rules are tested on a stand-in word, so that the examples say nothing themselves; the scan's pattern is
# the same pattern with its own word.
W = "sprint"


def test_the_scan_uses_the_tested_pattern():
    assert dev_round_pattern(W).pattern.replace(W, WORD) == DEV_ROUND.pattern


@pytest.mark.parametrize("text", [
    f"measured in {W} 4 call D", f"{W.title()} 11 on the H200", f"{W} #7", f"{W}s 5 and 6",
    f"{W} no. 3", f"as this {W} found", f"left for the next {W}", f"the previous {W} timed it",
    f"since the last {W}", f"in earlier {W}s", f"THIS {W.upper()}", f"this {W}'s results",
    f"the {W}\u2019s commits", f"the {W}s' runs", f"a prior {W}",
])
def test_a_round_of_development_is_found(text):
    assert dev_round_mentions(text, W), text


@pytest.mark.parametrize("text", [
    f"s = requests.{W.title()}()", f"opens an HTTP {W}", f"the HTTP {W}'s cookies",
    f"ort.Inference{W.title()}(path)", f"a torch {W} object", f"tmux {W} 0", f"{W}_id = 4",
    f"{W}2 = make()", f"a {W} of the report", f"blue{W} 4", f"blue{W}'s", f"{W}_state", f"{W}.get(url)",
    f"professional {W}s",
])
def test_a_technical_use_is_left_alone(text):
    assert not dev_round_mentions(text, W), text


def test_a_mention_is_reported_with_its_line():
    text = f"first line\nsecond, from {W} 9\nthird: next {W}\n"
    assert dev_round_mentions(text, W) == [(2, f"{W} 9"), (3, f"next {W}")]
