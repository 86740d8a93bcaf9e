"""Spans: what a reader with a window of its own reads for a question. The finder's best passages, each with the
passages on either side of it, joined where they touch or overlap, shown in book order, as many as fit the reading
budget.

    spans = widen(bank, found, count_tokens, budget=1800, neighbours=1)   # found: the finder's best, best first

Why. A passage (100-250 tokens) holds the sentence that states an answer, but often not what a reader needs around
it: who "he" is, the question's own words a sentence earlier, the end of a reply that began in the passage before.
A RAG script that hands its reader 1,600-character windows reads that context; a reader reading bare passages does
not, and answers less (issue 85). Spans are shown in the order of the book, not of their scores: order-preserving
RAG (Yu et al. 2024, arXiv 2409.01666) finds that reading retrieved chunks in document order gains as more are read.

How. First the found passages alone, best first, as many as fit the budget (one that does not fit is skipped; a
smaller one after it may still fit): what is found comes before what surrounds it (on the tuning sets, the evidence
lies whole in what is read for more questions when more passages are found than when fewer are widened:
``training.studies.reading_coverage``). Then, in rounds, each found passage read gains its neighbour before and its
neighbour after (``Bank.passages_around``), the nearest first, best-ranked first, each as long as it fits, up to
``neighbours`` on either side. Passages of one document that touch (nothing but whitespace between them) are read as
one span. The budget counts the tokens of each passage read, plus ``HEADING`` for each span's heading in the prompt.

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
TOUCH = 4096  # characters between two passages of a document at most for them to touch (when only whitespace:
#               passages tile their document, so neighbours always touch; the bound keeps the look cheap)


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
    chosen: dict[int, Passage] = {}
    seeds: dict[int, tuple[int, object]] = {}  # passage id -> (rank, Found) of the found passages read
    tokens: dict[int, int] = {}
    touch: dict[tuple[int, int], bool] = {}

    def fits(extra: Passage) -> bool:
        if extra.id not in tokens:
            tokens[extra.id] = count(extra.text)
        trial = [*chosen.values(), extra]
        runs = _runs(bank, trial, touch)
        return HEADING * len(runs) + sum(tokens[p.id] for p in trial) <= budget

    for rank, f in enumerate(found):
        if f.passage.id not in chosen and fits(f.passage):
            chosen[f.passage.id] = f.passage
            seeds[f.passage.id] = (rank, f)
    if neighbours > 0:
        around = {pid: bank.passages_around(f.passage, neighbours) for pid, (_, f) in seeds.items()}
        for r in range(1, neighbours + 1):
            for pid in seeds:
                ps = around[pid]
                i = next(j for j, p in enumerate(ps) if p.id == pid)
                for j, inner in ((i - r, i - r + 1), (i + r, i + r - 1)):  # before, then after; the nearer one read
                    if 0 <= j < len(ps) and ps[inner].id in chosen and ps[j].id not in chosen and fits(ps[j]):
                        chosen[ps[j].id] = ps[j]
    runs = []
    for group in _runs(bank, list(chosen.values()), touch):
        own = [seeds[p.id] for p in group if p.id in seeds]
        if own:  # (a neighbour always touches the passage it was read beside)
            rank, best = min(own, key=lambda x: x[0])
            runs.append(_Run(group, best, rank))
    first = {}
    for r in sorted(runs, key=lambda r: r.rank):
        first.setdefault(r.passages[0].document_id, r.rank)
    runs.sort(key=lambda r: (first[r.passages[0].document_id], r.start))
    return [_found(bank, r) for r in runs]


def _runs(bank: Bank, passages: list[Passage], touch: dict) -> list[list[Passage]]:
    """``passages`` grouped into runs that touch (see ``_touch``), each in book order."""
    out: list[list[Passage]] = []
    for p in sorted(passages, key=lambda p: (p.document_id, p.char_start)):
        last = out[-1][-1] if out else None
        if last is not None and last.document_id == p.document_id and _touch(bank, last, p, touch):
            out[-1].append(p)
        else:
            out.append([p])
    return out


def _touch(bank: Bank, a: Passage, b: Passage, seen: dict) -> bool:
    """Whether passage ``b`` follows ``a`` in their document with only whitespace (at most ``TOUCH`` characters)
    between them, or overlaps it (``seen``: the answers so far, by id pair)."""
    key = (a.id, b.id)
    if key not in seen:
        gap = b.char_start - a.char_end
        seen[key] = gap <= 0 or (gap <= TOUCH and not bank.document_text_between(a.document_id, a.char_end,
                                                                                  b.char_start).strip())
    return seen[key]


def _found(bank: Bank, run: _Run):
    """The span of ``run`` as a ``Found`` (see the module doc)."""
    first, best = run.passages[0], run.best
    if len(run.passages) == 1:
        return replace(best, covers=(first.id,))
    text = bank.document_text_between(first.document_id, run.start, run.end)
    span = replace(first, id=best.passage.id, char_end=run.end, text=text)
    return replace(best, passage=span, covers=tuple(p.id for p in run.passages))
