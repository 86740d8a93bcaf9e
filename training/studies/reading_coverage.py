"""What a reader reads, before it reads: how often the book's words that state the answer (the *evidence*) lie whole
within the text handed to the reader, and how many tokens that text is, for each way of choosing it.

A study (``training.studies``: it ships nothing). It chose the spans' order (``tasks.spans.widen`` reads the found
passages first and their neighbours after: more found passages hold more evidence than fewer widened ones) and the
reading sizes tried with the reader (12 passages, 1,900 tokens), and it chose against building the names of the
passage before into the bank (``text.names``: no gain to pay a schema migration for). Figures: ``docs/design.md``
("A window of its own, spans in book order; measured, not chosen") and ``docs/history/notes-issue-85.md``
("Measured", "Names the text leaves out").

No reader runs: this is the finding half of an answer, measured in seconds on a natural run's banks, so that the
reading sizes (how many passages, how many neighbours, what budget) are chosen on the tuning sets before the reader's
minutes are spent. Compared:

- ``app 4 bare``: the 135M's reading, the lexical finder's best 4 passages alone within ~720 tokens;
- ``spans P/N/B``: the lexical finder's best ``P`` passages as many as fit, then up to ``N`` neighbours either side
  of each as the budget allows, joined, in book order, within ``B`` tokens of the reader's tokenizer
  (``tasks.spans.widen``; N = 0: the passages alone);
- ``script``: the RAG script's four 1,600-character windows (``eval.ragscript``).
- ``fts 4`` against ``fts 4 + names before`` (and ``fts 4 + names column``): the best four passages by the bank's
  own word search (an FTS5 index as the bank's, the same query, no sections) over the passages alone, and over each
  passage with the names of the passage before it appended to its text (or as a second column): the index-only field
  of issue 85's item 4 (``text.names``), built here in memory, the bank untouched.

    python -m training.studies.reading_coverage --run runs/tune-a --sets natural-tune natural-tune2

Tuning sets only (the sets kept aside and the dev sets are not for choosing).
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

from longmem.eval.calibrate import run_bank
from longmem.eval.natural import package_set_path, read_questions
from longmem.eval.ragscript import RagScript
from longmem.model.longmem import LongMemConfig, LongMemModel
from longmem.model.readers import load_reader
from longmem.storage.passages import fts_query
from longmem.tasks.reading import PassageFinder, Reading, fit
from longmem.tasks.spans import widen
from longmem.text.names import names_before, names_in, proper_names
from longmem.util.data import data_dir

BARE = ("app 4 bare", 4, None, 720)  # the 135M's reading: 4 passages, the window's ~720 tokens of excerpts
GRID = [(p, n, b) for b in (1300, 1900, 2600) for p in (8, 12, 16) for n in (0, 1, 2)]
NAMES = ("fts 4", "fts 4 + names before", "fts 4 + names column", "fts 4 + names column at 0.3",
         "fts 4 + names before where none")  # the word search's best four: the passages alone, with the names of
#        the passage before appended, in a column of their own (weighed 1 or 0.3 against the text's 1), or appended
#        to the passages that name no one themselves
TOKENIZE = "porter unicode61 remove_diacritics 2"  # the bank's FTS5 tokenizer (``storage.schema``)


def word_index(rows: list[tuple[str, ...]]) -> sqlite3.Connection:
    """An in-memory FTS5 index as the bank's, over ``rows`` (rowid = position + 1), one column per field."""
    db = sqlite3.connect(":memory:")
    cols = [f"c{i}" for i in range(len(rows[0]))] if rows else ["c0"]
    db.execute(f"CREATE VIRTUAL TABLE t USING fts5({', '.join(cols)}, tokenize='{TOKENIZE}')")
    db.executemany(f"INSERT INTO t(rowid, {', '.join(cols)}) VALUES (?, {', '.join('?' * len(cols))})",
                   [(i + 1, *r) for i, r in enumerate(rows)])
    return db


def best(db: sqlite3.Connection, question: str, k: int, weights: tuple[float, ...] = ()) -> list[int]:
    """Positions of the ``k`` rows whose words best match ``question`` (FTS5's bm25, the columns weighed by
    ``weights``; none: each 1)."""
    query = fts_query(question)
    if query is None:
        return []
    rank = f"bm25(t{''.join(f', {w}' for w in weights)})"
    return [r[0] - 1 for r in db.execute(f"SELECT rowid FROM t WHERE t MATCH ? ORDER BY {rank} LIMIT ?",
                                         (query, k))]


def covers(spans: list[tuple[int, int]], at: tuple[int, int]) -> bool:
    return any(a <= at[0] and at[1] <= b for a, b in spans)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.studies.reading_coverage",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="a natural run's --out folder whose banks hold the sets' books")
    p.add_argument("--sets", nargs="+", default=["natural-tune", "natural-tune2"], help="answerable question sets")
    p.add_argument("--reader", default="qwen2.5-coder-1.5b", help="the reader whose tokenizer counts the budget")
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    tok = load_reader(args.reader, "auto", "cpu", 1024).backbone.tokenizer

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False).input_ids)

    model = LongMemModel.from_config(LongMemConfig())
    rows = {name: [] for name in [BARE[0], *(f"spans {p}/{n}/{b}" for p, n, b in GRID), "script", *NAMES]}
    tokens = {name: [] for name in rows}
    for name in args.sets:
        path = package_set_path(name) or data_dir() / "bookqa" / f"{name}.jsonl"
        questions = [q for q in read_questions(path) if q.answers]
        for book in dict.fromkeys(q.book for q in questions):
            directory, bank_name = run_bank(Path(args.run), book)
            with directory.open(bank_name) as bank:
                doc = bank.documents()[0]
                text = bank.document_text(doc.id)
                finder = PassageFinder(bank, model, bank.load_memory(model))
                script = RagScript(text)
                passages = bank.passages([i for i, _ in bank.passage_texts(doc.id)])
                names = proper_names(text)
                named = [" ".join(ns) for ns in names_before([p.text for p in passages], names)]
                column = word_index([(p.text, ns) for p, ns in zip(passages, named)])
                indexes = dict(zip(NAMES, ((word_index([(p.text,) for p in passages]), ()),
                                           (word_index([(f"{p.text} {ns}",) for p, ns in zip(passages, named)]), ()),
                                           (column, ()), (column, (1.0, 0.3)),
                                           (word_index([(p.text if names_in(p.text, names) else f"{p.text} {ns}",)
                                                        for p, ns in zip(passages, named)]), ()))))
                for q in (q for q in questions if q.book == book):
                    at = text.find(q.evidence)
                    ev = (at, at + len(q.evidence))
                    found = finder.find(q.question, Reading(passages=max(p for p, _, _ in GRID)))
                    bare = fit(found[: BARE[1]], tok, BARE[3])
                    rows[BARE[0]].append(covers([(f.passage.char_start, f.passage.char_end) for f in bare], ev))
                    tokens[BARE[0]].append(sum(count(f.passage.text) for f in bare))
                    for n_p, n, b in GRID:
                        spans = widen(bank, found[:n_p], count, b, n)
                        key = f"spans {n_p}/{n}/{b}"
                        rows[key].append(covers([(f.passage.char_start, f.passage.char_end) for f in spans], ev))
                        tokens[key].append(sum(count(f.passage.text) for f in spans))
                    _, read = script.prompt(q.question)
                    rows["script"].append(covers(read, ev))
                    tokens["script"].append(sum(count(text[a:b]) for a, b in read))
                    for key, (index, weights) in indexes.items():
                        read = [passages[i] for i in best(index, q.question, 4, weights)]
                        rows[key].append(covers([(p.char_start, p.char_end) for p in read], ev))
                        tokens[key].append(sum(count(p.text) for p in read))
    n = len(rows["script"])
    out = {k: {"covered": sum(v), "of": n, "tokens": sum(tokens[k]) / max(1, n)} for k, v in rows.items()}
    print(json.dumps({"run": args.run, "sets": args.sets, "results": out}))
    print(f"\n| reading | evidence read whole (of {n}) | tokens read (mean) |\n| --- | ---: | ---: |")
    for k, v in out.items():
        print(f"| {k} | {v['covered']} ({100 * v['covered'] / max(1, n):.0f}%) | {v['tokens']:.0f} |")
    for key in NAMES[1:]:
        a, b = rows[NAMES[0]], rows[key]
        print(f"\n{key}: the evidence read for {sum(y and not x for x, y in zip(a, b))} questions more than "
              f"{NAMES[0]} and {sum(x and not y for x, y in zip(a, b))} fewer.")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
