"""SubRip subtitles (.srt) as running text: what is said, without cue numbers, timings or markup.

    with open("/tmp/film.txt", "wb") as f:
        title, meta = read_srt(Path("film.srt"), TextSink(f, Path("film.srt"), limits), limits, None)

A file is a list of cues, each a number, a timing line ("00:01:02,500 --> 00:01:04,000") and one or more lines of
text. A cue's lines are one utterance wrapped to fit the screen, so they are joined with spaces, and so are the cues
of one stretch of speech; a paragraph ends at a pause of ``PAUSE_S`` or more, and once it holds ``PARAGRAPH_CHARS``
at the next cue that ends a sentence. Tags (``<i>``, ``<font color=...>``) and override codes (``{\\an8}``) are
dropped. The file is read line by line, one paragraph held at a time (a file without cues or line breaks is held
whole: the registry bounds its size by ``max_bytes``, the extraction child its memory); a number alone on a line is a
cue number only when a timing line follows it. This is the format registry's reader and signature check (``formats``).
"""

from __future__ import annotations

import codecs
import re
from pathlib import Path
from typing import TYPE_CHECKING

from longmem.ingest.limits import ExtractLimits
from longmem.text.io import InputError

if TYPE_CHECKING:
    from longmem.ingest.documents import TextSink

# "00:01:02,500 --> 00:01:04,000", also with a dot before the milliseconds and positions after the end time
TIMING = re.compile(r"^\s*(\d+):(\d{1,2}):(\d{1,2})[,.](\d{1,3})\s*-->\s*(\d+):(\d{1,2}):(\d{1,2})[,.](\d{1,3})")
MARKUP = re.compile(r"<[^>\n]*>|\{\\[^}\n]*\}")  # HTML-like tags and SSA override codes
PAUSE_S = 3.0  # a silence at least this long between two cues starts a new paragraph
PARAGRAPH_CHARS = 1500  # a paragraph this long ends at the next cue that ends a sentence...
MAX_PARAGRAPH_CHARS = 6000  # ...and at the next cue at all once it is this long
SENTENCE_END = (".", "!", "?", "\u2026", '."', '!"', '?"', ".\u201d", "!\u201d", "?\u201d")


def signature(head: bytes) -> str | None:
    """None when ``head`` (a file's first bytes) may start a SubRip file: UTF-8 text holding a cue timing; else why
    not."""
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "it is UTF-16 encoded; save it as UTF-8 first"
    if b"\x00" in head:
        return "it looks like a binary file, not text"
    if b"-->" not in head:
        return 'there is no cue timing ("00:00:01,000 --> 00:00:04,000") at its start'
    return None


def read_srt(path: Path, sink: TextSink, limits: ExtractLimits, demos=None) -> tuple[str, dict]:
    """The registry's reader of SubRip files (see ``formats.Reader``): the text of the cues as paragraphs (see the
    module docstring); no title (a subtitle file names none); the facts {"cues": how many held text}."""
    paragraph: list[str] = []  # the texts of the cues of the paragraph being gathered
    chars, cues, last_end = 0, 0, 0.0  # characters in the paragraph, cues with text, when the last cue ended
    cue: list[str] | None = None  # the lines of the cue being read; None = between cues
    number: str | None = None  # a line of digits that is a cue number if a timing line follows

    def end_cue() -> None:
        nonlocal cue, cues, chars
        text = " ".join(" ".join(MARKUP.sub("", line) for line in cue or []).split())
        if text:
            paragraph.append(text)
            chars += len(text) + 1
            cues += 1
        cue = None

    def end_paragraph() -> None:
        nonlocal chars
        sink.part(" ".join(paragraph))
        paragraph.clear()
        chars = 0

    try:
        with open(path, encoding="utf-8-sig", errors="replace") as f:
            for line in f:
                timing = TIMING.match(line)
                if timing:
                    end_cue()
                    start, end = _seconds(timing.groups()[:4]), _seconds(timing.groups()[4:])
                    if paragraph and (start - last_end >= PAUSE_S or chars >= MAX_PARAGRAPH_CHARS
                                      or chars >= PARAGRAPH_CHARS and paragraph[-1].endswith(SENTENCE_END)):
                        end_paragraph()
                    cue, number, last_end = [], None, end
                    continue
                if number is not None and cue is not None:  # no timing line followed: the digits were text
                    cue.append(number)
                number = None
                if not line.strip():
                    end_cue()
                elif line.strip().isdigit():
                    number = line.strip()
                elif cue is not None:
                    cue.append(line.strip())
            if number is not None and cue is not None:
                cue.append(number)
            end_cue()
            if paragraph:
                end_paragraph()
    except OSError as e:
        raise InputError(f"{path}: cannot read the file: {e.strerror or e}") from e
    if not sink.parts:
        raise InputError(f"{path}: has no text")
    return "", {"cues": cues}


def _seconds(parts: tuple[str, ...]) -> float:
    hours, minutes, seconds, millis = parts
    return int(hours) * 3600 + int(minutes) * 60 + int(seconds) + int(millis.ljust(3, "0")) / 1000
