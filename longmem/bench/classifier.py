"""The app's classifier end to end, timed (issue 86's speed targets): building one from labelled examples (the
ingestion of the examples into a bank and the fitting of its head, in the job the Classify tab starts) and
classifying texts with it, one at a time (the tab's Classify button) and as a file.

    python -m longmem.bench.classifier                    # SST-2: 2,000 examples in memory, 200 texts classified
    python -m longmem.bench.classifier --quick            # 200 examples, 20 texts (to see that everything runs)
    python -m longmem.bench.classifier --quick --file app/samples/reviews.csv   # no shared data needed
    python -m longmem.bench.classifier --out classifier.json

The examples are drawn from a set's train split (seed 0) (``--set``, the ICL sets' files in the shared data); the
texts classified come from its evaluation split (the record's dev split: SST-2's test split stays out of this). With
``--file`` (a CSV with ``text`` and ``label`` columns, such as the app's sample of reviews) both come from that file
instead, shuffled with seed 0: the texts classified are its last rows, the examples drawn from the rest. Everything
runs through ``service.Workspace`` on the default model (the shipped SideNet) in a temporary banks folder, as the app
runs it. The head is then fitted once more from scratch on its own (its stored head dropped: every example's
features, then the fit), timed apart from the build. Accuracy on the classified texts is a by-product, not a record
(``longmem eval icl`` is). Prints one JSON object (stdout) and a markdown table.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

from longmem.bench.inference import log, machine_facts, report
from longmem.ingest.readers import DemoFormat
from longmem.model.cpu import setup_cpu
from longmem.tasks.examples import PRESETS, Example, read_examples


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m longmem.bench.classifier", description=__doc__.split("\n\n")[0])
    p.add_argument("--set", default="SST-2", choices=list(PRESETS), help="the ICL set whose examples are used")
    p.add_argument("--examples", type=int, default=2000, help="examples kept in memory (the head is fitted on them)")
    p.add_argument("--texts", type=int, default=200, help="texts classified, from the set's evaluation split")
    p.add_argument("--one-by-one", type=int, default=50, help="of those, classified one call each (the rest: a file)")
    p.add_argument("--file", type=Path, default=None,
                   help="a CSV of labelled examples (columns text, label) to use instead of the set's files")
    p.add_argument("--quick", action="store_true", help="200 examples, 20 texts")
    p.add_argument("--dtype", default="auto", help="the model's dtype (auto: bfloat16 where the CPU has it)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: every core)")
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    if args.quick:
        args.examples, args.texts, args.one_by_one = 200, 20, 10
    args.threads = args.threads or os.cpu_count() or 1
    return args


def read_labelled(path: Path, held_out: int) -> tuple[list[Example], list[Example]]:
    """``path``'s rows (columns ``text`` and ``label``, read as bank ingestion reads them: ``read_examples``),
    shuffled with seed 0 and split into (examples to learn from, the last ``held_out`` rows to classify)."""
    rows = read_examples(path, DemoFormat(template="{text} {label}", text_column="text", label_column="label"))
    if len(rows) <= held_out:
        raise SystemExit(f"{path}: {len(rows)} rows, too few to keep {held_out} texts to classify")
    random.Random(0).shuffle(rows)
    return rows[:-held_out], rows[-held_out:]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    setup_cpu(args.threads)
    from longmem.model.longmem import LongMemConfig, LongMemModel
    from longmem.service import Workspace
    from longmem.storage import BankDirectory
    from longmem.util.data import data_dir

    t_start = time.perf_counter()
    preset = PRESETS[args.set]
    source_name = str(args.file) if args.file else args.set
    if args.file:
        train, evaluation = read_labelled(args.file, args.texts)
    else:
        train, evaluation = preset.read(data_dir())
    examples = random.Random(0).sample(train, min(args.examples, len(train)))  # the file's order may be sorted
    texts = [e.text for e in evaluation[:args.texts]]
    truths = [e.label for e in evaluation[:args.texts]]
    with tempfile.TemporaryDirectory(prefix="longmem-bench-") as tmp:
        source = Path(tmp) / "examples.csv"
        with open(source, "w", newline="", encoding="utf-8") as f:  # the words as labels: no mapping needed
            writer = csv.writer(f)
            writer.writerow(["text", "label"])
            writer.writerows([e.text, e.label] for e in examples)
        fmt = DemoFormat(template=preset.template, text_column="text", label_column="label")
        model = LongMemModel.from_config(LongMemConfig(dtype=args.dtype)).eval()
        ws = Workspace(model, BankDirectory(Path(tmp) / "banks"), work_dir=Path(tmp) / "work")
        log(f"building a classifier from {len(examples):,} {source_name} examples (ingestion + head)")
        t0 = time.perf_counter()
        job = ws.classifiers.build("bench", "clf", source, fmt, 0, len(examples), 0, seed=0)
        state = ws.jobs.wait(job, timeout=3600)
        build_s = time.perf_counter() - t0
        if state.status != "done":
            raise SystemExit(f"the build failed: {state.message}")
        log(state.message)
        with ws.directory.open("bench") as bank:  # the head again, from the stored features
            blob = bank.classifier_head("clf")
            bank.save_classifier_head("clf", None)
        t0 = time.perf_counter()
        ws.classifiers.head("bench", "clf")  # from scratch: every example's features, then the fit
        head_s = time.perf_counter() - t0
        with ws.directory.open("bench") as bank:
            bank.save_classifier_head("clf", blob)
        summary = ws.classifiers.head("bench", "clf").summary()

        log(f"classifying {args.one_by_one} texts one call each, then {args.texts - args.one_by_one} as one file")
        one = []
        predictions = []
        for t in texts[:args.one_by_one]:
            t0 = time.perf_counter()
            [row] = ws.classifiers.classify("bench", "clf", [t])
            one.append(time.perf_counter() - t0)
            predictions.append(row["prediction"])
        rest = texts[args.one_by_one:]
        t0 = time.perf_counter()
        rows = ws.classifiers.classify("bench", "clf", rest) if rest else []
        batch_s = time.perf_counter() - t0
        predictions += [r["prediction"] for r in rows]
        ws.close()
    accuracy = sum(p == t for p, t in zip(predictions, truths)) / len(truths)
    results = {"machine": machine_facts(args.dtype, args.threads), "set": source_name,
               "examples": len(examples),
               "build_s": build_s, "head_from_scratch_s": head_s, "cv_accuracy": summary["cv_accuracy"],
               "one_call_median_s": statistics.median(one) if one else None,
               "one_call_max_s": max(one) if one else None,
               "file_s_per_text": batch_s / len(rest) if rest else None, "texts": len(texts),
               "accuracy_on_texts": accuracy, "wall_s": time.perf_counter() - t_start}
    m = results["machine"]
    table = ("| what | value | target |\n| --- | ---: | ---: |\n"
             f"| build from {len(examples):,} examples (ingestion + head) | {build_s / 60:.1f} min | <= 10 min |\n"
             f"| the head alone, fitted again from scratch (features + fit) | {head_s:.0f} s | |\n"
             f"| classify one text (one call, median of {len(one)}) | {results['one_call_median_s']:.3f} s | "
             "<= 0.3 s |\n"
             + (f"| classify a file ({len(rest)} texts), per text | {results['file_s_per_text']:.3f} s | |\n"
                if rest else "")
             + f"| cross-validated accuracy / on the {len(texts)} texts | {100 * summary['cv_accuracy']:.1f}% / "
             f"{100 * accuracy:.1f}% | |\n\n"
             f"{m['cpu']}, {args.threads} threads, {m['dtype']} ({m['dtype_reason']}).")
    report(results, table, args.out)
    return results


if __name__ == "__main__":
    main()
