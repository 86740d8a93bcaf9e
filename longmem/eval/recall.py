"""Suite 7, long-range recall by distance (beyond the paper): a fact stated once, asked about D tokens later.

Each item (``longmem.eval.datasets.recall``) is real book text with one fact sentence spliced in ("The code to the old
safe is 4817." or a name from a list never trained on) between D and D + 1k tokens before a question whose answer
restates the fact up to its value. The question's local window is the last 1k tokens; everything before it goes into an
unbounded memory (LongMem), is out of reach (the 1k backbone), or is read directly when it fits the full-context
backbone's 8k window. An item counts when every answer token is the model's greedy prediction.

The filler text is the held-out books one after another; distances beyond their ~600k tokens continue into books of
the training split (the fact and question are new either way; the note under the table says when).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from longmem.eval.core import EvalContext, SuiteResult, Timer, figure, table, versus
from longmem.eval.datasets.books import book_split, tokenize_files
from longmem.eval.datasets.recall import recall_documents
from longmem.eval.measures import recall_record, recalled
from longmem.util.data import cache_root


@dataclass
class Size:
    distances: list[int] = field(default_factory=lambda: [4096, 16384, 65536, 262144, 1048576])  # D, in tokens
    items: int = 10  # items per distance (half numbers, half names on average)


QUICK = Size(distances=[2048], items=2)
FULL = Size()


def filler(ctx: EvalContext, need: int) -> tuple[np.ndarray, int]:
    """One stream of book text with at least ``need`` tokens: the held-out books, then training books as needed;
    and how many of its tokens came from training books."""
    stream = [d.ids for d in ctx.held_out_books()]
    held = sum(len(x) for x in stream)
    if held < need:
        train, _ = book_split(ctx.data_dir)
        for doc in tokenize_files(train, ctx.tokenizer, cache_root() / "tokens"):
            stream.append(doc.ids)
            if sum(len(x) for x in stream) >= need:
                break
    ids = np.concatenate(stream)
    if len(ids) < need:
        raise ValueError(f"the shared books hold {len(ids):,} tokens; a recall distance needs {need:,}")
    return ids, max(0, need - held)


def run(ctx: EvalContext) -> SuiteResult:
    size: Size = ctx.size("recall", QUICK, FULL)
    timer = Timer()
    L = ctx.model.segment_len
    stream, borrowed = filler(ctx, max(size.distances) + 2 * L)
    results: dict = {e.key: {} for e in ctx.entrants}
    for i, d in enumerate(size.distances):
        items = recall_documents(ctx.tokenizer, [stream], size.items, d, d + L, seed=ctx.seed + i)
        for e in ctx.entrants:
            t = Timer()
            rec = recall_record([recalled(e.lm, it) for it in items], items)
            rec["s"] = t.seconds
            results[e.key][str(d)] = rec
            ctx.log(f"recall at {d:,} tokens, {e.key}: {sum(rec['recalled'])}/{len(items)} "
                    f"(answer NLL {rec['answer_nll']:.2f}/token, {t.seconds:.0f} s)")
    header = ["model"] + [f"{distance_label(d)}" for d in size.distances]
    rows = [[e.label] + [_cell(results[e.key][str(d)]) for d in size.distances] for e in ctx.entrants]
    lm = results["longmem"]
    worst = min(lm[str(d)]["accuracy"] for d in size.distances)
    by_distance = {k: {distance_label(d): r[str(d)] for d in size.distances} for k, r in results.items()}
    notes = [versus(by_distance, lambda r: r["accuracy"], False),
             f"LongMem's lowest accuracy over these distances: {100 * worst:.0f}% (target: >= 80% at every "
             "distance); cells give accuracy, then numbers and names recalled.",
             f"{size.items} items per distance; the fact lies D to D + {L:,} tokens before the question."]
    if borrowed:
        notes.append(borrowed_note(borrowed))
    plot = _plot(ctx, size.distances, results)
    return SuiteResult("recall", "Long-range recall by distance (beyond the paper): exact recall of a fact stated D "
                       "tokens before the question", [table(header, rows)],
                       {"results": results, "models": {e.key: e.label for e in ctx.entrants},
                        "borrowed_train_tokens": borrowed}, asdict(size), [plot], notes, timer.seconds)


def distance_label(d: int) -> str:
    """4096 -> "4k", 1048576 -> "1M"."""
    return f"{d // 1048576}M" if d % 1048576 == 0 else f"{d // 1024}k" if d % 1024 == 0 else f"{d:,}"


def borrowed_note(tokens: int) -> str:
    return (f"The held-out books end before the longest distance: the last {tokens:,} filler tokens come from books "
            "of the training split.")


def _cell(rec: dict) -> str:
    kinds = rec["by_kind"]
    parts = [f"{kind}s {round(v['accuracy'] * v['items'])}/{v['items']}" for kind, v in kinds.items()]
    return f"{100 * rec['accuracy']:.0f}% ({', '.join(parts)})"


def _plot(ctx: EvalContext, distances: list[int], results: dict) -> str:
    fig = figure(6.0, 3.6)
    ax = fig.add_subplot()
    for e in ctx.entrants:
        ax.plot(distances, [100 * results[e.key][str(d)]["accuracy"] for d in distances], marker="o", label=e.label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(distances, [distance_label(d) for d in distances])
    ax.set_xlabel("tokens between the fact and the question")
    ax.set_ylabel("recalled %")
    ax.set_ylim(-5, 105)
    ax.axhline(80, color="gray", lw=0.8, ls="--")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(ctx.out_dir / "recall.png")
    return "recall.png"
