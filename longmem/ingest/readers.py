"""Reading user files into the memory bank: every supported file becomes a `Source`, a deterministic stream of
UTF-8 text addressed by byte offsets and read in blocks, so that an interrupted ingestion can resume at a recorded
offset and see exactly the same blocks again.

    check_source("book.epub")                 # refuse what cannot be read, reading only what that takes
    with open_source("book.epub") as src:     # the text, extracted once; the with block removes its text file
        for block in src.blocks(): ...

Plain text is streamed from the file itself (bounded memory, any size up to ``ExtractLimits.max_chars``). The text
of HTML, EPUB, PDF and labelled demonstration files (CSV/TSV/JSONL, turned into text with a `DemoFormat` template)
is extracted once, by a child process held to ``ExtractLimits`` (``sandbox``, ``documents``), into a temporary
UTF-8 file that the Source streams and owns.
"""

from __future__ import annotations

import codecs
import csv
import io
import json
import logging
import os
import string
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from longmem.ingest.limits import ExtractLimits
from longmem.text.io import InputError
from longmem.util.files import file_sha256

log = logging.getLogger(__name__)

BLOCK_BYTES = 256 * 1024  # target block size of the text stream
# html/epub/pdf/csv/jsonl files are parsed in memory: refuse larger ones
MAX_EXTRACT_BYTES = 256 * 1024 * 1024

TEXT_EXTS = (".txt", ".text", ".md", ".markdown", ".rst")
HTML_EXTS = (".html", ".htm", ".xhtml")
DEMO_EXTS = (".csv", ".tsv", ".jsonl")
BOOK_SUFFIXES = TEXT_EXTS + HTML_EXTS + (".epub", ".pdf")  # documents read as running text
SUPPORTED = BOOK_SUFFIXES + DEMO_EXTS

BOM = codecs.BOM_UTF8
SNIFF_BYTES = 8192  # how much of a file is looked at to tell text from binary

CONTINUATION = bytes(range(0x80, 0xC0))  # the bytes that continue a UTF-8 character


@dataclass(frozen=True)
class Block:
    text: str  # decoded text of bytes [start, end) of the stream
    start: int  # byte offset in the source's UTF-8 stream
    end: int


@dataclass
class DemoFormat:
    """How a labelled demonstration file (CSV/TSV/JSONL) becomes text."""
    template: str = "Review: {text} Sentiment: {label}"  # one demonstration; {text} and {label} fields
    # label value in the file -> word written into memory; None = the value itself
    label_words: dict[str, str] | None = None
    labels: list[str] | None = None  # allowed label values; None = the keys of label_words if given, else anything
    text_column: str = "text"  # column (CSV/TSV header name) or JSON key holding the text
    label_column: str = "label"
    # names for a header-less CSV/TSV (e.g. ["label", "text"]); None = the first row is the header
    columns: list[str] | None = None
    separator: str = "\n\n"  # between demonstrations


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
    """Open a user file as a `Source`, choosing the reader by extension. Plain text is streamed from the file; the
    text of any other kind is extracted once, by a child process held to ``limits`` (``sandbox``), into a temporary
    file that the Source owns (use it in a ``with`` block). ``check`` is called every ~0.1 s while that runs and
    stops it by raising (a job's cancel check). Bad input raises `InputError` naming the file and the problem; a
    crossed limit raises `LimitError` (an `InputError`) naming the limit too."""
    from longmem.ingest.titles import clean_title, text_title

    limits = limits or ExtractLimits()
    p, kind, head, size = _inspect(path, demos)
    if kind == "text":
        skip = _plain_checks(p, head, size, limits)
        try:
            title = text_title(p) if p.suffix.lower() in TEXT_EXTS else None
        except OSError as e:
            raise InputError(f"{p}: cannot read the file: {e.strerror or e}") from e
        return Source(p, p.name, title or p.stem, "text", sha256_file(p), size - skip, {}, skip=skip, own_title=title)
    from longmem.ingest.sandbox import extract_in_child

    got = extract_in_child(p, kind, (demos or DemoFormat()) if kind == "demos" else None, limits, check)
    try:
        sha = sha256_file(p)
    except BaseException:
        _unlink(got.text_path)
        raise
    title = clean_title(got.title)
    return Source(p, p.name, title or p.stem, "demos" if kind == "demos" else "text", sha, got.size, got.meta,
                  text_path=got.text_path, own_title=title)


def check_source(path: str | Path, demos: DemoFormat | None = None, limits: ExtractLimits | None = None) -> str:
    """Refuse a file that cannot be read, reading only what that takes and extracting nothing: missing, empty,
    unsupported or binary; a plain-text file longer than ``limits.max_chars``; a document larger than
    ``MAX_EXTRACT_BYTES`` or without its format's signature (EPUB: a zip archive; PDF: "%PDF-"); a demonstration
    template without exactly {text} and {label}. What only reading the whole file can show is the job's
    (``open_source``). Returns the kind of reader the file gets: "text" (streamed where it lies) or one of
    ``documents.KINDS`` (extracted)."""
    limits = limits or ExtractLimits()
    p, kind, head, size = _inspect(path, demos)
    if kind == "text":
        _plain_checks(p, head, size, limits)
    return kind


def _inspect(path: str | Path, demos: DemoFormat | None) -> tuple[Path, str, bytes, int]:
    """(path, kind, first bytes, size) of a user file after the checks every kind shares; kind is "text", "html",
    "epub", "pdf" or "demos"."""
    p = Path(path)
    if p.is_dir():
        raise InputError(f"{p}: is a directory, not a file")
    if not p.is_file():
        raise InputError(f"{p}: no such file")
    ext = p.suffix.lower()
    if demos is not None and ext not in DEMO_EXTS:
        raise InputError(f"{p}: a demonstration format was given, but only {', '.join(DEMO_EXTS)} files hold "
                         "demonstrations")
    try:
        file_size = p.stat().st_size
        with open(p, "rb") as f:
            head = f.read(SNIFF_BYTES)
    except OSError as e:
        raise InputError(f"{p}: cannot read the file: {e.strerror or e}") from e
    if file_size == 0:
        raise InputError(f"{p}: the file is empty")
    if ext not in SUPPORTED and (b"\x00" in head or not _looks_utf8(head)):
        raise InputError(f"{p}: unsupported file type '{ext or p.name}' (supported: {', '.join(SUPPORTED)})")
    if ext in TEXT_EXTS or ext not in SUPPORTED:
        return p, "text", head, file_size
    if file_size > MAX_EXTRACT_BYTES:
        raise InputError(f"{p}: {file_size / 2**20:.0f} MiB is larger than the {MAX_EXTRACT_BYTES // 2**20} MiB "
                         f"limit for {ext} files (convert it to plain text first)")
    if ext in HTML_EXTS:
        return p, "html", head, file_size
    if ext == ".epub":
        if not head.startswith(b"PK"):
            raise InputError(f"{p}: cannot read this EPUB: it is not a zip archive")
        return p, "epub", head, file_size
    if ext == ".pdf":
        if b"%PDF-" not in head[:1024]:
            raise InputError(f"{p}: cannot read this PDF: there is no %PDF- header in its first 1024 bytes")
        return p, "pdf", head, file_size
    _check_template(p, demos or DemoFormat())
    return p, "demos", head, file_size


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
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise InputError(f"{p}: is UTF-16 encoded; save it as UTF-8 first")
    if b"\x00" in head:
        raise InputError(f"{p}: looks like a binary file, not text")
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


# -----------------------------------------------------------------------------
# demonstrations: CSV, TSV, JSONL

def labelled(p: Path, rows: list[tuple[int, str, str]], fmt: DemoFormat) -> tuple[list[tuple[str, str]],
                                                                                   list[str] | None]:
    """Parsed rows (line, text, label value) as (text, label word) pairs, every label checked against the format's
    allowed labels (``InputError`` naming the first bad line); also returns those allowed labels (None = any)."""
    if not rows:
        raise InputError(f"{p}: has no examples")
    allowed = fmt.labels if fmt.labels is not None else (list(fmt.label_words) if fmt.label_words else None)
    if allowed is not None:
        allowed = [str(a) for a in allowed]
        bad = [(line, label) for line, _, label in rows if label not in allowed]
        if bad:
            line, label = bad[0]
            raise InputError(f"{p}: line {line}: label {label!r} is not one of: {', '.join(allowed)} "
                             f"({len(bad)} of {len(rows)} rows have labels outside this set)")
    words = {str(k): v for k, v in (fmt.label_words or {}).items()}
    return [(text, words.get(label, label)) for _, text, label in rows], allowed


def demo_texts(p: Path, fmt: DemoFormat, emit: Callable[[str], None]) -> dict:
    """Parse a demonstration file, hand the text of each demonstration (``fmt.template`` filled in) to ``emit`` in
    file order, and return the facts kept with the document (template, labels, counts)."""
    _check_template(p, fmt)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise InputError(f"{p}: cannot read the file: {e.strerror or e}") from e
    try:
        content = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        log.warning("%s is not valid UTF-8 (%s); undecodable bytes were replaced with U+FFFD", p, e.reason)
        content = raw.decode("utf-8-sig", errors="replace")
    del raw
    rows = demo_rows(p, content, fmt)
    del content
    pairs, allowed = labelled(p, rows, fmt)
    counts: dict[str, int] = {}
    for text, word in pairs:
        emit(fmt.template.format(text=text, label=word))
        counts[word] = counts.get(word, 0) + 1
    return {"template": fmt.template, "label_words": fmt.label_words,
            "labels": allowed if allowed is not None else sorted({label for _, _, label in rows}),
            "n_examples": len(rows), "label_counts": counts}


def _check_template(p: Path, fmt: DemoFormat) -> None:
    fields = {name for _, name, _, _ in _parse_template(p, fmt.template) if name is not None}
    if fields != {"text", "label"}:
        raise InputError(f"{p}: the template {fmt.template!r} must use exactly the fields {{text}} and {{label}} "
                         f"(it uses: {', '.join(sorted(fields)) or 'none'})")


def _parse_template(p: Path, template: str) -> list:
    try:
        return list(string.Formatter().parse(template))
    except ValueError as e:
        raise InputError(f"{p}: the template {template!r} is not a valid format string: {e}") from e


def demo_rows(p: Path, content: str, fmt: DemoFormat, skip_empty: bool = False) -> list[tuple[int, str, str]]:
    """(line, text, label) rows of a demonstration file's ``content``, JSONL or CSV/TSV by ``p``'s suffix: the
    columns ``fmt`` names checked, line numbers kept for messages; empty texts refused unless ``skip_empty``."""
    parse = _jsonl_rows if p.suffix.lower() == ".jsonl" else _csv_rows
    return parse(p, content, fmt, skip_empty)


def _csv_rows(p: Path, content: str, fmt: DemoFormat, skip_empty: bool = False) -> list[tuple[int, str, str]]:
    """(line number, text, label) of every row of a CSV/TSV file (``skip_empty``: leave out rows without text)."""
    reader = csv.reader(io.StringIO(content, newline=""), delimiter="\t" if p.suffix.lower() == ".tsv" else ",")
    header, rows = fmt.columns, []
    if header is not None:
        _check_columns(p, header, fmt)
    try:
        for row in reader:
            if not row:  # a blank line
                continue
            if header is None:
                header = [name.strip() for name in row]
                _check_columns(p, header, fmt)
                continue
            if len(row) != len(header):
                raise InputError(f"{p}: line {reader.line_num}: expected {len(header)} fields, got {len(row)}")
            rows.append(_example(p, reader.line_num, dict(zip(header, row)), fmt, skip_empty))
    except csv.Error as e:
        raise InputError(f"{p}: line {reader.line_num}: malformed CSV: {e}") from e
    return [r for r in rows if r is not None]


def _check_columns(p: Path, header: list[str], fmt: DemoFormat) -> None:
    for col in (fmt.text_column, fmt.label_column):
        if col not in header:
            raise InputError(f"{p}: has no '{col}' column (columns: {', '.join(header)})")


def _jsonl_rows(p: Path, content: str, fmt: DemoFormat, skip_empty: bool = False) -> list[tuple[int, str, str]]:
    """(line number, text, label) of every JSON object of a JSONL file (``skip_empty``: leave out rows without
    text)."""
    rows = []
    for n, line in enumerate(content.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise InputError(f"{p}: line {n}: invalid JSON: {e}") from e
        except RecursionError as e:
            raise InputError(f"{p}: line {n}: the JSON is nested too deeply") from e
        if not isinstance(obj, dict):
            raise InputError(f"{p}: line {n}: expected a JSON object, got {type(obj).__name__}")
        for col in (fmt.text_column, fmt.label_column):
            if col not in obj:
                raise InputError(f"{p}: line {n}: has no '{col}' key (keys: {', '.join(obj)})")
        rows.append(_example(p, n, obj, fmt, skip_empty))
    return [r for r in rows if r is not None]


def _example(p: Path, line: int, record: dict, fmt: DemoFormat, skip_empty: bool = False) -> tuple | None:
    text, label = (v if isinstance(v, str) else ("" if v is None else json.dumps(v))
                   for v in (record[fmt.text_column], record[fmt.label_column]))
    if not text.strip():
        if skip_empty:
            return None
        raise InputError(f"{p}: line {line}: the text is empty")
    if not label.strip():
        raise InputError(f"{p}: line {line}: the label is empty")
    return line, text.strip(), label.strip()
