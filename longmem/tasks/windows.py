"""Windows of a bank's own text ranked by BM25: how a reader other than the bank's model finds what to read (issue 92).

The RAG script a user writes with a local reader (``eval.ragscript``, the anchor of the reading suites) answers more
questions about books nobody tuned on than the app's passages and checks did, so the app starts from its reading: cut
each book's raw text into windows of 1,600 characters every 800 (every sentence is whole in at least one window),
rank the windows by BM25 for the question, and hand the best four to the reader in the script's one-line prompt
(``tasks.reading.PROMPTS["plain"]``). Here the windows are a bank's: each document's text as the bank stores it,
windows never crossing two documents, each cited with the place of the bank passage it starts in.

    index = WindowIndex(bank)                        # once per bank (rebuilt when its documents change)
    for doc, start, end, score in index.top("Who fixed the World's Series?", 4):
        print(bank.document_text(doc)[start:end])

BM25 is the textbook Okapi BM25 (k1 1.5, b 0.75, the non-negative idf), over lower-cased words (runs of letters
and digits), no stopwords; its scores are summed in the same order as a dense loop would, from an inverted index, so
a question costs the windows that share its words, not all of them. Over a bank of one book the ranking is the
script's to the bit; a library's idf and mean window length are the whole library's.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import replace
from typing import Callable

from longmem.storage.bank import Bank
from longmem.storage.passages import Passage

WINDOW_CHARS = 1600  # characters of raw text a window holds
STEP_CHARS = 800  # characters between the starts of two windows (windows overlap by half)
WINDOWS_READ = 4  # windows a reader is handed, best first
WINDOW_TOKENS = 4096  # tokens of the reader's own window it reads them in (prompt + answer; within its context)
K1, B = 1.5, 0.75  # Okapi BM25's constants
_WORD = re.compile(r"\w+", re.UNICODE)


def windows(text: str, size: int = WINDOW_CHARS, step: int = STEP_CHARS) -> list[tuple[int, int]]:
    """(start, end) of the windows of ``text``: ``size`` characters every ``step``, the last one ending at the
    text's end (a text shorter than ``size`` is one window; an empty one has none)."""
    if size < 1 or not 0 < step <= size:
        raise ValueError(f"need size >= 1 and 0 < step <= size, got {size}, {step}")
    if not text:
        return []
    starts = list(range(0, max(1, len(text) - size + step), step))
    return [(s, min(s + size, len(text))) for s in starts]


def words(text: str) -> list[str]:
    """The lower-cased words of ``text``, in order."""
    return _WORD.findall(text.lower())


class BM25:
    """Okapi BM25 over ``docs`` (lists of words). ``top(query, k)``: the ``k`` best documents' indices, best first
    (ties: the earlier one); documents sharing no word with the query are not returned."""

    def __init__(self, docs: list[list[str]]):
        self.lengths = [len(d) for d in docs]
        self.mean = sum(self.lengths) / len(docs) if docs else 0.0
        self.postings: dict[str, list[tuple[int, int]]] = {}  # word -> (document, count), documents in order
        for i, d in enumerate(docs):
            for w, c in Counter(d).items():
                self.postings.setdefault(w, []).append((i, c))
        n = len(docs)
        self.idf = {w: math.log((n - len(p) + 0.5) / (len(p) + 0.5) + 1.0) for w, p in self.postings.items()}
        self.norm = [K1 * (1 - B + B * m / self.mean) if self.mean else K1 for m in self.lengths]

    def sparse(self, query: list[str]) -> dict[int, float]:
        """Document -> score, for the documents holding a word of ``query`` (each word counted once)."""
        out: dict[int, float] = {}
        for w in dict.fromkeys(query):
            idf = self.idf.get(w)
            if idf is None:
                continue
            for i, c in self.postings[w]:
                out[i] = out.get(i, 0.0) + idf * c * (K1 + 1) / (c + self.norm[i])
        return out

    def scores(self, query: list[str]) -> list[float]:
        """Every document's score for ``query`` (0: none of its words)."""
        sparse = self.sparse(query)
        return [sparse.get(i, 0.0) for i in range(len(self.lengths))]

    def top(self, query: list[str], k: int, keep: Callable[[int], bool] | None = None) -> list[tuple[int, float]]:
        """The ``k`` best (document, score), best first; ``keep``: only the documents it accepts."""
        scores = self.sparse(query)
        ranked = sorted((i for i, s in scores.items() if s > 0 and (keep is None or keep(i))),
                        key=lambda i: (-scores[i], i))
        return [(i, scores[i]) for i in ranked[:k]]


def documents_key(bank: Bank) -> tuple:
    """What a window index was built from: the bank's text documents, each with its size and state."""
    return tuple((d.id, d.n_tokens, d.status) for d in bank.documents() if d.kind == "text")


class WindowIndex:
    """BM25 over the windows of every text document of ``bank`` (demonstration sets are not read), each window
    within one document. ``stale()`` says when the bank's text documents changed since it was built."""

    def __init__(self, bank: Bank, size: int = WINDOW_CHARS, step: int = STEP_CHARS):
        self.bank, self.key = bank, documents_key(bank)
        self.spans: list[tuple[int, int, int]] = []  # (document id, start, end), in document then text order
        self.texts: dict[int, str] = {}
        docs = []
        for d in bank.documents():
            if d.kind != "text":
                continue
            text = self.texts[d.id] = bank.document_text(d.id)
            for a, b in windows(text, size, step):
                self.spans.append((d.id, a, b))
                docs.append(words(text[a:b]))
        self.index = BM25(docs)

    def stale(self) -> bool:
        return documents_key(self.bank) != self.key

    @classmethod
    def current(cls, index: "WindowIndex | None", bank: Bank) -> "WindowIndex":
        """``index`` while it is current for ``bank``'s text documents, else a new one built from them."""
        return index if index is not None and not index.stale() else cls(bank)

    def top(self, question: str, k: int, documents: list[int] | None = None) -> list[tuple[int, int, int, float]]:
        """The ``k`` best windows for ``question``, best first, as (document id, start, end, score); ``documents``:
        only those documents' windows (None: all)."""
        allowed = set(documents) if documents is not None else None
        keep = None if allowed is None else (lambda i: self.spans[i][0] in allowed)
        return [(*self.spans[i], s) for i, s in self.index.top(words(question), k, keep)]

    def passage(self, doc: int, start: int, end: int) -> Passage:
        """The window as a passage a reader is shown: its raw text, its offsets, and the place (title, chapter) of
        the bank passage it starts in (whose id it carries)."""
        ids = self.bank.passages_overlapping(doc, start, start + 1) or self.bank.passages_overlapping(doc, start, end)
        text = self.texts[doc][start:end]
        if not ids:  # a document too short to hold a passage: its title and place alone
            d = self.bank.document(doc)
            return Passage(id=-1, document_id=doc, document=d.title, chapter=None, char_start=start, char_end=end,
                           document_chars=len(self.texts[doc]), text=text)
        (first,) = self.bank.passages(ids[:1])
        return replace(first, char_start=start, char_end=end, text=text)
