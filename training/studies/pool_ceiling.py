"""How much a second finder would widen the app's candidates: the ceiling of any reranker over their union.

A study (``training.studies``: it ships nothing). It chose against a second finder (stock MiniLM, BM25 over passages
widened by their neighbours' words or names, LongMem's memory): none widens the app's best 16 by more than a few of
128 tuning questions, and issue 70 is blocked on passages that share no word with their question. Figures:
``docs/design.md`` ("Finding is measured on its own, ...") and ``docs/history/notes-issue-70.md`` (session of
2026-12-03 (25)).

A reranker can only read what a finder puts in its pool; the app's best 16 passages hold the gold passage for 78% of
the tuning questions (``longmem eval finding``), and the questions it misses share no word with their evidence
("What was Crispin's own father's profession?" against "My father was a surgeon"). This probe measures, on a finding
run's banks, how often the gold passage is within the first k of:

- ``own``: BM25 over each passage's own words (what ``bank.search_passages`` does, the whole book);
- ``near.W``: BM25 over a passage with the words of the passage before and after it as a second column weighted W
  (the neighbours often name who speaks or acts: contextual passages);
- ``names.W``: the same with only the capitalised words of the three passages either side;
- and each of those and the ``embed`` ranks of the run (if it has them) in union with the app's best 16.

It reads the app's and the other finders' first-gold ranks from the run's ``finding.tasks.jsonl``, so run
``longmem eval finding --set finding.finders=app,embed`` on the same sets first. Tuning sets only: nothing here is
chosen on the sets kept aside.

    python -m training.studies.pool_ceiling --run runs/find-embed --sets natural-tune natural-tune2
"""

from __future__ import annotations

import argparse
import json
import re
import sqlite3
from pathlib import Path

from longmem.eval.finding import DEPTH, first_gold
from longmem.eval.natural import gold_passages, package_set_path, read_questions
from longmem.storage.directory import BankDirectory
from longmem.storage.passages import fts_query

CAPITALISED = re.compile(r"\b[A-Z][a-z]{2,}\b")
NAMES_SPAN = 3  # passages either side whose capitalised words join a passage's ``names`` column
POOL = 16  # the app's passages a reranker orders (``finding.rerank_depth``)
# (name, weights of the own / near / names columns)
VARIANTS = [("own", (1.0, 0.0, 0.0)), ("near.2", (1.0, 0.2, 0.0)), ("near.4", (1.0, 0.4, 0.0)),
            ("names.3", (1.0, 0.0, 0.3)), ("names.6", (1.0, 0.0, 0.6)), ("both", (1.0, 0.2, 0.3))]
KS = (1, 4, 8, 16, 50)


def run_ranks(run: Path) -> dict[str, dict[str, int]]:
    """finder -> question -> first-gold rank (0: not within ``DEPTH``) of a finding run's recorded units."""
    out: dict[str, dict[str, int]] = {}
    for line in (run / "finding.tasks.jsonl").read_text(encoding="utf-8").splitlines():
        unit = json.loads(line).get("value")
        for finder, ranks in (unit or {}).get("ranks", {}).items():
            out.setdefault(finder, {}).update(zip(unit["questions"], ranks))
    return out


def widened_index(texts: list[tuple[int, str]]) -> sqlite3.Connection:
    """An in-memory FTS5 table of a book's passages (rowid = passage id) with its ``near`` and ``names`` columns,
    tokenised as the bank's own index is."""
    con = sqlite3.connect(":memory:")
    con.execute("CREATE VIRTUAL TABLE t USING fts5(own, near, names, tokenize='porter unicode61 remove_diacritics 2')")
    for i, (pid, text) in enumerate(texts):
        near = " ".join(texts[j][1] for j in (i - 1, i + 1) if 0 <= j < len(texts))
        span = range(max(0, i - NAMES_SPAN), min(len(texts), i + NAMES_SPAN + 1))
        names = " ".join(" ".join(CAPITALISED.findall(texts[j][1])) for j in span if j != i)
        con.execute("INSERT INTO t(rowid, own, near, names) VALUES (?, ?, ?, ?)", (pid, text, near, names))
    return con


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m training.studies.pool_ceiling", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, required=True, help="a longmem eval finding output folder")
    p.add_argument("--sets", nargs="+", default=["natural-tune", "natural-tune2"], help="question sets (tuning only)")
    args = p.parse_args(argv)
    recorded = run_ranks(args.run)
    if "app" not in recorded:
        raise SystemExit(f"{args.run}: the run has no ranks of the app's finder (run it with finding.finders=app,...)")
    directory = BankDirectory(args.run / "natural-banks")
    banks = {name.rsplit("-", 1)[0]: name for name in directory.names()}
    ranks: dict[str, list[int]] = {"app": [], **{f: [] for f in recorded if f != "app"}, **{v: [] for v, _ in VARIANTS}}
    for name in args.sets:
        questions = [q for q in read_questions(package_set_path(name)) if q.answers]
        for book in dict.fromkeys(q.book for q in questions):
            bank = directory.open(banks[Path(book).stem])
            doc = bank.documents()[0]
            stored = bank.document_text(doc.id)
            index = widened_index(bank.passage_texts(doc.id))
            for q in (q for q in questions if q.book == book):
                gold = gold_passages(bank, doc.id, stored, q)
                if gold is None or q.question not in recorded["app"]:
                    continue
                for finder, by_question in recorded.items():
                    ranks[finder].append(by_question[q.question])
                query = fts_query(q.question)
                for variant, (w_own, w_near, w_names) in VARIANTS:
                    rows = index.execute(f"SELECT rowid FROM t WHERE t MATCH ? ORDER BY bm25(t, {w_own}, {w_near}, "
                                         f"{w_names}) LIMIT {DEPTH}", [query]).fetchall() if query else []
                    ranks[variant].append(first_gold([r[0] for r in rows], set(gold)))
    app = ranks["app"]
    print(f"{len(app)} answerable questions of {', '.join(args.sets)} (gold within k; union: the app's best {POOL} "
          f"with the finder's best {POOL})\n")
    print("| finder | " + " | ".join(f"in {k}" for k in KS) + f" | app {POOL} + it {POOL} |")
    print("| --- | " + " | ".join("---:" for _ in KS) + " | ---: |")
    for finder, r in ranks.items():
        union = sum((0 < a <= POOL) or (0 < x <= POOL) for a, x in zip(app, r))
        print(f"| {finder} | " + " | ".join(str(sum(0 < x <= k for x in r)) for k in KS) + f" | {union} |")


if __name__ == "__main__":
    main()
