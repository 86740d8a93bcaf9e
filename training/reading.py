"""Reading items: questions about a training book, asked the way the app's chat asks them, as training data.

Issue 42 (item 2) asks for a SideNet that reads excerpts at its own weight without writing its training templates:
trained on recall items ("Question: ... Answer: ..."), the shipped one writes their wording into answers unless the
frozen backbone's logits outweigh its own (``Reading.side_weight``, docs/design.md). An item here is what the app
reads and an answer to it:

  - a question about a training book, written from one of its passages picked at random by a question writer (by
    default Qwen2.5-Coder-0.5B-Instruct: the 135M backbone, asked for a question, copies the passage instead);
  - the app's reading prompt for it: the chat template around BM25's passages of that book and the question
    (``tasks.reading``; the passage the question was written from is among them for some items, not for others, as
    for a reader's questions);
  - the answer taught: the frozen backbone's own greedy answer reading that prompt (what BM25-RAG answers:
    ``tasks.answer`` without the check), or, with ``--answer-by writer``, where the question's passage is among those
    read, the question writer's one-sentence answer reading that passage alone (a teacher: the backbone's answers run
    on and invent; the writer's are short and taken from the passage). Where the passage is not read, the item
    keeps the backbone's answer; training can teach the app's "The book does not say." there instead
    (``python -m training --reading-unread not-said``).

``reading_documents`` turns items into training documents: the book's text up to the passage, segment by segment,
so that it is in memory, then a segment that opens with the prompt and the answer (the rest of it the book's text
again). The answer's tokens are weighted as recall answers are: the SideNet is taught to answer, with a book in
memory and its excerpts in the window, what its backbone (sequence-level distillation) or the writer answers,
beside the recall items that teach it to read facts out of memory. Items are written once (each takes two models'
generations) and reused (``python -m training --reading-items FILE``):

    python -m training.reading --out runs/reading-items.jsonl --books 6 --per-book 25
    python -m training.reading --out runs/reading-items-w.jsonl --books 12 --per-book 25 --answer-by writer

The books of the team's own question sets (``longmem/eval/data``: the tuning sets and those kept aside) are left
out, so that the choices measured on them stay measured on questions about books the items never asked about; the
test-split books are never used.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from longmem.eval.datasets.books import Document

QUESTION_WRITER = "qwen2.5-coder-0.5b"  # a backbone name ``longmem models`` knows
ASK = "Write one question about a fact in this passage of a novel. Write only the question."
ANSWER_ASK = "Answer the question in one short sentence, from the passage only."  # the writer as a teacher
ANSWER_BY = ("backbone", "writer")  # who writes an item's answer (``--answer-by``)
UNREAD = ("answer", "not-said")  # what training teaches where the question's passage is not read (``--reading-unread``)
MIN_PASSAGE_CHARS = 400  # shorter passages (headings, a line of dialogue) give no question worth asking


@dataclass
class ReadingItem:
    """One question about a book, the app's prompt for it and the answer taught (token ids of the backbone whose
    fingerprint is ``backbone``)."""

    book: str  # file name under books/
    question: str
    position: float  # where the passage the question was written from ends, as a fraction of the book's text
    prompt_ids: list[int]  # the app's reading prompt (chat template, excerpts, question), as the model reads it
    answer_ids: list[int]  # the answer taught, then the end-of-turn token unless it was cut off
    answer: str
    source_read: bool  # whether the passage the question was written from is among the passages read
    backbone: str  # ``Backbone.fingerprint()`` of the model the ids belong to
    answered_by: str = "backbone"  # "backbone" (its greedy answer to the prompt) or "writer" (ANSWER_BY)

    @staticmethod
    def from_json(line: str) -> ReadingItem:
        return ReadingItem(**json.loads(line))


def read_items(path: Path, backbone: str | None = None) -> list[ReadingItem]:
    """The items of a JSONL file written by ``build``; a cut last line (an interrupted write) is skipped. Raises
    ValueError naming the line for any other line that is not an item, and, given ``backbone`` (a fingerprint), for
    an item whose token ids belong to another backbone."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    items = []
    for n, line in enumerate(lines, 1):
        try:
            item = ReadingItem.from_json(line)
        except (json.JSONDecodeError, TypeError) as e:
            if n == len(lines):
                break
            raise ValueError(f"{path}, line {n}: not a reading item ({e})") from None
        if backbone is not None and item.backbone != backbone:
            raise ValueError(f"{path}, line {n}: its token ids are another backbone's (fingerprint "
                             f"{item.backbone[:12]}..., the model's {backbone[:12]}...)")
        items.append(item)
    return items


def end_position(passage) -> float:
    """Where ``passage`` ends, as a fraction of its book's text: an item's ``position``, by which a run knows the
    passages already asked about."""
    return passage.char_end / max(1, passage.document_chars)


def question_from(text: str) -> str | None:
    """The question in a writer's reply: its first line if it is one question of 4 to 40 words, else None."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines:
        return None
    q = lines[0].strip('"“” ')
    if not q.endswith("?") or q.count("?") != 1 or not 4 <= len(q.split()) <= 40:
        return None
    return q


def reading_documents(items: list[ReadingItem], books: dict[str, Document], segment_len: int,
                      context_segments: int, unread: list[int] | None = None) -> list[Document]:
    """Training documents of ``items`` (see the module doc): ``context_segments`` segments of the book ending near the
    item's passage (it is in memory), then one segment: the prompt, the answer, and the book's following tokens to
    fill it. The answer's tokens are the document's ``answers`` (the loss weighs them by ``--answer-weight``, as it
    does recall answers: the item's answer, taught as a sequence); ``unread``: token ids taught instead where the
    question's passage is not among those read (``ReadingItem.source_read``; None: the item's own answer). Items whose
    book is not in ``books``, whose book is too short, or whose prompt and answer pass ``segment_len`` are left out."""
    if context_segments < 0:
        raise ValueError(f"context_segments must be >= 0, got {context_segments}")
    out = []
    for i, item in enumerate(items):
        book = books.get(item.book)
        answer_ids = item.answer_ids if unread is None or item.source_read else list(unread)
        head = item.prompt_ids + answer_ids
        if book is None or len(head) > segment_len:
            continue
        ids = book.ids
        context = context_segments * segment_len
        fill = segment_len - len(head)
        if len(ids) < context + fill:
            continue
        end = min(max(int(item.position * len(ids)) + segment_len // 4, context), len(ids) - fill)
        doc = np.concatenate([ids[end - context:end], np.asarray(head, dtype=ids.dtype), ids[end:end + fill]])
        answers = np.zeros(len(doc), dtype=bool)  # the backbone's answer: weighted as recall answers are
        answers[context + len(item.prompt_ids):context + len(head)] = True
        out.append(Document(f"reading-{i}", doc, answers))
    return out


def asked_books() -> set[str]:
    """The books the team's own question sets ask about (``longmem.eval.natural.TUNE_SETS``, ``ASIDE_SETS`` and
    ``FRESH_SETS``, the package's ``eval/data``): no reading item is made from them. A set the package lacks raises
    FileNotFoundError naming it."""
    from longmem.eval import natural

    books: set[str] = set()
    for name in natural.TUNE_SETS + natural.ASIDE_SETS + natural.FRESH_SETS:
        path = natural.package_set_path(name)
        if path is None:  # a packaging fault: every book of every set must stay out of the items
            raise FileNotFoundError(f"question set {name!r} is missing from the package's eval/data")
        books |= {q.book for q in natural.read_questions(path)}
    return books


def answer_from(text: str) -> str | None:
    """The answer in a teacher's reply: its first line if it has words and is not cut off mid-sentence, else None."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if not lines or not lines[0].endswith((".", "!", "?", '"', "”", "'", ")")):
        return None
    return lines[0]


def _writer_reply(writer, content: str, max_new_tokens: int) -> str:
    """``writer``'s greedy reply to one user turn (its chat template)."""
    import torch

    tok = writer.tokenizer
    msgs = [{"role": "user", "content": content}]
    x = tok(tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False), return_tensors="pt",
            add_special_tokens=False).input_ids.to(writer.device)
    with torch.no_grad():
        y = writer.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                  do_sample=False, pad_token_id=tok.eos_token_id)
    return tok.decode(y[0, x.shape[1]:], skip_special_tokens=True)


def write_question(writer, passage: str) -> str | None:
    """A question about ``passage`` by the ``writer`` backbone (greedy, the chat template), or None when its reply is
    not one question (``question_from``)."""
    return question_from(_writer_reply(writer, f"{ASK}\n\n{passage}", 40))


def write_answer(writer, passage: str, question: str) -> str | None:
    """The ``writer`` backbone's one-sentence answer to ``question`` reading ``passage`` alone (greedy), or None when
    its reply is not one complete line (``answer_from``)."""
    return answer_from(_writer_reply(writer, f"{passage}\n\nQuestion: {question}\n{ANSWER_ASK}", 48))


def reading_item(model, finder, book: str, question: str, source, teacher=None) -> ReadingItem | None:
    """``question`` as the app asks it of ``finder``'s bank (lexical finding, ``model``'s reading prompt) and the answer
    taught: the frozen backbone's own, read without the app's check (BM25-RAG's answer), or, given a ``teacher``
    backbone and ``source`` (the passage the question was written from) among the passages read, the teacher's answer
    reading ``source`` alone (``write_answer``; the backbone's when the teacher's reply is not one). None when nothing
    is found or nothing is answered."""
    from longmem.model.baselines import BackboneLM
    from longmem.tasks.answer import answer, answer_sampling
    from longmem.tasks.chat import Chat
    from longmem.tasks.reading import Reading, find_for_chat, reading_prompt

    sampling, reading = answer_sampling(), Reading(finder="lexical", abstain=0.0)
    chat = Chat(BackboneLM(model.backbone, model.segment_len), None, sampling)
    found = find_for_chat(finder, chat, question, reading)  # what ``answer`` reads
    source_read = any(f.passage.id == source.id for f in found)
    text, by = None, "backbone"
    if teacher is not None and source_read:
        text, by = write_answer(teacher, source.text, question), "writer"
    if text is None:
        reply = answer(chat, finder, question, reading)
        text, by, found = "".join(reply).strip(), "backbone", reply.found
    if not found or not text:
        return None
    tok = model.backbone.tokenizer
    prompt = chat.prompt_ids(question, reading_prompt(question, found), history=False)[0].tolist()
    answer_ids = tok(text, add_special_tokens=False).input_ids
    if tok.eos_token_id is not None and (by == "writer" or len(answer_ids) < sampling.max_new_tokens):  # it ended
        answer_ids.append(tok.eos_token_id)
    return ReadingItem(book, question, end_position(source), prompt, answer_ids, text, source_read,
                       model.backbone.fingerprint(), by)


def book_items(model, writer, bank, book: str, want: int, seed: int, asked: set[float] = frozenset(),
               answer_by: str = "backbone") -> Iterator[ReadingItem]:
    """Up to ``want`` items about ``bank``'s book (named ``book``), questions written by the ``writer`` backbone from
    its passages in a random order (``seed``), skipping passages under ``MIN_PASSAGE_CHARS`` and those whose
    ``ReadingItem.position`` is in ``asked`` (an earlier, interrupted run's); answered by ``answer_by`` (ANSWER_BY:
    "writer" teaches the writer's answer where the passage is read, ``reading_item``)."""
    if answer_by not in ANSWER_BY:
        raise ValueError(f"answer_by must be one of {ANSWER_BY}, not {answer_by!r}")
    from longmem.tasks.reading import PassageFinder

    finder = PassageFinder(bank, model, bank.load_memory(model))
    passages = bank.passage_texts()
    made = 0
    for i in random.Random(f"{seed}-{book}").sample(range(len(passages)), len(passages)):
        if made == want:
            return
        if len(passages[i][1]) < MIN_PASSAGE_CHARS:
            continue
        source = bank.passages([passages[i][0]])[0]
        if end_position(source) in asked:
            continue
        question = write_question(writer, source.text)
        item = question and reading_item(model, finder, book, question, source,
                                         writer if answer_by == "writer" else None)
        if item is not None:
            made += 1
            yield item


def build(args) -> int:
    """Write ``args.per_book`` items for each of ``args.books`` training books to ``args.out`` (JSONL, appended;
    the items already there are kept and their passages not asked about again, so an interrupted run continues)."""
    from tqdm import tqdm

    from longmem.ingest import ingest
    from longmem.model.backbone import load_backbone
    from longmem.model.longmem import LongMemConfig, LongMemModel
    from longmem.storage import BankDirectory

    from .data import book_split

    model = LongMemModel.from_config(LongMemConfig(backbone=args.backbone, dtype=args.dtype)).eval()
    writer = load_backbone(args.writer, args.dtype)
    skip = asked_books()
    train, _ = book_split(args.data)
    books = [p for p in train if p.name not in skip]
    random.Random(args.seed).shuffle(books)
    out = Path(args.out)
    asked: dict[str, set[float]] = {}
    for item in read_items(out, model.backbone.fingerprint()) if out.exists() else []:
        asked.setdefault(item.book, set()).add(item.position)
    directory = BankDirectory(Path(args.banks))
    with out.open("a", encoding="utf-8") as f:
        for path in books[: args.books]:
            want = args.per_book - len(asked.get(path.name, ()))
            if want <= 0:
                continue
            with (directory.open(path.stem) if directory.exists(path.stem)
                  else directory.create(path.stem, model)) as bank:
                ingest(bank, model, path)
                items = book_items(model, writer, bank, path.name, want, args.seed, asked.get(path.name, set()),
                                   args.answer_by)
                for item in tqdm(items, total=want, desc=path.name, file=sys.stderr):
                    f.write(json.dumps(asdict(item)) + "\n")
                    f.flush()
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from longmem.util.data import add_data_flag

    p = argparse.ArgumentParser(prog="python -m training.reading", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSONL file of items (appended to; a book's items there are kept)")
    p.add_argument("--banks", default="runs/reading-banks", help="where the training books' banks are made")
    p.add_argument("--books", type=int, default=6,
                   help="training books asked about (not the books of the team's question sets)")
    p.add_argument("--per-book", type=int, default=25, help="items per book")
    p.add_argument("--backbone", default="default", help="the model whose backbone answers (as in training)")
    p.add_argument("--writer", default=QUESTION_WRITER, help="the backbone that writes the questions")
    p.add_argument("--answer-by", choices=ANSWER_BY, default="backbone",
                   help="the answer taught: the backbone's own reading the prompt, or the writer's reading the "
                        "question's passage alone where that passage is among those read")
    p.add_argument("--dtype", default="auto", help="auto, bfloat16 or float32")
    p.add_argument("--seed", type=int, default=0, help="which books and passages")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    add_data_flag(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from longmem.model.cpu import setup_cpu

    args = parse_args(argv)
    setup_cpu(args.threads)
    return build(args)


if __name__ == "__main__":
    sys.exit(main())
