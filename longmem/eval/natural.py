"""Suite 9, natural questions about whole books (beyond the paper): what a user does with the product. A whole book
goes into a bank, then a reader's question is asked about it ("In which town do the Forresters live?"), answered by
every entrant of ``longmem.eval.answering`` on the same questions, the app's answer through the app's own function.

Data: question sets of JSON lines, each line a book (a file in the data's ``books/``), a question, its accepted
answers and the book's own words that state it (the *evidence*); or, for a question the book does not answer, no
answers and ``why_unanswerable``. A set name is a file of the shared data's ``bookqa/`` (``natural-dev``: 24
questions about two held-out books; ``natural-dev2``: 40 about two others; ``unanswerable-dev``: 30 the four books
do not answer), or of this package's ``eval/data/`` (``natural-tune``, ``unanswerable-tune``: questions the team
wrote on four books of the training split, the set its choices were tuned on; ``natural-tune2``,
``unanswerable-tune2``: 48 and 16 more on two others, each naming its story or chapter as natural-dev2's do;
``natural-tune3``: 197 answerable ones on six more; the dev sets are not tuned on), or ``natural-aside``,
``unanswerable-aside``: 48 and 16 the team wrote on two more training-split books and keeps aside, asked once a
change is chosen and never tuned on, so that a choice that only fits the sets it was made on shows as a gap there; or
``natural-fresh``, ``unanswerable-fresh``: 60 and 32 written for issue 92 on four more training-split books (Emily of
New Moon, The Girl from Hollywood, The Cabala, Tarzan and the Ant Men), once the sets before were worn.

Each book is ingested once into a bank under the output folder (kept and reused by later runs). With
``natural.library`` every question is asked of one bank holding all the books the sets ask about instead (a library:
the books' banks copied into it, ``Bank.copy_document``), as a user who keeps a folder of books in one bank asks,
without naming the book; the finders rank the whole library's passages (the backbone reading its native context
still reads the question's own book: a library is longer than any context). A passage read is
gold when it overlaps the evidence; the oracles read the gold passages alone and skip unanswerable questions. An
answer to an answerable question counts when it contains an accepted answer; to an unanswerable one, when it says
that the book does not say (``answering.says_not_said``). Each set's questions about one book are one recorded work
unit (``--resume``). The sets are small: the tables give 95% intervals and paired counts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path

import numpy as np

from longmem.eval.answering import (
    APP_ENTRANT,
    QUICK_NEW_TOKENS,
    Asked,
    Entrants,
    ReadingSize,
    check_entrants,
    entrants_for,
    finders,
    indexed_haystack,
    label,
    says_not_said,
    scored,
    summary,
    text_bank,
)
from longmem.eval.compare import discordant, sign_test
from longmem.eval.core import EvalContext, SuiteResult, Timer, figure, legend_below, table
from longmem.eval.datasets.recall import template_wording
from longmem.storage import BankDirectory
from longmem.storage.bank import Bank
from longmem.storage.passages import Passage
from longmem.tasks.reading import Found

DEV_SETS = ["natural-dev", "natural-dev2", "unanswerable-dev"]
TUNE_SETS = ["natural-tune", "unanswerable-tune",  # the team's own, on training-split books (``eval/data``);
             "natural-tune2", "unanswerable-tune2",  # tune2: each question names its story or chapter, as natural-dev2
             "natural-tune3"]  # tune3: 197 more, answerable, on six other books (no unanswerable set of its own)
ASIDE_SETS = ["natural-aside", "unanswerable-aside"]  # the team's own, kept aside: never tuned on (``eval/data``)
FRESH_SETS = ["natural-fresh", "unanswerable-fresh"]  # written for issue 92 on four more training-split books, once
#                                                       the reading was chosen: asked once, beside the RAG script
ENTRANTS = ["app", "rag_script", "app_memory_off", "rag_bm25", "rag_embed", "oracle", "oracle_backbone"]
TARGET_OF_ORACLE = 0.9  # the app's answered count against the backbone's oracle
TARGET_OVER_RAG = 10.0  # points over BM25-RAG on the answerable questions
TARGET_OVER_SCRIPT = 0  # answerable questions right beyond the RAG script's (``rag_script``, the anchor; issue 92:
#                        at least as many, paired)
TARGET_ABSTAINED = 70.0  # % of unanswerable questions the app says the book does not say
TARGET_LOST = 10.0  # % of the answers the app's drafts get right that its check may lose


@dataclass
class Size(ReadingSize):
    """The suite's items (and how every entrant reads: ``ReadingSize``)."""

    sets: list[str] = field(default_factory=lambda: list(DEV_SETS))  # question sets asked (see the module doc)
    questions: int = 0  # questions asked per set, in file order (0: all)
    max_tokens: int = 0  # each book cut to its first tokens (0: whole); questions whose evidence is cut are left out
    entrants: list[str] = field(default_factory=lambda: list(ENTRANTS))  # which entrants answer
    library: bool = False  # ask every question of one bank holding all the sets' books (a library), not its book's


QUICK = Size(sets=["natural-dev"], questions=2, max_tokens=2048, new_tokens=QUICK_NEW_TOKENS)
FULL = Size()


@dataclass(frozen=True)
class Question:
    """One line of a question set."""

    book: str  # file in the data's books/
    question: str
    answers: tuple[str, ...]  # empty: the book does not answer it
    evidence: str  # the book's words that state the answer, verbatim ("" when it does not answer)


def read_questions(path: Path) -> list[Question]:
    """The questions of ``path`` (JSON lines), with a clear error for a malformed line."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            q = Question(row["book"], row["question"], tuple(row["answers"]), row.get("evidence") or "")
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}, line {n}: not a natural question ({e})") from None
        if bool(q.answers) != bool(q.evidence) or (not q.answers and not row.get("why_unanswerable")):
            raise ValueError(f"{path}, line {n}: a question needs answers and evidence, or neither and "
                             "why_unanswerable")
        out.append(q)
    return out


def package_set_path(name: str) -> Path | None:
    """The file of the package's own question set ``name`` (``eval/data``: ``TUNE_SETS``, ``ASIDE_SETS``,
    ``FRESH_SETS``), or None."""
    own = resources.files("longmem.eval") / "data" / f"{name}.jsonl"
    return Path(str(own)) if own.is_file() else None


def set_path(ctx: EvalContext, name: str) -> Path:
    """The file of question set ``name``: the package's own (``eval/data``), else the shared data's ``bookqa/``."""
    own = package_set_path(name)
    if own is not None:
        return own
    path = ctx.data_dir / "bookqa" / f"{name}.jsonl"
    if not path.is_file():
        raise ValueError(f"natural.sets: no question set {name!r} (no {path}, and the package has none of that name)")
    return path


def book_text(ctx: EvalContext, book: str, max_tokens: int) -> str:
    """The book's text, cut to its first ``max_tokens`` tokens when that is not 0."""
    text = (ctx.data_dir / "books" / book).read_text(encoding="utf-8")
    if max_tokens:
        ids = ctx.tokenizer(text, add_special_tokens=False).input_ids
        text = ctx.tokenizer.decode(ids[:max_tokens]) if len(ids) > max_tokens else text
    return text


def gold_passages(bank: Bank, doc_id: int, text: str, q: Question) -> list[int] | None:
    """Ids of the passages of document ``doc_id`` (whose text is ``text``) that overlap ``q``'s evidence; None when
    the evidence is not in the text (cut off) or in no passage."""
    at = text.find(q.evidence)
    if at < 0:
        return None
    return bank.passages_overlapping(doc_id, at, at + len(q.evidence)) or None


def overlaps(p: Passage, doc: int, span: tuple[int, int]) -> bool:
    """Whether passage (or window, or span) ``p`` shares a character with characters ``span`` of document ``doc``:
    what makes a passage read gold (``gold_passages`` finds the bank's passages so)."""
    return p.document_id == doc and p.char_start < span[1] and span[0] < p.char_end


def run(ctx: EvalContext) -> SuiteResult:
    size: Size = ctx.size("natural", QUICK, FULL)
    if size.questions < 0 or size.max_tokens < 0:
        raise ValueError("natural.questions and natural.max_tokens must be >= 0 (0: all, whole books)")
    if not size.sets or len(set(size.sets)) < len(size.sets):
        raise ValueError(f"natural.sets: give each set once, at least one (got {size.sets})")
    check_entrants("natural", size.entrants)
    paths = {name: set_path(ctx, name) for name in size.sets}
    timer = Timer()
    entrants = entrants_for(ctx, size, "natural")
    units = ctx.task_log("natural", size, selects=("sets",))  # a unit: one set's questions about one book
    done: dict[str, dict] = {}
    asked = {name: read_questions(path)[: size.questions or None] for name, path in paths.items()}
    library = None  # with natural.library: (the bank of all the books, its memory), made at its first unit
    with contextlib.ExitStack() as opened:  # the library's bank is closed however the run ends
        for name, questions in asked.items():
            for book in dict.fromkeys(q.book for q in questions):  # in file order
                key = f"{name}/{book}"
                done[key] = units.get(key)
                if done[key] is None:
                    if size.library and library is None:
                        books = list(dict.fromkeys(q.book for qs in asked.values() for q in qs))
                        bank = opened.enter_context(library_bank(ctx, size, books))
                        library = (bank, bank.load_memory(ctx.model))
                    done[key] = _book(ctx, size, book, [q for q in questions if q.book == book], entrants, timer,
                                      library)
                    units.put(key, done[key])
    if not any(u["questions"] for u in done.values()):
        raise ValueError("natural: no question's evidence lies within the books as cut (natural.max_tokens)")
    return _result(ctx, size, done, units.commits())


def library_bank(ctx: EvalContext, size: Size, books: list[str]) -> Bank:
    """One bank holding ``books`` (each as cut, titled by its file's stem), under the output folder's
    ``natural-library``: each book's own bank (``text_bank``, reused) copied into it, once; a later run asking about
    the same books reuses it."""
    own = []
    for book in books:
        with text_bank(ctx, "natural-banks", Path(book).stem, book_text(ctx, book, size.max_tokens),
                       Path(book).stem) as bank:
            own.append(bank.name)
    root = ctx.out_dir / "natural-library"
    directory = BankDirectory(root)
    name = "library-" + hashlib.sha256("\x00".join(own).encode()).hexdigest()[:12]  # the books' banks name their text
    if directory.exists(name):
        bank = directory.open(name)
        if [d.title for d in bank.documents() if d.status == "complete"] == [Path(b).stem for b in books]:
            return bank
        bank.close()
        directory.delete(name)  # a library left unfinished: made again
    t0 = time.perf_counter()
    bank = directory.create(name, ctx.model)
    sources = BankDirectory(ctx.out_dir / "natural-banks")
    try:
        with bank.writing():
            for src_name in own:
                with sources.open(src_name) as src:
                    bank.copy_document(src, src.documents()[0].id)
            bank.sync_index()
    except BaseException:
        bank.close()  # left unfinished: the next run makes it again
        raise
    ctx.log(f"natural-library/{name}: {len(books)} books, {bank.stats()['tokens']:,} tokens "
            f"({time.perf_counter() - t0:.0f} s)")
    return bank


def _book(ctx: EvalContext, size: Size, book: str, questions: list[Question], entrants: Entrants, timer: Timer,
          library: tuple[Bank, object] | None = None) -> dict:
    """Every entrant's answers to ``book``'s questions whose evidence is in the book as cut: {"questions", "scores":
    entrant -> per-question scores, "reads": finder -> per-question gold read (answerable ones), "seconds"}; asked
    of the book's own bank, or of ``library`` (a bank holding it among others, and its memory)."""
    t0 = time.perf_counter()
    model = ctx.model
    out = {"questions": [], "scores": {k: [] for k in size.entrants},
           "reads": {f: [] for f in finders(size.entrants, size.finder)}}
    if library is None:
        bank = text_bank(ctx, "natural-banks", Path(book).stem, book_text(ctx, book, size.max_tokens),
                         Path(book).stem)
    else:
        bank = contextlib.nullcontext(library[0])
    with bank as bank:
        (doc,) = [d for d in bank.documents() if d.title == Path(book).stem] if library else bank.documents()[:1]
        stored = bank.document_text(doc.id)
        tokens = np.asarray(ctx.tokenizer(stored, add_special_tokens=False).input_ids)
        memory = bank.load_memory(model) if library is None else library[1]
        hay = indexed_haystack(bank, memory, tokens, entrants.embedder, stored)
        for q in questions:
            gold = gold_passages(bank, doc.id, stored, q) if q.answers else []
            if gold is None and not size.max_tokens:
                raise ValueError(f"{book}: the evidence of {q.question!r} is not in the book: {q.evidence!r}")
            if gold is None:  # cut off
                continue
            refs = bank.passages(gold)
            want = set(size.entrants) - ({"oracle", "oracle_backbone"} if not gold else set())
            reads = {f: [] for f in out["reads"]}
            at = stored.find(q.evidence) if q.answers else -1
            evidence = (at, at + len(q.evidence)) if at >= 0 else None
            asked = Asked(q.question, q.answers, [Found(r, 0.0) for r in refs],
                          lambda f, e=evidence, d=doc.id: e is not None and overlaps(f.passage, d, e), [], evidence)
            got = entrants.answers(want, asked, hay, reads)
            if q.answers:
                for f, r in reads.items():
                    out["reads"][f] += r
            out["questions"].append(q.question)
            for k in size.entrants:
                out["scores"][k].append({"id": f"{book}:{q.question}", "answerable": bool(q.answers),
                                         **(scored(got[k], q.answers) if k in got else {})})
            ctx.log(f"natural, {book}, question {len(out['questions'])}: "
                    + ", ".join(f"{k} {out['scores'][k][-1]['contains']:.0f}" for k in got)
                    + f" ({timer.seconds / 60:.1f} min)")
    out["seconds"] = time.perf_counter() - t0
    return out


def _rows(done: dict, names: list[str], k: str, answerable: bool | None = None) -> list[dict]:
    """Entrant ``k``'s scored answers over the units of sets ``names`` (those it answered; only the answerable or
    unanswerable questions when told)."""
    return [r for key, u in done.items() if key.split("/")[0] in names for r in u["scores"][k]
            if "contains" in r and (answerable is None or r["answerable"] == answerable)]


def _result(ctx: EvalContext, size: Size, done: dict, commits: list[str]) -> SuiteResult:
    names = list(dict.fromkeys(key.split("/")[0] for key in done))
    answerable = [n for n in names if any(r["answerable"] for k in done for r in done[k]["scores"][size.entrants[0]]
                                          if k.startswith(n + "/"))]
    unanswerable = [n for n in names if n not in answerable]
    results: dict = {}
    for k in size.entrants:
        results[k] = {n: summary(_rows(done, [n], k)) for n in names if _rows(done, [n], k)}
        if len(answerable) > 1 and _rows(done, answerable, k):
            results[k]["answerable"] = summary(_rows(done, answerable, k))
    columns = [n for n in [*answerable, "answerable" * (len(answerable) > 1), *unanswerable] if n]

    def count(n: str) -> int:
        return len(_rows(done, [n] if n != "answerable" else answerable, size.entrants[0]))

    header = ["entrant"] + [f"{n} ({count(n)})" for n in columns] + ["templates written"]
    rows = []
    for k, r in results.items():
        cells = [f"{r[n]['contains']:.0f} ± {r[n]['contains_ci95']:.0f}" if n in r else "" for n in columns]
        written = sum(template_wording(x["answer"]) is not None for x in _rows(done, names, k))
        rows.append([label(k, size.reader), *cells, str(written)])
    gold_read = {f: float(np.mean([x for u in done.values() for x in u["reads"][f]] or [np.nan]))
                 for f in finders(size.entrants, size.finder)}
    reads = table(["finder", "gold passage read (answerable questions)"],
                  [[f, f"{100 * v:.0f}%"] for f, v in gold_read.items()])
    outcomes = {k: reader_outcomes(done, answerable, unanswerable, k) for k in size.entrants}
    books = sorted({key.split("/", 1)[1] for key in done})
    notes = [f"Question sets {', '.join(names)}, each book whole in memory"
             + (f" (cut to its first {size.max_tokens:,} tokens)" if size.max_tokens else "")
             + (f", every question asked of one bank holding the {len(books)} books (a library, the book not named)"
                if size.library else "")
             + ". A cell: % of answers that contain an accepted answer (a question the book does not answer: % that "
             "say it does not), ± a 95% interval. Templates written: answers holding a training template's wording "
             "(``datasets.recall.template_wording``). The second table: the share of answerable questions with a "
             "gold passage among the passages read, per finder. The third: what a reader gets, in questions: right, "
             "told that the book does not say, or given a wrong answer (an answerable question answered wrongly, or "
             "an unanswerable one answered at all).", *_reader_note(ctx, size),
             *_targets(done, size, answerable, unanswerable)]
    seconds = sum(u["seconds"] for u in done.values())
    notes.append(f"Units run at {', '.join(commits)}; {seconds / 60:.1f} min of work in all.")
    return SuiteResult("natural", "Natural questions about whole books (beyond the paper): the book in memory, a "
                       "reader's question", [table(header, rows), reads, outcome_table(outcomes, size.reader)],
                       {"results": results, "gold_read": gold_read, "outcomes": outcomes,
                        "models": {k: label(k, size.reader) for k in results},
                        "questions": {key: u["questions"] for key, u in done.items()}},
                       asdict(size), [_plot(ctx, results, columns, size.reader)], notes, seconds)


def _reader_note(ctx: EvalContext, size: Size) -> list[str]:
    """Which model read, when another reader than the LongMem model's backbone answered (``Size.reader``)."""
    if not size.reader:
        return []
    from longmem.model.readers import label as reader_label

    return [f"Reader: {reader_label(size.reader)}. The app's entrants read with it, memory off (as the chat does with "
            f"another reader than the bank's model), and so do BM25-RAG, embedding RAG and the backbone's oracle; the "
            f"banks, their memory and LongMem's own entrants are {ctx.model.backbone.name}'s."]


def _declined(x: dict) -> bool:
    return not x["contains"] and (x.get("said") is False or bool(says_not_said(x["answer"])))


def _wrong(x: dict) -> bool:
    """An answer a reader is misled by: an answerable question answered wrongly, or an unanswerable one answered."""
    return not x["contains"] and (not x["answerable"] or not _declined(x))


def reader_outcomes(done: dict, answerable: list[str], unanswerable: list[str], k: str) -> dict:
    """What entrant ``k``'s answers gave a reader: on answerable questions right / says the book does not say /
    wrong; on unanswerable ones says so / invents an answer."""
    asked = _rows(done, answerable, k, answerable=True)
    right = sum(x["contains"] > 0 for x in asked)
    declined = sum(map(_declined, asked))
    none = _rows(done, unanswerable, k, answerable=False)
    honest = sum(x["contains"] > 0 for x in none)
    return {"answerable": len(asked), "right": right, "declined": declined, "wrong": len(asked) - right - declined,
            "unanswerable": len(none), "not_said": honest, "invented": len(none) - honest}


def outcome_table(outcomes: dict, reader: str = "") -> str:
    rows = []
    for k, o in outcomes.items():
        n, wrong = o["answerable"] + o["unanswerable"], o["wrong"] + o["invented"]
        rows.append([label(k, reader), str(o["right"]), str(o["declined"]), str(o["wrong"]),
                     *([str(o["not_said"]), str(o["invented"])] if o["unanswerable"] else ["", ""]),
                     f"{wrong} of {n} ({100 * wrong / n:.0f}%)" if n else ""])
    return table(["entrant", "answerable: right", "says the book does not say", "wrong",
                  "unanswerable: says so", "invents", "wrong answers given, of all asked"], rows)


def _paired(a: list[dict], b: list[dict], field_a: str = "contains", field_b: str = "contains") -> str:
    """'won vs lost (p = ...)' of two entrants over the same items (field "wrong": ``_wrong``)."""
    def values(rows: list[dict], f: str) -> list[float]:
        return [float(_wrong(x)) if f == "wrong" else x[f] for x in rows]

    won, lost = discordant(values(a, field_a), values(b, field_b))
    return f"{won} vs {lost} (sign test p = {sign_test(won, lost):.2f})"


def _targets(done: dict, size: Size, answerable: list[str], unanswerable: list[str]) -> list[str]:
    """The answers issue's targets, read off the run: answered against the oracle backbone and BM25-RAG, abstention
    and what it costs, and the full model against its backbone on the same passages."""
    me, notes = APP_ENTRANT, []
    if me not in size.entrants:
        return notes
    mine = _rows(done, answerable, me, answerable=True)
    right = sum(x["contains"] for x in mine)
    if mine and "oracle_backbone" in size.entrants:
        oracle = sum(x["contains"] for x in _rows(done, answerable, "oracle_backbone", answerable=True))
        notes.append(f"The app answers {right:.0f} of {len(mine)} answerable questions, "
                     f"{right / oracle if oracle else float('nan'):.2f}x the backbone's oracle ({oracle:.0f}; "
                     f"target >= {TARGET_OF_ORACLE}x).")
    if mine and "rag_bm25" in size.entrants:
        rag = _rows(done, answerable, "rag_bm25", answerable=True)
        points = 100 * (right - sum(x["contains"] for x in rag)) / len(mine)
        drafts = _paired(mine, rag, "draft_contains")
        notes.append(f"Against BM25-RAG: {points:+.1f} points (target >= +{TARGET_OVER_RAG:.0f}); paired, only the "
                     f"app / only BM25-RAG: {_paired(mine, rag)}. The app's drafts (the full model's whole answers "
                     f"without its check) against BM25-RAG: {drafts}.")
    if "rag_script" in size.entrants:
        script = _rows(done, answerable, "rag_script", answerable=True)
        names = [*answerable, *unanswerable]
        a, b = (_rows(done, names, k) for k in (me, "rag_script"))
        if mine:
            notes.append(f"Against the RAG script a user would write (the anchor): right {right:.0f} vs "
                         f"{sum(x['contains'] for x in script):.0f} of {len(mine)} (target: the script's"
                         f"{f' + {TARGET_OVER_SCRIPT}' if TARGET_OVER_SCRIPT else ' or more'}); paired, only the app "
                         f"/ only the script: {_paired(mine, script)}.")
        notes.append(f"Wrong answers given, of {len(a)} questions: the app {sum(map(_wrong, a))}, the RAG script "
                     f"{sum(map(_wrong, b))}.")
        shared = sum(bool(x.get("same_prompt")) for x in b)
        if shared:
            notes.append(f"The app read the script's prompt word for word, with the same reader, window and decoding, "
                         f"for {shared} of {len(b)} questions: the script's answer there is the app's draft, made "
                         f"once (``Entrants.decodes_as_script``).")
    checks = size.abstain > 0 or size.decline > 0 or size.sure > 0 or size.confirm > 0
    if mine and checks and any("draft_contains" in x for x in mine):
        drafted = sum(x["draft_contains"] for x in mine)
        lost = 100 * (drafted - right) / drafted if drafted else 0.0
        notes.append(f"Its check keeps {right:.0f} of the {drafted:.0f} answers its drafts got right: {lost:.0f}% lost "
                     f"(target <= {TARGET_LOST:.0f}%).")
    refused = [x for x in mine if not x.get("said", True) and "quoted_contains" in x]
    if refused:
        notes.append(f"Where it says that the book does not say about an answerable question ({len(refused)}), the "
                     f"sentences its closest passages are quoted by show an accepted answer for "
                     f"{sum(x['quoted_contains'] for x in refused):.0f}.")
    if "rag_bm25" in size.entrants:
        names = [*answerable, *unanswerable]
        a, b = (_rows(done, names, k) for k in (me, "rag_bm25"))
        notes.append(f"Wrong answers given (an answerable question answered wrongly, an unanswerable one answered at "
                     f"all), of {len(a)} questions: the app {sum(map(_wrong, a))}, BM25-RAG {sum(map(_wrong, b))}; "
                     f"paired, only BM25-RAG / only the app: {_paired(b, a, 'wrong', 'wrong') if a else ''}.")
    none = _rows(done, unanswerable, me, answerable=False)
    if none:
        said = 100 * float(np.mean([x["contains"] for x in none]))
        notes.append(f"On {len(none)} questions the books do not answer, the app says the book does not say for "
                     f"{said:.0f}% (target >= {TARGET_ABSTAINED:.0f}%).")
    return notes


def _plot(ctx: EvalContext, results: dict, columns: list[str], reader: str = "") -> str:
    keys = list(results)
    fig = figure(7.2, 0.5 * len(keys) * max(1, len(columns)) / 2 + 1.6)
    ax = fig.add_subplot()
    height = 0.8 / max(1, len(columns))
    y = np.arange(len(keys))[::-1]
    for i, n in enumerate(columns):
        vals = [results[k][n]["contains"] if n in results[k] else 0 for k in keys]
        errs = [results[k][n]["contains_ci95"] if n in results[k] else 0 for k in keys]
        ax.barh(y + (len(columns) / 2 - i - 0.5) * height, vals, height, xerr=errs, capsize=2, label=n)
    ax.set_yticks(y, [label(k, reader) for k in keys], fontsize=7)
    ax.set_xlabel("answers containing an accepted answer (unanswerable: saying the book does not say), %")
    ax.set_xlim(0, 100)
    legend_below(ax, ncol=2, gap=0.16)  # inside, it hid a strong reader's bars (Qwen2.5-Coder-0.5B's oracle)
    fig.tight_layout()
    path = Path(ctx.out_dir) / "natural.png"
    fig.savefig(path, bbox_inches="tight")
    return path.name
