"""The software speaks of itself, not of how it was developed.

1. No tracked file outside results/ numbers the project's rounds of development or places one relative to now.
   What counts (case-insensitive; `dev_round_pattern`, with WORD, the word for such a round):
   - WORD, singular or plural, followed by a number, "#" and a number, "no." or "number" and one;
   - WORD placed relative to now by one of the words in _RELATIVE right before it;
   - its possessive, singular or plural.
   A technical use is not a round of development: a match whose word right before WORD is in TECHNICAL (HTTP,
   torch, tmux and the like) is left alone, and so is the bare word (a client object, an id). The rules are
   tested on a stand-in word (the examples would otherwise be what they test). results/ is left out: a result
   file records where and when it was measured, in the words of its day.
2. Docstrings and comments of fp8bench/ and kernels/ name no commit: a 7-40 character hexadecimal token that
   `git rev-parse --verify <token>^{commit}` resolves here (`commit_candidates`, resolved in one batch). Code
   says why in timeless words; the commit, the run and the figure that showed it live in docs/ and git.
3. No docstring or comment of fp8bench/ and kernels/, no page of docs/ and no README points at a repository
   path that does not exist (`path_references`): a path under one of the repository's top-level folders
   (`docs/foo.md`, `scripts/x.py`, `conf/...yaml`, `results/<set>/...`), a Markdown link's target, or a root
   document in capitals (`DESIGN.md`). A glob must match something; a path git ignores is a local output
   (`results/runs/`, `results/fp8bench.duckdb`); a template (`results/spread/<device>.json`) is left alone;
   a path at a revision (`a8520a5:research/x.py`, what `git show` takes) must exist at that revision.
"""

from __future__ import annotations

import fnmatch
import os
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
    assert not offenders, ("tracked files mention rounds of development; say what was measured instead (docs/ "
                           "pages may name the commit):\n" + "\n".join(offenders))


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


# --------------------------------------------------------------------------- docstrings and comments

CODE_ROOTS = ("fp8bench", "kernels")
"""The code whose docstrings and comments must speak of itself (rules 2 and 3)."""
DOC_FILES = ("README.md", "scripts/README.md")
DOC_GLOBS = ("docs/*.md",)
"""The pages whose references to repository paths must resolve (rule 3), beside the code's docstrings."""


def code_text(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and every string that stands as a statement of its own (module, class,
    function and attribute docstrings) in Python `source`: what a reader takes as prose, not what runs."""
    import ast
    import io
    import tokenize

    lines = source.splitlines()
    out = [(tok.start[0], tok.string) for tok in tokenize.generate_tokens(io.StringIO(source).readline)
           if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            out += [(n, lines[n - 1]) for n in range(node.value.lineno, node.value.end_lineno + 1)]
    return sorted(out)


HEX_TOKEN = re.compile(r"(?<![0-9A-Za-z.])[0-9a-f]{7,40}(?![0-9A-Za-z])")


def commit_candidates(text: str) -> list[str]:
    """The hexadecimal tokens of 7-40 characters in `text` that could name a commit: not plain numbers, and
    standing alone (bounded by anything but a letter or digit, so `cast_2b05fcd.json` counts, `0x7F800000`
    and `deadbeefcafe0` inside a longer word do not), nor the digits after a decimal point (`3.38953e38`)."""
    return [m.group(0) for m in HEX_TOKEN.finditer(text) if not m.group(0).isdigit()]


def resolving_commits(tokens: set[str], repo: Path = ROOT) -> set[str]:
    """The tokens `git rev-parse --verify <token>^{commit}` would resolve in `repo`, asked in one batch (`git
    cat-file --batch-check`); a prefix of several commits names commits too."""
    if not tokens:
        return set()
    order = sorted(tokens)
    res = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch-check"], capture_output=True, text=True,
                         input="".join(f"{t}^{{commit}}\n" for t in order), timeout=60)
    assert res.returncode == 0, res.stderr
    return {t for t, line in zip(order, res.stdout.splitlines(), strict=True) if not line.endswith(" missing")}


FORMER_ROOTS = ("research",)
"""Top-level folders the repository no longer has: a reference into one is a reference to nothing."""
_PATH_CHARS = r"[\w.*/-]*[\w*/]"
_ROOT_DOC = re.compile(r"(?<![\w/.:-])([A-Z][A-Z0-9_]*(?:-[A-Z0-9_]+)*\.md)\b")
_MD_LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s#]+)(?:#[^)\s]*)?\)")
_AT_REVISION = re.compile(r"(?<![\w/.-])([0-9a-f]{7,40}(?:[~^]\d*)*):(" + _PATH_CHARS + ")")


def path_pattern(roots: tuple[str, ...]) -> re.Pattern:
    """A path under one of `roots` (top-level folders): `docs/kernels.md`, `results/h200-checks/`,
    `results/x/gemm_*.json`. It ends at the first character a path of ours never holds (a space, a quote, `<`,
    `#`, `:`, a closing bracket) and never on a full stop or comma."""
    return re.compile(r"(?<![\w/.:-])((?:" + "|".join(map(re.escape, roots)) + r")/(?:" + _PATH_CHARS + ")?)")


def path_references(text: str, roots: tuple[str, ...], markdown_dir: str | None = None) -> list[tuple[str, str]]:
    """(kind, path) of every reference to a repository path in `text`: ("path", p) under `roots`, ("root", p)
    a root document in capitals, ("revision", "rev:path") a path at a revision and, for a Markdown page in
    `markdown_dir` (its folder relative to the root), ("link", p) each relative link's target resolved from
    there. Templates (a path running into `<`, `{` or `$`) and URLs are left out."""
    found = []
    taken = [m.span() for m in _AT_REVISION.finditer(text)]
    found += [("revision", f"{m.group(1)}:{m.group(2)}") for m in _AT_REVISION.finditer(text)]
    for m in path_pattern(roots).finditer(text):
        if any(a <= m.start() < b for a, b in taken) or text[m.end():m.end() + 1] in ("<", "{", "$"):
            continue
        if text[max(0, m.start() - 3):m.start()].endswith(("://", "../", "./")):
            continue  # a URL's path, or a relative path a link resolves below
        found.append(("path", m.group(1)))
    found += [("root", m.group(1)) for m in _ROOT_DOC.finditer(text)]
    if markdown_dir is not None:
        for m in _MD_LINK.finditer(re.sub(r"`[^`]*`", "", text)):  # not in code: `kernel[grid](...)`
            target = m.group(1)
            if re.match(r"[a-z]+:", target) or target.startswith(("<", "{")):
                continue  # https:, mailto:, a template
            found.append(("link", os.path.normpath(os.path.join(markdown_dir, target))))
    return found


def missing_paths(refs: set[tuple[str, str]], tracked: list[str], repo: Path = ROOT) -> set[tuple[str, str]]:
    """The references that point at nothing: a path or link that is neither a tracked file nor a folder of
    one, nor matched by its glob, nor ignored by git (a local output); a root document not at the root; a
    path at a revision that revision lacks (asked in one batch)."""
    files = set(tracked)
    folders = {str(Path(f).parent.as_posix()) for f in tracked}
    folders |= {p for f in folders for p in (Path(f).as_posix(), *(q.as_posix() for q in Path(f).parents))}

    def exists(p: str) -> bool:
        p = p.rstrip("/")
        if "*" in p:
            return any(fnmatch.fnmatch(f, p) or fnmatch.fnmatch(f, p + "/*") for f in files)
        return p in files or p in folders

    candidates = {(k, p) for k, p in refs if k in ("path", "link") and not exists(p)}
    if candidates:  # what git ignores is a local output (runs, databases, the built site), not a repository file
        # each asked as a file and as a folder: `results/site/` in .gitignore ignores `results/site` only so
        asked = sorted({q for _, p in candidates for q in (p.rstrip("/"), p.rstrip("/") + "/")})
        res = subprocess.run(["git", "-C", str(repo), "check-ignore", "--no-index", "--stdin"], capture_output=True,
                             text=True, input="".join(f"{q}\n" for q in asked), timeout=60)
        ignored = {q.rstrip("/") for q in res.stdout.splitlines()}
        candidates = {(k, p) for k, p in candidates if p.rstrip("/") not in ignored}
    missing = candidates | {(k, p) for k, p in refs if k == "root" and p not in files}
    revisions = sorted(p for k, p in refs if k == "revision")
    if revisions:
        res = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch-check"], capture_output=True, text=True,
                             input="".join(f"{r}\n" for r in revisions), timeout=60)
        missing |= {("revision", r) for r, line in zip(revisions, res.stdout.splitlines(), strict=True)
                    if line.endswith(" missing")}
    return missing


# Known offenders in files the lead is rewriting right now ("being rewritten"): each entry is (file, the commit
# or path it names). Remove an entry when its file no longer names it; the test fails on any other.
ALLOWED = {
    ("fp8bench/backends/base.py", "8bbde37"),  # being rewritten
    ("fp8bench/backends/base.py", "abe5136"),  # being rewritten
    ("fp8bench/core/records.py", "e1dc016"),  # being rewritten
    ("fp8bench/core/records.py", "0ef419b"),  # being rewritten
    ("fp8bench/core/records.py", "DESIGN.md"),  # being rewritten
}


def _code_files(tracked: list[str]) -> list[str]:
    return [p for p in tracked if p.endswith(".py") and p.startswith(tuple(f"{r}/" for r in CODE_ROOTS))]


def _doc_files(tracked: list[str]) -> list[str]:
    pages = [p for p in DOC_FILES if p in tracked]
    return pages + sorted(p for p in tracked if any(fnmatch.fnmatch(p, g) for g in DOC_GLOBS))


def _roots(tracked: list[str]) -> tuple[str, ...]:
    return tuple(sorted({p.split("/")[0] for p in tracked if "/" in p} | set(FORMER_ROOTS)))


def test_docstrings_and_comments_name_no_commit():
    tracked = tracked_files()
    where: dict[str, list[str]] = {}
    for rel in _code_files(tracked):
        text = read_text(ROOT / rel)
        if text is None:
            continue
        for lineno, line in code_text(text):
            for token in commit_candidates(line):
                where.setdefault(token, []).append(f"{rel}:{lineno}")
    commits = resolving_commits(set(where))
    offenders = sorted(f"{at}: {token}" for token in commits for at in where[token]
                       if (at.split(":")[0], token) not in ALLOWED)
    assert not offenders, ("docstrings and comments name commits; say why in timeless words and move the "
                           "commit, run and figure to the matching page of docs/:\n" + "\n".join(offenders))


def test_docstrings_comments_and_docs_point_only_at_paths_that_exist():
    tracked = tracked_files()
    roots = _roots(tracked)
    refs: dict[tuple[str, str], list[str]] = {}
    for rel in _code_files(tracked):
        text = read_text(ROOT / rel)
        if text is None:
            continue
        for lineno, line in code_text(text):
            for ref in path_references(line, roots):
                refs.setdefault(ref, []).append(f"{rel}:{lineno}")
    for rel in _doc_files(tracked):
        text = read_text(ROOT / rel)
        if text is None:
            continue
        for lineno, line in enumerate(text.splitlines(), 1):
            for ref in path_references(line, roots, markdown_dir=str(Path(rel).parent)):
                refs.setdefault(ref, []).append(f"{rel}:{lineno}")
    missing = missing_paths(set(refs), tracked)
    offenders = sorted(f"{at}: {path} ({kind})" for kind, path in missing for at in refs[kind, path]
                       if (at.split(":")[0], path) not in ALLOWED)
    assert not offenders, "references to repository paths that do not exist:\n" + "\n".join(offenders)


def test_the_allow_list_holds_only_files_being_rewritten_and_what_they_still_name():
    """An entry is removed once its file no longer names it: the list only shrinks."""
    for rel, named in ALLOWED:
        text = read_text(ROOT / rel)
        assert text is not None and named in text, f"ALLOWED: {rel} no longer names {named}: drop the entry"


# The matchers on planted strings.

@pytest.mark.parametrize("text,tokens", [
    ("measured at 1cd5fc6 on the H200", ["1cd5fc6"]),
    ("(commit e1dc016), and version 2 began with 0ef419b", ["e1dc016", "0ef419b"]),
    ("results/h200-recipe-blockwise/cast_sass_2b05fcd.txt", ["2b05fcd"]),
    ("the full hash a8520a5f3c0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e", ["a8520a5f3c0c1d2e3f4a5b6c7d8e9f0a1b2c3d4e"]),
    ("at 12387a7:", ["12387a7"]),
    ("1234567 steps, 0x7F800000, 3.3895313892515355e38, abc123 and ABCDEF1", []),
    ("deadbeefcafe0x, a hash41 0123456789abcdef0123456789abcdef012345678", []),
])
def test_commit_candidates_are_standalone_hex_tokens(text, tokens):
    assert commit_candidates(text) == tokens


def test_a_planted_commit_is_found_and_a_hex_word_is_not(tmp_path):
    git = shutil.which("git")
    if git is None:
        pytest.skip("no git")
    run = dict(cwd=tmp_path, capture_output=True, check=True)
    subprocess.run([git, "init", "-q"], **run)
    (tmp_path / "f.py").write_text("x = 1\n")
    subprocess.run([git, "add", "f.py"], **run)
    for n in range(50):  # a short hash of digits alone is a number, no candidate: commit until one has a letter
        subprocess.run([git, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m",
                        f"commit {n}"], **run)
        head = subprocess.run([git, "rev-parse", "HEAD"], **run, text=True).stdout.strip()
        if not head[:7].isdigit():
            break
    source = f'"""Why: as {head[:7]} measured."""\n# and {head} in full; a hex word: {"fedcba9" if head[:7] != "fedcba9" else "fedcba8"}\n'
    tokens = {t for _, line in code_text(source) for t in commit_candidates(line)}
    assert resolving_commits(tokens, tmp_path) == {head[:7], head}


def test_code_text_is_comments_and_docstrings_only():
    source = ('"""module 1cd5fc6"""\nX = 1\n"""attribute docs/a.md"""\n\n\ndef f():\n    """function"""\n'
              '    s = "not prose docs/b.md"  # comment docs/c.md\n    return s\n')
    assert [line for _, line in code_text(source)] == [
        '"""module 1cd5fc6"""', '"""attribute docs/a.md"""', '    """function"""', "# comment docs/c.md"]


ROOTS = ("conf", "docs", "fp8bench", "research", "results", "scripts")


@pytest.mark.parametrize("text,refs", [
    ("see docs/kernels.md.", [("path", "docs/kernels.md")]),
    ("`scripts/recipe_bench.py --markdown FILE`", [("path", "scripts/recipe_bench.py")]),
    ("(results/h200-checks/, its logs)", [("path", "results/h200-checks/")]),
    ("results/h200-kernels/gemm_*probe.json", [("path", "results/h200-kernels/gemm_*probe.json")]),
    ("conf/sweep/quick.yaml, fp8bench/core/records.py", [("path", "conf/sweep/quick.yaml"),
                                                         ("path", "fp8bench/core/records.py")]),
    ("one of DESIGN.md's five questions", [("root", "DESIGN.md")]),
    ("`git show a8520a5:research/cast_ncu.py`", [("revision", "a8520a5:research/cast_ncu.py")]),
    ("`4af6f13~1:scripts/gemm_ws_probe.py`", [("revision", "4af6f13~1:scripts/gemm_ws_probe.py")]),
    ("docs/architecture.md#the-report-site and tests/x.py::test", [("path", "docs/architecture.md")]),
])
def test_path_references_are_found(text, refs):
    assert path_references(text, ROOTS) == refs


@pytest.mark.parametrize("text", [
    "results/spread/<device>.json", "results/runs/{run_id}/", "https://github.com/org/repo/blob/main/docs/x.md",
    "fp8bench.core.measure", "workload/ model/ format/", "hydra/launcher=local-gpus", "a/b/c.py", "1/128 of it",
    "mydocs/x.md", "kernels.md (lowercase, prose)", "sub/DESIGN.md",
])
def test_what_is_not_a_repository_path_is_left_alone(text):
    assert path_references(text, ROOTS) == []


def test_markdown_links_resolve_from_their_page():
    text = ("[a](probes.md) [b](../scripts/README.md#tools) [c](https://x.org/a.md) [d](#anchor) [e](../README.md) "
            "`kernel[grid](...)`")
    assert path_references(text, (), markdown_dir="docs") == [
        ("link", "docs/probes.md"), ("link", "scripts/README.md"), ("link", "README.md")]


def test_missing_paths_are_told_apart_from_globs_ignored_outputs_and_folders():
    tracked = ["docs/kernels.md", "results/h200-kernels/gemm_variant_probe.json", "README.md"]
    refs = {("path", "docs/kernels.md"), ("path", "results/h200-kernels/"), ("path", "results/h200-kernels"),
            ("path", "results/site"), ("path", "results/site/index.html"),
            ("path", "results/h200-kernels/gemm_*probe.json"), ("path", "results/runs/"),
            ("path", "results/fp8bench.duckdb"), ("root", "README.md"),
            ("path", "docs/gone.md"), ("path", "results/h200-kernels/power_*.json"), ("path", "research/x.py"),
            ("root", "DESIGN.md"), ("link", "docs/gone.md")}
    assert missing_paths(refs, tracked) == {("path", "docs/gone.md"), ("path", "results/h200-kernels/power_*.json"),
                                            ("path", "research/x.py"), ("root", "DESIGN.md"), ("link", "docs/gone.md")}
