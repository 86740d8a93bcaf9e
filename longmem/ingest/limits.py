"""How far one uploaded file may expand while its text is read, and the error for crossing a limit.

    limits = ExtractLimits(max_chars=10_000_000)           # or ExtractLimits.from_args(args) after add_arguments(p)
    source = open_source("book.epub", limits=limits)      # raises LimitError naming the limit and the file

A file on disk is small next to what it can expand to: a zip member deflates up to ~1000 times, a PDF stream as much,
and a font's character map can turn one byte into a whole sentence. Each limit below is checked while the file is
read, never after; crossing one raises ``LimitError`` (an ``InputError``) whose message names the file, the limit,
its setting and the command-line flag that changes it. The defaults are far above any real book (the reasons sit
beside each default), so only broken or hostile files meet them.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields

from longmem.text.io import InputError

MIB = 2**20


class LimitError(InputError):
    """A file crossed one of the ``ExtractLimits``; ``limit`` is the name of that field."""

    def __init__(self, message: str, limit: str):
        super().__init__(message)
        self.limit = limit


@dataclass(frozen=True)
class ExtractLimits:
    """Limits on what one file may expand to while it is read (see the module docstring)."""
    # characters of text one source may hold (plain text, a document's extracted text, demonstrations): 256 Mi,
    # ~25 times the longest novel cycles (Proust's is ~9.6 M characters), the size the project's whole-file limits
    # already allow (formats.MAX_EXTRACT_BYTES, text.MAX_TEXT_BYTES), and ~64 M tokens, days of ingestion on a CPU
    max_chars: int = 256 * MIB
    # uncompressed bytes of a zip (EPUB): the sum of its members' declared sizes, and again of the bytes actually
    # read; 1 GiB, where a 256 MiB EPUB of images (which do not compress) stays near 256 MiB and text deflates ~4x
    max_unzipped_bytes: int = 1024 * MIB
    # members of a zip: a real EPUB holds tens to a few thousand files (chapters, images, fonts, styles)
    max_zip_members: int = 10_000
    # how many times one zip member over 1 MiB may inflate: book text deflates 3-5x, images and fonts ~1x;
    # deflate itself reaches ~1000x on repeated bytes, which is what a zip bomb is made of
    max_zip_ratio: float = 100.0
    # decompressed bytes of one PDF stream (page contents, object streams, images): pypdf's own output limits are
    # set to this (their default is 75 MB); a book page's content stream is tens of KB
    max_pdf_stream_bytes: int = 64 * MIB
    # seconds one extraction may run in its child process before it is stopped: pypdf reads about a hundred book
    # pages a second and an EPUB of a long book takes seconds (docs/benchmarks.md), so a 10,000-page PDF is done in
    # a few minutes; jobs run one at a time, so this is also the longest a hostile file holds the others up
    max_extract_seconds: float = 300.0
    # address space of the extraction child process (resource.RLIMIT_AS), MiB: the interpreter with its parsers
    # takes tens of MiB, lxml the largest single document, pypdf the whole file (at most formats.MAX_EXTRACT_BYTES,
    # 256 MiB) and one decoded stream (max_pdf_stream_bytes)
    max_extract_memory_mb: int = 2048

    def __post_init__(self):
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise InputError(f"the extraction limit {f.name} must be positive, got {getattr(self, f.name)!r}")

    def describe(self, name: str) -> str:
        """A limit's value with its unit, setting and flag, e.g. "1,024 MiB (max_unzipped_bytes, --max-unzipped-mb)"."""
        value = getattr(self, name)
        if name.endswith("_bytes"):
            shown = f"{value / MIB:,g} MiB"
        elif name.endswith("_mb"):
            shown = f"{value:,} MiB"
        elif name.endswith("_seconds"):
            shown = f"{value:g} s"
        else:
            shown = (f"{value:,}" if isinstance(value, int) else f"{value:g}") + UNITS[name]
        return f"{shown} ({name}, {FLAGS[name]})"

    def error(self, name: str, what: str) -> LimitError:
        """The error for crossing limit ``name``: "<what>, past the limit of <describe(name)>"."""
        return LimitError(f"{what}, past the limit of {self.describe(name)}", name)

    @staticmethod
    def add_arguments(p: argparse.ArgumentParser) -> None:
        """The limits as command-line options (``--max-chars`` ...), defaults from this class."""
        d = ExtractLimits()
        g = p.add_argument_group("limits on what one file may expand to (defaults no real book reaches)")
        g.add_argument("--max-chars", type=int, default=d.max_chars,
                       help=f"characters of text one file may hold (default {d.max_chars:,})")
        g.add_argument("--max-unzipped-mb", type=float, default=d.max_unzipped_bytes / MIB,
                       help="uncompressed MiB of an EPUB, all members together "
                            f"(default {d.max_unzipped_bytes // MIB})")
        g.add_argument("--max-zip-members", type=int, default=d.max_zip_members,
                       help=f"files inside an EPUB (default {d.max_zip_members:,})")
        g.add_argument("--max-zip-ratio", type=float, default=d.max_zip_ratio,
                       help=f"how many times an EPUB member over 1 MiB may inflate (default {d.max_zip_ratio:g})")
        g.add_argument("--max-pdf-stream-mb", type=float, default=d.max_pdf_stream_bytes / MIB,
                       help=f"decompressed MiB of one PDF stream (default {d.max_pdf_stream_bytes // MIB})")
        g.add_argument("--max-extract-seconds", type=float, default=d.max_extract_seconds,
                       help=f"seconds the text extraction of one file may take (default {d.max_extract_seconds:g})")
        g.add_argument("--max-extract-memory-mb", type=int, default=d.max_extract_memory_mb,
                       help=f"memory (address space) of the process extracting one file's text, MiB "
                            f"(default {d.max_extract_memory_mb})")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "ExtractLimits":
        """The limits given by ``add_arguments``'s options."""
        return cls(max_chars=args.max_chars, max_unzipped_bytes=int(args.max_unzipped_mb * MIB),
                   max_zip_members=args.max_zip_members, max_zip_ratio=args.max_zip_ratio,
                   max_pdf_stream_bytes=int(args.max_pdf_stream_mb * MIB),
                   max_extract_seconds=args.max_extract_seconds, max_extract_memory_mb=args.max_extract_memory_mb)


UNITS = {"max_chars": " characters", "max_zip_members": " members", "max_zip_ratio": " times"}
FLAGS = {"max_chars": "--max-chars", "max_unzipped_bytes": "--max-unzipped-mb", "max_zip_members": "--max-zip-members",
         "max_zip_ratio": "--max-zip-ratio", "max_pdf_stream_bytes": "--max-pdf-stream-mb",
         "max_extract_seconds": "--max-extract-seconds", "max_extract_memory_mb": "--max-extract-memory-mb"}
