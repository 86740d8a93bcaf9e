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
Since issue 92 the app's readers read as this script does (the app started from its reading), so its windows, BM25
and prompt line are the app's own (``tasks.windows``, ``tasks.reading.PROMPTS["plain"]``); what stays the script's is
reading one book's whole raw text, the prompt put together here, and its decoding (``script_sampling``).
"""

from __future__ import annotations

from longmem.model.lm import Sampling
from longmem.tasks.chat import Chat
from longmem.tasks.reading import PROMPTS
from longmem.tasks.windows import BM25, STEP_CHARS, WINDOW_CHARS, WINDOW_TOKENS, WINDOWS_READ, windows, words

__all__ = ["BM25", "PROMPT", "SCRIPT_WINDOW", "RagScript", "script_answer", "windows", "words"]

SCRIPT_WINDOW = WINDOW_TOKENS  # tokens of the reader's window the script reads with (prompt + answer; its native
#                                context when that is shorter): four windows are ~1,700 tokens
PROMPT = PROMPTS["plain"] + "\n\n{context}\n\nQuestion: {question}"  # its one line, then the windows, the question


class RagScript:
    """The script over one book's raw ``text`` (see the module doc)."""

    def __init__(self, text: str, size: int = WINDOW_CHARS, step: int = STEP_CHARS, read: int = WINDOWS_READ):
        self.text, self.read = text, read
        self.spans = windows(text, size, step)
        self.index = BM25([words(text[a:b]) for a, b in self.spans])

    def find(self, question: str) -> list[tuple[int, int]]:
        """(start, end) of the windows read for ``question``, best first."""
        return [self.spans[i] for i, _ in self.index.top(words(question), self.read)]

    def prompt(self, question: str) -> tuple[str, list[tuple[int, int]]]:
        """The reader's prompt for ``question`` and the windows it holds (best first; none found: the question
        alone, as a script whose search found nothing would ask it)."""
        found = self.find(question)
        if not found:
            return question, []
        context = "\n\n".join(self.text[a:b].strip() for a, b in found)
        return PROMPT.format(context=context, question=question), found


def script_sampling(new_tokens: int) -> Sampling:
    """How the script decodes: greedily, at most ``new_tokens`` tokens, nothing else."""
    return Sampling(max_new_tokens=new_tokens, temperature=0.0)


def script_answer(lm, prompt: str, new_tokens: int) -> str:
    """The reader ``lm``'s greedy reply to ``prompt`` in its chat template (at most ``new_tokens`` tokens), lines
    joined: what the script prints."""
    chat = Chat(lm, None, script_sampling(new_tokens))
    return " ".join("".join(chat.ask(prompt)).split())
