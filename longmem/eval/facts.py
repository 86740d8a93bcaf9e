"""Suite 10, facts at a distance, asked as a reader asks (beyond the paper): long-range recall through the product's
answering path, taken to 1M tokens.

An item is a fact (a 4-digit number or a name from the evaluation pools of ``datasets.recall``, never trained on)
stated inside a short excerpt of book text, and the plain question about it ("What is the code to the old safe?").
The haystack is ``bookqa``'s: the first D tokens of the held-out books in a bank (built once per D and shared with
``bookqa``), the item's excerpt spliced in as one more document and rolled back after it, so the fact lies D tokens
before the question. Every ``bookqa`` entrant answers in the chat template; an answer counts when it contains the
value. The oracles read the excerpt itself: the same model with the fact inside its window, the measure the targets
divide by.

Where ``recall`` asks the paper's way (the answer restated up to the value, greedy exact match, everything before the
window memorized afresh for every item, with no reading), this suite asks the way the app does, and costs one filler
ingestion per distance rather than one per item: 1M tokens is within reach on a CPU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from longmem.eval.answering import APP_ENTRANT, FINDER_ENTRANTS, QUICK_NEW_TOKENS, entrants_for, label, versus_notes
from longmem.eval.bookqa import (
    SplicedSize,
    answer_at_distances,
    chosen_blocks,
    chosen_items,
    plot_distances,
    reads_table,
    run_notes,
)
from longmem.eval.core import EvalContext, SuiteResult, Timer, table
from longmem.eval.datasets.recall import make_fact_passage
from longmem.eval.datasets.squad import QA
from longmem.eval.recall import distance_label, filler


@dataclass
class Size(SplicedSize):
    """The suite's items (and where and how they are asked: ``SplicedSize``)."""

    facts: int = 20  # items, the same at every distance (numbers and names, at random)
    excerpt: int = 160  # tokens of book text around each fact


QUICK = Size(distances=[4096], facts=2, excerpt=60, new_tokens=QUICK_NEW_TOKENS,  # bookqa's quick size runs every
             entrants=["longmem", "app", "rag_bm25", "oracle"])  # entrant; this one the headline's, to keep CI short
FULL = Size()
TARGET_OF_ORACLE = 90.0  # % of the oracle's recall that LongMem reading must reach at every distance
TARGET_NUMBERS = 85.0  # % of numbers it must recall


def items(ctx: EvalContext, size: Size, stream: np.ndarray) -> list[QA]:
    """``size.facts`` fact excerpts drawn with the run's seed from ``stream``'s head, the held-out books (``filler``
    adds training books after them as a distance needs: the same facts whatever the distances), as questions with
    their passage (the id names the kind: "fact-3-number")."""
    stream = stream[:sum(len(b.ids) for b in ctx.held_out_books())]
    rng = np.random.default_rng(ctx.seed)
    out = []
    for i in range(size.facts):
        f = make_fact_passage(ctx.tokenizer, stream, rng, size.excerpt)
        out.append(QA(id=f"fact-{i}-{f.kind}", title="a fact", passage=f.text, question=f.question,
                      answers=(f.answer,)))
    return out


def run(ctx: EvalContext) -> SuiteResult:
    size: Size = ctx.size("facts", QUICK, FULL)
    timer = Timer()
    chosen_blocks("facts", size, size.facts)  # a block number the size does not have fails before any work
    entrants = entrants_for(ctx, size, "facts")
    stream, borrowed = filler(ctx, max(max(size.distances), size.excerpt))
    qas = items(ctx, size, stream)
    results, gold_read, seconds, commits = answer_at_distances(ctx, size, "facts", qas, stream, entrants, timer)
    qas = chosen_items("facts", size, qas)  # those this run reports
    ds = [str(d) for d in size.distances]
    kinds = sorted({q.id.rsplit("-", 1)[1] for q in qas})

    def cell(r: dict) -> str:
        by = [f"{k}s {sum(x['contains'] for x in r['items'] if x['id'].endswith(k)):.0f}/"
              f"{sum(x['id'].endswith(k) for x in r['items'])}" for k in kinds]
        return f"{r['contains']:.0f}% ± {r['contains_ci95']:.0f} ({', '.join(by)})"

    rows = [[label(k, size.reader)] + [cell(results[k][d]) for d in ds] for k in results]
    reads = reads_table(gold_read, ds)
    avg = {k: float(np.mean([results[k][d]["contains"] for d in ds])) for k in results}
    notes = [f"{len(qas)} facts at each distance, the same ones; a cell: % of answers containing the value (± a 95% "
             "interval), then numbers and names recalled. The second table: the share of items whose excerpt was "
             "among the passages read, per finder.", *targets(results, ds), *versus_notes(avg)]
    notes += run_notes("facts", results, borrowed, commits, seconds)
    plot = plot_distances(ctx, size.distances, results, "facts.png", "tokens between the fact and the question",
                          "answers containing the value, %", size.reader)
    models = {k: label(k, size.reader) for k in results}
    return SuiteResult("facts", "Facts at a distance, asked as a reader asks (beyond the paper): recall through "
                       "reading, to 1M tokens", [table(["model"] + [distance_label(int(d)) for d in ds], rows), reads],
                       {"results": results, "gold_read": gold_read, "models": models,
                        "facts": [{"id": q.id, "question": q.question, "answer": q.answers[0]} for q in qas],
                        "borrowed_train_tokens": borrowed},
                       asdict(size), [plot], notes, seconds)


def targets(results: dict, ds: list[str]) -> list[str]:
    """The issue's recall targets for LongMem reading as the app does, at every distance: >= 90% of its oracle's
    recall (the fact inside its window), and >= 85% of numbers recalled."""
    me = APP_ENTRANT
    if not {me, "oracle"} <= results.keys():
        return []
    ratios, numbers = [], []
    for d in ds:
        r, o = results[me][d], results["oracle"][d]
        ratios.append(100 * r["contains"] / o["contains"] if o["contains"] else float("nan"))
        nums = [x["contains"] for x in r["items"] if x["id"].endswith("number")]
        numbers.append(100 * float(np.mean(nums)) if nums else float("nan"))
    at = ", ".join(f"{distance_label(int(d))} {x:.0f}%" for d, x in zip(ds, ratios))
    num = ", ".join(f"{distance_label(int(d))} {x:.0f}%" for d, x in zip(ds, numbers))
    return [f"LongMem reading ({FINDER_ENTRANTS[me]}) against its oracle, by distance: {at} (target: >= "
            f"{TARGET_OF_ORACLE:.0f}% at every distance); numbers recalled: {num} (target: >= {TARGET_NUMBERS:.0f}%)."]
