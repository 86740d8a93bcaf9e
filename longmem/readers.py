"""Reading user files into the memory bank: every supported file becomes a `Source`, a deterministic stream of
UTF-8 text addressed by byte offsets and read in blocks, so that an interrupted ingestion can resume at a recorded
offset and see exactly the same blocks again.

Plain text is streamed from disk (bounded memory, any size). HTML, EPUB and PDF are parsed in memory and their
text is held as UTF-8 bytes; so are labelled demonstration files (CSV/TSV/JSONL), which are turned into text with
a `DemoFormat` template. pypdf, BeautifulSoup and ebooklib are imported only when a file needs them.
"""

from __future__ import annotations

import codecs
import csv
import hashlib
import io
import json
import logging
import string
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .text import InputError

log = logging.getLogger(__name__)

BLOCK_BYTES = 256 * 1024  # target block size of the text stream
# html/epub/pdf/csv/jsonl files are parsed in memory: refuse larger ones
MAX_EXTRACT_BYTES = 256 * 1024 * 1024

TEXT_EXTS = (".txt", ".text", ".md", ".markdown", ".rst")
HTML_EXTS = (".html", ".htm", ".xhtml")
DEMO_EXTS = (".csv", ".tsv", ".jsonl")
SUPPORTED = TEXT_EXTS + HTML_EXTS + (".epub", ".pdf") + DEMO_EXTS

BOM = codecs.BOM_UTF8
SNIFF_BYTES = 8192  # how much of a file is looked at to tell text from binary

# HTML elements that start a new paragraph; their text is separated from the surrounding text by a blank line
BLOCK_TAGS = ("p", "div", "section", "article", "aside", "header", "footer", "main", "nav", "blockquote", "pre",
              "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "dl", "dt", "dd", "table", "tr", "figure",
              "figcaption", "hr", "address", "details", "summary", "body")
PARA, LINE = "\ue000", "\ue001"  # private-use marks for a paragraph break and a line break while extracting HTML


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
    """One user file as a stream of UTF-8 text. Plain text is read from the file on demand (after any BOM); every
    other kind holds its extracted text in `data`."""
    path: Path
    name: str  # file name
    title: str  # HTML <title>, EPUB dc:title, PDF metadata title, else the file stem
    kind: str  # "text" or "demos"
    sha256: str  # hex sha256 of the raw file bytes
    size: int  # length in bytes of the UTF-8 text stream
    meta: dict = field(default_factory=dict)  # extra JSON-serialisable facts (pages, chapters, label counts, ...)
    data: bytes | None = field(default=None, repr=False)  # the stream held in memory; None = read from the file
    skip: int = 0  # bytes at the start of the file that are not part of the stream (a UTF-8 BOM)
    warned: bool = field(default=False, repr=False)  # a "not valid UTF-8" warning was already logged

    def blocks(self, start: int = 0) -> Iterator[Block]:
        """Consecutive blocks from byte offset `start` to the end of the stream. A block is a pure function of its
        start offset and the stream, so resuming at any block's start reproduces the same blocks from there."""
        if not 0 <= start <= self.size:
            raise ValueError(f"{self.path}: start offset {start} is outside the stream [0, {self.size}]")
        return self._blocks(start)

    def _blocks(self, start: int) -> Iterator[Block]:
        block = BLOCK_BYTES  # read at call time so that it can be changed (tests use small blocks)
        if self.data is not None:
            yield from self._cut(lambda o, n: self.data[o:o + n], start, block)
            return
        with open(self.path, "rb") as f:
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

def open_source(path: str | Path, demos: DemoFormat | None = None) -> Source:
    """Open a user file as a `Source`, choosing the reader by extension. Bad input raises `InputError` naming the
    file and the problem."""
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
        return _plain_source(p, head, file_size)
    if file_size > MAX_EXTRACT_BYTES:
        raise InputError(f"{p}: {file_size / 2**20:.0f} MiB is larger than the {MAX_EXTRACT_BYTES // 2**20} MiB "
                         f"limit for {ext} files (convert it to plain text first)")
    if ext in HTML_EXTS:
        title, text, meta = _read_html(p)
    elif ext == ".epub":
        title, text, meta = _read_epub(p)
    elif ext == ".pdf":
        title, text, meta = _read_pdf(p)
    else:
        return _demo_source(p, demos or DemoFormat())
    data = text.encode("utf-8", errors="replace")  # "replace" only for lone surrogates a parser let through
    return Source(p, p.name, title or p.stem, "text", sha256_file(p), len(data), meta, data=data)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes, read 1 MiB at a time."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    except OSError as e:
        raise InputError(f"{path}: cannot read the file: {e.strerror or e}") from e
    return h.hexdigest()


def _looks_utf8(head: bytes) -> bool:
    try:  # an incremental decoder tolerates a character cut off at the end of the sniffed bytes
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
        return True
    except UnicodeDecodeError:
        return False


def _plain_source(p: Path, head: bytes, file_size: int) -> Source:
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        raise InputError(f"{p}: is UTF-16 encoded; save it as UTF-8 first")
    if b"\x00" in head:
        raise InputError(f"{p}: looks like a binary file, not text")
    skip = len(BOM) if head.startswith(BOM) else 0
    if file_size == skip:
        raise InputError(f"{p}: the file is empty")
    return Source(p, p.name, p.stem, "text", sha256_file(p), file_size - skip, {}, skip=skip)


# -----------------------------------------------------------------------------
# documents: HTML, EPUB, PDF

def html_to_text(markup: bytes | str) -> tuple[str, str]:
    """(title, text) of an HTML document: scripts, styles and the head dropped, paragraphs separated by blank lines,
    runs of spaces collapsed."""
    from bs4 import BeautifulSoup, FeatureNotFound
    from bs4.element import NavigableString, PreformattedString
    try:
        soup = BeautifulSoup(markup, "lxml")  # bytes: BeautifulSoup detects the encoding
    except FeatureNotFound:
        soup = BeautifulSoup(markup, "html.parser")
    def texts(tag) -> list:  # the text pieces under a tag, without comments, doctypes and the like
        return [s for s in tag.descendants if isinstance(s, NavigableString) and not isinstance(s, PreformattedString)]

    title = " ".join(soup.title.get_text().split()) if soup.title else ""
    for tag in soup(["script", "style", "head", "noscript", "template"]):
        tag.decompose()
    for s in texts(soup):  # our marks must not occur in the document itself
        if PARA in s or LINE in s:
            s.replace_with(s.replace(PARA, " ").replace(LINE, " "))
    for pre in soup.find_all("pre"):  # keep the line breaks of preformatted text
        for s in texts(pre):
            s.replace_with(s.replace("\n", LINE))
    for br in soup.find_all("br"):
        br.replace_with(LINE)
    for tag in soup.find_all(list(BLOCK_TAGS)):
        tag.insert_before(PARA)
        tag.insert_after(PARA)
    paragraphs = []
    for para in "".join(texts(soup)).split(PARA):
        lines = [" ".join(line.split()) for line in para.split(LINE)]  # collapses runs of whitespace
        para = "\n".join(lines).strip()
        if para:
            paragraphs.append(para)
    return title, "\n\n".join(paragraphs)


def _read_html(p: Path) -> tuple[str, str, dict]:
    try:
        title, text = html_to_text(p.read_bytes())
    except Exception as e:  # a parser failure on malformed input: report it as the file's problem
        raise InputError(f"{p}: cannot read this HTML file: {e}") from e
    if not text.strip():
        raise InputError(f"{p}: has no text")
    return title, text, {}


def _read_epub(p: Path) -> tuple[str, str, dict]:
    import ebooklib
    from ebooklib import epub
    try:
        book = epub.read_epub(str(p), options={"ignore_ncx": True})
        titles = book.get_metadata("DC", "title")
        title = str(titles[0][0]).strip() if titles else ""
        chapters = []
        for idref, _linear in book.spine:  # reading order
            item = book.get_item_with_id(idref)
            if item is None or item.get_type() != ebooklib.ITEM_DOCUMENT or isinstance(item, epub.EpubNav):
                continue  # the navigation document only repeats the chapter titles
            _, text = html_to_text(item.content)  # the raw file (get_content() re-renders it and can drop text)
            if text:
                chapters.append(text)
    except Exception as e:  # zipfile, lxml and ebooklib all raise their own errors on a damaged file
        raise InputError(f"{p}: cannot read this EPUB: {e}") from e
    if not chapters:
        raise InputError(f"{p}: has no text")
    return title, "\n\n".join(chapters), {"chapters": len(chapters)}


def _read_pdf(p: Path) -> tuple[str, str, dict]:
    from pypdf import PdfReader
    try:
        reader = PdfReader(p)
        locked = reader.is_encrypted and not reader.decrypt("")
        pages = [] if locked else [(page.extract_text() or "").strip() for page in reader.pages]
        title = "" if locked else str((reader.metadata.title if reader.metadata else None) or "").strip()
    except Exception as e:  # pypdf raises many kinds of error on a damaged file
        raise InputError(f"{p}: cannot read this PDF: {e}") from e
    if locked:
        raise InputError(f"{p}: the PDF is password-protected")
    text = "\n\n".join(page for page in pages if page)
    if not text.strip():
        raise InputError(f"{p}: has no text layer (a scanned PDF? run OCR first)")
    return title, text, {"pages": len(pages)}


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


def _demo_source(p: Path, fmt: DemoFormat) -> Source:
    fields = {name for _, name, _, _ in _parse_template(p, fmt.template) if name is not None}
    if fields != {"text", "label"}:
        raise InputError(f"{p}: the template {fmt.template!r} must use exactly the fields {{text}} and {{label}} "
                         f"(it uses: {', '.join(sorted(fields)) or 'none'})")
    raw = p.read_bytes()
    try:
        content = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        log.warning("%s is not valid UTF-8 (%s); undecodable bytes were replaced with U+FFFD", p, e.reason)
        content = raw.decode("utf-8-sig", errors="replace")
    rows = _jsonl_rows(p, content, fmt) if p.suffix.lower() == ".jsonl" else _csv_rows(p, content, fmt)
    pairs, allowed = labelled(p, rows, fmt)
    demos, counts = [], {}
    for text, word in pairs:
        demos.append(fmt.template.format(text=text, label=word))
        counts[word] = counts.get(word, 0) + 1
    data = fmt.separator.join(demos).encode("utf-8", errors="replace")
    meta = {"template": fmt.template, "label_words": fmt.label_words,
            "labels": allowed if allowed is not None else sorted({label for _, _, label in rows}),
            "n_examples": len(rows), "label_counts": counts}
    return Source(p, p.name, p.stem, "demos", sha256_file(p), len(data), meta, data=data)


def _parse_template(p: Path, template: str) -> list:
    try:
        return list(string.Formatter().parse(template))
    except ValueError as e:
        raise InputError(f"{p}: the template {template!r} is not a valid format string: {e}") from e


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
