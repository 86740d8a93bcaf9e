"""The chapters of a plain-text book: ``find_chapters(text)`` says where each heading starts and where its text
starts. Passages name the chapter they are in (``longmem.text.passages``); the ChapterBreak suite builds its items from
the breaks (``longmem.eval.chapterbreak``).

Heading rules (robust, not perfect; tuned on the 8 held-out books, checked on the 43 training ones)
--------------------------------------------------------------------------------------------------
Only text between the ``*** START OF`` and ``*** END OF`` Project Gutenberg lines is searched (the whole text when
they are missing), and a final "THE END" line is left out. A heading starts a paragraph: the line before it is
blank. Four kinds of heading line are read (a line may be wrapped in ``_italics_``):

1. **chapter**: ``CHAPTER``/``Chapter`` and a number, with an optional title after it: ``CHAPTER XII``,
   ``Chapter 3.``, ``CHAPTER ONE``, ``CHAPTER THE FOURTH``, ``CHAPTER XII. THE TITLE``; also ``CHAPTER`` alone on a
   line with the number on one of the next lines. Numbers are arabic, roman (parsed, up to 399) or English words
   (cardinal or ordinal, up to ninety-nine: ``TWENTY-ONE``, ``FIFTH``).
2. **numeral**: an upper-case roman or arabic number alone on its line (``I``, ``II.``, ``12``), with a blank line
   after it as well (The Great Gatsby, A Lost Lady, Poirot Investigates).
3. **part**: ``PART``/``BOOK``/``VOLUME`` and a number (``PART TWO``, ``BOOK FIRST``, ``BOOK ONE: A TITLE``).
   Parts are *not* chapters while finer headings exist: a part heading only lets chapter numbering restart at 1
   (A Lost Lady: PART ONE I..IX, PART TWO I..IX), and a part heading right above a chapter heading (fewer than
   `MIN_BODY_WORDS` words between them) becomes part of that chapter's heading, so the prefix never ends with
   "PART TWO". Every numbered chapter after a part heading names that part (``Chapter.part``: the part's heading
   line, on the first chapter of the part and on the rest), until the next part heading; before the first chapter
   only a part heading right above it counts (a table of contents lists parts too). Parts count as chapters only when
   a book has no finer headings at all.
4. **title**: for books without numbered headings (story collections such as All the Sad Young Men), the entries
   of the CONTENTS list (numbers and page numbers removed), found again after the list, in the same order, each as
   a paragraph of its own (up to 3 lines; letters and digits compared, case ignored). Their order is the check.

The first kind that yields at least two chapters wins, in the order chapter, numeral, title, part. Within a kind:

* **Tables of contents are dropped**: a heading followed by fewer than `MIN_BODY_WORDS` words of text before the next
  heading (lines that look like headings do not count as text; for chapter and title headings, a bare section
  number does not end the text) is a contents entry or an empty heading, not a chapter. Compact tables (one entry
  a line, no blank lines) never qualify at all, since a heading must start a paragraph.
* **Numbering must continue**: the chapters are the longest chain of headings whose numbers start at 1 and go up by
  one (a step of two is tolerated: one heading the rules missed), restarting at 1 only after a part heading. So the
  last entry of a table of contents that survives the rule above (it is followed by a dedication or a preface) is
  dropped as out of sequence, and so are section numbers inside chapters that do not start at I (the sections
  II, III, ... of each story in All the Sad Young Men).

A chapter's heading also takes in its title: the first paragraph after the heading line when it is short (at most
4 lines, 25 words, 70 characters a line) and looks like a title (all capitals, or not ending like a sentence),
e.g. "DR. SHEPPARD AT THE BREAKFAST TABLE" or "The Tragedy at Marsdon Manor"; and a section number right below
("CHAPTER ONE" then "I", or "§ 1"). ``[Illustration]`` paragraphs and rules of dashes or stars there are skipped.
The chapter's text (``body_start``, its first non-blank character) starts after all of these.

A place names a chapter by its label (``chapter_label``, ``Chapter.label``): the part and the chapter as the book
prints them, title-cased when printed in capitals, a bare number with the word "chapter", a title after a colon:
"Part Two, chapter VII", "Chapter III: The Title". ``heading`` stays the text's own lines (ChapterBreak uses it).

Known limits: a book whose finer headings cover only part of it (numbered chapters in its last BOOK only) gets only
those chapters; headings of other shapes ("ONE", "— 1 —", a title with no CONTENTS list) are not found.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIN_BODY_WORDS = 20  # a heading with fewer words of text before the next heading is a contents entry, not a chapter
MAX_HEADING_CHARS = 80  # a longer line is prose, not a heading
MAX_STEP = 2  # chapter numbers go up by 1, or by 2 when the rules missed one heading

_CHAPTER_LABELS = ("CHAPTER", "Chapter")
_PART_LABELS = ("PART", "Part", "BOOK", "Book", "VOLUME", "Volume")
_ROMAN = re.compile(r"(?=[IVXLC])(C{0,3})(XC|XL|L?X{0,3})(IX|IV|V?I{0,3})")
_LABELLED = re.compile(r"(?P<label>[A-Za-z]+)\s+(?:[Tt][Hh][Ee]\s+)?(?P<num>[A-Za-z0-9]+(?:-[A-Za-z]+)?)(?P<rest>.*)")
_BARE = re.compile(r"(?P<num>[IVXLC]+|[0-9]{1,3})\.?")
ILLUSTRATION = re.compile(r"\[Illustration[^\]]*\]")  # "[Illustration: ...]" markers
_UNITS = ("ONE TWO THREE FOUR FIVE SIX SEVEN EIGHT NINE TEN ELEVEN TWELVE THIRTEEN FOURTEEN FIFTEEN SIXTEEN "
          "SEVENTEEN EIGHTEEN NINETEEN").split()
_TENS = "TWENTY THIRTY FORTY FIFTY SIXTY SEVENTY EIGHTY NINETY".split()
_IRREGULAR_ORDINALS = {"FIRST": 1, "SECOND": 2, "THIRD": 3, "FIFTH": 5, "EIGHTH": 8, "NINTH": 9, "TWELFTH": 12}


# ------------------------------------------------------------------------------------------------------ chapters


@dataclass(frozen=True)
class Chapter:
    """One chapter of a book, as char offsets into the book's text."""

    index: int  # 0-based order in the book
    heading: str  # the heading line(s) as in the text, each stripped, joined by "\n", e.g. "CHAPTER XII\nTHE TITLE"
    start: int  # char offset where the heading starts (the start of its first line, part heading included)
    body_start: int  # char offset where the chapter's text starts (after the heading lines and blank lines)
    part: str | None = None  # the heading line of the part it is in, as in the text ("PART TWO"); None: no parts

    @property
    def label(self) -> str:
        """How a place names the chapter: "Part Two, chapter VII" (``chapter_label``)."""
        return chapter_label(self.heading, self.part)


def find_chapters(text: str) -> list[Chapter]:
    """The chapters of a plain-text book in order, following the rules of the module docstring; [] when fewer than
    two are found (a book without detectable chapters)."""
    lines = _split_lines(text)
    lo, hi = _book_span(lines)
    found = _scan(lines, lo, hi)
    parts = [h for h in found if h.kind == "part"]
    coarser = [h for h in found if h.kind != "numeral"]  # a chapter's text runs on over section numbers
    chain = _chain(_drop_empty([h for h in found if h.kind == "chapter"], coarser, lines, hi), parts)
    if len(chain) >= 2:
        return _chapters(chain, parts, lines, lo, hi, text)
    chain = _chain(_drop_empty([h for h in found if h.kind == "numeral"], found, lines, hi), parts)
    if len(chain) >= 2:
        return _chapters(chain, parts, lines, lo, hi, text)
    titles = _contents_titles(lines, lo, hi)
    chain = _drop_empty(titles, sorted(coarser + titles, key=lambda h: h.first), lines, hi)
    if len(chain) >= 2:
        return _chapters(chain, parts, lines, lo, hi, text)
    chain = _chain(_drop_empty(parts, parts, lines, hi), [])
    if len(chain) >= 2:
        return _chapters(chain, [], lines, lo, hi, text)
    return []


# ------------------------------------------------------------------------------------------- heading detection


@dataclass(frozen=True)
class _Line:
    start: int  # char offset of the line's first char
    indent: int  # chars of leading whitespace
    raw: str  # the line, stripped
    text: str  # the line with runs of whitespace collapsed to one space ("" for a blank line)


@dataclass(frozen=True)
class _Heading:
    kind: str  # "chapter", "numeral", "part" or "title" (see the module docstring)
    number: int  # its number (for a contents title: its place in the contents, from 1)
    first: int  # index of its first line
    last: int  # index of its last line


def _split_lines(text: str) -> list[_Line]:
    lines, pos = [], 0
    for raw in text.split("\n"):
        lines.append(_Line(pos, len(raw) - len(raw.lstrip()), raw.strip(), " ".join(raw.split())))
        pos += len(raw) + 1
    return lines


def _book_span(lines: list[_Line]) -> tuple[int, int]:
    """[lo, hi) line indices of the book proper: after the last ``*** START OF`` line before the first ``*** END OF``
    line, up to that ``*** END OF`` line and a "THE END" line before it."""
    hi = next((i for i, ln in enumerate(lines) if re.match(r"\*{3}\s*END OF", ln.text)), len(lines))
    lo = max((i + 1 for i in range(hi) if re.match(r"\*{3}\s*START OF", lines[i].text)), default=0)
    last = max((i for i in range(lo, hi) if lines[i].text), default=lo)
    if re.fullmatch(r"(?:THE END|The End|FINIS)\.?", lines[last].text.strip("_*")):
        hi = last
    return lo, hi


def text_end(text: str) -> int:
    """Char offset where the book's text ends: at its ``*** END OF`` line or final "THE END" line, else its end."""
    lines = _split_lines(text)
    _, hi = _book_span(lines)
    return lines[hi].start if hi < len(lines) else len(text)


def _roman(s: str) -> int | None:
    m = _ROMAN.fullmatch(s)
    if m is None:
        return None
    value = {"": 0, "C": 100, "CC": 200, "CCC": 300}[m.group(1)]
    tens, units = m.group(2), m.group(3)
    value += 90 if tens == "XC" else 40 if tens == "XL" else 50 * tens.startswith("L") + 10 * tens.count("X")
    value += 9 if units == "IX" else 4 if units == "IV" else 5 * units.startswith("V") + units.count("I")
    return value


def _word_number(word: str) -> int | None:
    """'ONE' -> 1, 'Twenty-One' -> 21, 'FOURTH' -> 4, 'TWENTIETH' -> 20; None for anything else (1..99)."""
    w = word.upper()
    if "-" in w:
        tens, _, unit = w.partition("-")
        t, u = _word_number(tens), _word_number(unit)
        return t + u if t is not None and u is not None and t in range(20, 100, 10) and u < 10 else None
    if w in _IRREGULAR_ORDINALS:
        return _IRREGULAR_ORDINALS[w]
    if w.endswith("IETH"):  # TWENTIETH
        w = w[:-4] + "Y"
    elif w.endswith("TH") and w[:-2] in _UNITS:  # FOURTH, SIXTEENTH
        w = w[:-2]
    if w in _UNITS:
        return _UNITS.index(w) + 1
    if w in _TENS:
        return 20 + 10 * _TENS.index(w)
    return None


def _number(token: str) -> int | None:
    """An arabic, roman (either case) or English-word number, or None."""
    if token.isdigit():
        return int(token) if 0 < int(token) < 1000 else None
    return _roman(token.upper()) or _word_number(token)


def _labelled_number(line: str, labels: tuple[str, ...]) -> int | None:
    """The number of a line like 'CHAPTER XII. THE TITLE' (with 'CHAPTER' in labels), or None."""
    m = _LABELLED.fullmatch(line.strip("_*"))  # italics: "_BOOK THE FIRST_"
    if m is None or m.group("label") not in labels or len(line) > MAX_HEADING_CHARS:
        return None
    return _number(m.group("num"))


def _bare_number(line: str) -> int | None:
    """The number of a line that is only a roman or arabic number ('IV', 'II.', '12'), or None."""
    m = _BARE.fullmatch(line.strip("_*"))
    if m is None:
        return None
    num = m.group("num")
    return _number(num) if num.isdigit() else _roman(num)


def _is_heading_like(line: str) -> bool:
    return (line in _CHAPTER_LABELS or _bare_number(line) is not None
            or _labelled_number(line, _CHAPTER_LABELS + _PART_LABELS) is not None)


def _scan(lines: list[_Line], lo: int, hi: int) -> list[_Heading]:
    """Every chapter, numeral and part heading line in lines[lo:hi] that starts a paragraph, in order."""
    found = []
    for i in range(lo, hi):
        t = lines[i].text
        if not t or (i > lo and lines[i - 1].text):
            continue
        blank_after = i + 1 >= hi or not lines[i + 1].text
        if (n := _labelled_number(t, _CHAPTER_LABELS)) is not None:
            found.append(_Heading("chapter", n, i, i))
        elif t in _CHAPTER_LABELS:  # "CHAPTER" alone, the number on a following line
            j = next((j for j in range(i + 1, min(i + 4, hi)) if lines[j].text), None)
            if j is not None and (n := _bare_number(lines[j].text)) is not None:
                found.append(_Heading("chapter", n, i, j))
        elif (n := _labelled_number(t, _PART_LABELS)) is not None:
            found.append(_Heading("part", n, i, i))
        elif blank_after and (n := _bare_number(t)) is not None:
            found.append(_Heading("numeral", n, i, i))
    return found


def _prose_words(lines: list[_Line], a: int, b: int) -> int:
    """Words in lines[a:b], not counting lines that look like headings."""
    return sum(len(ln.text.split()) for ln in lines[a:b] if ln.text and not _is_heading_like(ln.text))


def _drop_empty(headings: list[_Heading], boundaries: list[_Heading], lines: list[_Line], hi: int) -> list[_Heading]:
    """The headings followed by at least MIN_BODY_WORDS words before the next boundary heading (or the book's end):
    contents entries and empty headings go."""
    kept = []
    for h in headings:
        stop = next((b.first for b in boundaries if b.first > h.last), hi)
        if _prose_words(lines, h.last + 1, stop) >= MIN_BODY_WORDS:
            kept.append(h)
    return kept


def _chain(headings: list[_Heading], parts: list[_Heading]) -> list[_Heading]:
    """The longest chain of headings numbered from 1 up in steps of 1 (or MAX_STEP), restarting at 1 only after a
    part heading; among equally long chains, the one ending last (a table of contents comes first)."""
    best = [1 if h.number == 1 else 0 for h in headings]  # length of the best chain ending at each heading
    prev = [-1] * len(headings)
    for i, h in enumerate(headings):
        for j in range(i):
            if best[j] == 0:
                continue
            g = headings[j]
            restart = h.number == 1 and any(g.last < p.first and p.last < h.first for p in parts)
            if (1 <= h.number - g.number <= MAX_STEP or restart) and best[j] + 1 >= best[i]:
                best[i], prev[i] = best[j] + 1, j
    if not headings or max(best) == 0:
        return []
    i = max(range(len(best)), key=lambda k: (best[k], k))
    chain = []
    while i != -1:
        chain.append(headings[i])
        i = prev[i]
    return chain[::-1]


def _contents_titles(lines: list[_Line], lo: int, hi: int) -> list[_Heading]:
    """The entries of the book's CONTENTS list, found again after the list in the same order, each as a paragraph
    of its own (of at most 3 lines); [] when the book has no such list."""
    at = next((i for i in range(lo, hi) if lines[i].text.upper() in ("CONTENTS", "TABLE OF CONTENTS")), None)
    if at is None:
        return []
    entries, blanks, i = [], 0, at + 1
    while i < min(hi, at + 400) and not (entries and blanks >= 3):  # the list ends at 3 blank lines in a row ...
        blanks = 0 if lines[i].text else blanks + 1
        entry = _norm(_contents_entry(lines[i].text))
        if entry in entries:  # ... or where its first entry comes again
            break
        if len(entry) >= 3 and entry not in ("page", "chapter page"):
            entries.append(entry)
        i += 1
    found, want = [], 0
    while i < hi and want < len(entries):
        if not lines[i].text or lines[i - 1].text:
            i += 1
            continue
        end = i
        while end < hi and lines[end].text:
            end += 1
        block = _norm(" ".join(ln.text for ln in lines[i:end]))
        if end - i <= 3 and block in entries[want:]:
            want = entries.index(block, want) + 1
            found.append(_Heading("title", want, i, end - 1))
        i = end
    return found


def _contents_entry(line: str) -> str:
    """'XII. The Title .... 145' -> 'The Title' (a contents line without its number and page)."""
    line = re.sub(r"^(?:CHAPTER|Chapter)\s+", "", line)
    line = re.sub(r"^(?:[IVXLC]+|[0-9]+)\.?(?:\s+|$)", "", line)
    return re.sub(r"[\s.]*\b(?:[0-9]+|[ivxlc]+)$", "", line)


def _norm(s: str) -> str:
    return " ".join(re.sub(r"[^0-9a-z]+", " ", s.casefold()).split())


# ----------------------------------------------------------------------------------------- chapters from headings


def _chapters(chain: list[_Heading], parts: list[_Heading], lines: list[_Line], lo: int, hi: int,
              text: str) -> list[Chapter]:
    """Chapter records for the chosen headings: each takes in a part heading right above it and its title below,
    and names the part it is in (``_parts_of``)."""
    firsts, prev_last = [], lo - 1
    for h in chain:
        above = [p for p in parts if prev_last < p.first and p.last < h.first
                 and _prose_words(lines, p.last + 1, h.first) < MIN_BODY_WORDS]
        firsts.append(above[-1].first if above else h.first)
        prev_last = h.last
    chapters = []
    for k, (h, part) in enumerate(zip(chain, _parts_of(chain, parts, lines, lo))):
        stop = firsts[k + 1] if k + 1 < len(chain) else hi
        below, body = _heading_end(lines, h.last, stop)
        heading_lines = [ln.raw for ln in lines[firsts[k]:h.last + 1] if ln.raw and not ln.raw.startswith("[Ill")]
        heading = "\n".join(heading_lines + [lines[i].raw for i in below])
        body_start = lines[body].start + lines[body].indent if body < len(lines) else len(text)
        part_line = lines[part.first].raw if part is not None else None
        chapters.append(Chapter(k, heading, lines[firsts[k]].start, body_start, part_line))
    return chapters


def _parts_of(chain: list[_Heading], parts: list[_Heading], lines: list[_Line], lo: int) -> list[_Heading | None]:
    """The part heading each chapter is in: the last one between the previous chapter heading and its own, carried
    on to the chapters after it until the next. Before the first chapter only a part heading right above it (fewer
    than `MIN_BODY_WORDS` words between) counts, so the parts a table of contents lists are not taken for one.
    Only numbered chapters are in parts: contents titles and parts themselves are in none."""
    out: list[_Heading | None] = []
    if chain and chain[0].kind in ("title", "part"):
        return [None] * len(chain)
    current, prev_last = None, lo - 1
    for k, h in enumerate(chain):
        between = [p for p in parts if prev_last < p.first and p.last < h.first
                   and (k > 0 or _prose_words(lines, p.last + 1, h.first) < MIN_BODY_WORDS)]
        current = between[-1] if between else current
        out.append(current)
        prev_last = h.last
    return out


def _heading_end(lines: list[_Line], last: int, stop: int) -> tuple[list[int], int]:
    """(heading lines below the heading line, first line of the text) for a heading line ending at ``last``: skips
    blank lines, [Illustration] paragraphs, rules, section numbers and one title paragraph, never past ``stop``."""
    i, below, took_title = last + 1, [], False
    while True:
        while i < stop and not lines[i].text:
            i += 1
        end = i
        while end < stop and lines[end].text:
            end += 1
        if i >= stop:
            return below, stop
        block = [ln.text for ln in lines[i:end]]
        joined = " ".join(block)
        section = len(block) == 1 and (_is_heading_like(joined) or re.fullmatch(r"§ ?[0-9]+\.?", joined) is not None)
        if (joined.startswith("[") and joined.endswith("]")) or not any(c.isalnum() for c in joined):
            i = end  # [Illustration: ...], a rule of dashes or stars
        elif section or (not took_title and _is_title(block)):
            took_title = took_title or not section  # "CHAPTER ONE / I", "I / The Title", "CHAPTER X / TITLE / § 1"
            below, i = below + list(range(i, end)), end
        else:
            return below, i


def _is_title(block: list[str]) -> bool:
    """Whether a paragraph right after a heading is the chapter's title rather than its first paragraph."""
    joined = " ".join(block)
    if (len(block) > 4 or max(len(t) for t in block) > 70 or len(joined.split()) > 25
            or _is_heading_like(block[0])):
        return False
    letters = [c for c in joined if c.isalpha()]
    if not letters or letters[0].islower():
        return False
    tail = joined.rstrip("\"'”’)]_*")
    return all(c.isupper() for c in letters) or (tail != "" and tail[-1] not in ".,;:!?—-")


# ------------------------------------------------------------------------------------------------- place labels

_SMALL_WORDS = frozenset("a an and as at but by for from in into nor of on or the to with".split())
_WORD = re.compile(r"[^\W\d_]+(?:['\u2019][^\W\d_]+)*")
# the next word starts a clause (or a quotation): a small word there keeps its capital
_CLAUSE_START = re.compile(r"(?:(?:^|[:.!?\u2014]|--)[\s\"'\u201c\u2018(]*|[\"\u201c\u2018(])$")


def printed(line: str) -> str:
    """A heading line as a place names it: spaces collapsed, without ``_italics_`` marks or a final full stop, and
    title-cased when the book prints it in capitals ("PART TWO" -> "Part Two", "BOOK THE FIRST" -> "Book the First",
    "THE TRAGEDY AT MARSDON MANOR" -> "The Tragedy at Marsdon Manor"), roman numerals kept ("PART II" -> "Part II").
    A line with a lower-case letter is kept as printed."""
    return title_case(" ".join(line.strip("_*").split()).rstrip(".").rstrip())


def title_case(line: str) -> str:
    """A line printed in capitals, in title case: small words lower case but where a clause starts, roman numerals
    kept ("A LOST LADY" -> "A Lost Lady", "THE SENSE OF THE PAST" -> "The Sense of the Past"); a line with a
    lower-case letter is kept as it is."""
    if any(c.islower() for c in line):
        return line

    def word(m: re.Match) -> str:
        w = m.group()
        if _roman(w):
            return w
        if w.lower() in _SMALL_WORDS and not _CLAUSE_START.search(line, 0, m.start()):
            return w.lower()
        return w[0] + w[1:].lower()

    return _WORD.sub(word, line)


def chapter_label(heading: str, part: str | None = None) -> str:
    """How a place names a chapter: its part (``part``, or a part line heading ``heading``) and the chapter as the
    book prints it, title-cased when printed in capitals (``printed``), a bare number with the word "chapter" and a
    title after a colon. "PART TWO\nI" or ("VII", "PART TWO") -> "Part Two, chapter VII"; "CHAPTER III\nTHE TITLE"
    -> "Chapter III: The Title"; "II.\nThe Adventure" -> "chapter II: The Adventure"; a title alone ("THE RICH BOY")
    -> "The Rich Boy". Also reads the one-line headings stored before labels ("PART TWO I" -> "Part Two, chapter I",
    "VII" -> "chapter VII"), and a label gives itself back, so a stored string of either kind can go through it."""
    lines = [t for t in (" ".join(raw.split()) for raw in heading.split("\n")) if t]
    if not lines:
        return printed(part) if part else ""
    if len(lines) == 1 and (split := _part_split(lines[0])) is not None:
        lines = list(split)
    at = next((i for i in range(1, len(lines)) if _starts_chapter(lines[i])), None) if _is_part_line(lines[0]) else None
    if at is not None:  # "PART I\nTHE PART'S TITLE\nCHAPTER I\n...": the part's own title is left out
        part, lines = part or lines[0], lines[at:]
    return ", ".join(x for x in (printed(part) if part else None, _chapter_name(lines)) if x)


_NAMED_NUMBER = re.compile(r"\b(?P<label>[A-Za-z]+)\s+(?:[Tt][Hh][Ee]\s+)?(?P<num>[A-Za-z0-9]+(?:-[A-Za-z]+)?)\b")


def label_titles(label: str) -> list[str]:
    """The titles a label (``chapter_label``) carries, its part's and its chapter's, without their numbered names:
    "Part I: The Sea Like Bronze, chapter II" -> ["The Sea Like Bronze"], "Chapter Twenty-One: The Long Walk" ->
    ["The Long Walk"], "Winter Dreams" -> ["Winter Dreams"], "Part Two, chapter VII" -> [] ("The Book of Tea" keeps
    its "Book": "of" is no number)."""
    named = {w.lower() for w in _CHAPTER_LABELS + _PART_LABELS}
    pieces, at = [], 0
    for m in _NAMED_NUMBER.finditer(label):
        if m.group("label").lower() in named and _number(m.group("num")) is not None:
            pieces.append(label[at:m.start()])
            at = m.end()
    pieces.append(label[at:])
    return [t for t in (p.strip(" ,:.") for p in pieces) if t]


def _chapter_name(lines: list[str]) -> str:
    """'chapter VII', 'Chapter III: The Title', 'chapter II: The Adventure', or a title, from a heading's lines."""
    if len(lines) > 1 and lines[0] in _CHAPTER_LABELS and _bare_number(lines[1]) is not None:
        lines = [f"{lines[0]} {lines[1]}", *lines[2:]]  # "CHAPTER" alone, the number below it
    head = lines[0]
    if _bare_number(head) is not None:
        name = f"chapter {head.strip('_*').rstrip('.')}"
    elif _labelled_number(head, _CHAPTER_LABELS + _PART_LABELS) is not None:
        name = printed(head)
    else:
        return printed(" ".join(lines))  # a title heading
    title = [t for t in lines[1:] if not _is_heading_like(t) and re.fullmatch(r"§ ?[0-9]+\.?", t) is None]
    return f"{name}: {printed(' '.join(title))}" if title else name


def _is_part_line(line: str) -> bool:
    return _labelled_number(line, _PART_LABELS) is not None


def _starts_chapter(line: str) -> bool:
    """Whether a line starts a chapter's name: 'VII', 'CHAPTER XII ...', 'CHAPTER' alone, or a label's 'chapter VII'."""
    return (line in _CHAPTER_LABELS or _bare_number(line) is not None or line.startswith("chapter ")
            or _labelled_number(line, _CHAPTER_LABELS) is not None)


def _part_split(line: str) -> tuple[str, str] | None:
    """A one-line heading that starts with a part: 'PART TWO I' -> ('PART TWO', 'I'), 'Part Two, chapter I' ->
    ('Part Two', 'chapter I'); None for any other line."""
    m = _LABELLED.fullmatch(line)
    if m is None or m.group("label") not in _PART_LABELS or _number(m.group("num")) is None:
        return None
    rest = m.group("rest").lstrip(" ,")
    return (line[: m.start("rest")], rest) if rest and _starts_chapter(rest) else None
