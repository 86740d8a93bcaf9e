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
known (``Chapters``, from ``longmem.text.chapters.find_chapters``), named as a place names it ("Part Two, chapter
VII": ``longmem.text.chapters.chapter_label``).

Shown to a reader, a passage is reflowed (``reflow``: a book's hard-wrapped lines joined into paragraphs) and set in
the text around it cut where a reader can start and stop: at sentence bounds within reach, else at whole words with
"…" (``excerpt``).
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
        # read lazily: the loop stops within a passage's length, so a whole book in the tail is cut in linear time
        cuts = ((m.start(), m.group().strip() == "" and "\n" in m.group()) for m in _BOUNDARY.finditer(text, lead))
        if self.demonstrations:
            return next((c for c, is_para in cuts if is_para and text[lead:c].strip()), None)
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
    """Which chapter a character offset of a book is in, None before the first chapter or in a book without
    detectable chapters: ``heading(offset)``, its heading's lines joined by spaces as the book prints them ("PART TWO
    I", "VII", "CHAPTER XII THE TITLE"), and ``label(offset)``, its place as a reader is told it ("Part Two, chapter
    I", "Part Two, chapter VII", "Chapter XII: The Title": ``Chapter.label``)."""

    def __init__(self, text: str):
        found = find_chapters(text)
        self.starts = [c.start for c in found]
        self.headings = [" ".join(c.heading.split("\n")) for c in found]
        self.labels = [c.label for c in found]

    def _index(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, offset) - 1

    def heading(self, offset: int) -> str | None:
        i = self._index(offset)
        return self.headings[i] if i >= 0 else None

    def label(self, offset: int) -> str | None:
        i = self._index(offset)
        return self.labels[i] if i >= 0 else None


# ------------------------------------------------------------------------------------------------ showing a passage

ELLIPSIS = "\u2026"  # marks where the text around a passage was cut inside a sentence
_SPACES = re.compile(r"\s+")
_SENTENCE_END = re.compile(r"[.!?\u2026][\"'\u201d\u2019\u00bb)\]]*$")


def reflow(text: str) -> str:
    """A book's hard-wrapped text as paragraphs: a run of whitespace that holds a blank line (two line breaks or more)
    becomes one paragraph break "\\n\\n", any other run (a line break inside a paragraph, indentation, double spaces)
    one space. Words hyphenated at a line's end are left as they are. A run at either end is mapped the same way, not
    removed, so reflowing the pieces of a text and joining them gives the reflowed whole wherever no whitespace run
    spans two pieces (a passage has none at its ends)."""
    return _SPACES.sub(lambda m: "\n\n" if m.group().count("\n") >= 2 else " ", text)


@dataclass(frozen=True)
class Excerpt:
    """A passage set in the text around it, as a reader is shown it (``excerpt``); all three reflowed."""

    before: str  # the text before the passage, from a sentence start or from "…" (keeps its whitespace to the passage)
    text: str  # the passage
    after: str  # the text after it, to a sentence end or to "…"

    @property
    def context(self) -> str:
        """``before + text + after``: the passage is ``context[len(before):len(before) + len(text)]``."""
        return self.before + self.text + self.after


def excerpt(before: str, text: str, after: str, cut_before: bool = True, cut_after: bool = True) -> Excerpt:
    """``text`` (a passage) set between ``before`` and ``after`` (the document's text on either side of it), all
    reflowed (``reflow``). ``cut_before``: ``before`` was cut out of a longer text (False: it starts the document),
    so it is trimmed to start at its first sentence start within its first half (after a sentence end or a paragraph
    break, as ``sentence_spans`` reads them), else at its first whole word, after "…". Likewise ``cut_after``:
    ``after`` ends at its last sentence end within its second half, else at its last whole word, before "…". An
    uncut end only loses its surrounding whitespace. So the text shown never starts or ends inside a word, unless the
    passage itself does and nothing around it is left."""
    if cut_before:
        starts = [a for a, _ in sentence_spans(before)[1:] if a <= len(before) / 2]
        if starts:
            before = before[starts[0]:]
        else:
            m = _SPACES.search(before)
            before = ELLIPSIS + (before[m.end():] if m else "")
    else:
        before = before.lstrip()
    if cut_after:
        ends = [b for _, b in sentence_spans(after) if b >= len(after) / 2 and b < len(after)
                and _SENTENCE_END.search(after, 0, b)]
        if ends:
            after = after[:ends[-1]]
        else:
            m = re.search(r"\s\S*$", after)
            after = (after[:m.start()].rstrip() if m else "") + ELLIPSIS
    else:
        after = after.rstrip()
    shown, (a, b) = _reflow_marked(before + text + after, len(before), len(before) + len(text))
    return Excerpt(shown[:a], shown[a:b], shown[b:])


def _reflow_marked(text: str, start: int, end: int) -> tuple[str, tuple[int, int]]:
    """``reflow(text)`` and where ``text[start:end]`` went in it. The text is reflowed as one, so a paragraph break
    split between a passage and its neighbour stays one; a whitespace run that an edge of the span falls inside goes
    outside the span."""
    pieces, n, pos = [], 0, 0  # n: characters reflowed so far, up to ``pos`` of ``text``
    a: int | None = None
    b: int | None = None
    for m in _SPACES.finditer(text):
        s, e = m.span()
        if a is None and start <= s:
            a = n + start - pos
        if b is None and end <= s:
            b = n + end - pos
        run = "\n\n" if m.group().count("\n") >= 2 else " "
        pieces += [text[pos:s], run]
        n += s - pos + len(run)
        if a is None and start < e:  # the span starts inside the run: after it
            a = n
        if b is None and end < e:  # the span ends inside the run: before it
            b = n - len(run)
        pos = e
    pieces.append(text[pos:])
    a = n + start - pos if a is None else a
    b = n + end - pos if b is None else b
    return "".join(pieces), (a, max(a, b))
