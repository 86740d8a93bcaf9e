"""Suite 9, natural questions about whole books (beyond the paper): what a user does with the product. A whole book
goes into a bank, then a reader's question is asked about it ("In which town do the Forresters live?"), answered by
every entrant of ``longmem.eval.answering`` on the same questions.

Data: ``bookqa/natural-dev.jsonl`` in the shared data (24 questions about two held-out books, each with its accepted
answers and the book's own words that state it, the *evidence*). Unlike the SQuAD questions of ``bookqa``, these are
worded as a reader asks, not copied from the paragraph, so finding the passage is part of the test.

Each book is ingested once into a bank under the output folder (kept and reused by later runs). A passage read is
gold when it overlaps the evidence; the oracles read the gold passages alone. Each book's questions are one recorded
work unit (``--resume``). The set is small: the table gives 95% intervals, and it is for seeing how real questions
fare, not for tuning on.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from longmem.eval.answering import (LABELS, Asked, Reader, ReadingSize, finders, indexed_haystack, reader_for,
                                    scored, summary, text_bank, versus_notes)
from longmem.eval.compare import discordant
from longmem.eval.core import EvalContext, SuiteResult, Timer, figure, table
from longmem.storage.bank import Bank
from longmem.tasks.reading import Found


@dataclass
class Size(ReadingSize):
    """The suite's items (and how every entrant reads: ``ReadingSize``)."""

    questions: int = 0  # questions asked, in file order (0: all)
    max_tokens: int = 0  # each book cut to its first tokens (0: whole); questions whose evidence is cut are left out


QUICK = Size(questions=2, max_tokens=2048)
FULL = Size()


@dataclass(frozen=True)
class Question:
    """One line of ``natural-dev.jsonl``."""

    book: str  # file in the data's books/
    question: str
    answers: tuple[str, ...]
    evidence: str  # the book's words that state the answer, verbatim


def read_questions(path: Path) -> list[Question]:
    """The questions of ``path`` (JSON lines), with a clear error for a malformed line."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            q = Question(row["book"], row["question"], tuple(row["answers"]), row["evidence"])
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"{path}, line {n}: not a natural question ({e})") from None
        if not q.answers or not q.evidence:
            raise ValueError(f"{path}, line {n}: a question needs answers and evidence")
        out.append(q)
    return out


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


def run(ctx: EvalContext) -> SuiteResult:
    size: Size = ctx.size("natural", QUICK, FULL)
    if size.questions < 0 or size.max_tokens < 0:
        raise ValueError("natural.questions and natural.max_tokens must be >= 0 (0: all, whole books)")
    timer = Timer()
    reader = reader_for(ctx, size, "natural")
    questions = read_questions(ctx.data_dir / "bookqa" / "natural-dev.jsonl")
    units = ctx.task_log("natural", size)  # a unit: one book's questions
    done, asked_n = {}, 0
    for book in dict.fromkeys(q.book for q in questions):  # in file order
        if size.questions and asked_n >= size.questions:
            break
        done[book] = units.get(book)
        if done[book] is None:
            done[book] = _book(ctx, size, book, [q for q in questions if q.book == book],
                               size.questions - asked_n if size.questions else 0, reader, timer)
            units.put(book, done[book])
        asked_n += len(done[book]["questions"])
    if not asked_n:
        raise ValueError("natural: no question's evidence lies within the books as cut (natural.max_tokens)")
    return _result(ctx, size, done, units.commits())


def _book(ctx: EvalContext, size: Size, book: str, questions: list[Question], most: int, reader: Reader,
          timer: Timer) -> dict:
    """Every entrant's answers to ``book``'s questions (at most ``most``; 0: all) whose evidence is in the book as
    cut: {"questions", "scores": entrant -> per-question scores, "reads": finder -> per-question gold read,
    "seconds"}."""
    t0 = time.perf_counter()
    model, want = ctx.model, set(size.entrants)
    text = book_text(ctx, book, size.max_tokens)
    out = {"questions": [], "scores": {k: [] for k in size.entrants}, "reads": {f: [] for f in finders(size.entrants)}}
    with text_bank(ctx, "natural-banks", Path(book).stem, text, Path(book).stem) as bank:
        doc = bank.documents()[0]
        stored = bank.document_text(doc.id)
        tokens = np.asarray(ctx.tokenizer(stored, add_special_tokens=False).input_ids)
        hay = indexed_haystack(bank, bank.load_memory(model), tokens, reader.embedder)
        for q in questions:
            gold = gold_passages(bank, doc.id, stored, q)
            if gold is None and not size.max_tokens:
                raise ValueError(f"{book}: the evidence of {q.question!r} is not in the book: {q.evidence!r}")
            if gold is None:  # cut off
                continue
            if most and len(out["questions"]) >= most:
                break
            refs = bank.passages(gold)
            asked = Asked(q.question, q.answers, [Found(r, 0.0) for r in refs],
                          lambda f, g=frozenset(gold): f.passage.id in g, [])
            got = reader.answers(want, asked, hay, out["reads"])
            out["questions"].append(q.question)
            for k in size.entrants:
                out["scores"][k].append({"id": f"{book}:{q.question}", **scored(got[k], q.answers)})
            ctx.log(f"natural, {book}, question {len(out['questions'])}: answered: "
                    + ", ".join(f"{k} {out['scores'][k][-1]['contains']:.0f}" for k in size.entrants)
                    + f" ({timer.seconds / 60:.1f} min)")
    out["seconds"] = time.perf_counter() - t0
    return out


def _result(ctx: EvalContext, size: Size, done: dict, commits: list[str]) -> SuiteResult:
    books = list(done)
    results = {k: {"all": summary([r for u in done.values() for r in u["scores"][k]]),
                   **{b: summary(done[b]["scores"][k]) for b in books}} for k in size.entrants}
    n = len(results[size.entrants[0]]["all"]["items"])
    header = ["model", f"all {n}: answered / EM / F1"] + [f"{Path(b).stem} ({len(done[b]['questions'])})"
                                                          for b in books]
    rows = [[LABELS[k], f"{r['all']['contains']:.0f} ± {r['all']['contains_ci95']:.0f} / {r['all']['em']:.0f} / "
                        f"{r['all']['f1']:.1f}", *[f"{r[b]['contains']:.0f}" for b in books]]
            for k, r in results.items()]
    gold_read = {f: float(np.mean([x for u in done.values() for x in u["reads"][f]])) for f in finders(size.entrants)}
    reads = table(["finder", "gold passage read"], [[f, f"{100 * v:.0f}%"] for f, v in gold_read.items()])
    avg = {k: r["all"]["contains"] for k, r in results.items()}
    notes = [f"{n} questions from bookqa/natural-dev.jsonl, each book whole in memory"
             + (f" (cut to its first {size.max_tokens:,} tokens)" if size.max_tokens else "")
             + ". Answered: % of answers that contain an accepted answer (± a 95% interval); then SQuAD EM and F1, "
             "in %. A gold passage overlaps the book's words that state the answer. The second table: the share of "
             "questions with a gold passage among the passages read, per finder.", *versus_notes(avg)]
    items = {k: r["all"]["items"] for k, r in results.items()}
    for a, b in (("longmem_lexical", "longmem_fused"), ("longmem_lexical", "rag_bm25"), ("longmem_fused", "rag_bm25")):
        if {a, b} <= items.keys():
            won, lost = discordant([x["contains"] for x in items[a]], [x["contains"] for x in items[b]])
            notes.append(f"Paired, {a} vs {b}: {won} questions answered only by the first, {lost} only by the second.")
    if set(results) != set(LABELS):
        notes.append(f"Entrants run: {', '.join(results)} (natural.entrants).")
    seconds = sum(u["seconds"] for u in done.values())
    notes.append(f"Books run at {', '.join(commits)}; {seconds / 60:.1f} min of work in all.")
    return SuiteResult("natural", "Natural questions about whole books (beyond the paper): the book in memory, a "
                       "reader's question", [table(header, rows), reads],
                       {"results": results, "gold_read": gold_read, "models": {k: LABELS[k] for k in results},
                        "questions": {b: u["questions"] for b, u in done.items()}},
                       asdict(size), [_plot(ctx, results)], notes, seconds)


def _plot(ctx: EvalContext, results: dict) -> str:
    keys = list(results)
    fig = figure(6.4, 0.45 * len(keys) + 1.2)
    ax = fig.add_subplot()
    y = np.arange(len(keys))[::-1]
    ax.barh(y, [results[k]["all"]["contains"] for k in keys], xerr=[results[k]["all"]["contains_ci95"] for k in keys],
            color=["tab:gray" if k.startswith(("oracle", "rag", "backbone")) else "tab:blue" for k in keys],
            capsize=3)
    ax.set_yticks(y, [LABELS[k] for k in keys], fontsize=8)
    ax.set_xlabel("answers containing an accepted answer, % (95% interval)")
    ax.set_xlim(0, 100)
    fig.tight_layout()
    path = Path(ctx.out_dir) / "natural.png"
    fig.savefig(path, bbox_inches="tight")
    return path.name
