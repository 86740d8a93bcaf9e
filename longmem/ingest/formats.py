"""The file formats the readers take, one entry each in ``FORMATS``: the suffixes that choose it, how it is read (its
kind), the check of its first bytes (its signature), the reader that extracts its text, the reader of the title it
gives itself, and the largest file taken. Everything that lists or dispatches on formats derives from this table:
the readers' checks (``readers``), the extraction child (``sandbox``), the titles (``titles``), the command line's
help, the app's upload boxes (through ``service``) and the README's list (a test holds it to the table).

    fmt = for_path(Path("book.epub"))       # the "epub" Format; None for a suffix no format claims
    facts = extract(Path("book.epub"), "epub", Path("/tmp/book.txt"), ExtractLimits())  # {"title", "meta", "chars"}
    listed()                                 # "txt, md, rst, html, epub, pdf, ..."

Adding a format is one entry here, its reader (a function writing the text into a ``documents.TextSink``, see
``Reader``) and their tests. A reader runs in the extraction child (``sandbox``), held to ``ExtractLimits``; it is
imported here, so it imports its parsers (lxml, pypdf) inside its functions. Nothing here imports torch: the child
imports this module without the package's ``__init__``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from longmem.ingest import demofiles, documents, subtitles
from longmem.ingest.documents import TextSink
from longmem.ingest.limits import ExtractLimits

if TYPE_CHECKING:
    from longmem.ingest.demofiles import DemoFormat

# A reader: (the file, the sink its text goes into part by part, the limits, the DemoFormat of a demonstration file or
# None) -> (the raw title the file gives itself, "" if none; JSON-serialisable facts kept with the document). It
# raises InputError naming the file for bad input and LimitError for a crossed limit.
Reader = Callable[[Path, TextSink, ExtractLimits, "DemoFormat | None"], tuple[str, dict]]

SNIFF_BYTES = 8192  # how much of a file is looked at first: its signature, and whether it is text or binary
MAX_EXTRACT_BYTES = 256 * 1024 * 1024  # the largest file a reader that holds it whole takes (``Format.max_bytes``)
TEXT = "text"  # the kind of plain text: streamed from the file where it lies, nothing extracted


@dataclass(frozen=True)
class Format:
    """One file format the readers take (see the module docstring)."""
    name: str  # its short name in lists and help texts ("epub"); messages about its signature say it in capitals
    suffixes: tuple[str, ...]  # the file name endings that choose it: lower case, with the dot
    kind: str  # how it is read: TEXT, or the kind of extraction the child is asked for (formats of one kind share it)
    read: Reader | None = None  # writes its text in the extraction child; None for plain text (kind TEXT)
    # its first SNIFF_BYTES -> None when they may start such a file, else why not ("it is not a zip archive")
    signature: Callable[[bytes], str | None] | None = None
    # (file, limits) -> the raw title the file gives itself, read in the child; None = no title of its own (plain
    # text has the Gutenberg header that ``titles.text_title`` reads where the file lies)
    title: Callable[[Path, ExtractLimits], str] | None = None
    max_bytes: int | None = None  # the largest file taken; None = any, the text bounded as it is read (max_chars)
    labelled: bool = False  # labelled demonstrations (a ``DemoFormat`` applies), not a book's running text


def zip_archive(head: bytes) -> str | None:
    """The signature of a zip archive (EPUB): its local file header."""
    return None if head.startswith(b"PK") else "it is not a zip archive"


def pdf_header(head: bytes) -> str | None:
    """The signature of a PDF: "%PDF-" within its first 1024 bytes, where readers look for it."""
    return None if b"%PDF-" in head[:1024] else "there is no %PDF- header in its first 1024 bytes"


_DEMOS = {"kind": "demos", "read": demofiles.read_demos, "max_bytes": MAX_EXTRACT_BYTES, "labelled": True}

FORMATS = (  # in the order lists show them
    Format("txt", (".txt", ".text"), TEXT),
    Format("md", (".md", ".markdown"), TEXT),
    Format("rst", (".rst",), TEXT),
    Format("html", (".html", ".htm", ".xhtml"), "html", read=documents.read_html, title=documents.html_title,
           max_bytes=MAX_EXTRACT_BYTES),
    Format("epub", (".epub",), "epub", read=documents.read_epub, signature=zip_archive, title=documents.epub_title,
           max_bytes=MAX_EXTRACT_BYTES),
    Format("pdf", (".pdf",), "pdf", read=documents.read_pdf, signature=pdf_header, title=documents.pdf_title,
           max_bytes=MAX_EXTRACT_BYTES),
    Format("srt", (".srt",), "srt", read=subtitles.read_srt, signature=subtitles.signature,
           max_bytes=MAX_EXTRACT_BYTES),
    Format("csv", (".csv",), **_DEMOS),
    Format("tsv", (".tsv",), **_DEMOS),
    Format("jsonl", (".jsonl",), **_DEMOS),
)

PLAIN = FORMATS[0]  # how a file whose suffix no format claims is read, when it looks like text
BY_SUFFIX = {suffix: fmt for fmt in FORMATS for suffix in fmt.suffixes}  # ".htm" -> the "html" Format
BOOK_SUFFIXES = tuple(s for fmt in FORMATS if not fmt.labelled for s in fmt.suffixes)  # read as running text
DEMO_SUFFIXES = tuple(s for fmt in FORMATS if fmt.labelled for s in fmt.suffixes)  # labelled demonstrations
SUPPORTED = BOOK_SUFFIXES + DEMO_SUFFIXES
TEXT_SUFFIXES = tuple(s for fmt in FORMATS if fmt.kind == TEXT for s in fmt.suffixes)
KINDS = tuple(dict.fromkeys(fmt.kind for fmt in FORMATS if fmt.kind != TEXT))  # what the child extracts
TITLED_KINDS = tuple(dict.fromkeys(fmt.kind for fmt in FORMATS if fmt.title is not None))  # titles read in the child


def for_path(path: str | Path) -> Format | None:
    """The format a file's suffix chooses (case aside), None for a suffix no format claims."""
    return BY_SUFFIX.get(Path(path).suffix.lower())


def of_kind(kind: str) -> Format:
    """The first format read as ``kind`` (one of ``KINDS``); ValueError for another."""
    for fmt in FORMATS:
        if fmt.kind == kind and kind != TEXT:
            return fmt
    raise ValueError(f"unknown kind of document {kind!r} (known: {', '.join(KINDS)})")


def listed(labelled: bool = False) -> str:
    """The short names of the book formats (``labelled``: of the demonstration formats) in ``FORMATS``'s order, for
    help texts: "txt, md, rst, html, epub, pdf, ..."."""
    return ", ".join(fmt.name for fmt in FORMATS if fmt.labelled == labelled)


def extract(path: Path, kind: str, out: Path, limits: ExtractLimits, demos: DemoFormat | None = None) -> dict:
    """Write the text of ``path`` (a file of one of ``KINDS``) to ``out`` with its format's reader, within
    ``limits``; returns {"title", "meta", "chars"}. This is what the extraction child runs (``sandbox``); it can run
    in any process, as the tests do."""
    fmt = of_kind(kind)
    with open(out, "wb", buffering=1 << 20) as f:
        sink = TextSink(f, path, limits, (demos or demofiles.DemoFormat()).separator if fmt.labelled else "\n\n")
        title, meta = fmt.read(path, sink, limits, demos)
    return {"title": title, "meta": meta, "chars": sink.chars}


def read_title(path: Path, kind: str, limits: ExtractLimits) -> str:
    """The raw title that a file of ``kind`` (one of ``TITLED_KINDS``) gives itself, "" if none, reading only what
    holds it. Raises for a file that cannot be read. Runs in the extraction child (``sandbox.title_in_child``)."""
    if kind not in TITLED_KINDS:
        raise ValueError(f"no title is read from a document of kind {kind!r} (known: {', '.join(TITLED_KINDS)})")
    return of_kind(kind).title(path, limits)
