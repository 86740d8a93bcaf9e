"""Suite 1, long-context language modelling (paper table 3): token-level perplexity on held-out books and papers.

The paper splits PG-22 books by length (5k-10k, 10k-100k, 100k-500k, 500k-1M, >1M tokens). The held-out books here
(the 8 ``test`` books of the shared data) are 30k-110k tokens long, so the splits are filled the way the data
allows: every book's opening ``opening_tokens`` tokens are one document (8,192: the 5k-10k split), and every whole
book (cut at ``max_tokens``) is another, filed under the split of its length. The ArXiv column is the shared
LaTeX papers (a stand-in for the Pile's ArXiv subset, see the data manifest), never trained on.

Each document is read from its start in consecutive windows (1k for LongMem and the 1k backbone, 8k for the
full-context backbone); LongMem's memory holds the last ``memory`` tokens before its window (65k, the paper's).
Perplexity is exp(total NLL / total predicted tokens) over a split's documents.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from longmem.eval.core import (
    WITH_MEMORY,
    Entrant,
    EvalContext,
    SuiteResult,
    Timer,
    figure,
    legend_below,
    memory_empty,
    ppl,
    table,
    versus,
)
from longmem.eval.datasets.books import Document, tokenize_files
from longmem.eval.measures import perplexity
from longmem.util.data import cache_root

SPLITS = ((0, 5_000, "<5k"), (5_000, 10_000, "5k-10k"), (10_000, 100_000, "10k-100k"),
          (100_000, 500_000, "100k-500k"), (500_000, 1_000_000, "500k-1M"), (1_000_000, None, ">1M"))


@dataclass
class Size:
    books: int = 8  # held-out books
    opening_tokens: int = 8192  # each book's opening as a document of its own (0 = none)
    whole_books: bool = True  # each whole book as a document
    max_tokens: int = 500_000  # documents are cut here
    arxiv: int = 8  # LaTeX papers (the first by file name; 0 = no ArXiv column)
    arxiv_tokens: int = 0  # cut each paper here (0 = whole)
    memory: int = 65536  # LongMem's memory size M, in tokens


QUICK = Size(books=1, opening_tokens=1536, whole_books=False, arxiv=1, arxiv_tokens=1536)
FULL = Size()


def split_of(n_tokens: int) -> str:
    """The paper's length split of an ``n_tokens``-token document."""
    for lo, hi, name in SPLITS:
        if n_tokens >= lo and (hi is None or n_tokens < hi):
            return name
    raise ValueError(f"no split for {n_tokens} tokens")


def book_documents(books: list[Document], size: Size) -> list[tuple[str, Document]]:
    """(split, document) pairs: each book's opening, then each whole book (cut at ``max_tokens``)."""
    docs = []
    for book in books[: size.books]:
        if size.opening_tokens and len(book.ids) > size.opening_tokens:
            docs.append(Document(f"{book.name}[:{size.opening_tokens}]", book.ids[: size.opening_tokens]))
        if size.whole_books:
            docs.append(Document(book.name, book.ids[: size.max_tokens]))
    return [(split_of(len(d.ids)), d) for d in docs]


def arxiv_documents(ctx: EvalContext, size: Size) -> list[tuple[str, Document]]:
    files = sorted((ctx.data_dir / "arxiv").glob("*.tex"))[: size.arxiv]
    if size.arxiv and not files:
        raise FileNotFoundError(f"{ctx.data_dir / 'arxiv'}: no .tex papers (the ArXiv column's data)")
    docs = tokenize_files(files, ctx.tokenizer, cache_root() / "tokens")
    cut = size.arxiv_tokens or None
    return [("ArXiv", Document(d.name, d.ids[:cut])) for d in docs]


def score_documents(entrant: Entrant, docs: list[tuple[str, Document]], capacity: int | None, log) -> dict:
    """Per split: perplexity, tokens, seconds; and per document."""
    out: dict = {"splits": {}, "documents": {}}
    for split, doc in docs:
        t = Timer()
        nll, count = perplexity(entrant.lm, doc.ids, use_memory=entrant.fills_memory, capacity=capacity)
        s = out["splits"].setdefault(split, {"nll": 0.0, "tokens": 0, "documents": 0, "s": 0.0})
        s["nll"] += nll
        s["tokens"] += count
        s["documents"] += 1
        s["s"] += t.seconds
        out["documents"][doc.name] = {"split": split, "ppl": ppl(nll, count), "tokens": count}
        log(f"{entrant.key}: {doc.name} ({split}) perplexity {ppl(nll, count):.3f}, {count / t.seconds:.0f} tok/s")
    for s in out["splits"].values():
        s["ppl"] = ppl(s["nll"], s["tokens"])
    return out


def run(ctx: EvalContext) -> SuiteResult:
    size: Size = ctx.size("books", QUICK, FULL)
    timer = Timer()
    docs = book_documents(ctx.held_out_books(), size) + (arxiv_documents(ctx, size) if size.arxiv else [])
    splits = [name for _, _, name in SPLITS if any(s == name for s, _ in docs)] + (["ArXiv"] if size.arxiv else [])
    entrants = ctx.entrants + memory_empty(ctx.entrants)
    results = {e.key: score_documents(e, docs, size.memory, ctx.log) for e in entrants}
    rows = []
    for e in entrants:
        sp = results[e.key]["splits"]
        rows.append([e.label] + [f"{sp[s]['ppl']:.2f}" for s in splits])
    count = {s: sum(1 for d, _ in docs if d == s) for s in splits}
    tokens = {s: results[ctx.entrants[0].key]["splits"][s]["tokens"] for s in splits}
    header = ["model"] + [f"{s} ({count[s]} docs, {tokens[s] / 1000:.0f}k tok)" for s in splits]
    tables = [table(header, rows)]
    notes = [_verdict(results, splits)] + [_memory_share(results, splits, e.empty_of)
                                           for e in entrants if e.empty_of is not None]
    plot = _plot(ctx, entrants, results, splits)
    return SuiteResult("books", "Long-context language modelling (paper table 3): perplexity, lower is better",
                       tables, {"models": {e.key: e.label for e in entrants}, "results": results,
                                "splits": splits}, asdict(size), [plot], notes, timer.seconds)


def _verdict(results: dict, splits: list[str]) -> str:
    """Which columns LongMem beats the 1k-context backbone (and MemTRM) on."""
    return versus({k: {s: r["splits"][s] for s in splits} for k, r in results.items()}, lambda r: r["ppl"], True)


def _memory_share(results: dict, splits: list[str], model: str) -> str:
    """How much of a model's perplexity change memory makes, per split (the rest is its training's without memory):
    ``model`` is "longmem" or "memtrm"."""
    cells = []
    for s in splits:
        empty, full = results[f"{model}_empty"]["splits"][s]["ppl"], results[model]["splits"][s]["ppl"]
        cells.append(f"{s} {empty:.2f} -> {full:.2f} ({100 * (full / empty - 1):+.1f}%)")
    name = WITH_MEMORY[model][0]
    return f"Memory's own share ({name} with its memory empty -> with memory): " + ", ".join(cells) + "."


def _plot(ctx: EvalContext, entrants: list[Entrant], results: dict, splits: list[str]) -> str:
    fig = figure(1.6 + 1.4 * len(splits), 3.0 + 0.17 * len(entrants))
    ax = fig.add_subplot()
    width = 0.8 / len(entrants)
    for i, e in enumerate(entrants):
        xs = [j + i * width for j in range(len(splits))]
        ax.bar(xs, [results[e.key]["splits"][s]["ppl"] for s in splits], width, label=e.label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(splits))], splits)
    ax.set_ylabel("perplexity (lower is better)")
    ax.set_title("Held-out perplexity by document length")
    legend_below(ax)
    fig.tight_layout()
    name = "books.png"
    fig.savefig(Path(ctx.out_dir) / name, bbox_inches="tight")  # the legend below may be wider than the axes
    return name
