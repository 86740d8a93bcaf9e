"""Questions answered by reading a bank, shared by the suites that ask them (``bookqa``: a SQuAD paragraph spliced
into book text; ``natural``: natural questions about whole books; ``facts``): the entrants, how each answers, how an
answer is scored, and the bank and embeddings of a text, built once under the run's output folder.

Every entrant that reads answers through the app's own function (``longmem.tasks.answer.answer``), with the app's
sampling (``ANSWER_SAMPLING``: greedy, the same answer length, ending where the backbone would); they differ only in
the model that reads, its memory, what finds the passages, and whether an answer the passages do not support is
replaced by "the book does not say":

- ``app``: the app's answer: LongMem with the bank in memory, reading what the app's finder finds, as the chat does;
  its answer without that check (``Answer.draft``, written to its end: ``answer(..., whole_draft=True)``) is kept too
  (``draft_contains``);
- ``app_memory_off``: the same, with no memory attached (the SideNet alone);
- ``longmem``: LongMem with the bank in memory, reading nothing (the paper's memory fusion alone);
- ``longmem_memory``, ``longmem_fused``: as the app, with that finder;
- ``rag_script``: the RAG script a user would write instead (``eval.ragscript``): the reader, with its own window,
  reading BM25's best four 1,600-character windows of the book's raw text, a one-line prompt, greedy, no check: the
  anchor the app is measured against, at full strength;
- ``rag_bm25``: the frozen backbone (same window, no memory) reading BM25's best passages, as many as the app reads:
  the app's own reading without its checks (it shares the app's passages and sizes, so it is no anchor);
- ``rag_embed``: the backbone reading the passages closest to the question under all-MiniLM-L6-v2
  (``longmem.model.embedder``), what a document-chat app would use;
- ``backbone_full``: the backbone reading the last tokens before the question that fit its native context (8k);
- ``oracle`` and ``oracle_backbone``: LongMem (as the app reads, without the check) and the backbone reading the
  gold passage alone: what reading can give at best with each model.

Scores. A chat model answers in sentences ("The V&A co-owns Canova's The Three Graces."), so the headline is the
rule of the project's ``bookqa/natural-dev.jsonl``: an answer counts when it contains a gold answer (both under
SQuAD's normalisation). SQuAD EM and F1 of the same answer are reported beside it (EM is near 0 for every entrant
for that reason). The answer is the whole generation, lines joined. An answer to a question the book does not
answer counts when it says so (``says_not_said``).
"""

from __future__ import annotations

import hashlib
import io
import re
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np

from longmem.eval.core import EvalContext, mean_std
from longmem.eval.datasets.squad import exact_match, f1, normalize_answer
from longmem.eval.ragscript import SCRIPT_WINDOW, RagScript, script_answer, script_sampling
from longmem.ingest.pipeline import ingest
from longmem.memory.memory import Memory
from longmem.storage import BankDirectory
from longmem.storage.bank import Bank
from longmem.storage.passages import ChunkPlaces
from longmem.tasks.answer import ANSWER_SAMPLING, NOT_SAID, answer
from longmem.tasks.chat import Chat
from longmem.tasks.reading import (
    ABSTAIN,
    DEFAULT_FINDER,
    PASSAGES_READ,
    READING_TOPK,
    SEARCH_EXCERPTS,
    SIDE_WEIGHT,
    Found,
    PassageFinder,
    Reading,
    find_for_chat,
    prompt_for,
)
from longmem.tasks.setup import load as load_reader
from longmem.tasks.setup import profile, reader_settings, resolve
from longmem.tasks.windows import WindowIndex
from longmem.util.files import write_file_atomic

FINDER_ENTRANTS = {"app": DEFAULT_FINDER, "longmem_memory": "memory", "longmem_fused": "fused"}
APP_ENTRANT = "app"  # what the app's chat does
LABELS = {
    "app": f"the app's answer: LongMem reading what {DEFAULT_FINDER} finding finds, with its checks",
    "app_memory_off": "the app's answer with the memory off (the SideNet alone)",
    "longmem": "LongMem, memory fusion alone (reads nothing)",
    "longmem_memory": "LongMem reading what its memory retrieval finds",
    "longmem_fused": "LongMem reading both, fused",
    "rag_script": "the RAG script: the backbone reading BM25's best four 1,600-character windows, no check",
    "rag_bm25": "BM25-RAG: the backbone reading what BM25 finds",
    "rag_embed": "embedding RAG: the backbone reading what all-MiniLM-L6-v2 finds",
    "backbone_full": "the backbone, native context (8k) before the question",
    "oracle": "oracle: LongMem reading the gold passage",
    "oracle_backbone": "oracle: the backbone reading the gold passage",
}
LEGACY_LABELS = {"longmem_lexical": "LongMem reading what BM25 finds (the app before issue 42)"}  # older records
TEXT_PROMPT = "Answer the question from this text.\n\n{text}\n\nQuestion: {question}"


READER_LABELS = {  # the entrants that read with another reader (``ReadingSize.reader``), as they are then
    "app": "the app's answer: {reader} reading as the app does, memory off (its finder, prompt and checks: the size)",
    "longmem_memory": "{reader} reading what LongMem's memory retrieval finds, memory off",
    "longmem_fused": "{reader} reading what memory retrieval and BM25 find, fused, memory off",
    "rag_script": "the RAG script: {reader} reading BM25's best four 1,600-character windows, no check",
    "rag_bm25": "BM25-RAG: {reader} reading what BM25 finds",
    "rag_embed": "embedding RAG: {reader} reading what all-MiniLM-L6-v2 finds",
    "oracle_backbone": "oracle: {reader} reading the gold passage",
}


def label(key: str, reader: str = "") -> str:
    """An entrant's label, for this code's entrants and those of older records; ``reader``: the reader its run's
    app entrants and baselines read with (``ReadingSize.reader``; "": the LongMem model's backbone)."""
    if reader and key in READER_LABELS:
        from longmem.model.readers import label as reader_label

        return READER_LABELS[key].format(reader=reader_label(reader))
    return LABELS.get(key) or LEGACY_LABELS.get(key, key)


WHOLE_BOOK = ("rag_script",)  # entrants that read the raw text of the book asked about (``Haystack.text``)
WHOLE_BOOK_SUITES = ("natural",)  # the suites whose items are questions about whole books
QUICK_NEW_TOKENS = 24  # tokens per answer at the reading suites' CI size (``--quick``): short, every path still run


@dataclass
class ReadingSize:
    """The size fields of the suites whose entrants answer by reading (``bookqa``, ``natural``, ``facts``): how much
    each entrant reads and says, and how LongMem reads, at the app's chat defaults. Each suite's ``Size`` adds its
    items and distances."""

    finder: str = DEFAULT_FINDER  # what the app's entrant reads (``Reading.finder``): the lexical finder's passages,
    #                               as the chat does with the bank's model, or "windows" of the raw text, as it does
    #                               with another reader (its profile: ``tasks.setup``)
    passages: int = PASSAGES_READ  # passages an answer reads at most, as the chat does
    budget: int = Reading.budget  # tokens of passages an answer reads at most (what fits the window: the other bound)
    new_tokens: int = ANSWER_SAMPLING.max_new_tokens  # tokens generated per answer at most, as the chat does
    best_last: bool = True  # passages shown best last, nearest the question, as the chat does (false: best first)
    reading_topk: int = READING_TOPK  # memory tokens per query while LongMem reads, as the chat does (0: model's K)
    search_excerpts: bool = SEARCH_EXCERPTS  # the excerpts' tokens search memory too, as the chat does
    backbone_stops: bool = ANSWER_SAMPLING.backbone_stops  # LongMem's answers also end where the backbone would
    side_weight: float = SIDE_WEIGHT  # LongMem's share of the next-token logits while it reads, as the chat's
    abstain: float = ABSTAIN  # the app's check of each answer sentence (``Reading.abstain``), as the chat's
    no_repeat: int = ANSWER_SAMPLING.no_repeat  # n-grams an answer never repeats (0: off), as the chat's
    sections: bool = Reading.sections  # the app looks in the section a question names, as the chat does (the RAG
    #                                    baselines never: plain BM25)
    entrants: list[str] = field(default_factory=lambda: [k for k in LABELS if k not in WHOLE_BOOK])  # which
    #                                 entrants answer (default: all that this suite's items allow)
    prompt: str = Reading.prompt  # the app's reading prompt (``tasks.reading.PROMPTS``); the baselines read with
    #                               the plain one ("book") always
    decline: float = Reading.decline  # with the book-or-not prompt, the least probability of "The book does not say."
    #                                   for the app's reader to say it (``Reading.decline``; 0: greedy)
    sure: float = Reading.sure  # the least probability of each of the app's answer's first tokens for it to be shown
    #                             (``Reading.sure``; 0: off)
    confirm: float = Reading.confirm  # the least probability the app's reader gives Yes, asked once its answer is
    #                                   made whether the excerpts state it, for it to be shown (``Reading.confirm``;
    #                                   0: not asked); a run records it where asked (``eval.calibrate --confirms``)
    reach: int = Reading.reach  # the app's check: sentences either side of a sentence in one stretch
    asked_words: int = Reading.asked_words  # the app's check: the question's words a stretch must hold
    window: int = 0  # tokens of the reader's window (0: its profile's, else the LongMem model's; ``tasks.setup``)
    spans: bool = Reading.spans  # the app reads spans in book order (``Reading.spans``), as the chat does with a
    #                              reader whose profile says so (``tasks.setup``)
    neighbours: int = Reading.neighbours  # with spans, passages on either side of each found one
    reader: str = ""  # the model the app's entrants, the RAG baselines and the backbone's oracle read with ("": the
    #                   LongMem model's own backbone; a name as ``longmem chat --reader`` takes it: the app then reads
    #                   with memory off, as the chat does with another reader)


@dataclass
class Asked:
    """One question as every entrant meets it."""

    question: str
    golds: tuple[str, ...]  # accepted answers
    gold: list[Found]  # what the oracles read
    is_gold: Callable[[Found], bool]  # whether a passage read holds the answer
    own_passages: list[tuple[int, str]]  # (id, text) of passages the item added, not in the embedding index
    evidence: tuple[int, int] | None = None  # where the book's words that state the answer are in ``Haystack.text``


@dataclass
class Haystack:
    """What the question is asked about: the bank and its loaded memory, and the tokens before the question."""

    bank: Bank
    memory: Memory
    tokens: np.ndarray  # (N,) every token before the question, in order (the native-context backbone reads the last)
    places: ChunkPlaces | None = None  # which passage holds each memory chunk (None: the bank's own, as loaded)
    index: object = None  # an EmbeddingIndex over ``indexed`` (needed by ``rag_embed``)
    indexed: list[tuple[int, str]] | None = None  # (id, text) of the passages in ``index``, in its order
    text: str = ""  # the raw text of the book asked about (what the RAG script reads: ``script``)
    _script: RagScript | None = None
    _windows: WindowIndex | None = None

    @property
    def windows(self) -> WindowIndex:
        """BM25 over the windows of the bank's text (``tasks.windows``), made at first use: every question's finder
        over this haystack shares it."""
        self._windows = WindowIndex.current(self._windows, self.bank)
        return self._windows

    @property
    def script(self) -> RagScript:
        """The RAG script over ``text`` (``eval.ragscript``), made at first use."""
        if not self.text:
            raise ValueError("the RAG script needs the book's text (Haystack.text)")
        if self._script is None:
            self._script = RagScript(self.text)
        return self._script


def check_entrants(suite: str, entrants: list[str]) -> None:
    """Raise ValueError unless ``entrants`` are known ones, each given once, that ``suite``'s items allow (the RAG
    script reads a whole book's raw text: ``natural`` only)."""
    unknown = sorted(set(entrants) - set(LABELS))
    if unknown or not entrants or len(set(entrants)) < len(entrants):
        raise ValueError(f"{suite}.entrants: {', '.join(entrants) or 'none'} (unknown: {unknown}); give each "
                         f"once, among {', '.join(LABELS)}")
    if suite not in WHOLE_BOOK_SUITES and set(entrants) & set(WHOLE_BOOK):
        raise ValueError(f"{suite}.entrants: {', '.join(sorted(set(entrants) & set(WHOLE_BOOK)))} reads a whole "
                         f"book's text; {suite}'s items are passages spliced into a stream (natural has books)")


def finders(entrants: list[str], app_finder: str = DEFAULT_FINDER) -> list[str]:
    """The finders whose gold-passage reads ``entrants`` record: one per reading LongMem entrant (the app's:
    ``app_finder``, ``ReadingSize.finder``), and the embedder's for embedding RAG (BM25-RAG reads what the lexical
    finder found; the app with its memory off, what the app's finder found)."""
    out = [app_finder if k == APP_ENTRANT else f for k, f in FINDER_ENTRANTS.items() if k in entrants]
    for key, f in (("app_memory_off", app_finder), ("rag_bm25", "lexical")):
        if key in entrants and f not in out:
            out.append(f)
    return out + ["embed"] * ("rag_embed" in entrants) + ["script"] * ("rag_script" in entrants)


def read_ref(found: Found) -> int | list[int] | dict:
    """How a record names a text an answer read (``eval.calibrate.read_texts`` reads it back): a passage's id, a
    span's passages' ids, or a window of the raw text as {"window": [document id, start, end]}."""
    if "windows" in found.ranks:
        p = found.passage
        return {"window": [p.document_id, p.char_start, p.char_end]}
    return list(found.ids) if found.covers else found.passage.id


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
    the same (embedding a long book's passages takes minutes on a CPU: ``docs/design.md``)."""
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


def indexed_haystack(bank: Bank, memory: Memory, tokens: np.ndarray, embedder, text: str = "") -> Haystack:
    """The haystack of ``bank`` (its memory loaded), its passages in an embedding index when ``embedder`` is given;
    ``text``: the raw text of the book asked about (the RAG script's)."""
    from longmem.model.embedder import EmbeddingIndex

    if embedder is None:
        return Haystack(bank, memory, tokens, text=text)
    indexed = bank.passage_texts()
    index = EmbeddingIndex(embedder)
    index.add_vectors(bank_embeddings(bank, embedder, [t for _, t in indexed]))
    return Haystack(bank, memory, tokens, index=index, indexed=indexed, text=text)


def contains(answer: str, golds) -> float:
    """1.0 when the normalised answer contains a normalised gold answer as whole words, else 0.0."""
    text = f" {normalize_answer(answer)} "
    return float(any(f" {g} " in text for g in map(normalize_answer, golds) if g))


# what a reply says when it says that the book does not say (the app's NOT_SAID, and a backbone's own wordings)
_NOT_SAID = re.compile(r"\b(does not|doesn't|do not|did not|didn't|is not|isn't)\s+(say|says|mention|specify|state|"
                       r"tell|provide|give|reveal|name|indicate)|\bnot (mentioned|specified|stated|given|provided|"
                       r"named|revealed|known|clear)\b|\bno (information|mention|indication)\b|\bunknown\b|"
                       r"\bcannot be (determined|found)\b", re.IGNORECASE)


def says_not_said(answer: str) -> float:
    """1.0 when the answer says that the book (or text) does not say, in the app's words or plainer ones."""
    return float(answer.strip().startswith(NOT_SAID.split(".")[0]) or _NOT_SAID.search(answer) is not None)


def scored(got: str | dict, golds) -> dict:
    """An answer with its scores: contains a gold answer (a question with no gold: says that the book does not say),
    SQuAD EM and F1; an entrant's reply (``Entrants.answers``) also keeps whether it was shown and its draft, and
    whether what its citations quote (``Citation.quote``) holds a gold answer."""
    reply = got if isinstance(got, dict) else {"answer": got}
    text = reply["answer"]
    if golds:
        row = {"answer": text, "contains": contains(text, golds), "em": exact_match(text, golds),
               "f1": f1(text, golds)}
    else:
        row = {"answer": text, "contains": says_not_said(text), "em": 0.0, "f1": 0.0}
    if reply.get("draft") is not None:
        draft = reply["draft"]
        row |= {"said": reply["said"], "draft": draft,
                "draft_contains": contains(draft, golds) if golds else says_not_said(draft),
                **{k: reply[k] for k in ("read", "decline", "probs", "confirm") if k in reply}}
    if reply.get("same_prompt") is not None:
        row["same_prompt"] = reply["same_prompt"]
    if reply.get("quoted") is not None and golds:
        row["quoted_contains"] = float(any(contains(q, golds) for q in reply["quoted"]))
    return row


def window_text(lm, question: str, tokens: np.ndarray, new_tokens: int) -> str:
    """The backbone's full-context prompt: the last ``tokens`` that fit with the question and the answer."""
    tok = lm.backbone.tokenizer
    chat = Chat(lm, None, replace(ANSWER_SAMPLING, max_new_tokens=new_tokens))
    room = lm.segment_len - new_tokens - chat.prompt_ids(TEXT_PROMPT.format(text="", question=question),
                                                         history=False).shape[1] - 8
    return TEXT_PROMPT.format(text=tok.decode(tokens[-room:].tolist()), question=question)


class FixedFinder:
    """A finder that always finds the same passages (what an oracle reads, or another ranker's best), with the
    interface ``tasks.answer`` uses: ``bank`` and ``find``."""

    def __init__(self, bank: Bank, found: list[Found]):
        self.bank, self.found = bank, found

    def find(self, question: str, reading: Reading, question_ids=None) -> list[Found]:
        return list(self.found)


@dataclass
class Entrants:
    """How the entrants read: the run's size and the baselines' models (``backbone``: LongMem's window, no memory;
    ``full``: the backbone's native context). With another reader (``ReadingSize.reader``), ``app`` is that reader:
    the app's entrants (``FINDER_ENTRANTS``) read with it, memory off, and ``backbone`` (the RAG baselines, the
    backbone's oracle) is it too, so that the app is measured against RAG with the same reader."""

    model: object  # the LongMem model
    backbone: object
    full: object
    size: ReadingSize
    embedder: object = None  # needed by ``rag_embed``
    app: object = None  # the model the app's entrants read with (None: ``model``, with the bank's memory)
    script: object = None  # the RAG script's reader: ``backbone``'s model with the script's own window (``rag_script``)

    @property
    def app_reader(self):
        return self.app if self.app is not None else self.model

    def answers(self, want: set[str], asked: Asked, hay: Haystack, reads: dict) -> dict[str, dict]:
        """The wanted entrants' replies to one question (entrant -> {"answer", and for the app "said" and "draft"});
        appends to ``reads`` (finder -> list) whether each finder read a gold passage."""
        model, q = self.model, asked.question
        finder = PassageFinder(hay.bank, model, hay.memory, hay.places,
                               hay.windows if self.size.finder == "windows" else None)
        app, app_memory = self.app_reader, hay.memory if self.app is None else None
        got = {}

        def ask(lm, memory, finder, reading: Reading, app_entrant: bool = False) -> dict:
            # the app's draft is made whole: what its check lost is judged on the answer it would give unchecked
            reply = answer(Chat(lm, memory, self.sampling(lm)), finder, q, reading, whole_draft=True)
            text = " ".join("".join(reply).split())
            out = {"answer": text, "found": reply.found}
            if app_entrant:  # how the app's answer was made, for the record (``eval.calibrate``)
                out |= {"prompt": prompt_for(q, reply.found, reading) if reply.found else None, "said": reply.said,
                        "draft": " ".join((text if reply.draft is None else reply.draft).split()),
                        "read": [read_ref(f) for f in reply.found],  # what the check read (``eval.calibrate``)
                        **({"decline": round(reply.trace.decline, 4)} if reply.trace.decline is not None else {}),
                        **({"confirm": round(reply.confirm, 6)} if reply.confirm is not None else {}),
                        "probs": [round(p, 3) for p in reply.trace.probs],  # each draft token's probability
                        "quoted": [c.quote().removesuffix("…") for c in reply.citations]}  # the scorer keeps "…"
            return out

        if "longmem" in want:
            got["longmem"] = ask(model, hay.memory, None, self.reading("none"))
        for key, how in FINDER_ENTRANTS.items():
            how = self.size.finder if key == APP_ENTRANT else how
            if how not in reads:
                continue
            if key in want:
                got[key] = ask(app, app_memory, finder, self.reading(how), app_entrant=True)
                found = got[key]["found"]
            else:  # only what it finds is recorded
                found = find_for_chat(finder, Chat(app, app_memory, self.sampling(app)), q, self.reading(how))
            reads[how].append(any(map(asked.is_gold, found)))
            if key == "app" and "app_memory_off" in want:
                got["app_memory_off"] = ask(model, None, finder, self.reading(how))
            if how == "lexical" and "rag_bm25" in want:
                got["rag_bm25"] = ask(self.backbone, None, finder, self.reading(how, app=False))
        if "rag_bm25" in want and "rag_bm25" not in got:  # the app reads another finder's: BM25's passages apart
            got["rag_bm25"] = ask(self.backbone, None, finder, self.reading("lexical", app=False))
            reads["lexical"].append(any(map(asked.is_gold, got["rag_bm25"]["found"])))
        if "rag_embed" in want:
            embedded = FixedFinder(hay.bank, self.embedded(asked, hay))
            reply = ask(self.backbone, None, embedded, self.reading("lexical", app=False))
            reads["embed"].append(any(map(asked.is_gold, reply["found"])))
            got["rag_embed"] = reply
        if "rag_script" in want:
            prompt, read = hay.script.prompt(q)
            app_read = got.get(APP_ENTRANT)
            if app_read is not None and app_read["prompt"] == prompt and self.decodes_as_script():
                # the same reader, window, decoding and prompt, word for word: its answer is the app's unchecked draft
                # (an app that found nothing has no prompt: its reader was not asked)
                got["rag_script"] = {"answer": app_read["draft"], "same_prompt": True}
            else:
                got["rag_script"] = {"answer": script_answer(self.script, prompt, self.size.new_tokens),
                                     "same_prompt": False}
            if asked.evidence is not None:
                a, b = asked.evidence
                reads["script"].append(any(s < b and a < e for s, e in read))
        if "backbone_full" in want:
            n = self.size.new_tokens
            chat = Chat(self.full, None, self.sampling(self.full))
            got["backbone_full"] = {"answer": " ".join("".join(
                chat.ask(q, window_text(self.full, q, hay.tokens, n))).split())}
        gold = FixedFinder(hay.bank, asked.gold)
        if "oracle" in want:
            got["oracle"] = ask(model, hay.memory, gold, self.reading("lexical", app=False))
        if "oracle_backbone" in want:
            got["oracle_backbone"] = ask(self.backbone, None, gold, self.reading("lexical", app=False))
        for reply in got.values():
            reply.pop("found", None)
            reply.pop("prompt", None)
        return got

    def decodes_as_script(self) -> bool:
        """Whether the app's reader answers a prompt exactly as the RAG script's does: the same model and window,
        decoding greedily with nothing else (an answer's stop where the backbone would stop is the same for a reader
        that is its own backbone)."""
        app, script = self.app, self.script
        return (app is not None and script is not None and app.backbone is script.backbone
                and app.segment_len == script.segment_len
                and replace(self.sampling(app), backbone_stops=False) == script_sampling(self.size.new_tokens))

    def sampling(self, lm=None):
        """How an entrant whose model is ``lm`` decodes: the app's sampling at the run's size. With another reader
        (``ReadingSize.reader``), the run's ``no_repeat`` is that reader's (its profile's, ``entrants_for``); the
        LongMem model's own entrants (``lm`` the model or its backbone) keep the chat's."""
        size = self.size
        bank_model = getattr(self.model, "backbone", None)
        own = self.app is not None and lm is not None and (lm is self.model or lm is self.full or (
            bank_model is not None and getattr(lm, "backbone", None) is bank_model))
        return replace(ANSWER_SAMPLING, max_new_tokens=size.new_tokens, backbone_stops=size.backbone_stops,
                       no_repeat=ANSWER_SAMPLING.no_repeat if own else size.no_repeat)

    def reading(self, finder: str, app: bool = True) -> Reading:
        """How an entrant reads: the app's reading at the run's size, with ``finder``; a baseline's (``app`` False)
        without the app's check that the passages support the answer, and with plain BM25 (no sections)."""
        size = self.size
        return Reading(finder=finder, passages=size.passages, budget=size.budget, best_last=size.best_last,
                       topk=size.reading_topk or None, search_excerpts=size.search_excerpts,
                       side_weight=size.side_weight, abstain=size.abstain if app else 0.0,
                       sections=size.sections and app, prompt=size.prompt if app else Reading.prompt,
                       decline=size.decline if app else 0.0, sure=size.sure if app else 0.0,
                       confirm=size.confirm if app else 0.0,
                       spans=size.spans and app, neighbours=size.neighbours, reach=size.reach,
                       asked_words=size.asked_words)

    def embedded(self, asked: Asked, hay: Haystack) -> list[Found]:
        """The passages closest to the question under the embedder, best first: the indexed ones and the item's
        own."""
        embedder, k = self.embedder, self.size.passages
        query = embedder.encode([asked.question])[0]
        ranked = [(hay.indexed[i][0], s) for i, s in hay.index.search_vector(query, k)]
        if asked.own_passages:
            vectors = embedder.encode([t for _, t in asked.own_passages])
            ranked += [(pid, float(e @ query)) for (pid, _), e in zip(asked.own_passages, vectors)]
        ranked = sorted(ranked, key=lambda x: -x[1])[:k]
        refs = {r.id: r for r in hay.bank.passages([p for p, _ in ranked])}
        return [Found(refs[p], s, {"embed": i}) for i, (p, s) in enumerate(ranked, 1) if p in refs]


def entrants_for(ctx: EvalContext, size: ReadingSize, suite: str) -> Entrants:
    """How ``size``'s entrants read, after checking its entrants and ``reading_topk`` (0: the model's own K); the
    embedder is loaded only when embedding RAG runs. ``size.reader`` is resolved here ("auto": the best installed,
    ``model.readers.choose``; the LongMem model's own backbone: ""), so that the run's record names the reader."""
    from longmem.model.baselines import BackboneLM
    from longmem.model.embedder import Embedder

    check_entrants(suite, size.entrants)
    if size.reading_topk < 0:
        raise ValueError(f"{suite}.reading_topk must be >= 0 (0: the model's K), got {size.reading_topk}")
    model, bb = ctx.model, ctx.model.backbone
    if size.reader:  # the LongMem model's own backbone ("") reads as the app does (``tasks.setup.resolve``)
        name, own = resolve(model, size.reader)
        size.reader = "" if own else name
    if size.reader:  # it reads and decodes as its profile says (``tasks.setup``), but for what the run sets
        told = set(ctx.overrides.get(suite, {}))
        own = {**reader_settings(size.reader, told), **{k: v for k, v in profile(size.reader).sampling.items()
                                                        if k not in told}}
        for key, value in own.items():  # each a field of ReadingSize too
            setattr(size, key, value)
    if size.window < 0:
        raise ValueError(f"{suite}.window must be >= 0 (0: the reader's own), got {size.window}")
    app = load_reader(size.reader, model, size.window or None) if size.reader else None  # its own window
    #                                                                                    (``tasks.setup``)
    reader_bb = app.backbone if app is not None else bb
    script = BackboneLM(reader_bb, min(SCRIPT_WINDOW, reader_bb.spec.max_positions))
    return Entrants(model, app or BackboneLM(bb, model.segment_len), BackboneLM(bb, bb.spec.max_positions), size,
                    Embedder.load() if "rag_embed" in size.entrants else None, app, script)


def summary(rows: list[dict]) -> dict:
    """Percentages of the items' scores, with a 95% interval (normal approximation) for the headline."""
    out = {m: 100 * float(np.mean([r[m] for r in rows])) for m in ("contains", "em", "f1")}
    out["contains_ci95"] = 196 * mean_std([r["contains"] for r in rows])[1] / max(1, len(rows)) ** 0.5
    return {**out, "items": rows}


def versus_notes(avg: dict[str, float]) -> list[str]:
    """The targets' comparisons on the entrants' average answered %: the app's default reader against its oracle
    (target >= 90%) and against the two RAG baselines."""
    notes, me = [], APP_ENTRANT
    if {me, "oracle"} <= avg.keys():
        oracle = avg["oracle"]
        notes.append(f"LongMem reading as the app does ({FINDER_ENTRANTS[me]}) answers {avg[me]:.1f}% on average, "
                     f"{100 * avg[me] / oracle:.0f}% of its oracle's {oracle:.1f}% (target: >= 90%)"
                     if oracle > 0 else "LongMem's oracle answers none: the ratio to it is undefined at this size.")
    if {me, "rag_bm25", "rag_embed"} <= avg.keys():
        notes.append(f"Against the RAG baselines on the average: LongMem reading ({FINDER_ENTRANTS[me]}) "
                     f"{avg[me]:.1f}%, BM25-RAG {avg['rag_bm25']:.1f}%, embedding RAG {avg['rag_embed']:.1f}%.")
    return notes
