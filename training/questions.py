"""Finder questions: questions in a reader's words about passages of the training books, each with the passage it was
written from, to train and measure a finder (issue 70).

A reader asks "Who shot Gatsby?" where the book says "the gardener saw Wilson's body": the words BM25 matches are not
there. A finder learns to bridge that only from questions written the way readers write them, about the passages
that answer them. Promptagator (Dai et al., ICLR 2023) wrote such questions with an LLM shown a handful of a task's own
questions; here the best reader we have (``QUESTION_WRITER``, run in 4 bits on the CPU) is asked, for one passage,
for a question a reader of the book might ask that the passage answers, about who did what, to whom, where or why,
in the reader's words rather than the passage's, with its answer in a few of the passage's words. Shown examples of
the team's own questions (``EXAMPLES``, ``SHOWN``), the 1.5B copied them, so by default it is shown none
(docs/history/notes-issue-70.md).

A record (one JSON line) names the passage by its book and its character span in the book's file (``cut_passages``
of its text, the cutter a bank uses), and the writer by name and fingerprint, so the set is data that any later run
can read without the writer:

    {"book": "pg61221.txt", "start": 1234, "end": 2101, "question": "...", "answer": "...", "writer": "...",
     "writer_id": "...", "prompt": 1}

A reply that is not one question and an answer (``parse_reply``), or whose answer's words the passage does not hold
(``grounded``), is kept as a record with ``question`` null and ``why`` set, so that a resumed run does not ask about
that passage again. The writer is never shown the books of the team's question sets (``training.reading.asked_books``)
nor a test-split book. Runs append and resume (``--out``); passages are asked about book by book in turns, so a run
cut short still covers every book:

    python -m training.questions --out training/sets/finder-questions.jsonl --per-book 120
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

QUESTION_WRITER = "qwen2.5-coder-1.5b"  # a backbone name ``longmem models`` knows: the best reader we have
PROMPT_VERSION = 1  # bumped whenever ``EXAMPLES`` or ``ASK`` change: a record says which prompt wrote it
EXAMPLES = (  # readers' questions from the team's tuning sets (``longmem/eval/data/natural-tune*.jsonl``)
    "Who came upon Crispin Senior's broken body while walking up to his morning work?",
    "How much did Hash Todhunter pay for the dog Amy?",
    "What did Waldo drop on the cave man who had crept to within five feet of the ledge?",
    "Which member of the crew, who played the bass drum, was infatuated with Julie and fought Steve?",
    "Where did Devizes first meet Christina Alberta's mother?",
    "How was Lord Roxton wounded in East Africa during the war?",
    "What false name does Soapy Molloy use when he calls at Mon Repos pretending to be Dolly's father?",
    "Why did Billson hold back and lose his fight at Wonderland?",
    "Whom does Devizes abruptly decide to marry?",
    "What was the surname of the bankrupt Irish squire whose daughter Commander Blair fell in love with?",
    "To whom was the locket in the package inscribed?",
    "At the market, what animal did Julian 9th wrestle to the ground to save a child?",
    "What weapon did Herrick Crispin use to kill himself beside his father's body?",
    "Where were Waldo and Nadara married?",
    "Whom was Nadara actually aiming at when her stone struck Waldo?",
    "What is the name of the haunted house in Dorsetshire?",
    "Whom did Sergeant Gray's former sweetheart marry, according to her telegram?",
    "Which pilot brought the new Cotton Blossom to safety through the flood when Kim was born?",
    "What was the name of Doc's old black-and-white terrier?",
    "Where did Speed and Helen stay on their honeymoon?",
    "Why did Preemby buy a flat-paper planisphere on Kingsway?",
    "Whom did the general send Tommy to telephone so the spies could be caught?",
    "What is the rescue-circle medium Terbane's job?",
    "What killed Nagoola after he leapt on Waldo at the top of the ravine?",
)
SHOWN = 0  # examples shown with each passage, drawn from ``EXAMPLES`` by the passage (0: none; the 1.5B copied
#            them: docs/history/notes-issue-70.md)
ASK = ("Write one question that a reader of this book might ask and that this passage answers. Ask about something "
       "a person in the story did, or about a place, a thing or a reason, and name the people involved. Use your own "
       "words, not the passage's, and do not mention the passage. Reply in two lines: \"Question:\" and the "
       "question, then \"Answer:\" and its answer in a few words from the passage.")
MIN_PASSAGE_CHARS = 400  # shorter passages (headings, a line of dialogue) give no question worth asking
MAX_NEW_TOKENS = 48  # a question and a short answer
_STEM = re.compile(r"\w+")
_ABOUT_TEXT = re.compile(r"\b(passage|excerpt|text|author|theme)s?\b", re.IGNORECASE)  # a question about the page,
#                                                                                     not about the story


@dataclass
class FinderQuestion:
    """One record of the set (see the module doc); ``question`` None: the writer's reply was not kept (``why``)."""

    book: str  # file name under books/
    start: int  # the passage: characters start..end of the book's file text
    end: int
    question: str | None
    answer: str | None
    writer: str  # the writer's name (``QUESTION_WRITER``)
    writer_id: str  # ``Backbone.fingerprint()`` of the writer, cut to 16 characters
    prompt: int = PROMPT_VERSION
    why: str | None = None  # why the reply was not kept (None when it was)

    @property
    def kept(self) -> bool:
        return self.question is not None


def read_questions(path: Path) -> list[FinderQuestion]:
    """The records of a JSONL file written by ``build``; a cut last line (an interrupted write) is skipped. Raises
    ValueError naming the line for any other line that is not a record."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    out = []
    for n, line in enumerate(lines, 1):
        try:
            out.append(FinderQuestion(**json.loads(line)))
        except (json.JSONDecodeError, TypeError) as e:
            if n == len(lines):
                break
            raise ValueError(f"{path}, line {n}: not a finder question ({e})") from None
    return out


def prompt_for(passage: str, seed: str = "") -> str:
    """The writer's user turn for ``passage``: the passage, then the request (``ASK``); with ``SHOWN`` > 0, that many
    of the examples (drawn by ``seed``: a passage's own examples are the same in every run)."""
    shown = random.Random(f"examples-{seed}").sample(EXAMPLES, SHOWN) if SHOWN else []
    examples = "".join(f"- {q}\n" for q in shown)
    examples = f"Readers ask questions like these about other books:\n{examples}\n" if shown else ""
    return f"Here is a passage of a book:\n\n{passage}\n\n{examples}{ASK}"


def parse_reply(text: str) -> tuple[str, str] | None:
    """(question, answer) from a writer's reply "Question: ...\\nAnswer: ...", or None when it is not one question of
    4 to 40 words ending in "?" and an answer of 1 to 30 words."""
    q = a = None
    for line in (s.strip() for s in text.strip().splitlines()):
        low = line.lower()
        if q is None and low.startswith("question:"):
            q = line[len("question:"):].strip().strip('"“” ')
        elif q is not None and a is None and low.startswith("answer:"):
            a = line[len("answer:"):].strip().strip('"“” ').rstrip(".")
    if not q or not a or not q.endswith("?") or q.count("?") != 1 or not 4 <= len(q.split()) <= 40:
        return None
    if not 1 <= len(a.split()) <= 30:
        return None
    return q, a


def grounded(answer: str, passage: str) -> bool:
    """Whether most of ``answer``'s words (at least half, case and punctuation aside) are words of ``passage``: an
    answer the writer did not take from the passage is one it made up, and so may be its question."""
    words = _STEM.findall(answer.lower())
    have = set(_STEM.findall(passage.lower()))
    return bool(words) and sum(w in have for w in words) * 2 >= len(words)


def copies_example(question: str) -> bool:
    """Whether ``question`` is mostly one of ``EXAMPLES``: at least half of its content words (stopwords aside) are
    content words of one of them. The writer copied what it was shown, not the passage."""
    from longmem.storage.passages import STOPWORDS

    def content(text: str) -> list[str]:
        return [w for w in _STEM.findall(text.lower()) if w not in STOPWORDS]

    words = content(question)
    return bool(words) and any(sum(w in set(content(e)) for w in words) * 2 >= len(words) for e in EXAMPLES)


def book_passages(text: str) -> list[tuple[int, int, str]]:
    """The passages of a book's text a question may be written from: (start, end, text), at least
    ``MIN_PASSAGE_CHARS`` long, cut as a bank cuts them (``longmem.text.passages.cut_passages``)."""
    from longmem.text.passages import cut_passages

    return [(s.start, s.end, s.text) for s in cut_passages(text) if len(s.text) >= MIN_PASSAGE_CHARS]


def write_batch(writer, prompts: list[str], max_new_tokens: int = MAX_NEW_TOKENS) -> list[str]:
    """The ``writer`` backbone's greedy replies to user turns ``prompts`` (``prompt_for``), generated together (rows
    padded on the left; decoding a few rows costs about what one does on a CPU)."""
    import torch

    tok = writer.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    if pad is None:
        raise ValueError("the writer's tokenizer has neither a padding nor an end-of-text token to pad rows with")
    rows = [tok(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False),
                add_special_tokens=False).input_ids for p in prompts]
    width = max(map(len, rows))
    ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows])  # (B, T), padded on the left
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    with torch.no_grad():
        y = writer.model.generate(ids.to(writer.device), attention_mask=mask.to(writer.device),
                                  max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=pad)
    return [tok.decode(row[width:], skip_special_tokens=True) for row in y]



def record(book: str, span: tuple[int, int, str], reply: str, writer: str, writer_id: str) -> FinderQuestion:
    """The record of ``reply``, written from passage ``span`` of ``book``: kept, or not with its reason."""
    start, end, text = span
    parsed = parse_reply(reply)
    if parsed is None:
        return FinderQuestion(book, start, end, None, None, writer, writer_id, why="not a question and an answer")
    q, a = parsed
    if _ABOUT_TEXT.search(q):
        return FinderQuestion(book, start, end, None, a, writer, writer_id, why="asks about the passage")
    if SHOWN and copies_example(q):  # examples shown may be copied
        return FinderQuestion(book, start, end, None, a, writer, writer_id, why="copies an example")
    if not grounded(a, text):
        return FinderQuestion(book, start, end, None, a, writer, writer_id, why="answer not in the passage")
    return FinderQuestion(book, start, end, q, a, writer, writer_id)


def training_books(data_dir: Path) -> list[Path]:
    """The training-split books a question may be written about: not the test split, not the books of the team's
    question sets (``training.reading.asked_books``)."""
    from longmem.eval.datasets.books import book_split

    from .reading import asked_books

    skip = asked_books()
    train, _ = book_split(data_dir)
    return [p for p in train if p.name not in skip]


def plan(books: list[Path], per_book: int, seed: int, done: set[tuple[str, int]]) -> list[tuple[str, tuple]]:
    """The passages still to ask about, (book name, span), taking the books in turns (each book's passages in a
    random order by ``seed``, at most ``per_book`` of them counting those already ``done``: (book, start))."""
    queues = []
    for path in books:
        spans = book_passages(path.read_text(encoding="utf-8"))
        random.Random(f"{seed}-{path.name}").shuffle(spans)
        spans = spans[:per_book]
        queues.append([(path.name, s) for s in spans if (path.name, s[0]) not in done])
    out = []
    for i in range(max((len(q) for q in queues), default=0)):
        out += [q[i] for q in queues if i < len(q)]
    return out


def build(args) -> int:
    """Append records to ``args.out`` until every book has ``args.per_book`` passages asked about, or ``args.minutes``
    have passed (0: no limit); an interrupted run continues where it stopped."""
    from tqdm import tqdm

    from longmem.model.backbone import load_backbone

    out = Path(args.out)
    done = {(r.book, r.start) for r in read_questions(out)} if out.exists() else set()
    todo = plan(training_books(Path(args.data)), args.per_book, args.seed, done)
    if args.limit:
        todo = todo[: args.limit]
    if not todo:
        print(f"{out}: every passage planned is asked about", file=sys.stderr)
        return 0
    writer = load_backbone(args.writer, args.dtype)
    writer_id = writer.fingerprint()[:16]
    out.parent.mkdir(parents=True, exist_ok=True)
    t0, kept = time.monotonic(), 0
    with out.open("a", encoding="utf-8") as f, tqdm(total=len(todo), desc="passages", file=sys.stderr) as bar:
        for i in range(0, len(todo), args.batch):
            rows = todo[i:i + args.batch]
            replies = write_batch(writer, [prompt_for(span[2], f"{book}:{span[0]}") for book, span in rows])
            for (book, span), reply in zip(rows, replies):
                r = record(book, span, reply, args.writer, writer_id)
                kept += r.kept
                f.write(json.dumps(asdict(r), ensure_ascii=False) + "\n")
            f.flush()
            bar.update(len(rows))
            bar.set_postfix(kept=kept)
            if args.minutes and time.monotonic() - t0 > args.minutes * 60:
                break
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from longmem.util.data import add_data_flag

    p = argparse.ArgumentParser(prog="python -m training.questions", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSONL file of records (appended to; passages there are not asked "
                                                "about again)")
    p.add_argument("--per-book", type=int, default=120, help="passages asked about per training book")
    p.add_argument("--writer", default=QUESTION_WRITER, help="the backbone that writes the questions")
    p.add_argument("--batch", type=int, default=8, help="passages whose questions are generated together")
    p.add_argument("--minutes", type=float, default=0.0, help="stop after the batch that passes this (0: no limit)")
    p.add_argument("--limit", type=int, default=0, help="ask about at most this many passages this run (0: all)")
    p.add_argument("--dtype", default="auto", help="auto, bfloat16 or float32")
    p.add_argument("--seed", type=int, default=0, help="which passages")
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
