"""The `train` workload's text: byte-level tokens of a real corpus that exists offline on every machine.

By default the source files of the running Python's standard library (about 30 MB of real code and prose
comments); any text file or folder can be given instead. The split is deterministic (a hash of each file's
path decides train or validation) and every batch is a pure function of (seed, step), so a resumed run
sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import functools
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path

import torch

from fp8bench.models.shapes import TRAIN_VOCAB

VOCAB = TRAIN_VOCAB
"""Byte-level tokens: no tokenizer to download, the same vocabulary everywhere."""
SUFFIXES = (".py", ".txt", ".md", ".rst")
EVAL_SEED = 0x5EED
"""Validation windows are the same for every seed and recipe: curves are comparable point by point."""


class CorpusError(ValueError):
    """The configured corpus exists but cannot be used (no text files, too small): the case is recorded
    `failed` with this reason (a path that does not exist is refused earlier, by the config check)."""


@dataclass(frozen=True)
class Corpus:
    train: torch.Tensor
    """uint8 tokens of the training files, concatenated."""
    val: torch.Tensor
    files: int


def _files(spec: str) -> tuple[Path, list[Path]]:
    if spec == "stdlib":
        root = Path(sysconfig.get_paths()["stdlib"])
        return root, sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and p.is_file())
    root = Path(spec).expanduser()
    if root.is_file():
        return root.parent, [root]
    if root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        if files:
            return root, files
        raise CorpusError(f"workload.train.corpus={spec!r} holds no {list(SUFFIXES)} files")
    raise CorpusError(f"workload.train.corpus={spec!r} is neither 'stdlib' nor an existing file or folder")


@functools.cache
def load(spec: str, val_percent: int) -> Corpus:
    root, files = _files(spec)
    parts: dict[bool, list[bytes]] = {True: [], False: []}
    for p in files:
        rel = p.relative_to(root).as_posix()
        parts[zlib.crc32(rel.encode()) % 100 < val_percent].append(p.read_bytes())
    if len(files) == 1:  # one file: hold out its tail instead
        data = parts[True][0] if parts[True] else parts[False][0]
        cut = len(data) * (100 - val_percent) // 100
        parts = {False: [data[:cut]], True: [data[cut:]]}
    train, val = (b"\n".join(parts[k]) for k in (False, True))
    if min(len(train), len(val)) < 4096:
        raise CorpusError(f"workload.train.corpus={spec!r} is too small ({len(train)} train / {len(val)} "
                          "validation bytes); give at least a few hundred KB of text")
    as_tensor = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8)  # noqa: E731
    return Corpus(as_tensor(train), as_tensor(val), len(files))


def windows(tokens: torch.Tensor, starts: torch.Tensor, seq: int) -> torch.Tensor:
    """(len(starts), seq+1) int64 token windows (inputs [:, :-1], targets [:, 1:]), on tokens' device."""
    idx = starts.to(tokens.device)[:, None] + torch.arange(seq + 1, device=tokens.device)
    return tokens[idx].long()


def train_starts(corpus: Corpus, seed: int, step: int, batch: int, seq: int) -> torch.Tensor:
    """Window starts of training step `step`: a pure function of (seed, step), drawn on the CPU."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, corpus.train.numel() - seq - 1, (batch,), generator=g)


def val_batches(corpus: Corpus, n: int, batch: int, seq: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(EVAL_SEED)
    return [windows(corpus.val, torch.randint(0, corpus.val.numel() - seq - 1, (batch,), generator=g), seq)
            for _ in range(n)]
