"""Corpora for training and evaluation: the shared books' train/test split and cached tokenization.

Books are listed in the shared data's MANIFEST.md with a ``train`` or ``test`` split; the test books are never
trained on (``training``) and are the held-out set of every evaluation (``longmem.eval``). Tokenizing a 3 MB book
takes seconds, so token ids are cached on disk, keyed by the file's bytes and the tokenizer.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from longmem.text.io import read_text

log = logging.getLogger(__name__)

PIECE_CHARS = 1_000_000  # tokenize long texts in pieces of about this many characters, cut after a newline
_MANIFEST_ROW = re.compile(r"^\|\s*(train|test)\s*\|\s*([^|\s]+)\s*\|")  # "| train | pg61221.txt | ..."


@dataclass
class Document:
    name: str  # e.g. file name, or "recall-17"
    ids: np.ndarray  # (T,) int32 token ids
    answers: np.ndarray | None = None  # (T,) bool: tokens only memory can supply (recall answers); None = none


# -----------------------------------------------------------------------------
# the book split


def book_split(data_dir: Path) -> tuple[list[Path], list[Path]]:
    """(train, test) book files from data_dir/books, using the ``split`` column of data_dir/MANIFEST.md (rows like
    ``| train | pg61221.txt | ...`` and ``| test | pg61262.txt | ...``). Raise FileNotFoundError/ValueError with a
    clear message if the manifest or a listed book is missing. Sorted by file name."""
    data_dir = Path(data_dir)
    manifest = data_dir / "MANIFEST.md"
    if not manifest.is_file():
        raise FileNotFoundError(f"{manifest}: no such file (the data manifest with the train/test book split)")
    split: dict[str, list[Path]] = {"train": [], "test": []}
    seen: dict[str, str] = {}
    for line in manifest.read_text(encoding="utf-8").splitlines():
        m = _MANIFEST_ROW.match(line.strip())
        if m is None:
            continue
        which, name = m.groups()
        if name in seen:
            if seen[name] != which:
                raise ValueError(f"{manifest}: {name} is listed as both {seen[name]} and {which}")
            continue
        seen[name] = which
        path = data_dir / "books" / name
        if not path.is_file():
            raise FileNotFoundError(f"{path}: listed as a {which} book in {manifest} but missing")
        split[which].append(path)
    if not split["train"] or not split["test"]:
        raise ValueError(f"{manifest}: expected rows '| train | <file> |' and '| test | <file> |', found "
                         f"{len(split['train'])} train and {len(split['test'])} test books")
    return sorted(split["train"], key=lambda p: p.name), sorted(split["test"], key=lambda p: p.name)


# -----------------------------------------------------------------------------
# tokenization with an on-disk cache


def _pieces(text: str, size: int = PIECE_CHARS) -> list[str]:
    """Cut text into pieces of about ``size`` characters, each ending after a run of newlines where there is one."""
    pieces, start = [], 0
    while len(text) - start > size:
        cut = text.rfind("\n", start, start + size)
        if cut <= start:  # no newline in reach: cut hard
            cut = start + size
        else:
            cut += 1
            while cut < len(text) and text[cut] == "\n":  # keep a paragraph break in one piece
                cut += 1
        pieces.append(text[start:cut])
        start = cut
    pieces.append(text[start:])
    return pieces


def _tokenize(tokenizer, text: str) -> np.ndarray:
    pieces = _pieces(text, PIECE_CHARS)  # read at call time (tests make it small)
    ids = tokenizer(pieces, add_special_tokens=False)["input_ids"]  # batched: the fast tokenizer runs in parallel
    return np.concatenate([np.asarray(p, dtype=np.int32) for p in ids])  # (T,)


def _cache_key(data: bytes, tokenizer) -> str:
    h = hashlib.sha256(data)
    h.update(b"\0" + str(getattr(tokenizer, "name_or_path", "")).encode())
    h.update(b"\0" + str(len(tokenizer)).encode())
    return h.hexdigest()


def _save_atomic(path: Path, ids: np.ndarray) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.stem[:16], suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, ids)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def tokenize_files(paths: Iterable[Path], tokenizer, cache_dir: Path | None = None) -> list[Document]:
    """Tokenize UTF-8 text files (add_special_tokens=False) into Documents named by file name. With cache_dir, cache
    each as <cache_dir>/<sha256 of (file bytes + tokenizer name_or_path + vocab size)>.npy (int32), written
    atomically (temp file + os.replace), and reuse it. Long files are tokenized in pieces of ~1 MB split at newlines
    (the fast tokenizer is slow and RAM-hungry on one 3 MB string); the ids are concatenated."""
    if cache_dir is not None:
        cache_dir = Path(cache_dir)
        cache_dir.mkdir(parents=True, exist_ok=True)
    docs = []
    for path in map(Path, paths):
        cached = None
        if cache_dir is not None:
            cached = cache_dir / f"{_cache_key(path.read_bytes(), tokenizer)}.npy"
            if cached.is_file():
                try:
                    docs.append(Document(path.name, np.load(cached).astype(np.int32, copy=False)))
                    continue
                except (OSError, ValueError) as e:  # unreadable cache entry: tokenize again
                    log.warning("ignoring unreadable token cache %s (%s)", cached, e)
        ids = _tokenize(tokenizer, read_text(path))
        if cached is not None:
            _save_atomic(cached, ids)
        docs.append(Document(path.name, ids))
    return docs
