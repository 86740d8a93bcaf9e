"""A book's own title, to name its bank and its document by: the EPUB package's ``dc:title``, the PDF's /Title, the
HTML ``<title>``, a Project Gutenberg header (its ``Title:`` line, else a first line "The Project Gutenberg eBook of
X, by Y"), or, in a Gutenberg text whose header was stripped, its title page ("A LOST LADY / by / WILLA CATHER").

    book_title("pg65636.txt")       # "A Lost Lady", or None: the file gives itself no usable title

Files are untrusted, and only what holds the title is read. Plain text: its first ``TEXT_BYTES``, matched line by
line by this module's own patterns, in the calling process. HTML, EPUB and PDF are parsed by libraries (lxml,
zipfile and zlib, pypdf) that no Python check can interrupt, so their title is read as their text is, in a child
process held to the extraction limits (``sandbox.title_in_child``, with a clock of ``sandbox.TITLE_SECONDS``), by
its format's title reader (``formats``, ``documents``): an HTML file's first ``documents.HTML_BYTES``, an EPUB's
container and package files (checked zip directory, each file capped), a PDF's document information dictionary;
the web app's process never parses an untrusted document. A title is cleaned (``clean_title``) and junk is
refused. ``book_title`` never raises for a bad file: it answers None, and the reader that extracts the text refuses
the file later, with its reason.
"""

from __future__ import annotations

import logging
import re
import unicodedata
from pathlib import Path
from typing import Callable

from longmem.ingest import formats
from longmem.ingest.limits import ExtractLimits
from longmem.text.chapters import title_case
from longmem.text.io import InputError

log = logging.getLogger(__name__)

TEXT_BYTES = 16 * 1024  # bytes of a plain-text file looked at for a Gutenberg header (it ends within ~2 KB)
MAX_TITLE_CHARS = 120  # a longer title is cut at a word

GUTENBERG = re.compile(r"project\s+gutenberg", re.IGNORECASE)
START_MARKER = re.compile(r"^\W*\*\*\*\s*START OF", re.IGNORECASE)  # the header ends here, the book begins
TITLE_LINE = re.compile(r"^title:\s*(.*)$", re.IGNORECASE)
FIRST_LINE = re.compile(r"^\W*(?:the\s+)?project\s+gutenberg(?:'s|\u2019s|\s+(?:e-?books?|e-?texts?|etexts?)\s+of)"
                        r"\s+(.+?)[\s*]*$", re.IGNORECASE)
BY_AUTHOR = re.compile(r",\s+by\s+.*$", re.IGNORECASE)  # ", by Y" ending a first line "...eBook of X, by Y"
# what document software writes when nobody gave a title
JUNK = re.compile(r"^(untitled( document| \d+)?|unknown|no title|title|document|book|none|null|layout \d+|"
                  r"microsoft word\b.*|.*\.(docx?|rtf|odt|pdf|indd|qxd|tex|dvi|txt|html?|epub|ps))$", re.IGNORECASE)
TITLE_PAGE_SPAN = 40  # lines after a "*** START OF" marker searched for a title page
TITLE_PAGE_LINES = 4  # a title on a title page is at most this many lines
TITLE_PAGE_GAP = 3  # paragraphs between a title page's title and its "by" line, at most
BY_LINE = re.compile(r"^by(\s+\S.*)?$", re.IGNORECASE)  # "by", "BY E. M. FORSTER"
PAGE_NOTE = re.compile(r"^(transcriber|produced by|note:|italic text|e-text prepared)", re.IGNORECASE)
TRIM = " -\u2013\u2014_|*\""  # stripped from a title's ends ("-- A Book --", "*** A Book ***", '"A Book"')


def book_title(path: str | Path, limits: ExtractLimits | None = None,
               check: Callable[[], None] | None = None) -> str | None:
    """The title that ``path`` gives itself (see the module docstring), cleaned by ``clean_title``; None when it
    has none worth showing or cannot be read. ``check`` is called while a child process looks (a job's cancel
    check): what it raises is raised here; a bad file never raises."""
    p, limits = Path(path), limits or ExtractLimits()
    kind = titled_kind(p)
    try:
        if kind is None or not p.is_file() or p.stat().st_size > formats.MAX_EXTRACT_BYTES:
            return None
        if kind == "text":
            return text_title(p)
        from longmem.ingest.sandbox import title_in_child

        return clean_title(title_in_child(p, kind, limits, check))
    except (InputError, OSError) as e:
        log.info("no title read from %s: %s", p, e)
        return None


def text_title(path: Path) -> str | None:
    """The cleaned title in the Gutenberg header of a plain-text file (``gutenberg_title`` of its first
    ``TEXT_BYTES``, decoded as the readers decode it), or None. Raises OSError when the file cannot be read."""
    with open(path, "rb") as f:
        head = f.read(TEXT_BYTES).decode("utf-8", errors="replace")
    return clean_title(gutenberg_title(head) or title_page(head))


def titled_kind(path: Path) -> str | None:
    """Where a book file's title is looked for, by its format (``formats``): "text" (a Gutenberg header) or one of
    ``formats.TITLED_KINDS`` (read in a child); None for any other file."""
    fmt = formats.for_path(path)
    if fmt is None or fmt.labelled:
        return None
    if fmt.kind == formats.TEXT:
        return "text"
    return fmt.kind if fmt.title is not None else None


def clean_title(raw: str | None) -> str | None:
    """``raw`` as a title: control characters dropped, whitespace collapsed, stray punctuation trimmed from its ends,
    cut at a word to at most ``MAX_TITLE_CHARS``. None for no title: empty, without a letter or digit, or what
    document software writes for a missing one ("Untitled", "Microsoft Word - draft.doc", a file name)."""
    if not raw:
        return None
    text = "".join(" " if c.isspace() else c for c in raw if unicodedata.category(c) != "Cc" or c.isspace())
    title = " ".join(text.split()).strip(TRIM)
    if not any(c.isalnum() for c in title) or JUNK.match(title):
        return None
    if len(title) > MAX_TITLE_CHARS:
        cut = title[:MAX_TITLE_CHARS + 1].rsplit(" ", 1)[0]
        title = (cut if len(cut) <= MAX_TITLE_CHARS else title[:MAX_TITLE_CHARS]).rstrip(TRIM)
    return title or None


def gutenberg_title(head: str) -> str | None:
    """The raw title in a Project Gutenberg header at the start of ``head`` (text): its ``Title:`` line, with the
    indented lines that continue it, else a first line "The Project Gutenberg eBook of X, by Y" (also "...EBook",
    "...Etext", "Project Gutenberg's X, by Y"). Only the header is looked at (up to "*** START OF"), and only in a
    text that names Project Gutenberg there; None otherwise. Any other first line is not a title."""
    lines = head.lstrip("\ufeff").splitlines()
    end = next((i for i, line in enumerate(lines) if START_MARKER.match(line)), len(lines))
    header = lines[:end]
    if not any(GUTENBERG.search(line) for line in header):
        return None
    for i, line in enumerate(header):
        m = TITLE_LINE.match(line.strip())
        if m and m.group(1).strip():
            parts = [m.group(1)]
            for more in header[i + 1:]:
                if not more.strip() or not more[:1].isspace():  # a blank line or the next field ends it
                    break
                parts.append(more)
            return " ".join(" ".join(parts).split())
    first = next((line.strip() for line in header if line.strip()), "")
    m = FIRST_LINE.match(first)
    return BY_AUTHOR.sub("", m.group(1)) if m else None


def title_page(head: str) -> str | None:
    """The raw title on the title page of a Project Gutenberg text that starts at its "*** START OF" line (a header
    stripped, as in the shared data): the first paragraph after the marker (up to ``TITLE_PAGE_LINES`` lines;
    ``[Illustration]`` and notes skipped), taken only when a "by" line (``by``, ``BY E. M. FORSTER``) ends it or
    follows it within the next ``TITLE_PAGE_GAP`` paragraphs ("A LOST LADY / by / WILLA CATHER",
    "SOME DO NOT. . . / A Novel / by"). Set in capitals, it is given in title case ("A Lost Lady"). None when there
    is no such page: no other line is taken for a title."""
    lines = head.lstrip("\ufeff").splitlines()
    start = next((i for i, line in enumerate(lines[:TITLE_PAGE_SPAN]) if START_MARKER.match(line)), None)
    if start is None:
        return None
    paragraphs, block = [], []
    for line in lines[start + 1:start + 1 + TITLE_PAGE_SPAN] + [""]:
        if line.strip():
            block.append(line.strip())
        elif block:
            paragraphs.append(block)
            block = []
    paragraphs = [b for b in paragraphs if not b[0].startswith("[") and not PAGE_NOTE.match(b[0])]
    if not paragraphs:
        return None
    first = paragraphs[0]
    by = next((i for i, line in enumerate(first) if BY_LINE.match(line)), None)
    if by:  # "The Great Gatsby / by / F. Scott Fitzgerald" in one paragraph
        first = first[:by]
    elif not any(BY_LINE.match(line) for b in paragraphs[1:1 + TITLE_PAGE_GAP] for line in b):
        return None
    if len(first) > TITLE_PAGE_LINES:
        return None
    title = " ".join(first)
    return title_case(title)
