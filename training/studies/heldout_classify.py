"""Issue 86's held-out check, as a user runs it: a bank of labelled examples made with ``longmem bank ingest``, texts
classified with ``longmem classify --bank`` (the default method: the head fitted on the bank's examples), beside
the anchor a user would build from the same examples (the shipped sentence embeddings + a logistic regression,
``measure.anchor_results``), on the same texts, paired.

A study (``training.studies``: it ships nothing). It chose nothing: run once the choices were made, it checks that
the head ``training.studies.icl_features`` chose on the dev splits holds on sentences never used for a choice (SST-2's
test split). Figures: ``docs/design.md`` ("The classifier decides with a head fitted on its examples") and
``docs/history/notes-issue-86.md`` ("Measured", session 35's held-out check, and "The ICL sets' test splits through
``longmem classify --bank``").

    python -m training.studies.heldout_classify --set SST-2 --split test --examples 2000 --texts 800 --out runs/heldout

The split is the set's test file for SST-2 (never used for tuning: run this once choices are made), else its
evaluation file. Writes the examples and texts, the bank (under ``--out``), the CLI's output and ``results.json``;
prints a markdown line.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import json
import random
import sys
from pathlib import Path

from longmem.cli.main import main as longmem
from longmem.model.embedder import Embedder
from longmem.tasks.examples import PRESETS, Example
from longmem.tasks.measure import anchor_results, paired_gap, wilson
from longmem.util.data import data_dir


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m training.studies.heldout_classify",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--set", default="SST-2", choices=list(PRESETS), help="the ICL set")
    p.add_argument("--split", default="test", choices=["test", "evaluation"],
                   help="test: SST-2's test.tsv (held out); evaluation: the set's evaluation file (the record's)")
    p.add_argument("--examples", type=int, default=2000, help="labelled examples in the bank, from the train split")
    p.add_argument("--texts", type=int, default=800, help="texts classified")
    p.add_argument("--seed", type=int, default=0, help="which examples and texts are drawn")
    p.add_argument("--out", default="runs/heldout", help="folder for the files, the bank and the results")
    args = p.parse_args(argv)
    preset = PRESETS[args.set]
    train, evaluation = preset.read(data_dir())
    if args.split == "test":
        if args.set != "SST-2":
            p.error("--split test is SST-2's test.tsv; other sets: --split evaluation")
        # test.tsv is "<label> <sentence>" per line (the stsa.binary layout), unlike train.tsv and dev.tsv
        lines = (Path(data_dir()) / "icl" / preset.folder / "test.tsv").read_text(encoding="utf-8").splitlines()
        evaluation = [Example(line[2:].strip(), preset.label_words[line[0]]) for line in lines if line[2:].strip()]
    rng = random.Random(args.seed)
    examples = rng.sample(train, args.examples)
    texts = rng.sample(evaluation, args.texts)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    demos = out / "examples.csv"
    with open(demos, "w", newline="", encoding="utf-8") as f:  # the label words as labels
        w = csv.writer(f)
        w.writerow(["text", "label"])
        w.writerows([e.text, e.label] for e in examples)
    (out / "texts.txt").write_text("".join(e.text.replace("\n", " ") + "\n" for e in texts))
    banks, bank = str(out / "banks"), f"{args.set.lower()}-{args.examples}-seed{args.seed}"  # the draw's own bank

    if not (out / "banks" / bank).exists():
        code = longmem(["bank", "ingest", bank, str(demos), "--create", "--template", preset.template,
                        "--banks-dir", banks])
        if code != 0:
            return code
    printed, stdin = io.StringIO(), sys.stdin
    try:  # the texts on standard input, one per line, as a user pipes a file in
        sys.stdin = io.StringIO((out / "texts.txt").read_text())
        with contextlib.redirect_stdout(printed):
            code = longmem(["classify", "--bank", bank, "--banks-dir", banks])
    finally:
        sys.stdin = stdin
    if code != 0:
        return code
    (out / "classify.tsv").write_text(printed.getvalue())
    lines = [line.split("\t") for line in printed.getvalue().strip().splitlines()]
    if len(lines) != len(texts):
        raise SystemExit(f"longmem classify printed {len(lines)} lines for {len(texts)} texts")
    mine = [cols[0] == e.label for cols, e in zip(lines, texts)]
    unsure = [cols[2] == "unsure" for cols in lines]
    [(_, anchor)] = anchor_results(Embedder.load().encode, preset.labels, examples, texts, [len(examples)], args.seed)
    theirs = [a == b for a, b in zip(anchor.predictions, anchor.truths)]
    gap, half, _ = paired_gap(mine, theirs)
    sure = [m for m, u in zip(mine, unsure) if not u]
    result = {"set": args.set, "split": args.split, "examples": args.examples, "texts": len(texts), "seed": args.seed,
              "longmem_classify": sum(mine) / len(mine), "longmem_interval": wilson(sum(mine), len(mine)),
              "anchor": sum(theirs) / len(theirs), "anchor_interval": wilson(sum(theirs), len(theirs)),
              "minus_anchor": [gap, half], "sure_share": len(sure) / len(mine),
              "sure_accuracy": sum(sure) / len(sure) if sure else None}
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    lo, hi = result["longmem_interval"]
    alo, ahi = result["anchor_interval"]
    print(f"| {args.set} {args.split}, {len(texts)} texts, {args.examples:,} examples | `longmem classify --bank`: "
          f"{100 * result['longmem_classify']:.1f} ({100 * lo:.0f}-{100 * hi:.0f}) | anchor "
          f"{100 * result['anchor']:.1f} ({100 * alo:.0f}-{100 * ahi:.0f}) | {gap:+.1f} ± {half:.1f} "
          f"paired | sure {100 * result['sure_share']:.0f}%, right "
          f"{100 * (result['sure_accuracy'] or 0):.1f}% |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
