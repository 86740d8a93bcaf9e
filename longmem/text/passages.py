"""Passages: a document's text cut into sentence-bounded spans of about 100-250 tokens, the units that are found for
a question, read by the model and cited to the user.

``PassageCutter`` cuts a document as it streams in, one piece at a time (ingestion feeds it each segment's text), and
returns each passage as soon as the sentence that ends it is complete. The only state between pieces is the text
not yet in a passage (the *tail*), so an interrupted ingestion rebuilds the cutter from what it stored
(``PassageCutter(start, tail)``) and cuts exactly as an uninterrupted one.

Rules. A passage ends at a sentence end (``.``, ``!``, ``?``, ``…``, closing quotes or brackets after them, then
whitespace) or at a paragraph break (a blank line). It ends at the first paragraph break after ``min_tokens``, else at
the last sentence end before it would pass ``target_tokens``, and a single sentence longer than ``max_tokens`` is cut
at spaces. Token counts are estimated from the piece's own characters-per-token (the caller gives each piece's token
count), so no tokenizer is needed: good to ~10% on prose, and the reader counts exact tokens when it fills its window.
Leading and trailing whitespace is left out of a passage, so its ``text`` is ``document[start:end]`` exactly.
In ``demonstrations`` mode (labelled examples) every paragraph is a passage of its own: one demonstration each.

A passage's place: its character offsets in the document, and the chapter it starts in, found once the whole text is
known (``chapter_of``, from ``longmem.text.chapters.find_chapters``).
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from longmem.text.chapters import find_chapters

MIN_TOKENS = 100  # a passage ends at a paragraph break once it has this many tokens
TARGET_TOKENS = 180  # ... else at the last sentence end before this many
MAX_TOKENS = 250  # a longer sentence is cut at spaces
# a sentence end: end punctuation, any closing quotes/brackets, then whitespace; or a blank line (paragraph break)
# a title or an initial just before a full stop: not a sentence's end (``sentence_spans``; passages keep ``_BOUNDARY``)
_ABBREVIATION = re.compile(r"(?:^|[\s(\"'\u201c\u2018])(?:Mrs?|Ms|Dr|St|Jr|Sr|Capt|Col|Gen|Lt|Sgt|Rev|Prof|Mt|Messrs|"
                           r"Mme|Mlle|No|vs|[A-Z])\.$")
_BOUNDARY = re.compile(r"(?<=[.!?\u2026])[\"'\u201d\u2019\u00bb)\]]*(?=\s)|\n[ \t]*\n")


@dataclass(frozen=True)
class Span:
    """One passage: ``text`` is the document's characters ``start`` to ``end``."""

    start: int
    end: int
    text: str
    n_tokens: int  # estimated


class PassageCutter:
    """Streaming passage cutter for one document (see the module doc). ``start`` and ``tail``: where the text not
    yet cut begins in the document, and that text (both 0 and "" for a new document)."""

    def __init__(self, start: int = 0, tail: str = "", *, demonstrations: bool = False,
                 min_tokens: int = MIN_TOKENS, target_tokens: int = TARGET_TOKENS, max_tokens: int = MAX_TOKENS):
        if not 0 < min_tokens <= target_tokens <= max_tokens:
            raise ValueError(f"need 0 < min_tokens <= target_tokens <= max_tokens, got {min_tokens}, "
                             f"{target_tokens}, {max_tokens}")
        self.start, self.tail = start, tail
        self.demonstrations = demonstrations
        self.min_tokens, self.target_tokens, self.max_tokens = min_tokens, target_tokens, max_tokens
        self.chars_per_token = 4.0  # updated from each piece fed

    def feed(self, text: str, n_tokens: int) -> list[Span]:
        """Add the document's next ``text`` (``n_tokens`` tokens); returns the passages it completed."""
        if text and n_tokens > 0:
            self.chars_per_token = len(text) / n_tokens
        self.tail += text
        return self._cut(final=False)

    def finish(self) -> list[Span]:
        """The document is complete: the passages left in the tail."""
        return self._cut(final=True)

    # -- cutting ----------------------------------------------------------------------------------------------------
    def _tokens(self, chars: int) -> int:
        return max(1, round(chars / self.chars_per_token))

    def _cut(self, final: bool) -> list[Span]:
        out = []
        while True:
            end = self._next_end(final)
            if end is None:
                break
            out += self._emit(end)
        if final and self.tail.strip():
            out += self._emit(len(self.tail))
        return out

    def _next_end(self, final: bool) -> int | None:
        """Where in the tail the next passage ends (a boundary whose following whitespace is in the tail), or None
        when the tail cannot end one yet."""
        text = self.tail
        lead = len(text) - len(text.lstrip())
        cuts = [(m.start(), m.group().strip() == "" and "\n" in m.group()) for m in _BOUNDARY.finditer(text, lead)]
        if self.demonstrations:
            para = [c for c, is_para in cuts if is_para and text[lead:c].strip()]
            return para[0] if para else None
        best = None
        for pos, is_para in cuts:
            n = self._tokens(pos - lead)
            if n > self.target_tokens and best is not None:
                return best  # the last sentence end before the target
            if n > self.max_tokens:
                return self._space_before(lead, self._chars(self.target_tokens))  # one sentence too long
            if is_para and n >= self.min_tokens:
                return pos
            best = pos if text[lead:pos].strip() else best
        if self._tokens(len(text) - lead) > self.max_tokens:  # no sentence end in sight: cut at a space
            return self._space_before(lead, self._chars(self.target_tokens))
        return None

    def _chars(self, tokens: int) -> int:
        return int(tokens * self.chars_per_token)

    def _space_before(self, lead: int, length: int) -> int:
        """The last space within ``length`` characters after ``lead`` (or exactly there when there is none)."""
        limit = lead + length
        space = self.tail.rfind(" ", lead + length // 2, limit)
        return space if space > lead else limit

    def _emit(self, end: int) -> list[Span]:
        """Take the tail's text up to ``end`` as a passage (without surrounding whitespace)."""
        piece = self.tail[:end]
        lead = len(piece) - len(piece.lstrip())
        body = piece.strip()
        span = Span(self.start + lead, self.start + lead + len(body), body, self._tokens(len(body))) if body else None
        self.start += end
        self.tail = self.tail[end:]
        return [span] if span is not None else []


def sentence_spans(text: str) -> list[tuple[int, int]]:
    """The sentences of ``text`` as (start, end) character offsets, by the passages' own rule (a sentence end or a
    paragraph break), except after a title or an initial ("Mrs. Forrester", "J. Sheringham Adair"), without
    surrounding whitespace; together they hold every non-space character of ``text``."""
    out, start = [], 0
    for m in [*_BOUNDARY.finditer(text), None]:
        if m is not None and not m.group().strip() and "\n" not in m.group() \
                and _ABBREVIATION.search(text, 0, m.start()):
            continue  # "Mrs." does not end a sentence
        # closing quotes stay with their sentence; a paragraph break's whitespace goes with neither
        end = len(text) if m is None else m.end() if m.group().strip() else m.start()
        piece = text[start:end]
        lead = len(piece) - len(piece.lstrip())
        if piece.strip():
            out.append((start + lead, start + len(piece.rstrip())))
        start = end
    return out


def cut_passages(text: str, n_tokens: int | None = None, demonstrations: bool = False) -> list[Span]:
    """All passages of a whole document (``n_tokens``: its token count, else ~4 characters a token)."""
    cutter = PassageCutter(demonstrations=demonstrations)
    return cutter.feed(text, n_tokens or max(1, len(text) // 4)) + cutter.finish()


class Chapters:
    """Which chapter a character offset of a book is in: ``heading(offset)``, None before the first chapter or in
    a book without detectable chapters."""

    def __init__(self, text: str):
        found = find_chapters(text)
        self.starts = [c.start for c in found]
        self.headings = [" ".join(c.heading.split("\n")) for c in found]

    def heading(self, offset: int) -> str | None:
        i = bisect.bisect_right(self.starts, offset) - 1
        return self.headings[i] if i >= 0 else None
