"""Spans: what a reader with a window of its own reads for a question. The finder's best passages, each with the
passages on either side of it, joined where they touch or overlap, shown in book order, as many as fit the reading
budget.

    spans = widen(bank, found, count_tokens, budget=1800, neighbours=1)   # found: the finder's best, best first

Why. A passage (100-250 tokens) holds the sentence that states an answer, but often not what a reader needs around
it: who "he" is, the question's own words a sentence earlier, the end of a reply that began in the passage before.
A RAG script that hands its reader 1,600-character windows reads that context; a reader reading bare passages does
not, and answers less (issue 85). Spans are shown in the order of the book, not of their scores: order-preserving
RAG (Yu et al. 2024, arXiv 2409.01666) finds that reading retrieved chunks in document order gains as more are read.

How. The found passages are taken best first. Each is widened to its ``neighbours`` passages on either side
(``Bank.passages_around``); when the widened span would pass the budget, the passage alone is tried; when that would
too, it is skipped (a smaller one after it may fit). A found passage already inside a span is read there. Spans of
one document that overlap or touch (nothing but whitespace between them) become one. The budget counts the tokens
of the passages a span joins, plus ``HEADING`` for its heading in the prompt.

A span is a ``Found`` whose passage is the span (its text is the document's characters from its first passage's start
to its last's end, its place is its first passage's), whose score and ranks are those of the best found passage in it,
and whose ``covers`` are the ids of the passages it joins, in book order (``Found.ids``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from longmem.storage.bank import Bank
from longmem.storage.passages import Passage

HEADING = 8  # tokens of a span's heading in the prompt ("[n] (place)") and the spacing around it
TOUCH = 64  # characters between two passages of a document at most for them to touch (when only whitespace)


@dataclass
class _Run:
    """Passages of one document read together, in book order, and the best found passage among them."""

    passages: list[Passage]
    best: object  # Found
    rank: int  # the best found passage's rank (0 = the finder's best)

    @property
    def start(self) -> int:
        return self.passages[0].char_start

    @property
    def end(self) -> int:
        return self.passages[-1].char_end


def widen(bank: Bank, found: list, count: Callable[[str], int], budget: int, neighbours: int) -> list:
    """The spans to read for ``found`` (``Found``, best first) within ``budget`` tokens (``count``: a text's tokens),
    in book order (documents in the order of their best passage; see the module doc)."""
    runs: list[_Run] = []
    tokens: dict[int, int] = {}

    def cost(rs: list[_Run]) -> int:
        for p in (p for r in rs for p in r.passages if p.id not in tokens):
            tokens[p.id] = count(p.text)
        return sum(HEADING + sum(tokens[p.id] for p in r.passages) for r in rs)

    for rank, f in enumerate(found):
        if any(f.passage.id == p.id for r in runs for p in r.passages):
            continue  # already read, within a span
        for width in dict.fromkeys((max(0, neighbours), 0)):
            around = bank.passages_around(f.passage, width) if width else [f.passage]
            trial = _join(bank, runs, _Run(around, f, rank))
            if cost(trial) <= budget:
                runs = trial
                break
    first = {}
    for r in sorted(runs, key=lambda r: r.rank):
        first.setdefault(r.passages[0].document_id, r.rank)
    runs.sort(key=lambda r: (first[r.passages[0].document_id], r.start))
    return [_found(bank, r) for r in runs]


def _join(bank: Bank, runs: list[_Run], new: _Run) -> list[_Run]:
    """``runs`` with ``new`` added: joined with every run of its document that it overlaps or touches."""
    doc = new.passages[0].document_id
    keep, merged = [], new
    for r in runs:
        if r.passages[0].document_id == doc and _meet(bank, r, merged):
            by_id = {p.id: p for p in [*r.passages, *merged.passages]}
            best = r if r.rank <= merged.rank else merged
            merged = _Run(sorted(by_id.values(), key=lambda p: p.char_start), best.best, best.rank)
        else:
            keep.append(r)
    return keep + [merged]


def _meet(bank: Bank, a: _Run, b: _Run) -> bool:
    """Whether two runs of one document overlap or touch (only whitespace, at most ``TOUCH`` characters, between)."""
    lo, hi = (a, b) if a.start <= b.start else (b, a)
    if hi.start <= lo.end:
        return True
    gap = hi.start - lo.end
    doc = lo.passages[0].document_id
    return gap <= TOUCH and not bank.document_text_between(doc, lo.end, hi.start).strip()


def _found(bank: Bank, run: _Run):
    """The span of ``run`` as a ``Found`` (see the module doc)."""
    first, best = run.passages[0], run.best
    if len(run.passages) == 1:
        return replace(best, covers=(first.id,))
    text = bank.document_text_between(first.document_id, run.start, run.end)
    span = replace(first, id=best.passage.id, char_end=run.end, text=text)
    return replace(best, passage=span, covers=tuple(p.id for p in run.passages))
