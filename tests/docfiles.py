"""Documents built byte by byte for the tests: EPUBs (also zip bombs and hostile ones) and PDFs (also stream bombs
and slow ones), written with zipfile and a minimal PDF writer so that every byte is under the test's control; and
the extraction child processes they are read in."""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path

import psutil

CONTAINER = ('<?xml version="1.0"?>\n<container version="1.0" xmlns="urn:oasis:names:tc:opendocument:xmlns:container">'
             '<rootfiles><rootfile full-path="OEBPS/content.opf" media-type="application/oebps-package+xml"/>'
             '</rootfiles></container>')


def chapter(body: str, title: str = "Chapter", doctype: str = "<!DOCTYPE html>") -> str:
    return (f'<?xml version="1.0" encoding="utf-8"?>\n{doctype}\n<html xmlns="http://www.w3.org/1999/xhtml">'
            f"<head><title>{title}</title></head><body>{body}</body></html>")


def package(n_chapters: int, title: str = "A Test Book", prolog: str = "", metadata: str = "") -> str:
    items = "".join(f'<item id="c{i}" href="ch{i}.xhtml" media-type="application/xhtml+xml"/>'
                    for i in range(n_chapters))
    spine = "".join(f'<itemref idref="c{i}"/>' for i in range(n_chapters))
    return (f'<?xml version="1.0" encoding="utf-8"?>\n{prolog}<package xmlns="http://www.idpf.org/2007/opf" '
            f'version="3.0" unique-identifier="id"><metadata xmlns:dc="http://purl.org/dc/elements/1.1/">'
            f'<dc:identifier id="id">test</dc:identifier><dc:title>{title}</dc:title>{metadata}</metadata>'
            f'<manifest><item id="nav" href="nav.xhtml" media-type="application/xhtml+xml" properties="nav"/>'
            f'<item id="ncx" href="toc.ncx" media-type="application/x-dtbncx+xml"/>{items}</manifest>'
            f'<spine toc="ncx"><itemref idref="nav"/>{spine}</spine></package>')


NAV = chapter('<nav epub:type="toc" xmlns:epub="http://www.idpf.org/2007/ops"><ol><li>Contents</li></ol></nav>')
NCX = ('<?xml version="1.0"?><ncx xmlns="http://www.daisy.org/z3986/2005/ncx/" version="2005-1"><head/>'
       '<docTitle><text>A Test Book</text></docTitle><navMap/></ncx>')


def write_epub(path: Path, chapters: list[str], title: str = "A Test Book", opf: str | None = None,
               container: str = CONTAINER, ncx: str = NCX, extra: dict[str, bytes] | None = None) -> Path:
    """An EPUB 3 with ``chapters`` (XHTML documents) in reading order, a navigation document and an NCX."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        z.writestr("META-INF/container.xml", container, compress_type=zipfile.ZIP_DEFLATED)
        z.writestr("OEBPS/content.opf", opf if opf is not None else package(len(chapters), title),
                   compress_type=zipfile.ZIP_DEFLATED)
        z.writestr("OEBPS/nav.xhtml", NAV, compress_type=zipfile.ZIP_DEFLATED)
        z.writestr("OEBPS/toc.ncx", ncx, compress_type=zipfile.ZIP_DEFLATED)
        for i, text in enumerate(chapters):
            z.writestr(f"OEBPS/ch{i}.xhtml", text, compress_type=zipfile.ZIP_DEFLATED)
        for name, data in (extra or {}).items():
            z.writestr(name, data, compress_type=zipfile.ZIP_DEFLATED)
    return path


def bomb_epub(path: Path, inflated: int, paragraph: str = "All work and no play makes Jack a dull boy. ") -> Path:
    """A valid EPUB whose one chapter is ``inflated`` bytes of repeated paragraphs, deflated ~270 times (340 MiB
    become 1.3 MB, the issue's bomb), written 1 MiB at a time."""
    block = ("<p>" + paragraph * 20 + "</p>\n").encode()
    block = block * (2**20 // len(block))
    head, tail = chapter("").split("<body>")
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as z:
        z.writestr("mimetype", "application/epub+zip", compress_type=zipfile.ZIP_STORED)
        z.writestr("META-INF/container.xml", CONTAINER)
        z.writestr("OEBPS/content.opf", package(1, "Bomb"))
        z.writestr("OEBPS/nav.xhtml", NAV)
        z.writestr("OEBPS/toc.ncx", NCX)
        with z.open("OEBPS/ch0.xhtml", "w", force_zip64=True) as f:
            f.write((head + "<body>").encode())
            done = 0
            while done < inflated:
                piece = block[: inflated - done]
                f.write(piece)
                done += len(piece)
            f.write(tail.encode())
    return path


def pdf_bytes(streams: list[bytes], compress: bool = True, title: str | None = None) -> bytes:
    """A PDF with one page per content stream (Helvetica as /F1), FlateDecode-compressed if ``compress``."""
    n = len(streams)
    kids = " ".join(f"{5 + 2 * i} 0 R" for i in range(n))
    info = f"<< /Title ({title}) >>".encode() if title else b"<< >>"
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode(),
            b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>", info]
    for i, s in enumerate(streams):
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
                    f"/Contents {6 + 2 * i} 0 R >>".encode())
        data = zlib.compress(s, 9) if compress else s
        objs.append(b"<< /Length %d%s >>\nstream\n" % (len(data), b" /Filter /FlateDecode" if compress else b"")
                    + data + b"\nendstream")
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, o in enumerate(objs):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % (i + 1) + o + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R /Info 4 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


def text_stream(*lines: str) -> bytes:
    """A content stream that shows ``lines`` of Latin-1 text."""
    shown = b" ".join(b"(%s) Tj 0 -14 Td" % line.encode("latin-1").replace(b"(", b"\\(").replace(b")", b"\\)")
                      for line in lines)
    return b"BT /F1 12 Tf 72 720 Td " + shown + b" ET"


def write_pdf(path: Path, pages: list[list[str]], title: str | None = None) -> Path:
    path.write_bytes(pdf_bytes([text_stream(*lines) for lines in pages], title=title))
    return path


def bomb_pdf(path: Path, inflated: int) -> Path:
    """A one-page PDF whose content stream shows one line, then a comment of ``inflated`` spaces (a few KB deflated)."""
    path.write_bytes(pdf_bytes([text_stream("hello") + b"\n%" + b" " * inflated + b"\n"]))
    return path


def slow_pdf(path: Path, shows: int = 3_000_000, per_page: int = 500_000) -> Path:
    """A small PDF (tens of KB) whose pages draw ``shows`` one-letter strings in all, ``per_page`` on each: pypdf
    needs ~10 us per string, so extracting its text takes ~30 s at the default. A page stays under pypdf 7's parsing
    budget of 2 M tokens per content stream (a show is two), so the file is slow, not refused, by default."""
    pages = [b"BT /F1 12 Tf 72 720 Td " + b"(a) Tj " * min(per_page, shows - i) + b"ET"
             for i in range(0, shows, per_page)]
    path.write_bytes(pdf_bytes(pages))
    return path


def extraction_children(of: psutil.Process | None = None) -> list[psutil.Process]:
    """The extraction children (``longmem.ingest.sandbox``) of a process (default: this one), once they run their own
    program (just after the fork a child's RSS is still that of its whole parent)."""
    out = []
    for c in (of or psutil.Process()).children(recursive=True):
        try:
            if any("child_main" in part for part in c.cmdline()):
                out.append(c)
        except psutil.Error:
            pass
    return out
