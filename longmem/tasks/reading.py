"""Answering from a bank: find the passages a question is about, read them in the local window, cite them.

    finder = PassageFinder(bank, model, memory)        # the bank's memory loaded by ``bank.load_memory``
    found = finder.find("Who is the narrator?", Reading(finder="lexical"))
    prompt = reading_prompt("Who is the narrator?", fit(found, tokenizer, budget=640))

Find. Two finders rank a bank's passages (``longmem.text.passages``) for a question:

- ``memory``: LongMem's own retrieval. The question runs through the model with the bank's memory attached; each
  query token's memory-layer search retrieves chunks per head, and each retrieved chunk votes for the passage that
  holds it (``storage.passages.ChunkPlaces``). Passages are ranked by votes.
- ``lexical``: BM25 over the passages' words (the FTS5 index in the bank's SQLite); a question none of whose words
  the book has reads what ``memory`` finds.
- ``fused``: both, by reciprocal rank fusion (Cormack et al. 2009): score = sum over finders of 1 / (60 + rank).
- ``windows``: not the bank's passages but windows of its documents' raw text, 1,600 characters every 800, ranked by
  BM25 (``tasks.windows``): the RAG script's reading, which a reader other than the bank's model reads by default
  (``tasks.setup``), with the script's one-line prompt (``PROMPTS["plain"]``: no numbers, no places).

A question that names a chapter or story of the book by its title ("In 'Winter Dreams', ...") is looked for in that
section only, and one that asks how something turns out there ("what finally happened to ...", "who turned out to
be ...") reads the section's last passages, where a story tells its outcome (``Reading.sections``,
``tasks.sections``). ``memory`` ranks the whole bank either way.

Read. The best passages go into the prompt before the question as numbered excerpts with their place, within a token
budget, ordered from the worst to the best so the best is read last, nearest the question
(``Reading.best_last``); the model then answers with its memory attached as always (the paper's fusion stays beside the
reading). While it reads excerpts, each query token reads ``Reading.topk`` memory tokens (256), not the model's own
K (1,024 for the shipped SideNet, chosen for recall from memory alone): the excerpts carry the facts. And only the
question and the answer search memory (``Reading.search_excerpts``): the excerpts' tokens read the window alone, so
the first answer token does not pay a search of the whole bank for each excerpt token. ``finder="none"`` reads
nothing: the paper's pure memory fusion, at the model's K, every token searching. The measurements behind these
defaults: ``docs/design.md``, "How a chat answer reads".

Cite. What was read is returned with the answer (``Citation``): text, place, and the text around it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from longmem.memory.memory import Memory
from longmem.memory.view import MemoryView
from longmem.storage.bank import Bank
from longmem.storage.passages import ChunkPlaces, Passage
from longmem.tasks.evidence import ASKED, REACH, nearest
from longmem.tasks.sections import asks_ending, named_books, named_sections
from longmem.tasks.spans import widen
from longmem.tasks.windows import WindowIndex
from longmem.text.passages import excerpt

FINDERS = ("lexical", "fused", "memory", "windows", "none")
DEFAULT_FINDER = "lexical"  # what a chat reads unless told: chosen by measurement (docs/design.md)
RRF_K = 60  # reciprocal rank fusion's constant (the paper's)
PASSAGES_READ = 4  # passages an answer reads at most unless told (measured: docs/design.md)
READING_TOPK = 256  # memory tokens each query token reads while an answer reads excerpts (measured: docs/design.md)
SEARCH_EXCERPTS = False  # the excerpts' tokens read the window alone; the question and answer search memory: the
#                          same answers, a first token that does not grow with the bank (docs/design.md)
SIDE_WEIGHT = 0.25  # LongMem's share of an answer's next-token logits beside its frozen backbone's while it reads
#                    excerpts (measured: docs/design.md)
ENDING_PASSAGES = 4  # a section's last passages read for a question about how it turns out (docs/design.md)
ABSTAIN = 0.5  # an answer sentence whose added words no stretch of what it read holds this share of is not shown;
#               an answer with none shown says the book does not say (``tasks.evidence``; measured: docs/design.md)
SURE_TOKENS = 4  # the answer's first tokens whose probabilities ``Reading.sure`` judges (docs/design.md)
INSTRUCTION = "Answer the question from these excerpts of the book."
DECLINE = "The book does not say."  # what the book-or-not prompt tells a reader to say when the excerpts do not
#                                     answer
PROMPTS = {  # the reading prompt's instruction, by name (``Reading.prompt``)
    "book": INSTRUCTION,  # the 135M's: it cannot tell whether excerpts answer, the check does (docs/design.md)
    "book-or-not": f"{INSTRUCTION} If they do not answer it, say: {DECLINE}",  # a reader that can tell
    "book-or-not-after": INSTRUCTION,  # the same told after the question too, where a reader of long spans reads it
    "plain": "Answer the question using these excerpts from the book.",  # the RAG script's line: the excerpts
    #        follow it bare, best first, no numbers or places (``plain_prompt``; the windows finder's reading)
    "plain-or-not": f"Answer the question using these excerpts from the book. If they do not answer it, say: "
                    f"{DECLINE}",  # the script's line told to decline, read the same way (``PLAIN``; issue 92's
    #                                 decline prompt, measured as a change from the script's: docs/design.md)
    "quote-first": f"{INSTRUCTION} First copy the sentence of the excerpts that answers it, in quotation marks, then "
                   f"answer in a few words. If they do not answer it, say: {DECLINE}",  # an answer resting on a quote
}
PLAIN = ("plain", "plain-or-not")  # the prompts read as the script reads: excerpts bare, no numbers or places
CONFIRM = "Is your answer stated in the excerpts? Answer Yes or No."  # asked of the reader once its answer is made
#                                                                     (``Reading.confirm``)
AFTER = {  # what the reading prompt says after the question, by name (none: nothing)
    "book-or-not-after": f"If the excerpts do not answer it, say: {DECLINE}",
}


@dataclass
class Reading:
    """How an answer reads its bank: which finder, how many passages, how many tokens of them."""

    finder: str = DEFAULT_FINDER  # "lexical", "fused", "memory", "windows" (of the raw text: ``tasks.windows``), or
    #                               "none" (read nothing: the paper's memory fusion)
    passages: int = PASSAGES_READ  # passages read at most
    budget: int = 1024  # tokens of excerpts at most in the prompt (the window, less the question and the answer, is
    #                     the other bound)
    depth: int = 50  # candidates each finder ranks before fusion
    best_last: bool = True  # excerpts from the worst to the best, the best nearest the question (docs/design.md)
    topk: int | None = READING_TOPK  # memory tokens per query token while excerpts are read (None: the model's K)
    search_excerpts: bool = SEARCH_EXCERPTS  # the excerpts' tokens search memory too (False: only the question's
    #                                          and the answer's do)
    side_weight: float = SIDE_WEIGHT  # the model's share of the answer's next-token logits while excerpts are read,
    #                                   beside the frozen backbone's (``Sampling.side_weight``; 1: the model's own)
    abstain: float = ABSTAIN  # the least share of a sentence's added words that one stretch of the passages must
    #                           hold for it to be shown (``tasks.evidence.Checker``); with no sentence shown the reply
    #                           says the book does not say (0: every answer is shown as made)
    sections: bool = True  # a question naming a section by its title is looked for in it; asked how it ends, its
    #                        last passages are read (lexical finding; docs/design.md); one naming a book of the
    #                        bank by its title is looked for in that book (every finder)
    books: tuple[int, ...] = ()  # the documents (ids) of the bank passages are found in; (): all of them
    prompt: str = "book"  # the reading prompt (``PROMPTS``, ``AFTER``): "book", "book-or-not" (told to say that the
    #                       book does not say when the excerpts do not answer), "plain" (the RAG script's), or
    #                       "plain-or-not" (the script's, told so too)
    decline: float = 0.0  # > 0, with the book-or-not prompt: the reader says that the book does not say (``DECLINE``)
    #                       only when its probability of saying so, right after the prompt, is above this; below, it
    #                       answers with its likeliest other reply, checked as any (``Sampling.decline``); 0: as it
    #                       generates (greedy); no effect with the book prompt
    sure: float = 0.0  # > 0, when excerpts are read: an answer is shown only when each of its first ``SURE_TOKENS``
    #                    tokens had at least this probability as the reader chose it (sure how its answer begins);
    #                    else the reply says that the book does not say; 0: off
    confirm: float = 0.0  # > 0, when excerpts are read: once its answer is made the reader is asked whether it is
    #                       stated in the excerpts (``CONFIRM``, ``Sampling.probe``); with its probability of Yes
    #                       against No below this, the reply says that the book does not say. The answer is then
    #                       shown whole once confirmed, not streamed as made; 0: not asked
    reach: int = REACH  # the check's stretch: sentences on either side of a sentence read with it
    #                     (``tasks.evidence.stretches``)
    asked_words: int = ASKED  # the question's words a stretch of the check must hold (all it has, when fewer)
    spans: bool = False  # read spans, not bare passages: each found passage with ``neighbours`` passages on either
    #                      side, joined where they touch, in book order, as many as fit ``budget`` (``tasks.spans``);
    #                      False: the found passages alone, best last (the 135M's 1,024-token window)
    neighbours: int = 1  # with ``spans``, passages on either side of each found passage read with it

    def __post_init__(self):
        if self.finder not in FINDERS:
            raise ValueError(f"finder must be one of {', '.join(FINDERS)}, got {self.finder!r}")
        if self.passages < 0 or self.budget < 0 or self.depth < 1 or self.neighbours < 0 or self.reach < 0:
            raise ValueError("passages, budget, neighbours and reach must be >= 0 and depth >= 1")
        if self.asked_words < 1:
            raise ValueError(f"asked_words must be >= 1, got {self.asked_words}")
        if self.topk is not None and self.topk < 1:
            raise ValueError(f"topk must be >= 1 or None (the model's K), got {self.topk}")
        shares = (self.side_weight, self.abstain, self.decline, self.sure, self.confirm)
        if not all(0.0 <= x <= 1.0 for x in shares):
            raise ValueError("side_weight, abstain, decline, sure and confirm must be in [0, 1], got "
                             + ", ".join(f"{x:g}" for x in shares))
        if self.prompt not in PROMPTS:
            raise ValueError(f"prompt must be one of {', '.join(PROMPTS)}, got {self.prompt!r}")

    @property
    def declines(self) -> bool:
        """Whether the reader's decline is weighed (``decline``): a threshold, with the prompt that names it."""
        return self.decline > 0 and DECLINE in PROMPTS[self.prompt] + AFTER.get(self.prompt, "")

    def chunks(self, memory, found: list, model_topk: int) -> int | None:
        """Memory chunks each query token reads while answering: ``topk`` tokens' worth of ``memory``'s chunks (at
        least one; never more than the model's own ``model_topk``) when excerpts are read (``found``), else None
        (the model's own K)."""
        if not found or self.topk is None:
            return None
        return max(1, min(self.topk, model_topk) // memory.chunk_size)


@dataclass(frozen=True)
class Found:
    """A passage a finder ranked, with its rank per finder (1 = best; absent: not among that finder's candidates)."""

    passage: Passage  # the passage, or a span of passages joined (``tasks.spans``)
    score: float  # the ranking's score (fused: RRF; memory: votes; lexical: BM25)
    ranks: dict = field(default_factory=dict)  # finder -> rank
    covers: tuple[int, ...] = ()  # a span's passages (ids, in book order); (): the passage alone

    @property
    def ids(self) -> tuple[int, ...]:
        """The ids of the passages read: a span's, else the passage's own."""
        return self.covers or (self.passage.id,)


@dataclass(frozen=True)
class Citation:
    """A passage an answer read: what the reader is shown under the answer."""

    number: int  # [n] in the prompt
    document: str
    place: str  # "A Lost Lady, Part Two, chapter VII, 83% through the book" (``Passage.place``)
    text: str  # the passage, reflowed: a book's hard-wrapped lines joined into paragraphs (``text.passages.reflow``)
    context: str  # the passage with the text around it, reflowed too; ``text`` is in it (``citations``)
    passage_id: int
    finders: dict  # finder -> rank that brought it
    support: tuple[int, int] | None = None  # text[start:end]: the sentence that supports the answer (None: none)
    nearest: tuple[int, int] | None = None  # text[start:end]: the sentence holding most of the question's words
    #                                         (``evidence.nearest``; None: none holds any), quoted when none supports
    rests: bool = False  # the passage the answer rests on: its supporting sentence holds most of the answer's words
    #                      (one citation of an answer shown, none when the reply says that the book does not say)

    def quote(self, words: int = 40, opening: int = 18) -> str:
        """What the reader is shown of the passage beside the answer: the sentence that supports the answer, else the
        one nearest the question, cut to ``words`` words, else the passage's first ``opening`` words ("…" where
        cut)."""
        span = self.support or self.nearest
        w = (self.text[span[0]:span[1]] if span else self.text).split()
        n = words if span else opening
        return " ".join(w[:n]) + ("…" if len(w) > n else "")


def fuse(rankings: dict[str, list[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """Reciprocal rank fusion: (id, score) best first, score = sum over rankings of 1 / (k + rank), ties broken by
    the best single rank, then id."""
    scores: dict[int, float] = {}
    best: dict[int, int] = {}
    for ranking in rankings.values():
        for rank, pid in enumerate(ranking, 1):
            scores[pid] = scores.get(pid, 0.0) + 1.0 / (k + rank)
            best[pid] = min(best.get(pid, rank), rank)
    return sorted(scores.items(), key=lambda kv: (-kv[1], best[kv[0]], kv[0]))


@torch.no_grad()
def memory_votes(model, memory: Memory, ids: torch.Tensor) -> dict[int, int]:
    """Chunk serial -> times retrieved, over every head and token, when the model reads ``ids`` (1, T) with
    ``memory`` attached (the last ``segment_len`` tokens; memory is read, not changed)."""
    view = MemoryView(memory)
    model.step(ids[:, -model.segment_len:].to(model.backbone.device), view)
    return view.hits


class PassageFinder:
    """Ranks a bank's passages for questions (see the module doc). ``memory`` is the bank's memory as loaded by
    ``bank.load_memory`` (possibly re-chunked or grown by a conversation); ``bank`` stays open while it is used.
    ``places``: which passage holds each chunk of ``memory`` (default: the bank's, as loaded); ``windows``: the bank's
    window index when one is kept elsewhere (default: built at first use of the windows finder)."""

    def __init__(self, bank: Bank, model, memory: Memory, places: ChunkPlaces | None = None,
                 windows: WindowIndex | None = None):
        self.bank, self.model, self.memory = bank, model, memory
        self.places = places if places is not None else bank.chunk_places()
        # memory chunk serial // fine = the bank's own serial
        self.fine = self.bank.info_cached.chunk_size // memory.chunk_size
        self._windows = windows

    @property
    def windows(self) -> WindowIndex:
        """BM25 over the windows of the bank's text (``tasks.windows``), built at first use and again once the
        bank's documents changed."""
        self._windows = WindowIndex.current(self._windows, self.bank)
        return self._windows

    def books_for(self, question: str, books: tuple[int, ...] = (), named: bool = True) -> list[int] | None:
        """The documents (ids) passages for ``question`` are found in: of ``books`` (default: all the bank's), those
        whose title the question names when ``named`` and it names one (``tasks.sections.named_books``), else
        ``books`` themselves; None: the whole bank."""
        if named:
            titles = {d.id: d.title for d in self.bank.documents() if not books or d.id in books}
            if len(titles) > 1 or books:
                hit = named_books(question, titles)
                if hit:
                    return hit
        return list(books) or None

    def rank(self, question: str, finder: str, depth: int, question_ids: torch.Tensor | None = None,
             sections: bool = False, books: tuple[int, ...] = ()) -> list[Found]:
        """The ``depth`` best passages for ``question`` by ``finder`` ("none": []); ``question_ids`` (1, T): the
        question as the model reads it (default: its tokens alone); ``sections``: lexical finding looks in the
        section the question names (``lexical``), and every finder in the book it names (``books_for``); ``books``:
        only those documents' passages (ids; (): the whole bank's)."""
        rankings: dict[str, list[int]] = {}
        scores: dict[str, dict[int, float]] = {}
        within = self.books_for(question, books, sections)
        if finder == "windows":  # the raw text's windows, not passages: the section a question names is not looked for
            index = self.windows
            return [Found(index.passage(doc, a, b), s, {"windows": i})
                    for i, (doc, a, b, s) in enumerate(index.top(question, depth, within), 1)]
        if finder in ("memory", "fused"):
            ids = question_ids if question_ids is not None else self._ids(question)
            hits: dict[int, int] = {}
            for serial, n in memory_votes(self.model, self.memory, ids).items():
                hits[serial // self.fine] = hits.get(serial // self.fine, 0) + n
            votes = self.places.votes(hits)
            if within is not None:
                allowed = self.bank.passages_of(within)
                votes = {p: n for p, n in votes.items() if p in allowed}
            order = sorted(votes, key=lambda p: (-votes[p], p))[:depth]
            rankings["memory"], scores["memory"] = order, {p: float(votes[p]) for p in order}
        if finder in ("lexical", "fused"):
            found = (self.lexical(question, depth, within) if sections
                     else self.bank.search_passages(question, depth, documents=within))
            rankings["lexical"], scores["lexical"] = [p for p, _ in found], dict(found)
        if finder == "fused":
            ranked = fuse(rankings)[:depth]
        elif finder in rankings:
            ranked = [(p, scores[finder][p]) for p in rankings[finder]]
        else:
            return []
        refs = {r.id: r for r in self.bank.passages([p for p, _ in ranked])}
        positions = {f: {p: i for i, p in enumerate(r, 1)} for f, r in rankings.items()}
        return [Found(refs[p], s, {f: pos[p] for f, pos in positions.items() if p in pos})
                for p, s in ranked if p in refs]

    def lexical(self, question: str, depth: int, books: list[int] | None = None) -> list[tuple[int, float]]:
        """BM25's ``depth`` best (passage id, score) for ``question`` in the sections it names by title
        (``tasks.sections``), or in the whole bank (the documents ``books``, when given) when it names none or none
        of its words is there; when it asks how something turns out there, the sections' last passages instead, the
        last first, scored 0."""
        named = named_sections(question, self.bank.chapter_labels())
        if named and asks_ending(question):
            return [(p, 0.0) for p in self.bank.last_passages(named, min(depth, ENDING_PASSAGES), books)]
        within = self.bank.search_passages(question, depth, named, books) if named else []
        return within or self.bank.search_passages(question, depth, documents=books)

    def _ids(self, question: str) -> torch.Tensor:
        tok = self.model.backbone.tokenizer
        return tok(question, return_tensors="pt", add_special_tokens=False).input_ids

    def find(self, question: str, reading: Reading, question_ids: torch.Tensor | None = None) -> list[Found]:
        """The passages to read for ``question``: the best ``reading.passages`` of its finder. When the lexical
        finder finds none (no word of the question is in the book: "Who is the narrator?"), the passages memory
        retrieves most for the question are read instead; an answer's check still decides what they support."""
        if reading.finder == "none" or reading.passages == 0:
            return []
        depth = reading.passages if reading.finder == "windows" else reading.depth  # (windows are not fused)
        found = self.rank(question, reading.finder, depth, question_ids, reading.sections, reading.books)
        if not found and reading.finder == "lexical":
            found = self.rank(question, "memory", reading.depth, question_ids, reading.sections, reading.books)
        return found[: reading.passages]


def find_for_chat(finder: PassageFinder, chat, question: str, reading: Reading) -> list[Found]:
    """The passages a chat's answer to ``question`` reads, in the order the prompt shows them (``ordered``):
    ``reading``'s best that fit what the window leaves after the question alone, the excerpts' heading and the answer
    (``chat.sampling.max_new_tokens``); older turns move into memory to make that room (``tasks.Chat.ask``)."""
    if reading.finder == "none" or reading.passages == 0:
        return []
    return fit_for_chat(finder.find(question, reading), chat, question, reading, finder.bank)


def fit_for_chat(found: list[Found], chat, question: str, reading: Reading, bank: Bank | None = None) -> list[Found]:
    """``found`` (best first) cut to what a chat's window leaves for excerpts (``find_for_chat``), in the order the
    prompt shows them; with ``reading.spans``, widened into spans of ``bank`` (``tasks.spans.widen``). With
    ``reading.confirm`` the window keeps room for the question asked after the answer (``Chat.probe``)."""
    if not found:
        return []
    alone = chat.prompt_ids(question, history=False).shape[1] + 16
    if reading.confirm > 0:
        alone += len(chat.probe(CONFIRM).ids) + 1  # and the answer's last token, read before it
    budget = max(0, min(reading.budget, chat.model.segment_len - chat.sampling.max_new_tokens - alone))
    tok = chat.model.backbone.tokenizer
    if reading.spans:
        if bank is None:
            raise ValueError("reading spans needs the bank the passages are in")
        return widen(bank, found, lambda t: len(tok(t, add_special_tokens=False).input_ids), budget,
                     reading.neighbours)
    return ordered(fit(found, tok, budget), reading)


def ordered(found: list[Found], reading: Reading) -> list[Found]:
    """The passages in the order the prompt shows them (and citations number them): with ``reading.best_last`` (the
    default) best last, nearest the question; otherwise best first."""
    return found[::-1] if reading.best_last else found


def fit(found: list[Found], tokenizer, budget: int) -> list[Found]:
    """The passages, best first, that fit ``budget`` tokens together (one that does not fit is skipped; a smaller
    one after it may still fit)."""
    out, used = [], 0
    for f in found:
        n = len(tokenizer(f.passage.text, add_special_tokens=False).input_ids) + 8  # "[n] (place)" and spacing
        if used + n <= budget:
            out.append(f)
            used += n
    return out


def reading_prompt(question: str, found: list[Found], instruction: str = INSTRUCTION, after: str = "") -> str:
    """The user's turn when reading: ``instruction`` (``PROMPTS``), numbered excerpts with their places, then the
    question, then ``after`` (``AFTER``) on a line of its own when given (no excerpts: the question alone)."""
    if not found:
        return question
    excerpts = "\n\n".join(f"[{i}] ({f.passage.prompt_place()})\n{f.passage.text}" for i, f in enumerate(found, 1))
    return f"{instruction}\n\n{excerpts}\n\nQuestion: {question}" + (f"\n{after}" if after else "")


def plain_prompt(question: str, found: list[Found], instruction: str = PROMPTS["plain"]) -> str:
    """The RAG script's user turn: its one line (or ``instruction``), the excerpts' text bare (no numbers, no
    places), then the question (no excerpts: the question alone)."""
    if not found:
        return question
    context = "\n\n".join(f.passage.text.strip() for f in found)
    return f"{instruction}\n\n{context}\n\nQuestion: {question}"


def prompt_for(question: str, found: list[Found], reading: Reading) -> str:
    """The user's turn ``reading`` reads for ``question`` (its prompt by name: ``PROMPTS``, ``AFTER``)."""
    if reading.prompt in PLAIN:
        return plain_prompt(question, found, PROMPTS[reading.prompt])
    return reading_prompt(question, found, PROMPTS[reading.prompt], AFTER.get(reading.prompt, ""))


def citations(bank: Bank, found: list[Found], question: str = "", context_chars: int = 600) -> list[Citation]:
    """What an answer to ``question`` read, numbered as in its prompt: each passage reflowed, in up to
    ``context_chars`` of its document's text on either side, cut at sentence bounds within reach, else at whole words
    with "…" (``text.passages.excerpt``), with its sentence nearest the question (``Citation.nearest``). So ``text`` is
    found in ``context``, and the spans (``Citation.support``, ``Citation.nearest``, computed from the citation's
    ``text``) index the reflowed text."""
    out = []
    for i, f in enumerate(found, 1):
        p = f.passage
        lo = max(0, p.char_start - context_chars)
        around = bank.document_text_between(p.document_id, lo, p.char_end + context_chars)
        after = around[p.char_end - lo:]
        shown = excerpt(around[: p.char_start - lo], p.text, after, cut_before=lo > 0,
                        cut_after=len(after) == context_chars)
        out.append(Citation(number=i, document=p.document, place=p.place(), text=shown.text, context=shown.context,
                            passage_id=p.id, finders=dict(f.ranks), nearest=nearest(question, shown.text)))
    return out
