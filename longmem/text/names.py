"""The names a passage refers to without writing them (issue 85, item 4): "My father was a surgeon," said after
a passage that names Crispin, is about Crispin's father, yet holds no word of "Crispin's father". An index-only field
of the names in the passage before gives a word-matching finder the person a "he", a "she" or an "I" most likely
follows. No model: a book's proper names are the capitalised words it never writes in lower case.

    names = proper_names(book_text)                        # {"Crispin", "Hesther", "Harkness", ...}
    before = names_before([p.text for p in passages], names)  # per passage: the names of the one before it

Measured before it is built into the bank (``training/studies/reading_coverage.py``: the evidence among the best four
passages on the tuning sets, with and without the names before).
"""

from __future__ import annotations

import re
from collections import Counter

CAPITALISED = re.compile(r"\b([A-Z][a-z]{2,})\b")  # a word of three letters or more with only its first capitalised
LOWER = re.compile(r"\b([a-z]+)\b")
MENTIONS = 2  # a name is written at least this often in the book


def proper_names(text: str, mentions: int = MENTIONS) -> set[str]:
    """The capitalised words of ``text`` written at least ``mentions`` times and never in lower case: its people's
    and places' names ("Crispin", "Treliss"), not a sentence's first word ("The", "When": written lower case too)."""
    lower = set(LOWER.findall(text))
    counts = Counter(CAPITALISED.findall(text))
    return {w for w, n in counts.items() if n >= mentions and w.lower() not in lower}


def names_in(text: str, names: set[str]) -> list[str]:
    """The names of ``names`` that ``text`` writes, in order of first mention, each once."""
    return list(dict.fromkeys(w for w in CAPITALISED.findall(text) if w in names))


def names_before(texts: list[str], names: set[str], before: int = 1) -> list[list[str]]:
    """Per text of ``texts`` (a book's passages in order): the names of ``names`` written in the ``before`` texts
    before it, in order of first mention, each once (the first text: none). A name the text writes too stays: an
    index reads it once more there."""
    own = [names_in(t, names) for t in texts]
    return [list(dict.fromkeys(w for j in range(max(0, i - before), i) for w in own[j])) for i in range(len(texts))]
