"""HTML to text, streamed: markup goes in chunk by chunk, paragraphs come out as they end.

    title = html_paragraphs(chunks_of_bytes, emit=paragraphs.append)
    title, text = html_to_text(markup)                      # the same, for a whole document in memory

The text is what a reader sees: scripts, styles, the head, ``noscript`` and ``template`` are dropped, block elements
(``BLOCK_TAGS``) start paragraphs, ``<br>`` and the line ends of ``<pre>`` break lines, runs of whitespace collapse to
one space. Paragraphs are handed to ``emit`` one by one, separated by nothing (the caller joins them).

Contract: time and memory grow linearly with the markup. This module holds the current paragraph and a title of at
most ``TITLE_CHARS``; lxml's push parser keeps the bytes it was fed until the document ends (about one byte per byte
of markup, freed with the parser), so memory follows the largest single document, never the whole book. The markup
is parsed by lxml's HTML parser driving a target (no tree is built), which never loads a DTD, never resolves an
entity beyond HTML's own (``&amp;``...) and never fetches anything: an external entity stays literal text
(``&xxe;``), an XInclude or a stylesheet link is an element like any other. Every ``<!DOCTYPE>`` declaration,
internal subset included, is cut out before parsing (the HTML parser would end it at the subset's first ``>`` and
keep the rest, ``]>``, as text). ``pending`` is called with the characters held for the paragraph not yet
emitted, so that a caller can refuse a document whose one paragraph is too long while it is still being read.
"""

from __future__ import annotations

import codecs
import re
from typing import Callable, Iterable

from bs4.dammit import EncodingDetector
from lxml import etree

# HTML elements that start a new paragraph; their text is separated from the surrounding text by a blank line
BLOCK_TAGS = frozenset(("p", "div", "section", "article", "aside", "header", "footer", "main", "nav", "blockquote",
                        "pre", "h1", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "dl", "dt", "dd", "table", "tr",
                        "figure", "figcaption", "hr", "address", "details", "summary", "body"))
SKIP_TAGS = frozenset(("script", "style", "head", "noscript", "template"))  # their text is not the document's
PARA, LINE = "\ue000", "\ue001"  # private-use marks the former tree-based extraction used: spaces in the text
HEAD_BYTES = 64 * 1024  # bytes looked at for a byte-order mark or a declared encoding
TITLE_CHARS = 64 * 1024  # characters of <title> kept
CHECK_EVERY = 1 << 16  # characters added to a paragraph between two calls of ``pending``
COMPACT = 4096  # words or lines held separately before they are joined into one string


class _Paragraphs:
    """The lxml parser target: turns start/end/data events into paragraphs."""

    def __init__(self, emit: Callable[[str], None], pending: Callable[[int], None] | None):
        self.emit, self.pending = emit, pending
        self.title: str | None = None
        self._title: list[str] | None = None  # collecting the first <title>
        self._title_len = 0
        self._skip = self._pre = 0  # depth inside skipped elements / <pre>
        self._lines: list[str] = []  # finished lines of the paragraph
        self._words: list[str] = []  # finished words of the line
        self._open: list[str] = []  # pieces of a word that has not ended yet
        self._held = 0  # characters held in the three lists
        self._check_at = CHECK_EVERY

    # -- parser target interface ------------------------------------------------------------------------------
    def start(self, tag, attrib) -> None:
        if tag == "title" and self.title is None and self._title is None:
            self._title = []
        if tag in SKIP_TAGS:
            self._skip += 1
        if self._skip:
            return
        if tag == "pre":
            self._pre += 1
        if tag == "br":
            self._newline()
        elif tag in BLOCK_TAGS:
            self._paragraph()

    def end(self, tag) -> None:
        if tag == "title" and self._title is not None:
            self.title = " ".join("".join(self._title).split())
            self._title = None
        if tag in SKIP_TAGS:
            self._skip = max(0, self._skip - 1)
            return
        if self._skip:
            return
        if tag == "pre":
            self._pre = max(0, self._pre - 1)
        if tag in BLOCK_TAGS:
            self._paragraph()

    def data(self, text: str) -> None:
        if self._title is not None and self._title_len < TITLE_CHARS:
            self._title.append(text[:TITLE_CHARS - self._title_len])
            self._title_len += len(self._title[-1])
        if self._skip:
            return
        if PARA in text or LINE in text:
            text = text.replace(PARA, " ").replace(LINE, " ")
        if self._pre and "\n" in text:
            first, *rest = text.split("\n")
            self._add(first)
            for piece in rest:
                self._newline()
                self._add(piece)
        else:
            self._add(text)

    def close(self) -> None:
        self._paragraph()

    # -- building paragraphs ------------------------------------------------------------------------------------
    def _add(self, text: str) -> None:
        words = text.split()
        if not words:
            if text:
                self._end_word()
            return
        if text[0].isspace():
            self._end_word()
        self._open.append(words[0])
        for w in words[1:]:
            self._end_word()
            self._open.append(w)
        if text[-1].isspace():
            self._end_word()
        self._held += len(text)
        if self.pending is not None and self._held >= self._check_at:
            self.pending(self._held)
            self._check_at = self._held + CHECK_EVERY

    def _end_word(self) -> None:
        if self._open:
            self._words.append(self._open[0] if len(self._open) == 1 else "".join(self._open))
            self._open = []
            if len(self._words) > COMPACT:
                self._words = [" ".join(self._words)]

    def _newline(self) -> None:
        self._end_word()
        self._lines.append(" ".join(self._words))
        self._words = []
        if len(self._lines) > COMPACT:
            self._lines = ["\n".join(self._lines)]

    def _paragraph(self) -> None:
        self._newline()
        text = "\n".join(self._lines).strip()
        self._lines, self._held, self._check_at = [], 0, CHECK_EVERY
        if text:
            self.emit(text)


class _DropDoctype:
    """Cuts every ``<!DOCTYPE ...>`` (with an internal subset ``[...]`` if any) out of a stream of text chunks."""

    START = re.compile(r"<!doctype", re.I)
    SUBSET_END = re.compile(r"\]\s*>")

    def __init__(self):
        self._carry = ""
        self._inside: str | None = None  # None, "decl" (before "[" or ">") or "subset" (inside "[...]")

    def __call__(self, chunk: str, final: bool = False) -> str:
        s, self._carry, out, i = self._carry + chunk, "", [], 0
        while i < len(s):
            if self._inside is None:
                m = self.START.search(s, i)
                if m is None:
                    cut = len(s) if final else _partial_start(s, i)
                    out.append(s[i:cut])
                    self._carry = s[cut:]
                    break
                out.append(s[i:m.start()])
                i, self._inside = m.end(), "decl"
            elif self._inside == "decl":
                gt, br = s.find(">", i), s.find("[", i)
                if br >= 0 and (gt < 0 or br < gt):
                    i, self._inside = br + 1, "subset"
                elif gt >= 0:
                    i, self._inside = gt + 1, None
                else:
                    break
            else:
                m = self.SUBSET_END.search(s, i)
                if m is None:
                    last = s.rfind("]", i)
                    if not final and last >= 0 and not s[last + 1:].strip():
                        self._carry = s[last:]  # "]" and whitespace: the ">" may come in the next chunk
                    break
                i, self._inside = m.end(), None
        return "".join(out)


def _partial_start(s: str, i: int) -> int:
    """Where a possible beginning of "<!doctype" cut off at the end of ``s`` starts (``len(s)`` if none)."""
    k = s.rfind("<", max(i, len(s) - 8))
    return k if k >= 0 and "<!doctype".startswith(s[k:].lower()) else len(s)


def _encoding(head: bytes) -> tuple[str, int]:
    """(text encoding, bytes of byte-order mark) of a document from its first bytes: the byte-order mark, else the
    declared encoding (XML declaration or <meta>), else UTF-8; an encoding Python lacks, or one that is not a text
    encoding (e.g. "zlib"), counts as undeclared."""
    stripped, bom = EncodingDetector.strip_byte_order_mark(head)
    if bom:
        return bom, len(head) - len(stripped)
    declared = EncodingDetector.find_declared_encoding(head, is_html=True)
    if declared:
        try:
            b"".decode(declared)  # LookupError for unknown names and for bytes-to-bytes codecs
            return declared, 0
        except (LookupError, ValueError):
            pass
    return "utf-8", 0


def html_paragraphs(chunks: Iterable[bytes], emit: Callable[[str], None],
                    pending: Callable[[int], None] | None = None, encoding: str | None = None) -> str:
    """Stream an HTML document (bytes, in chunks of any size) through the parser, handing each paragraph to
    ``emit``; returns the document's title ("" if none). ``encoding`` None: found from the document's first bytes.
    Undecodable bytes become U+FFFD."""
    target = _Paragraphs(emit, pending)
    parser = etree.HTMLParser(target=target, recover=True, no_network=True, encoding="utf-8")
    drop = _DropDoctype()
    decoder = None
    head, fed = b"", False

    def feed(text: str) -> None:
        nonlocal fed
        if text:
            parser.feed(text.encode("utf-8", errors="replace"))
            fed = True

    for chunk in chunks:
        if decoder is None:
            head += chunk
            if len(head) < HEAD_BYTES:
                continue
            chunk, decoder = _start_decoding(head, encoding)
        feed(drop(decoder.decode(chunk)))
    if decoder is None:
        head, decoder = _start_decoding(head, encoding)
        feed(drop(decoder.decode(head)))
    feed(drop(decoder.decode(b"", final=True), final=True))
    if fed:
        parser.close()
    else:
        target.close()
    return target.title or ""


def _start_decoding(head: bytes, encoding: str | None):
    encoding, bom = _encoding(head) if encoding is None else (encoding, 0)
    return head[bom:], codecs.getincrementaldecoder(encoding)(errors="replace")


def utf8_without_doctype(markup: bytes) -> bytes:
    """A whole markup file (HTML or XML) re-encoded as UTF-8 (from its byte-order mark or declared encoding) with
    every DOCTYPE cut out, for a parser told to read UTF-8: no internal subset means no entity of the file's own
    to expand or to check, so every entity reference stays literal."""
    body, decoder = _start_decoding(markup, None)
    text = _DropDoctype()(decoder.decode(body, final=True), final=True)
    return text.encode("utf-8", errors="replace")


def html_to_text(markup: bytes | str) -> tuple[str, str]:
    """(title, text) of a whole HTML document: its paragraphs separated by blank lines."""
    paragraphs: list[str] = []
    if isinstance(markup, str):
        title = html_paragraphs([markup.encode("utf-8", errors="replace")], paragraphs.append, encoding="utf-8")
    else:
        title = html_paragraphs([markup], paragraphs.append)
    return title, "\n\n".join(paragraphs)
