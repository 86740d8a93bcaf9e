"""Reading user files into the memory bank: every supported file becomes a `Source`, a deterministic stream of
UTF-8 text addressed by byte offsets and read in blocks, so that an interrupted ingestion can resume at a recorded
offset and see exactly the same blocks again.

    check_source("book.epub")                 # refuse what cannot be read, reading only what that takes
    with open_source("book.epub") as src:     # the text, extracted once; the with block removes its text file
        for block in src.blocks(): ...

Which formats there are, and how each is checked and read, is the format registry's (``formats``). Plain text is
streamed from the file itself (bounded memory, any size up to ``ExtractLimits.max_chars``); so is a file whose
suffix no format claims, when it looks like text. The text of every other format (documents such as HTML, EPUB or
PDF; labelled demonstration files, turned into text with a `DemoFormat` template) is extracted once, by its reader in a
child process held to ``ExtractLimits`` (``sandbox``), into a temporary UTF-8 file that the Source streams and owns.
"""

from __future__ import annotations

import codecs
import logging
import os
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from longmem.ingest import formats
from longmem.ingest.demofiles import DemoFormat, check_template
from longmem.ingest.formats import TEXT, Format
from longmem.ingest.limits import ExtractLimits
from longmem.text.io import InputError
from longmem.util.files import file_sha256

log = logging.getLogger(__name__)

BLOCK_BYTES = 256 * 1024  # target block size of the text stream

BOM = codecs.BOM_UTF8

CONTINUATION = bytes(range(0x80, 0xC0))  # the bytes that continue a UTF-8 character


@dataclass(frozen=True)
class Block:
    text: str  # decoded text of bytes [start, end) of the stream
    start: int  # byte offset in the source's UTF-8 stream
    end: int


@dataclass
class Source:
    """One user file as a stream of UTF-8 text, read from disk block by block: from the file itself for plain text
    (after any BOM), else from the text extracted from it into a temporary file, ``text_path``. The Source owns that
    file: ``close()`` removes it, and so do leaving a ``with`` block and the Source being garbage-collected."""
    path: Path
    name: str  # file name
    title: str  # ``own_title``, else the file stem
    kind: str  # "text" or "demos"
    sha256: str  # hex sha256 of the raw file bytes
    size: int  # length in bytes of the UTF-8 text stream
    meta: dict = field(default_factory=dict)  # extra JSON-serialisable facts (pages, chapters, label counts, ...)
    text_path: Path | None = field(default=None, repr=False)  # the extracted text; None = the stream is ``path``
    skip: int = 0  # bytes at the start of the file that are not part of the stream (a UTF-8 BOM)
    warned: bool = field(default=False, repr=False)  # a "not valid UTF-8" warning was already logged
    # the title the file gives itself (``titles``: HTML <title>, EPUB dc:title, PDF /Title, a Gutenberg header), if any
    own_title: str | None = None

    def __post_init__(self):
        self._remove = weakref.finalize(self, _unlink, self.text_path) if self.text_path is not None else None

    def close(self) -> None:
        """Remove the extracted text file (if any); the Source cannot be read afterwards."""
        if self._remove is not None:
            self._remove()

    def __enter__(self) -> "Source":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def blocks(self, start: int = 0) -> Iterator[Block]:
        """Consecutive blocks from byte offset `start` to the end of the stream. A block is a pure function of its
        start offset and the stream, so resuming at any block's start reproduces the same blocks from there."""
        if not 0 <= start <= self.size:
            raise ValueError(f"{self.path}: start offset {start} is outside the stream [0, {self.size}]")
        return self._blocks(start)

    def _blocks(self, start: int) -> Iterator[Block]:
        block = BLOCK_BYTES  # read at call time so that it can be changed (tests use small blocks)
        with open(self.text_path or self.path, "rb") as f:
            def read(o: int, n: int) -> bytes:
                f.seek(self.skip + o)
                buf = f.read(n)
                if len(buf) != n:
                    raise InputError(f"{self.path}: the file changed while it was being read")
                return buf
            yield from self._cut(read, start, block)

    def _cut(self, read, o: int, block: int) -> Iterator[Block]:
        while o < self.size:
            buf = read(o, min(block + 3, self.size - o))  # the window plus up to 3 bytes to finish a character
            n = block_length(buf, block)
            yield Block(self._decode(buf[:n], o), o, o + n)
            o += n

    def _decode(self, raw: bytes, offset: int) -> str:
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            if not self.warned:
                log.warning("%s is not valid UTF-8 (byte %d of the text); undecodable bytes were replaced with U+FFFD",
                            self.path, offset + e.start)
                self.warned = True
            return raw.decode("utf-8", errors="replace")


def block_length(buf: bytes, block: int) -> int:
    """Length of the block at the start of `buf`, which holds the window of `block` bytes and up to 3 more (fewer
    only at the end of the stream). Cut after the last newline, else after the last space, else between
    characters; never return 0."""
    if len(buf) <= block:  # the window reaches the end of the stream
        return len(buf)
    for sep in (b"\n", b" "):
        i = buf.rfind(sep, 0, block)
        if i >= 0:
            return i + 1
    cut = block
    while cut > 0 and buf[cut] & 0xC0 == 0x80:  # back up out of a multi-byte character
        cut -= 1
    if cut == 0:  # one character longer than the block (tiny blocks, or invalid UTF-8): take it whole
        cut = block
        while cut < len(buf) and buf[cut] & 0xC0 == 0x80:
            cut += 1
    return cut


# -----------------------------------------------------------------------------
# opening a file

def open_source(path: str | Path, demos: DemoFormat | None = None, limits: ExtractLimits | None = None,
                check: Callable[[], None] | None = None) -> Source:
    """Open a user file as a `Source`, its format chosen by its suffix (``formats``). Plain text is streamed from the
    file; the text of any other kind is extracted once, by its reader in a child process held to ``limits``
    (``sandbox``), into a temporary file that the Source owns (use it in a ``with`` block). ``check`` is called every
    ~0.1 s while that runs and stops it by raising (a job's cancel check). Bad input raises `InputError` naming the
    file and the problem; a crossed limit raises `LimitError` (an `InputError`) naming the limit too."""
    from longmem.ingest.titles import clean_title, text_title

    limits = limits or ExtractLimits()
    p, fmt, head, size = _inspect(path, demos)
    if fmt.kind == TEXT:
        skip = _plain_checks(p, head, size, limits)
        try:
            title = text_title(p) if p.suffix.lower() in formats.TEXT_SUFFIXES else None
        except OSError as e:
            raise InputError(f"{p}: cannot read the file: {e.strerror or e}") from e
        return Source(p, p.name, title or p.stem, "text", sha256_file(p), size - skip, {}, skip=skip, own_title=title)
    from longmem.ingest.sandbox import extract_in_child

    got = extract_in_child(p, fmt.kind, (demos or DemoFormat()) if fmt.labelled else None, limits, check)
    try:
        sha = sha256_file(p)
    except BaseException:
        _unlink(got.text_path)
        raise
    title = clean_title(got.title)
    return Source(p, p.name, title or p.stem, "demos" if fmt.labelled else "text", sha, got.size, got.meta,
                  text_path=got.text_path, own_title=title)


def check_source(path: str | Path, demos: DemoFormat | None = None, limits: ExtractLimits | None = None) -> str:
    """Refuse a file that cannot be read, reading only what that takes and extracting nothing: missing, empty,
    unsupported or binary; a plain-text file longer than ``limits.max_chars``; a file larger than its format's
    ``max_bytes`` or without its signature (``Format.signature``; an EPUB is a zip archive); a demonstration
    template without exactly {text} and {label}. What only reading the whole file can show is the job's
    (``open_source``). Returns the kind of reader the file gets: "text" (streamed where it lies) or one of
    ``formats.KINDS`` (extracted)."""
    limits = limits or ExtractLimits()
    p, fmt, head, size = _inspect(path, demos)
    if fmt.kind == TEXT:
        _plain_checks(p, head, size, limits)
    return fmt.kind


def _inspect(path: str | Path, demos: DemoFormat | None) -> tuple[Path, Format, bytes, int]:
    """(path, format, first bytes, size) of a user file after the checks its format asks for (``file_head``'s, its
    size limit, its signature, a demonstration template); a file whose suffix no format claims is plain text
    (``formats.PLAIN``) when it looks like text."""
    p, head, file_size = file_head(path)
    fmt = formats.for_path(p)
    if demos is not None and (fmt is None or not fmt.labelled):
        raise InputError(f"{p}: a demonstration format was given, but only {', '.join(formats.DEMO_SUFFIXES)} "
                         "files hold demonstrations")
    if fmt is None:
        if b"\x00" in head or not _looks_utf8(head):
            raise InputError(f"{p}: unsupported file type '{p.suffix.lower() or p.name}' "
                             f"(supported: {', '.join(formats.SUPPORTED)})")
        return p, formats.PLAIN, head, file_size
    if fmt.kind == TEXT:
        return p, fmt, head, file_size
    check_size(p, fmt, file_size)
    why = fmt.signature(head) if fmt.signature is not None else None
    if why is not None:
        raise InputError(f"{p}: cannot read this {fmt.name.upper()}: {why}")
    if fmt.labelled:
        check_template(p, demos or DemoFormat())
    return p, fmt, head, file_size


def file_head(path: str | Path) -> tuple[Path, bytes, int]:
    """(path, first ``SNIFF_BYTES``, size) of a user file, refusing what every reader refuses: a directory, a
    missing or unreadable file, an empty one."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{p}: is a directory, not a file")
    if not p.is_file():
        raise InputError(f"{p}: no such file")
    try:
        file_size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(formats.SNIFF_BYTES)
    except OSError as e:
        raise InputError(f"{p}: cannot read the file: {e.strerror or e}") from e
    if file_size == 0:
        raise InputError(f"{p}: the file is empty")
    return p, head, file_size


def check_size(p: Path, fmt: Format, file_size: int) -> None:
    """Refuse a file larger than its format's ``max_bytes`` (a reader that holds the file whole)."""
    if fmt.max_bytes is not None and file_size > fmt.max_bytes:
        hint = "" if fmt.labelled else " (convert it to plain text first)"
        raise InputError(f"{p}: {file_size / 2**20:.0f} MiB is larger than the {fmt.max_bytes // 2**20} MiB limit "
                         f"for {p.suffix.lower()} files{hint}")


def refuse_binary(p: Path, head: bytes) -> None:
    """Refuse a file meant as text whose first bytes (``head``) are UTF-16 or binary."""
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise InputError(f"{p}: is UTF-16 encoded; save it as UTF-8 first")
    if b"\x00" in head:
        raise InputError(f"{p}: looks like a binary file, not text")


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes (``util.files.file_sha256``); InputError naming the file when it cannot be read."""
    try:
        return file_sha256(path)
    except OSError as e:
        raise InputError(f"{path}: cannot read the file: {e.strerror or e}") from e


def _unlink(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _looks_utf8(head: bytes) -> bool:
    try:  # an incremental decoder tolerates a character cut off at the end of the sniffed bytes
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
        return True
    except UnicodeDecodeError:
        return False


def _plain_checks(p: Path, head: bytes, file_size: int, limits: ExtractLimits) -> int:
    """Refuse a plain-text file that is UTF-16, binary, empty after its BOM or longer than ``max_chars``
    characters (counted only when its bytes could exceed it); returns the bytes of BOM to skip."""
    refuse_binary(p, head)
    skip = len(BOM) if head.startswith(BOM) else 0
    if file_size == skip:
        raise InputError(f"{p}: the file is empty")
    if file_size - skip > limits.max_chars:  # a character takes one to four bytes: count them
        chars = 0
        try:
            with open(p, "rb") as f:
                f.seek(skip)
                while chunk := f.read(1 << 20):
                    chars += len(chunk.translate(None, CONTINUATION))
                    if chars > limits.max_chars:
                        raise limits.error("max_chars", f"{p}: its text runs on")
        except OSError as e:
            raise InputError(f"{p}: cannot read the file: {e.strerror or e}") from e
    return skip
