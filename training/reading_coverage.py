"""What a reader reads, before it reads: how often the book's words that state the answer (the *evidence*) lie whole
within the text handed to the reader, and how many tokens that text is, for each way of choosing it.

No reader runs: this is the finding half of an answer, measured in seconds on a natural run's banks, so that the
reading sizes (how many passages, how many neighbours, what budget) are chosen on the tuning sets before the reader's
minutes are spent. Compared:

- ``app 4 bare``: the 135M's reading, the lexical finder's best 4 passages alone within ~720 tokens;
- ``spans P/N/B``: the lexical finder's best ``P`` passages as many as fit, then up to ``N`` neighbours either side
  of each as the budget allows, joined, in book order, within ``B`` tokens of the reader's tokenizer
  (``tasks.spans.widen``; N = 0: the passages alone);
- ``script``: the RAG script's four 1,600-character windows (``eval.ragscript``).

    python -m training.reading_coverage --run runs/tune-a --sets natural-tune natural-tune2

Tuning sets only (the sets kept aside and the dev sets are not for choosing).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from longmem.eval.calibrate import run_bank
from longmem.eval.natural import package_set_path, read_questions
from longmem.eval.ragscript import RagScript
from longmem.model.longmem import LongMemConfig, LongMemModel
from longmem.model.readers import load_reader
from longmem.tasks.reading import PassageFinder, Reading, fit
from longmem.tasks.spans import widen
from longmem.util.data import data_dir

BARE = ("app 4 bare", 4, None, 720)  # the 135M's reading: 4 passages, the window's ~720 tokens of excerpts
GRID = [(p, n, b) for b in (1300, 1900, 2600) for p in (8, 12, 16) for n in (0, 1, 2)]


def covers(spans: list[tuple[int, int]], at: tuple[int, int]) -> bool:
    return any(a <= at[0] and at[1] <= b for a, b in spans)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.reading_coverage", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="a natural run's --out folder whose banks hold the sets' books")
    p.add_argument("--sets", nargs="+", default=["natural-tune", "natural-tune2"], help="answerable question sets")
    p.add_argument("--reader", default="qwen2.5-coder-1.5b", help="the reader whose tokenizer counts the budget")
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    tok = load_reader(args.reader, "auto", "cpu", 1024).backbone.tokenizer

    def count(text: str) -> int:
        return len(tok(text, add_special_tokens=False).input_ids)

    model = LongMemModel.from_config(LongMemConfig())
    rows = {name: [] for name in [BARE[0], *(f"spans {p}/{n}/{b}" for p, n, b in GRID), "script"]}
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
    n = len(rows["script"])
    out = {k: {"covered": sum(v), "of": n, "tokens": sum(tokens[k]) / max(1, n)} for k, v in rows.items()}
    print(json.dumps({"run": args.run, "sets": args.sets, "results": out}))
    print(f"\n| reading | evidence read whole (of {n}) | tokens read (mean) |\n| --- | ---: | ---: |")
    for k, v in out.items():
        print(f"| {k} | {v['covered']} ({100 * v['covered'] / max(1, n):.0f}%) | {v['tokens']:.0f} |")
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
