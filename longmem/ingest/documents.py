"""Reading the text out of documents (HTML, EPUB, PDF) into a UTF-8 text file, within ``ExtractLimits``, and the
title each gives itself. These are the format registry's readers (``formats``): the extraction child process runs
them (``sandbox``); they can run in any process, as the tests do.

    with open("/tmp/book.txt", "wb") as f:
        title, meta = read_epub(Path("book.epub"), TextSink(f, Path("book.epub"), limits), limits, None)
    epub_title(Path("book.epub"), limits)          # the raw dc:title, "" if none

The parsers (lxml through ``htmltext``, pypdf) are imported inside the functions that use them: importing this module
(the registry does) loads none of them.

Contract: the text is written part by part (paragraphs, pages, demonstrations) as it is read, so what is held in
memory is one paragraph, one PDF page or one demonstration file's rows, never the whole text. Every limit is checked
while reading: the characters written (``max_chars``), an EPUB's members, declared sizes and ratios before anything
is inflated and the bytes actually inflated as they come (``max_zip_*``, ``max_unzipped_bytes``), a PDF's streams
through pypdf's own configuration (``max_pdf_stream_bytes``, its ``LimitReachedError``). Bad input raises
``InputError`` naming the file; crossing a limit raises ``LimitError`` naming the limit too. Nothing is fetched or
resolved: the EPUB's container and package files are parsed by lxml without DTDs, entities or network, the NCX is
never read, and the chapters go through ``htmltext`` (which keeps entities literal and drops every DOCTYPE).
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import zipfile
from pathlib import Path
from typing import BinaryIO, Iterator
from urllib.parse import unquote

from longmem.ingest.limits import MIB, ExtractLimits, LimitError
from longmem.text.io import InputError

log = logging.getLogger(__name__)

CHUNK = 256 * 1024  # bytes read at a time from a file or a zip member
RATIO_FLOOR = MIB  # zip members up to this size may inflate any number of times (they cannot grow far)
PACKAGE_BYTES = 16 * MIB  # an EPUB's container.xml or package (.opf) file larger than this is not an EPUB's
DOCUMENT_TYPES = ("application/xhtml+xml", "text/html")  # EPUB spine items that hold text
HTML_BYTES = 64 * 1024  # bytes of an HTML file parsed for its <title> (it sits in the <head>)


class TextSink:
    """Writes a document's parts to a binary file as UTF-8, separated by ``separator``, counting characters (parts
    and separators) against ``max_chars`` before each write."""

    def __init__(self, f: BinaryIO, path: Path, limits: ExtractLimits, separator: str = "\n\n"):
        self.f, self.path, self.limits, self.separator = f, path, limits, separator
        self.chars = 0  # characters written
        self.parts = 0  # non-empty parts written

    def part(self, text: str) -> None:
        if not text:
            return
        n = len(text) + (len(self.separator) if self.parts else 0)
        self.pending(n)
        if self.parts:
            self.f.write(self.separator.encode("utf-8"))
        self.f.write(text.encode("utf-8", errors="replace"))  # "replace" only for lone surrogates
        self.chars += n
        self.parts += 1

    def pending(self, n: int) -> None:
        """Refuse the file if ``n`` more characters would cross ``max_chars``."""
        if self.chars + n > self.limits.max_chars:
            raise self.limits.error("max_chars", f"{self.path}: its text runs on")


def file_chunks(path: Path) -> Iterator[bytes]:
    try:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk
    except OSError as e:
        raise InputError(f"{path}: cannot read the file: {e.strerror or e}") from e


# -----------------------------------------------------------------------------
# HTML

def read_html(path: Path, sink: TextSink, limits: ExtractLimits, demos=None) -> tuple[str, dict]:
    """The registry's reader of HTML (see ``formats.Reader``): its paragraphs, its <title>."""
    from longmem.ingest.htmltext import html_paragraphs

    try:
        title = html_paragraphs(file_chunks(path), sink.part, sink.pending)
    except (InputError, MemoryError):
        raise
    except Exception as e:  # a parser failure on malformed input: the file's problem
        raise InputError(f"{path}: cannot read this HTML file: {e}") from e
    if not sink.parts:
        raise InputError(f"{path}: has no text")
    return title, {}


def html_title(path: Path, limits: ExtractLimits) -> str:
    """The raw <title> of an HTML file, parsed from its first ``HTML_BYTES`` ("" if none)."""
    from longmem.ingest.htmltext import html_paragraphs

    with open(path, "rb") as f:
        head = f.read(HTML_BYTES)
    return html_paragraphs([head], lambda paragraph: None)


# -----------------------------------------------------------------------------
# EPUB

class SafeZip:
    """A zip archive whose directory was checked against the limits before anything is inflated (members, their
    declared sizes, each member's ratio), and whose members are read in counted chunks (the bytes inflated, as
    they come, against the same size limit: a directory can lie)."""

    def __init__(self, path: Path, limits: ExtractLimits):
        self.path, self.limits, self.inflated = path, limits, 0
        self.zf = zipfile.ZipFile(path)  # reads the central directory only
        try:
            self._check_directory()
        except BaseException:
            self.zf.close()
            raise

    def _check_directory(self) -> None:
        infos, lim = self.zf.infolist(), self.limits
        if len(infos) > lim.max_zip_members:
            raise lim.error("max_zip_members", f"{self.path}: it holds {len(infos):,} files")
        total = sum(i.file_size for i in infos)
        if total > lim.max_unzipped_bytes:
            raise lim.error("max_unzipped_bytes", f"{self.path}: its files inflate to {total / MIB:,.0f} MiB")
        for i in infos:
            if i.file_size > RATIO_FLOOR and i.file_size > lim.max_zip_ratio * max(i.compress_size, 1):
                raise lim.error("max_zip_ratio", f"{self.path}: {i.filename} inflates "
                                f"{i.file_size / max(i.compress_size, 1):,.0f} times ({i.file_size / MIB:,.0f} MiB "
                                f"from {i.compress_size / 1024:,.0f} KiB)")

    def __enter__(self) -> "SafeZip":
        return self

    def __exit__(self, *exc) -> None:
        self.zf.close()

    def __contains__(self, name: str) -> bool:
        try:
            self.zf.getinfo(name)
            return True
        except KeyError:
            return False

    def chunks(self, name: str, most: int | None = None) -> Iterator[bytes]:
        """The bytes of member ``name`` as they inflate (refused past ``most`` bytes, if given)."""
        done = 0
        with self.zf.open(name) as f:
            while chunk := f.read(CHUNK):
                done += len(chunk)
                self.inflated += len(chunk)
                if self.inflated > self.limits.max_unzipped_bytes:
                    raise self.limits.error("max_unzipped_bytes", f"{self.path}: its files inflated to more than "
                                            f"{self.inflated / MIB:,.0f} MiB")
                if most is not None and done > most:
                    raise InputError(f"{self.path}: {name} is over {most // MIB} MiB, too large for an EPUB's "
                                     "container or package file")
                yield chunk

    def read(self, name: str, most: int) -> bytes:
        return b"".join(self.chunks(name, most))


def _xml(data: bytes, what: str):
    """Parse an EPUB's XML file with nothing resolved or fetched: its DOCTYPE cut out (so no internal subset
    either), no DTD loaded, no entity substituted (a reference stays literal), no network; tolerant of errors, as
    readers of EPUBs are."""
    from lxml import etree

    from longmem.ingest.htmltext import utf8_without_doctype

    parser = etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, dtd_validation=False,
                             huge_tree=False, recover=True, encoding="utf-8")
    data = utf8_without_doctype(data)
    root = etree.fromstring(data, parser) if data.strip() else None
    if root is None:
        raise InputError(f"{what} is not XML")
    return root


def _local(el) -> str:
    """An element's tag without its namespace ("" for comments, entities and processing instructions)."""
    return el.tag.rsplit("}", 1)[-1] if isinstance(el.tag, str) else ""


def read_epub(path: Path, sink: TextSink, limits: ExtractLimits, demos=None) -> tuple[str, dict]:
    """The registry's reader of EPUB: its spine's chapters in reading order, its dc:title."""
    from longmem.ingest.htmltext import html_paragraphs

    try:
        with SafeZip(path, limits) as z:
            root, package = epub_package(z)
            title, manifest, spine = package_parts(package)
            chapters = 0
            for idref in spine:  # reading order
                href, media_type, properties = manifest.get(idref, ("", "", ""))
                if media_type not in DOCUMENT_TYPES or "nav" in properties.split():
                    continue  # not text, or the navigation document (it only repeats the chapter titles)
                name = posixpath.normpath(posixpath.join(posixpath.dirname(root), unquote(href.split("#")[0])))
                if name not in z:
                    log.warning("%s: the spine names %s, which the archive lacks", path, name)
                    continue
                before = sink.parts
                html_paragraphs(z.chunks(name), sink.part, sink.pending)
                chapters += sink.parts > before
    except (InputError, MemoryError):
        raise
    except KeyError as e:  # a member the EPUB needs is missing
        raise InputError(f"{path}: cannot read this EPUB: {e.args[0] if e.args else e}") from e
    except Exception as e:  # zipfile, zlib and lxml raise their own errors on a damaged file
        raise InputError(f"{path}: cannot read this EPUB: {e}") from e
    if not chapters:
        raise InputError(f"{path}: has no text")
    return title, {"chapters": chapters}


def epub_title(path: Path, limits: ExtractLimits) -> str:
    """The raw dc:title of an EPUB, read from its container and package files only ("" if none)."""
    with SafeZip(path, limits) as z:
        return package_parts(epub_package(z)[1])[0]


def epub_package(z: SafeZip) -> tuple:
    """(its path in the archive, its parsed XML) of an EPUB's package (.opf) file, the first that
    META-INF/container.xml names; each of the two files is read only up to ``PACKAGE_BYTES``. Raises InputError (or
    KeyError for a missing member) for an archive that has no package file."""
    container = _xml(z.read("META-INF/container.xml", PACKAGE_BYTES), "META-INF/container.xml")
    roots = [posixpath.normpath(unquote(el.get("full-path"))).lstrip("/") for el in container.iter()
             if _local(el) == "rootfile" and el.get("full-path")]
    if not roots:
        raise InputError(f"{z.path}: cannot read this EPUB: META-INF/container.xml names no package file")
    return roots[0], _xml(z.read(roots[0], PACKAGE_BYTES), roots[0])


def package_parts(root) -> tuple[str, dict[str, tuple[str, str, str]], list[str]]:
    """(title, manifest {id: (href, media type, properties)}, spine idrefs) of an EPUB package document."""
    title, manifest, spine = "", {}, []
    for el in root.iter():
        tag = _local(el)
        if tag == "title" and not title:  # dc:title; an entity reference stays literal text
            title = " ".join("".join(el.itertext()).split())
        elif tag == "item" and el.get("id") is not None:
            manifest[el.get("id")] = (el.get("href") or "", (el.get("media-type") or "").strip().lower(),
                                      el.get("properties") or "")
        elif tag == "itemref" and el.get("idref") is not None:
            spine.append(el.get("idref"))
    return title, manifest, spine


# -----------------------------------------------------------------------------
# PDF

def pdf_configuration(limits: ExtractLimits) -> dict:
    """pypdf's own limits (``pypdf.Configuration`` fields) set from ours: every decompressed or declared stream
    length to ``max_pdf_stream_bytes``; no external program is ever run (jbig2dec)."""
    from pypdf import Configuration

    known = {f.name for f in dataclasses.fields(Configuration)}
    streams = ("maximum_declared_stream_length", "array_based_stream_maximum_output_length",
               "jbig2_maximum_output_length", "lzw_maximum_output_length", "run_length_maximum_output_length",
               "zlib_maximum_output_length", "brotli_maximum_output_length", "image_maximum_buffer_size")
    out = {name: limits.max_pdf_stream_bytes for name in streams if name in known}
    out["jbig2dec_binary"] = None
    return out


def read_pdf(path: Path, sink: TextSink, limits: ExtractLimits, demos=None) -> tuple[str, dict]:
    """The registry's reader of PDF: the text layer of each page, the /Title of its metadata."""
    from pypdf import PdfReader, apply_configuration
    from pypdf.errors import LimitReachedError

    pages = 0
    try:
        with apply_configuration(**pdf_configuration(limits)):
            reader = PdfReader(path)
            if reader.is_encrypted and not reader.decrypt(""):
                raise InputError(f"{path}: the PDF is password-protected")
            title = " ".join(str((reader.metadata.title if reader.metadata else None) or "").split())
            for page in reader.pages:
                pages += 1
                sink.part((page.extract_text() or "").strip())
    except LimitReachedError as e:  # pypdf's own limits, decompressed streams among them
        where = f"page {pages}" if pages else "opening it"
        if "tokens" in str(e):  # pypdf 7's parsing budget of one content stream, a limit of its own (not ours)
            raise InputError(f"{path}: {where}: a content stream too long to parse ({e}: a pypdf safety "
                             "limit)") from e
        raise LimitError(f"{path}: {where}: {e} (a pypdf safety limit; each decompressed stream may hold "
                         f"{limits.describe('max_pdf_stream_bytes')})", "max_pdf_stream_bytes") from e
    except (InputError, MemoryError):
        raise
    except Exception as e:  # pypdf raises many kinds of error on a damaged file
        raise InputError(f"{path}: cannot read this PDF: {e}") from e
    if not sink.parts:
        raise InputError(f"{path}: has no text layer (a scanned PDF? run OCR first)")
    return title, {"pages": pages}


def pdf_title(path: Path, limits: ExtractLimits) -> str:
    """The raw /Title of a PDF's document information ("" if none, or if it is password-protected)."""
    from pypdf import PdfReader, apply_configuration

    with apply_configuration(**pdf_configuration(limits)):
        reader = PdfReader(path)
        if reader.is_encrypted and not reader.decrypt(""):
            return ""
        info = reader.metadata
        return str((info.title if info else None) or "")
