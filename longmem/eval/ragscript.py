"""The RAG script a user would write instead of the app: the anchor of the reading suites' answers table.

A user with a book and a local reader writes about forty lines: cut the book's raw text into windows of 1,600
characters every 800 (so every sentence is whole in at least one window), rank the windows by BM25 for the question,
hand the best four to the reader with a one-line prompt, decode greedily, print what it says. No passages, no
chapters, no memory, no check: it always answers (unless the reader itself says the text does not say).

    script = RagScript(book_text)
    prompt, read = script.prompt("Whom did Mrs. Forrester marry?")   # read: (start, end) of the windows, best first
    reply = script_answer(reader_lm, prompt, new_tokens=64)

This is the anchor at full strength: the reader reads with its own window (``SCRIPT_WINDOW`` tokens, within the
reader's native context), not the LongMem model's. The BM25 is the textbook Okapi BM25 (k1 1.5, b 0.75, the
non-negative idf), over lower-cased words, no stopwords, as ``rank_bm25`` scores a script's ``text.lower().split()``.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from longmem.model.lm import Sampling
from longmem.tasks.chat import Chat

WINDOW_CHARS = 1600  # characters of raw text a window holds
STEP_CHARS = 800  # characters between the starts of two windows (windows overlap by half)
WINDOWS_READ = 4  # windows the reader is handed, best first
SCRIPT_WINDOW = 4096  # tokens of the reader's window the script reads with (prompt + answer; its native context
#                       when that is shorter): four windows are ~1,700 tokens
PROMPT = "Answer the question using these excerpts from the book.\n\n{context}\n\nQuestion: {question}"
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
    return _WORD.findall(text.lower())


class BM25:
    """Okapi BM25 over ``docs`` (lists of words). ``top(query, k)``: the ``k`` best documents' indices, best first
    (ties: the earlier one); documents sharing no word with the query are not returned."""

    def __init__(self, docs: list[list[str]]):
        self.counts = [Counter(d) for d in docs]
        self.lengths = [len(d) for d in docs]
        self.mean = sum(self.lengths) / len(docs) if docs else 0.0
        df = Counter(w for c in self.counts for w in c)
        n = len(docs)
        self.idf = {w: math.log((n - m + 0.5) / (m + 0.5) + 1.0) for w, m in df.items()}

    def scores(self, query: list[str]) -> list[float]:
        terms = [w for w in dict.fromkeys(query) if w in self.idf]
        out = []
        for c, n in zip(self.counts, self.lengths):
            norm = K1 * (1 - B + B * n / self.mean) if self.mean else K1
            out.append(sum(self.idf[w] * c[w] * (K1 + 1) / (c[w] + norm) for w in terms if w in c))
        return out

    def top(self, query: list[str], k: int) -> list[int]:
        scores = self.scores(query)
        ranked = sorted((i for i, s in enumerate(scores) if s > 0), key=lambda i: (-scores[i], i))
        return ranked[:k]


class RagScript:
    """The script over one book's raw ``text`` (see the module doc)."""

    def __init__(self, text: str, size: int = WINDOW_CHARS, step: int = STEP_CHARS, read: int = WINDOWS_READ):
        self.text, self.read = text, read
        self.spans = windows(text, size, step)
        self.index = BM25([words(text[a:b]) for a, b in self.spans])

    def find(self, question: str) -> list[tuple[int, int]]:
        """(start, end) of the windows read for ``question``, best first."""
        return [self.spans[i] for i in self.index.top(words(question), self.read)]

    def prompt(self, question: str) -> tuple[str, list[tuple[int, int]]]:
        """The reader's prompt for ``question`` and the windows it holds (best first; none found: the question
        alone, as a script whose search found nothing would ask it)."""
        found = self.find(question)
        if not found:
            return question, []
        context = "\n\n".join(self.text[a:b].strip() for a, b in found)
        return PROMPT.format(context=context, question=question), found


def script_answer(lm, prompt: str, new_tokens: int) -> str:
    """The reader ``lm``'s greedy reply to ``prompt`` in its chat template (at most ``new_tokens`` tokens), lines
    joined: what the script prints."""
    chat = Chat(lm, None, Sampling(max_new_tokens=new_tokens, temperature=0.0))
    return " ".join("".join(chat.ask(prompt)).split())
