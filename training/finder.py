"""Train the question encoder (``longmem.model.question_encoder``) on finder questions (``training.questions``).

Each question was written from one passage of a training book; the encoder learns to put it nearer that passage's
stock all-MiniLM-L6-v2 vector than (1) the passages BM25 ranks highest for it in the same book but which are not its
own (*hard negatives*: the near misses a reader's words lead BM25 to) and (2) every other question's passages in the
batch. The loss is the cross-entropy of the scaled inner products (``--scale``, 20 as sentence-transformers'
MultipleNegativesRankingLoss); only the question side's LoRA factors are trained, the passage vectors are fixed
(made once and kept under ``--work``), so a step reads a batch of questions alone: minutes on a CPU.

Some books' questions are kept out of training (``--val-books``) and the passage's rank among its own candidates
(itself and its hard negatives) is reported on them before and after: how a run is seen to learn, not how the finder
is chosen (that is ``longmem eval finding`` on the team's tuning sets).

    python -m training.finder --questions training/sets/finder-questions.jsonl --out runs/finder-a
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import random
import sqlite3
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HARD_NEGATIVES = 16  # BM25's best passages of the book that are not the question's, kept per question


@dataclass
class Example:
    """A question, its own passage and its hard negatives, as rows of the run's passage vectors."""

    book: str
    question: str
    positive: int
    negatives: list[int]


class BookIndex:
    """BM25 over one book's passages (an in-memory SQLite FTS5 table, the bank's tokenizer and query rule)."""

    def __init__(self, spans: list[tuple[int, int, str]]):
        self.spans = spans
        self.db = sqlite3.connect(":memory:")
        # the tokenizer of a bank's passages_fts (``storage.schema.FTS_SQL``)
        self.db.execute("CREATE VIRTUAL TABLE p USING fts5(text, tokenize='porter unicode61 remove_diacritics 2')")
        self.db.executemany("INSERT INTO p(rowid, text) VALUES (?, ?)", [(i, s[2]) for i, s in enumerate(spans)])

    def search(self, question: str, k: int) -> list[int]:
        """Indices of the ``k`` passages BM25 ranks best for ``question``, best first."""
        from longmem.storage.passages import fts_query

        query = fts_query(question)
        if query is None:
            return []
        rows = self.db.execute("SELECT rowid FROM p WHERE p MATCH ? ORDER BY bm25(p) LIMIT ?", (query, k))
        return [int(r[0]) for r in rows]


def examples_of(records, data_dir: Path, hard: int) -> tuple[list[Example], list[str]]:
    """The kept records as examples, and the texts of the passages they name (positives and hard negatives): rows
    of the run's passage vectors."""
    from training.questions import book_passages

    by_book: dict[str, list] = {}
    for r in records:
        if r.kept:
            by_book.setdefault(r.book, []).append(r)
    texts: list[str] = []
    row: dict[tuple[str, int], int] = {}

    def row_of(book: str, span) -> int:
        key = (book, span[0])
        if key not in row:
            row[key] = len(texts)
            texts.append(span[2])
        return row[key]

    out = []
    for book, recs in by_book.items():
        spans = book_passages((data_dir / "books" / book).read_text(encoding="utf-8"))
        at = {s[0]: i for i, s in enumerate(spans)}
        index = BookIndex(spans)
        for r in recs:
            if r.start not in at:
                raise ValueError(f"{book}: no passage starts at {r.start} (the book or the cutter changed)")
            own = at[r.start]
            negs = [i for i in index.search(r.question, hard + 1) if i != own][:hard]
            out.append(Example(book, r.question, row_of(book, spans[own]), [row_of(book, spans[i]) for i in negs]))
    return out, texts


def passage_vectors(embedder, texts: list[str], work: Path) -> np.ndarray:
    """Stock vectors of ``texts`` (n, dim). Every vector made is kept under ``work`` by its text's SHA-1
    (``passage-vectors.npz``), so a run on more questions embeds only the passages new to it."""
    from tqdm import tqdm

    from longmem.util.files import write_file_atomic

    path = work / "passage-vectors.npz"
    kept: dict[str, np.ndarray] = {}
    if path.exists():
        with np.load(path) as f:
            kept = dict(zip(f["keys"].tolist(), f["vectors"]))
    keys = [hashlib.sha1(t.encode()).hexdigest() for t in texts]
    new = sorted({k: t for k, t in zip(keys, texts) if k not in kept}.items())
    if new:
        bar = tqdm(total=len(new), desc="passage vectors", file=sys.stderr)
        made = embedder.encode([t for _, t in new], progress=lambda done, total: bar.update(done - bar.n))
        bar.close()
        kept.update(zip([k for k, _ in new], made))
        buf = io.BytesIO()
        np.savez(buf, keys=np.array(list(kept)), vectors=np.stack(list(kept.values())))
        write_file_atomic(path, buf.getvalue())
    return np.stack([kept[k] for k in keys]) if keys else np.zeros((0, embedder.dim), np.float32)


def ranks(encoder, examples: list[Example], vectors: np.ndarray) -> list[int]:
    """Each example's passage rank (1 = first) among itself and its hard negatives, by ``encoder``'s vectors."""
    q = encoder.encode([e.question for e in examples])
    out = []
    for qv, e in zip(q, examples):
        own = float(vectors[e.positive] @ qv)
        out.append(1 + sum(float(vectors[n] @ qv) > own for n in e.negatives))
    return out


def describe(r: list[int]) -> str:
    r = np.asarray(r)
    return f"first {np.mean(r == 1):.1%}, in 4 {np.mean(r <= 4):.1%}, MRR {np.mean(1 / r):.3f} ({len(r)} questions)"


def train(args) -> int:
    import torch

    from longmem.model.embedder import Embedder, default_model_dir
    from longmem.model.question_encoder import QuestionEncoder, weights_sha256, with_factors
    from training.questions import read_questions

    records = read_questions(Path(args.questions))
    examples, texts = examples_of(records, Path(args.data), args.hard)
    books = sorted({e.book for e in examples})
    val_books = set(random.Random(args.seed).sample(books, min(args.val_books, len(books) - 1)))
    train_ex = [e for e in examples if e.book not in val_books]
    val_ex = [e for e in examples if e.book in val_books]
    print(f"{len(examples)} questions on {len(books)} books: {len(train_ex)} to train, {len(val_ex)} on "
          f"{len(val_books)} books to watch", file=sys.stderr)
    work = Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    stock = Embedder.load()
    vectors = passage_vectors(stock, texts, work)
    pv = torch.from_numpy(vectors)  # (n, d), fixed
    questions = with_factors(stock, args.rank)
    config = {"base": "all-MiniLM-L6-v2", "base_sha256": weights_sha256(default_model_dir()), "rank": args.rank,
              "max_length": questions.max_length}
    before = ranks(QuestionEncoder(questions, config), val_ex, vectors) if val_ex else []
    params = [p for n, p in questions.model.named_parameters() if n.rsplit(".", 1)[-1].startswith("lora_")]
    for p in questions.model.parameters():
        p.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    steps = args.epochs * ((len(train_ex) + args.batch - 1) // args.batch)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / max(1, steps // 10))
                                              * max(0.0, (steps - s) / steps))
    rng = random.Random(args.seed)
    tok, log, t0, step = questions.tokenizer, [], time.monotonic(), 0
    questions.model.train()
    for epoch in range(args.epochs):
        order = list(train_ex)
        rng.shuffle(order)
        for i in range(0, len(order), args.batch):
            batch = order[i:i + args.batch]
            enc = tok([e.question for e in batch], padding=True, truncation=True, max_length=questions.max_length,
                      return_tensors="pt")
            hidden = questions.model(**enc).last_hidden_state  # (B, T, d)
            mask = enc["attention_mask"].unsqueeze(-1).float()
            q = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9), dim=-1)  # (B, d)
            rows = [e.positive for e in batch] + sorted({n for e in batch for n in e.negatives})
            cand = pv[rows]  # (B + H', d): each question's own passage first, then every hard negative in the batch
            logits = args.scale * q @ cand.T  # (B, B + H')
            same = torch.tensor([[r == e.positive and j != k for j, r in enumerate(rows)]
                                 for k, e in enumerate(batch)])  # a passage two questions share: not a negative
            logits = logits.masked_fill(same, float("-inf"))
            loss = torch.nn.functional.cross_entropy(logits, torch.arange(len(batch)))
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            step += 1
            log.append({"step": step, "epoch": epoch, "loss": loss.item()})
            if step % 20 == 0 or step == steps:
                print(f"step {step}/{steps} loss {loss.item():.3f} ({time.monotonic() - t0:.0f} s)", file=sys.stderr)
    questions.model.eval()
    encoder = QuestionEncoder(questions, config)
    after = ranks(encoder, val_ex, vectors) if val_ex else []
    if val_ex:
        print(f"watched books, the question's passage among itself and its {args.hard} hard negatives: stock "
              f"{describe(before)}; trained {describe(after)}", file=sys.stderr)
    encoder.save(work / "encoder", provenance={
        "questions": str(args.questions),
        "questions_sha256": hashlib.sha256(Path(args.questions).read_bytes()).hexdigest(),
        "trained_on": len(train_ex), "books": len(books) - len(val_books), "watched_books": sorted(val_books),
        "hard_negatives": args.hard, "epochs": args.epochs, "batch": args.batch, "lr": args.lr, "scale": args.scale,
        "seed": args.seed, "seconds": round(time.monotonic() - t0, 1),
        "watched": {"stock": describe(before), "trained": describe(after)} if val_ex else None})
    (work / "log.jsonl").write_text("".join(json.dumps(x) + "\n" for x in log))
    print(f"wrote {work / 'encoder'}", file=sys.stderr)
    return 0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from longmem.util.data import add_data_flag

    p = argparse.ArgumentParser(prog="python -m training.finder", description=__doc__.split("\n\n")[0])
    p.add_argument("--questions", required=True, help="finder questions (JSONL of training.questions)")
    p.add_argument("--out", required=True, help="run folder: passage vectors, log.jsonl, encoder/ (the checkpoint)")
    p.add_argument("--rank", type=int, default=8, help="LoRA rank of the question side's projections")
    p.add_argument("--hard", type=int, default=HARD_NEGATIVES, help="BM25 hard negatives per question")
    p.add_argument("--epochs", type=int, default=4, help="passes over the training questions")
    p.add_argument("--batch", type=int, default=32, help="questions per step")
    p.add_argument("--lr", type=float, default=3e-4, help="peak learning rate (warm-up 10%%, then linear decay)")
    p.add_argument("--scale", type=float, default=20.0, help="inner products are multiplied by this in the loss")
    p.add_argument("--val-books", type=int, default=3, help="books whose questions are kept out, to watch")
    p.add_argument("--seed", type=int, default=0, help="shuffling and which books are watched")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    add_data_flag(p)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from longmem.model.cpu import setup_cpu

    args = parse_args(argv)
    setup_cpu(args.threads)
    return train(args)


if __name__ == "__main__":
    sys.exit(main())
