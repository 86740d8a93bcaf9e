"""Train the passage reranker (``longmem.model.reranker``) on questions about training books.

Two kinds of questions teach it, each tied to the passages that answer it:

- finder questions (``training.questions``): written by a reader model from one passage, that passage their gold;
- the team's question sets (``--sets``, natural's format: a question, its answers, the book's words that state it),
  whose gold passages are those overlapping the evidence, as ``longmem eval natural`` counts them.

For each question the passages BM25 ranks highest in its book that are not gold are its *hard negatives*: the near
misses a finder puts before the reader, which is what the reranker must order. A step reads ``--batch`` questions,
each with one gold passage and ``--negatives`` hard negatives drawn from its best ``--hard`` (a list of
1 + negatives pairs), and the loss is the cross-entropy of the gold pair's score among its list's (listwise softmax,
as monoBERT-style rerankers are trained on MS MARCO's BM25 negatives). Only the LoRA factors, the token-type table and
the head learn.

Some books are kept out (``--val-books``) and watched: the gold passage's rank among itself and all its hard negatives
before and after, by the reranker against BM25's own order. How the reranker is chosen is ``longmem eval finding`` on
the team's tuning sets, never this.

    python -m training.reranker --questions training/sets/finder-questions.jsonl --sets natural-tune3 \
        --out runs/rerank-a --max-length 192
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HARD = 16  # BM25's best passages of the book that are not gold, kept per question
NEGATIVES = 7  # hard negatives read per question per step (drawn anew each epoch)


@dataclass
class Example:
    """A question, its gold passages' texts and its hard negatives' (best first by BM25)."""

    book: str
    question: str
    gold: list[str]
    negatives: list[str]
    source: str  # "finder" or the team's set's name
    bm25_rank: int  # where BM25 ranks the first gold passage among it and the negatives (len(negatives) + 1: below)


def _book_index(text: str):
    """The book's passages as a bank cuts them, short ones too ((start, end, text)), and a BM25 index over them."""
    from longmem.text.passages import cut_passages
    from training.finder import BookIndex

    spans = [(s.start, s.end, s.text) for s in cut_passages(text)]
    return spans, BookIndex(spans)


def examples_of(finder_records, team: dict[str, list], data_dir: Path, hard: int) -> list[Example]:
    """Examples of the kept finder questions (gold: their passage) and of the team's answerable questions by set name
    (gold: the passages overlapping their evidence). A question whose gold passage is not found raises ValueError; one
    for which BM25 finds no other passage (no word of it elsewhere in the book) is left out: it has no near miss."""
    by_book: dict[str, list] = {}
    for r in finder_records:
        if r.kept:
            by_book.setdefault(r.book, []).append(("finder", r))
    for name, questions in team.items():
        for q in questions:
            if q.answers:
                by_book.setdefault(q.book, []).append((name, q))
    out = []
    for book, items in by_book.items():
        text = (data_dir / "books" / book).read_text(encoding="utf-8")
        spans, index = _book_index(text)
        at = {s[0]: i for i, s in enumerate(spans)}
        for source, item in items:
            if source == "finder":
                if item.start not in at:
                    raise ValueError(f"{book}: no passage starts at {item.start} (the book or the cutter changed)")
                gold = {at[item.start]}
            else:
                start = text.find(item.evidence)
                gold = {i for i, s in enumerate(spans) if start >= 0 and s[0] < start + len(item.evidence)
                        and start < s[1]}
                if not gold:
                    raise ValueError(f"{source}: the evidence of {item.question!r} is in no passage of {book}")
            found = index.search(item.question, hard + len(gold))
            negs = [i for i in found if i not in gold][:hard]
            first = next((n for n, i in enumerate(found, 1) if i in gold), len(negs) + 1)
            if negs:
                out.append(Example(book, item.question, [spans[i][2] for i in sorted(gold)],
                                   [spans[i][2] for i in negs], source, min(first, len(negs) + 1)))
    return out


def rank_of_gold(reranker, e: Example, dtype=None) -> int:
    """The rank (1 = first) of ``e``'s best-scored gold passage among it and all its hard negatives (scored in
    ``dtype``, None: float32)."""
    import torch

    scores = reranker.score(e.question, e.gold + e.negatives, dtype=dtype or torch.float32)
    best = max(scores[: len(e.gold)])
    return 1 + int((scores[len(e.gold):] > best).sum())


def describe(r: list[int]) -> str:
    import numpy as np

    r = np.asarray(r)
    return f"first {np.mean(r == 1):.1%}, in 4 {np.mean(r <= 4):.1%}, MRR {np.mean(1 / r):.3f} ({len(r)} questions)"


def train(args) -> int:
    import torch

    from longmem.eval.natural import package_set_path
    from longmem.eval.natural import read_questions as read_team
    from longmem.model.backbone import dtype_choice
    from longmem.model.embedder import Embedder
    from longmem.model.reranker import Reranker
    from training.questions import read_questions

    team = {}
    for name in args.sets:
        path = package_set_path(name) or Path(args.data) / "bookqa" / f"{name}.jsonl"
        if not path.is_file():
            raise SystemExit(f"--sets: no question set {name!r} ({path})")
        team[name] = read_team(path)
    records = read_questions(Path(args.questions)) if args.questions else []
    examples = examples_of(records, team, Path(args.data), args.hard)
    books = sorted({e.book for e in examples})
    rng = random.Random(args.seed)
    val_books = set(rng.sample(books, min(args.val_books, len(books) - 1)))
    train_ex = [e for e in examples if e.book not in val_books]
    val_ex = [e for e in examples if e.book in val_books][: args.watch]
    print(f"{len(examples)} questions on {len(books)} books ({sum(e.source == 'finder' for e in examples)} finder "
          f"questions): {len(train_ex)} to train, {len(val_ex)} watched on {sorted(val_books)}", file=sys.stderr)
    amp, why = dtype_choice(args.dtype)
    print(f"products in {why} (float32 weights; bfloat16 by autocast)", file=sys.stderr)
    torch.manual_seed(args.seed)
    reranker = Reranker.new(Embedder.load(), args.rank, seed=args.seed, max_length=args.max_length)
    reranker.eval()
    before = [rank_of_gold(reranker, e, amp) for e in val_ex]
    params = reranker.trainable()
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01)
    per_epoch = (len(train_ex) + args.batch - 1) // args.batch
    steps = args.epochs * per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, steps // 10))
                                              * max(0.0, (steps - s) / steps))
    log, t0, step = [], time.monotonic(), 0
    reranker.train()
    for epoch in range(args.epochs):
        order = list(train_ex)
        rng.shuffle(order)
        for i in range(0, len(order), args.batch):
            batch = order[i:i + args.batch]
            qs, ps = [], []
            for e in batch:
                pool = e.negatives[: args.hard]
                lst = [rng.choice(e.gold)] + rng.sample(pool, min(args.negatives, len(pool)))
                lst += [lst[-1]] * (1 + args.negatives - len(lst))  # a short list repeats its last negative
                qs += [e.question] * len(lst)
                ps += lst
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp == torch.bfloat16):
                scores = reranker(reranker.batch(qs, ps)).float().view(len(batch), 1 + args.negatives)  # (B, 1 + N)
            loss = torch.nn.functional.cross_entropy(scores, torch.zeros(len(batch), dtype=torch.long))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            log.append({"step": step, "epoch": epoch, "loss": loss.item()})
            if step % 10 == 0 or step == steps:
                print(f"step {step}/{steps} loss {loss.item():.3f} ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    reranker.eval()
    after = [rank_of_gold(reranker, e, amp) for e in val_ex]
    watched = None
    if val_ex:
        watched = {"bm25": describe([e.bm25_rank for e in val_ex]), "untrained": describe(before),
                   "trained": describe(after)}
        print(f"watched books, the gold passage among itself and its {args.hard} hard negatives: BM25's order "
              f"{watched['bm25']}; untrained {watched['untrained']}; trained {watched['trained']}", file=sys.stderr)
    out = Path(args.out)
    reranker.save(out / "reranker", provenance={
        "questions": str(args.questions) if args.questions else None,
        "questions_sha256": hashlib.sha256(Path(args.questions).read_bytes()).hexdigest() if args.questions else None,
        "sets": args.sets, "trained_on": len(train_ex), "books": len(books) - len(val_books),
        "watched_books": sorted(val_books), "hard": args.hard, "negatives": args.negatives, "epochs": args.epochs,
        "batch": args.batch, "lr": args.lr, "seed": args.seed,
        "dtype": str(amp).removeprefix("torch."), "seconds": round(time.monotonic() - t0, 1),
        "watched": watched})
    (out / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in log))
    print(f"wrote {out / 'reranker'}", file=sys.stderr)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from longmem.model.cpu import add_runtime_flags
    from longmem.util.data import add_data_flag

    p = argparse.ArgumentParser(prog="python -m training.reranker", description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", default="", help="finder questions (JSONL of training.questions; '' for none)")
    p.add_argument("--sets", nargs="*", default=[], help="the team's question sets to train on (natural's names)")
    p.add_argument("--out", required=True, help="run folder: log.jsonl, reranker/ (the checkpoint)")
    p.add_argument("--rank", type=int, default=16, help="LoRA rank of the layers' projections")
    p.add_argument("--hard", type=int, default=HARD, help="BM25 hard negatives kept per question")
    p.add_argument("--negatives", type=int, default=NEGATIVES, help="hard negatives read per question per step")
    p.add_argument("--epochs", type=int, default=2, help="passes over the training questions")
    p.add_argument("--batch", type=int, default=4, help="questions per step (each with 1 + negatives passages)")
    p.add_argument("--lr", type=float, default=5e-4, help="peak learning rate (warm-up 10%%, then linear decay)")
    p.add_argument("--max-length", type=int, default=256, help="tokens of a (question, passage) pair")
    p.add_argument("--val-books", type=int, default=3, help="books whose questions are kept out, to watch")
    p.add_argument("--watch", type=int, default=120, help="watched questions at most (each costs a scoring pass)")
    p.add_argument("--seed", type=int, default=0, help="initialisation, shuffling, negatives, watched books")
    add_runtime_flags(p)
    add_data_flag(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from longmem.model.cpu import setup_cpu

    args = parse_args(argv)
    setup_cpu(args.threads)
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
