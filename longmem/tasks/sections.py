"""Which part of a book a question is about: the section it names by title, and whether it asks how that part ends.

A reader of a story collection names the story ("In 'Winter Dreams', who is Dexter going to marry?"); a bank labels
each passage with its chapter (``longmem.text.chapters``: "chapter IV: The Mystery of Hunter's Lodge", "Winter
Dreams", "Part I: The Sea Like Bronze, chapter II"). ``named_sections`` finds the labels whose title the question
names, and ``asks_ending`` whether the question asks how it turns out ("what finally happened to ...", "who turned out
to be the thief", "... at the end"): a story's outcome is told in its last pages, where a finder matching the question's
words seldom looks (``tasks.reading.PassageFinder``; measured in ``docs/design.md``, "A question that names its story").

Matching is by words (letters and digits, case ignored), so "The Adventure of “The Western Star”" is named by "In
'The Adventure of the Western Star', ...". A title of one word besides stopwords ("Absolution", "The Adjuster", "The
End") counts only when quoted in the question, since one word is too often just a word; where titles overlap, the
longest named wins. Labels without a title ("Part Two, chapter VII") are named by nothing here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from longmem.storage.passages import STOPWORDS
from longmem.text.chapters import label_titles

_WORD = re.compile(r"[^\W_]+")  # letters and digits: "Pr-nce" -> "pr", "nce"
_QUOTES = "'\"‘’“”"
# Words asking how a part turns out. Lower case only, so a name ("Ponder's End") is not one of them.
ENDING = re.compile(r"\b(?:end|ending|ends|finally|final|eventually|turned out|turns out|at last|really|actually)\b")


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD.findall(text)]


def titles(label: str) -> list[str]:
    """The titles a chapter label carries that a question can name (``chapters.label_titles``, less those of
    stopwords only): "Part I: The Sea Like Bronze, chapter II" -> ["The Sea Like Bronze"]; "Part Two, chapter VII"
    -> []."""
    return [t for t in label_titles(label) if not all(w in STOPWORDS for w in _words(t))]


def _named(question: str, qwords: list[str], title: str) -> bool:
    words = _words(title)
    n = len(words)
    if not any(qwords[i:i + n] == words for i in range(len(qwords) - n + 1)):
        return False
    if sum(w not in STOPWORDS for w in words) > 1:
        return True
    core = title.strip(_QUOTES + " ")
    return re.search(f"[{_QUOTES}]{re.escape(core)}[{_QUOTES}]", question, re.IGNORECASE) is not None


def named_sections(question: str, labels: Iterable[str]) -> list[str]:
    """The labels (of ``labels``) whose title ``question`` names, in the order given (a title of fewer than two words
    that are not stopwords, "Absolution", "The Adjuster", only when quoted); where several titles are named, only
    those of the most words ("The Return of Battling Billson" over "Battling Billson"). [] when none is."""
    qwords = _words(question)
    best, found = 0, []
    for label in labels:
        n = max((len(_words(t)) for t in titles(label) if _named(question, qwords, t)), default=0)
        if n and n > best:
            best, found = n, [label]
        elif n and n == best:
            found.append(label)
    return found


def named_books(question: str, books: dict[int, str]) -> list[int]:
    """The ids of the ``books`` (id -> title) whose title ``question`` names, by the rule of ``named_sections``
    ("In A Lost Lady, who ...", "In 'Gatsby', ..."; *asterisks* or _underscores_ around a title count as quotes).
    [] when none is."""
    plain = re.sub(r"(?<!\w)[*_]+|[*_]+(?!\w)", '"', question)  # *The Blue Castle* -> "The Blue Castle"
    qwords = _words(plain)
    best, found = 0, []
    for doc_id, title in books.items():
        n = len(_words(title)) if title and _named(plain, qwords, title) else 0
        if n and n > best:
            best, found = n, [doc_id]
        elif n and n == best:
            found.append(doc_id)
    return found


def asks_ending(question: str) -> bool:
    """Whether ``question`` asks how something turns out ("what finally happened", "who turned out to be", "at the
    end", "who really took"): see ``ENDING``."""
    return ENDING.search(question) is not None
