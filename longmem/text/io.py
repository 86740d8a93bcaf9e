"""Text in and out: reading a plain-text file safely, and turning a stream of token ids into a stream of text."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable, Iterator

log = logging.getLogger(__name__)

MAX_TEXT_BYTES = 256 * 1024 * 1024  # refuse larger plain-text files outright (the bank issue streams huge ones)


class InputError(ValueError):
    """Input a person gave that cannot be used; the message says why."""


def read_text(path: str | Path) -> str:
    """Read a UTF-8 text file. Empty, binary or oversized files are refused with a clear message; invalid UTF-8
    is decoded with a replacement fallback and a warning."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"{p}: no such file")
    size = p.stat().st_size
    if size == 0:
        raise InputError(f"{p}: the file is empty")
    if size > MAX_TEXT_BYTES:
        raise InputError(f"{p}: {size / 2**20:.0f} MiB is larger than the {MAX_TEXT_BYTES // 2**20} MiB limit")
    data = p.read_bytes()
    if b"\x00" in data[:8192]:
        raise InputError(f"{p}: looks like a binary file, not text")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        log.warning("%s is not valid UTF-8 (%s); undecodable bytes were replaced", p, e.reason)
        text = data.decode("utf-8", errors="replace")
    if not text.strip():
        raise InputError(f"{p}: the file holds only whitespace")
    return text


def stream_text(tokenizer, ids: Iterable[int]) -> Iterator[str]:
    """Yield text pieces as token ids arrive, never splitting a multi-byte character."""
    seen: list[int] = []
    emitted = ""
    for tok in ids:
        seen.append(tok)
        text = tokenizer.decode(seen, skip_special_tokens=True)
        if text.endswith("\ufffd"):  # an incomplete UTF-8 sequence: wait for the next token
            continue
        if len(text) > len(emitted):
            yield text[len(emitted):]
            emitted = text
