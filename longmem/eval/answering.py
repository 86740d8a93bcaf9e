"""Questions answered by reading a bank, shared by the suites that ask them (``bookqa``: a SQuAD paragraph spliced
into book text; ``natural``: natural questions about whole books): the entrants, how each answers, how an answer is
scored, and the bank and embeddings of a text, built once under the run's output folder.

Entrants, each answering greedily in the chat template, up to ``new_tokens`` tokens, with up to ``passages``
passages read (what fits the window after the question and the answer):

- ``longmem``: LongMem with the bank in memory, reading nothing (the paper's memory fusion alone);
- ``longmem_memory``, ``longmem_lexical``, ``longmem_fused``: LongMem reading the passages that finder found
  (``longmem.tasks.reading``), memory attached;
- ``rag_bm25``: the backbone (same window, no memory) reading the best BM25 passages;
- ``rag_embed``: the backbone reading the passages closest to the question under all-MiniLM-L6-v2
  (``longmem.model.embedder``), what a document-chat app would use;
- ``backbone_full``: the backbone reading the last tokens before the question that fit its native context (8k);
- ``oracle`` and ``oracle_backbone``: LongMem and the backbone reading the gold passage alone: what reading can
  give at best with each model. The targets compare LongMem to its own oracle.

Scores. A chat model answers in sentences ("The V&A co-owns Canova's The Three Graces."), so the headline is the
rule of the project's ``bookqa/natural-dev.jsonl``: an answer counts when it contains a gold answer (both under
SQuAD's normalisation). SQuAD EM and F1 of the same answer are reported beside it (EM is near 0 for every entrant
for that reason). The answer is the whole generation (``new_tokens`` at most), lines joined.
"""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from longmem.eval.core import EvalContext, mean_std
from longmem.eval.datasets.squad import exact_match, f1, normalize_answer
from longmem.ingest.pipeline import ingest
from longmem.memory.memory import Memory, MemoryView
from longmem.model.lm import Sampling
from longmem.storage import BankDirectory
from longmem.storage.bank import Bank
from longmem.storage.passages import ChunkPlaces
from longmem.tasks.chat import Chat
from longmem.tasks.reading import (DEFAULT_FINDER, PASSAGES_READ, READING_TOPK, SEARCH_EXCERPTS, Found,
                                   PassageFinder, Reading, find_for_chat, fit_for_chat, reading_prompt)
from longmem.util.files import write_file_atomic

FINDER_ENTRANTS = {"longmem_memory": "memory", "longmem_lexical": "lexical", "longmem_fused": "fused"}
DEFAULT_READER = next(k for k, f in FINDER_ENTRANTS.items() if f == DEFAULT_FINDER)  # what the app's chat does
LABELS = {
    "longmem": "LongMem, memory fusion alone (reads nothing)",
    "longmem_memory": "LongMem reading what its memory retrieval finds",
    "longmem_lexical": "LongMem reading what BM25 finds",
    "longmem_fused": "LongMem reading both, fused",
    "rag_bm25": "BM25-RAG: the backbone reading what BM25 finds",
    "rag_embed": "embedding RAG: the backbone reading what all-MiniLM-L6-v2 finds",
    "backbone_full": "the backbone, native context (8k) before the question",
    "oracle": "oracle: LongMem reading the gold passage",
    "oracle_backbone": "oracle: the backbone reading the gold passage",
}
LABELS[DEFAULT_READER] += " (the app's default)"
TEXT_PROMPT = "Answer the question from this text.\n\n{text}\n\nQuestion: {question}"


@dataclass
class ReadingSize:
    """The size fields of the suites whose entrants answer by reading (``bookqa``, ``natural``, ``facts``): how much
    each entrant reads and says, and how LongMem reads, at the app's chat defaults. Each suite's ``Size`` adds its
    items and distances."""

    passages: int = PASSAGES_READ  # passages an answer reads at most, as the chat does
    budget: int = 640  # tokens of passages an answer reads at most (what fits the window is the other bound)
    new_tokens: int = 24  # tokens generated per answer at most
    best_last: bool = True  # passages shown best last, nearest the question, as the chat does (false: best first)
    reading_topk: int = READING_TOPK  # memory tokens per query while LongMem reads, as the chat does (0: model's K)
    search_excerpts: bool = SEARCH_EXCERPTS  # the excerpts' tokens search memory too, as the chat does
    backbone_stops: bool = False  # LongMem's answers also end where the frozen backbone would (the chat's default)
    entrants: list[str] = field(default_factory=lambda: list(LABELS))  # which entrants answer (default: all)


@dataclass
class Asked:
    """One question as every entrant meets it."""

    question: str
    golds: tuple[str, ...]  # accepted answers
    gold: list[Found]  # what the oracles read
    is_gold: Callable[[Found], bool]  # whether a passage read holds the answer
    own_passages: list[tuple[int, str]]  # (id, text) of passages the item added, not in the embedding index


@dataclass
class Haystack:
    """What the question is asked about: the bank and its loaded memory, and the tokens before the question."""

    bank: Bank
    memory: Memory
    tokens: np.ndarray  # (N,) every token before the question, in order (the native-context backbone reads the last)
    places: ChunkPlaces | None = None  # which passage holds each memory chunk (None: the bank's own, as loaded)
    index: object = None  # an EmbeddingIndex over ``indexed`` (needed by ``rag_embed``)
    indexed: list[tuple[int, str]] | None = None  # (id, text) of the passages in ``index``, in its order


def check_entrants(suite: str, entrants: list[str]) -> None:
    """Raise ValueError unless ``entrants`` are known ones, each given once."""
    unknown = sorted(set(entrants) - set(LABELS))
    if unknown or not entrants or len(set(entrants)) < len(entrants):
        raise ValueError(f"{suite}.entrants: {', '.join(entrants) or 'none'} (unknown: {unknown}); give each "
                         f"once, among {', '.join(LABELS)}")


def finders(entrants: list[str]) -> list[str]:
    """The finders whose gold-passage reads ``entrants`` record: one per reading LongMem entrant, and the
    embedder's for embedding RAG (BM25-RAG reads what the lexical finder found)."""
    out = [f for k, f in FINDER_ENTRANTS.items() if k in entrants]
    if "rag_bm25" in entrants and "lexical" not in out:
        out.append("lexical")
    return out + ["embed"] * ("rag_embed" in entrants)


def text_bank(ctx: EvalContext, folder: str, stem: str, text: str, title: str) -> Bank:
    """The bank of ``text`` under the output folder's ``folder`` (ingested once; a later run with the same text and
    backbone reuses it), its one document titled ``title``."""
    model = ctx.model
    digest = hashlib.sha256(text.encode() + model.backbone.fingerprint().encode()).hexdigest()[:12]
    root = ctx.out_dir / folder
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{stem}-{digest}.txt"
    if not path.exists():
        write_file_atomic(path, text.encode("utf-8"))
    directory = BankDirectory(root)
    name = path.stem
    bank = directory.open(name) if directory.exists(name) else directory.create(name, model)
    res = ingest(bank, model, path, title=title)
    ctx.log(f"{folder}/{name}: {res.action}" + (f" ({res.tokens:,} tokens, {res.seconds:.0f} s)" if res.tokens else ""))
    return bank


def bank_embeddings(bank: Bank, embedder, texts: list[str]) -> np.ndarray:
    """The embeddings of the bank's passage ``texts`` (n, dim), kept beside the bank and reused while the texts are
    the same (embedding a 1M-token text takes ~12 minutes on a 2-core CPU)."""
    path = bank.path.parent / f"{bank.name}.embeddings.npz"
    made_by = f"{embedder.model.config.name_or_path}|{embedder.max_length}"
    digest = hashlib.sha256("\x00".join([made_by, *texts]).encode()).hexdigest()
    if path.exists():
        with np.load(path) as kept:
            if str(kept["digest"]) == digest and kept["vectors"].shape == (len(texts), embedder.dim):
                return kept["vectors"]
    vectors = embedder.encode(texts)
    buf = io.BytesIO()
    np.savez(buf, vectors=vectors, digest=np.array(digest))
    write_file_atomic(path, buf.getvalue())
    return vectors


def indexed_haystack(bank: Bank, memory: Memory, tokens: np.ndarray, embedder) -> Haystack:
    """The haystack of ``bank`` (its memory loaded), its passages in an embedding index when ``embedder`` is given."""
    from longmem.model.embedder import EmbeddingIndex

    if embedder is None:
        return Haystack(bank, memory, tokens)
    indexed = bank.passage_texts()
    index = EmbeddingIndex(embedder)
    index.add_vectors(bank_embeddings(bank, embedder, [t for _, t in indexed]))
    return Haystack(bank, memory, tokens, index=index, indexed=indexed)


def answer(lm, memory, question: str, reading: str | None, new_tokens: int, search_reading: bool = True,
           backbone_stops: bool = False) -> str:
    """The entrant's greedy answer to ``question`` (reading ``reading`` in its place, its excerpts searching
    ``memory`` unless not ``search_reading``: ``Chat.ask``; ending where the frozen backbone would too with
    ``backbone_stops``: ``Sampling``), its lines joined."""
    tok = lm.backbone.tokenizer
    stop = (tok.eos_token_id,) if tok.eos_token_id is not None else ()
    sampling = Sampling(max_new_tokens=new_tokens, temperature=0, stop_ids=stop, backbone_stops=backbone_stops)
    chat = Chat(lm, memory, sampling)
    return " ".join("".join(chat.ask(question, reading, search_reading)).split())


def contains(answer: str, golds) -> float:
    """1.0 when the normalised answer contains a normalised gold answer as whole words, else 0.0."""
    text = f" {normalize_answer(answer)} "
    return float(any(f" {g} " in text for g in map(normalize_answer, golds) if g))


def scored(got: str, golds) -> dict:
    """An answer with its scores: contains a gold answer, SQuAD EM and F1."""
    return {"answer": got, "contains": contains(got, golds), "em": exact_match(got, golds), "f1": f1(got, golds)}


def window_text(lm, question: str, tokens: np.ndarray, new_tokens: int) -> str:
    """The backbone's full-context prompt: the last ``tokens`` that fit with the question and the answer."""
    tok = lm.backbone.tokenizer
    chat = Chat(lm, None, Sampling(max_new_tokens=new_tokens))
    room = lm.segment_len - new_tokens - chat.prompt_ids(TEXT_PROMPT.format(text="", question=question),
                                                         history=False).shape[1] - 8
    return TEXT_PROMPT.format(text=tok.decode(tokens[-room:].tolist()), question=question)


@dataclass
class Reader:
    """How the entrants read: the run's size and the baselines' models (``backbone``: LongMem's window, no memory;
    ``full``: the backbone's native context)."""

    model: object  # the LongMem model
    backbone: object
    full: object
    size: ReadingSize
    embedder: object = None  # needed by ``rag_embed``

    def answers(self, want: set[str], asked: Asked, hay: Haystack, reads: dict) -> dict[str, str]:
        """The wanted entrants' answers to one question (entrant -> answer); appends to ``reads`` (finder -> list)
        whether each finder read a gold passage."""
        model, q, size = self.model, asked.question, self.size
        n = size.new_tokens
        finder = PassageFinder(hay.bank, model, hay.memory, hay.places)
        chat = Chat(model, hay.memory, Sampling(max_new_tokens=n))
        got = {}
        if "longmem" in want:
            got["longmem"] = answer(model, hay.memory, q, None, n, backbone_stops=size.backbone_stops)
        for key, how in FINDER_ENTRANTS.items():
            if how not in reads:
                continue
            found = find_for_chat(finder, chat, q, self.reading(how))
            reads[how].append(any(map(asked.is_gold, found)))
            if key in want:
                got[key] = answer(model, self.memory(hay, found), q, reading_prompt(q, found), n, size.search_excerpts,
                                  size.backbone_stops)
            if how == "lexical" and "rag_bm25" in want:
                got["rag_bm25"] = answer(self.backbone, None, q, reading_prompt(q, found), n)
        if "rag_embed" in want:
            found = fit_for_chat(self.embedded(asked, hay), chat, q, self.reading("none"))
            reads["embed"].append(any(map(asked.is_gold, found)))
            got["rag_embed"] = answer(self.backbone, None, q, reading_prompt(q, found), n)
        if "backbone_full" in want:
            got["backbone_full"] = answer(self.full, None, q, window_text(self.full, q, hay.tokens, n), n)
        gold = reading_prompt(q, asked.gold)
        if "oracle" in want:
            got["oracle"] = answer(model, self.memory(hay, asked.gold), q, gold, n, size.search_excerpts,
                                   size.backbone_stops)
        if "oracle_backbone" in want:
            got["oracle_backbone"] = answer(self.backbone, None, q, gold, n)
        return got

    def reading(self, finder: str) -> Reading:
        size = self.size
        return Reading(finder=finder, passages=size.passages, budget=size.budget, best_last=size.best_last,
                       topk=size.reading_topk or None, search_excerpts=size.search_excerpts)

    def memory(self, hay: Haystack, found: list[Found]) -> MemoryView:
        """The haystack's memory as LongMem reads it with ``found`` in its window (``Reading.chunks``; a
        ``reading_topk`` of 0 reads the model's own K)."""
        reading = Reading(topk=self.size.reading_topk or None)
        return MemoryView(hay.memory, reading.chunks(hay.memory, found, self.model.config.topk))

    def embedded(self, asked: Asked, hay: Haystack) -> list[Found]:
        """The passages closest to the question under the embedder: the indexed ones and the item's own."""
        embedder, k = self.embedder, self.size.passages
        query = embedder.encode([asked.question])[0]
        ranked = [(hay.indexed[i][0], s) for i, s in hay.index.search_vector(query, k)]
        if asked.own_passages:
            vectors = embedder.encode([t for _, t in asked.own_passages])
            ranked += [(pid, float(e @ query)) for (pid, _), e in zip(asked.own_passages, vectors)]
        ranked = sorted(ranked, key=lambda x: -x[1])[:k]
        refs = {r.id: r for r in hay.bank.passages([p for p, _ in ranked])}
        return [Found(refs[p], s, {"embed": i}) for i, (p, s) in enumerate(ranked, 1) if p in refs]


def reader_for(ctx: EvalContext, size: ReadingSize, suite: str) -> Reader:
    """How ``size``'s entrants read, after checking its entrants and ``reading_topk`` (0: the model's own K); the
    embedder is loaded only when embedding RAG runs."""
    from longmem.model.baselines import BackboneLM
    from longmem.model.embedder import Embedder

    check_entrants(suite, size.entrants)
    if size.reading_topk < 0:
        raise ValueError(f"{suite}.reading_topk must be >= 0 (0: the model's K), got {size.reading_topk}")
    model, bb = ctx.model, ctx.model.backbone
    return Reader(model, BackboneLM(bb, model.segment_len), BackboneLM(bb, bb.spec.max_positions), size,
                  Embedder.load() if "rag_embed" in size.entrants else None)


def summary(rows: list[dict]) -> dict:
    """Percentages of the items' scores, with a 95% interval (normal approximation) for the headline."""
    out = {m: 100 * float(np.mean([r[m] for r in rows])) for m in ("contains", "em", "f1")}
    out["contains_ci95"] = 196 * mean_std([r["contains"] for r in rows])[1] / max(1, len(rows)) ** 0.5
    return {**out, "items": rows}


def versus_notes(avg: dict[str, float]) -> list[str]:
    """The targets' comparisons on the entrants' average answered %: the app's default reader against its oracle
    (target >= 90%) and against the two RAG baselines."""
    notes, me = [], DEFAULT_READER
    if {me, "oracle"} <= avg.keys():
        oracle = avg["oracle"]
        notes.append(f"LongMem reading as the app does ({FINDER_ENTRANTS[me]}) answers {avg[me]:.1f}% on average, "
                     f"{100 * avg[me] / oracle:.0f}% of its oracle's {oracle:.1f}% (target: >= 90%)"
                     if oracle > 0 else "LongMem's oracle answers none: the ratio to it is undefined at this size.")
    if {me, "rag_bm25", "rag_embed"} <= avg.keys():
        notes.append(f"Against the RAG baselines on the average: LongMem reading ({FINDER_ENTRANTS[me]}) "
                     f"{avg[me]:.1f}%, BM25-RAG {avg['rag_bm25']:.1f}%, embedding RAG {avg['rag_embed']:.1f}%.")
    return notes
