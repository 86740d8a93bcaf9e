"""Suite 11, finding (beyond the paper): how often each finder ranks a question's gold passage among its first k, on
the natural question sets, no reader involved.

A reader can only answer from what it reads; the app reads its finder's best four passages. This suite asks each
answerable question of ``natural``'s sets (the same banks, under ``natural-banks``: a run of either reuses the other's)
of every finder and records where the first gold passage (one that overlaps the evidence) ranks:

- ``app``: what a chat reads, in its order (``tasks.reading.PassageFinder.find``): BM25 within the section the
  question names, a section's last passages for how it turns out, LongMem's memory where no word matches;
- ``bm25``: BM25 over the whole bank;
- ``embed``: all-MiniLM-L6-v2 as it ships, question and passages alike (the embedding-RAG baseline's finder);
- ``trained``: the trained question encoder (``model.question_encoder``) against the stock passage vectors;
- ``fused``: ``app`` and ``trained`` by reciprocal rank fusion (``tasks.reading.fuse``);
- ``rerank``: ``app``'s best ``rerank_depth`` passages ordered again by the trained reranker (``model.reranker``),
  the rest in ``app``'s order;
- ``memory``: LongMem's own retrieval, chunks voting for passages (a model pass per question; not in the default set).

Recall at k (k = 1, 2, 4, 8) is the share of questions whose gold passage ranks k or better, with a 95% Wilson
interval; paired counts compare each finder with ``app`` at k = 4 (the passages read). Each set's questions about one
book are one recorded work unit (``--resume``).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from longmem.eval.answering import bank_embeddings, text_bank
from longmem.eval.compare import sign_test
from longmem.eval.core import EvalContext, SuiteResult, figure, legend_below, table
from longmem.eval.natural import book_text, gold_passages, read_questions, set_path

FINDERS = ["app", "bm25", "embed", "trained", "fused", "rerank", "memory"]
DEFAULT_FINDERS = ["app", "bm25", "embed", "trained", "fused"]
KS = (1, 2, 4, 8)
DEPTH = 50  # passages each finder ranks; a gold passage below is recorded as not found (rank 0)
Z95 = 1.959964


@dataclass
class Size:
    """The suite's items."""

    sets: list[str] = field(default_factory=lambda: ["natural-dev", "natural-dev2"])  # answerable sets (``natural``)
    questions: int = 0  # questions asked per set, in file order (0: all)
    max_tokens: int = 0  # each book cut to its first tokens (0: whole); questions whose evidence is cut are left out
    finders: list[str] = field(default_factory=lambda: list(DEFAULT_FINDERS))  # which finders rank (``FINDERS``)
    encoder: str = ""  # the trained question encoder's checkpoint folder ("": the shipped one)
    reranker: str = ""  # the reranker's checkpoint folder ("": the shipped one, ``model.reranker.CHECKPOINT``; none
    #                     is shipped yet); it scores in float32
    rerank_depth: int = 16  # the app's best passages the reranker orders again


QUICK = Size(sets=["natural-dev"], questions=2, max_tokens=2048, finders=["app", "bm25"])
FULL = Size()


def wilson(hits: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a proportion ``hits`` / ``n`` (as fractions; (0, 1) when n is 0)."""
    if n == 0:
        return 0.0, 1.0
    p, z2 = hits / n, Z95 * Z95
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z95 * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    return (0.0 if hits == 0 else float(centre - half)), (1.0 if hits == n else float(centre + half))


def first_gold(ranked: list[int], gold: set[int]) -> int:
    """The rank (1 = first) of the first gold passage in ``ranked``, 0 when none is there."""
    return next((i for i, p in enumerate(ranked, 1) if p in gold), 0)


def check_finders(finders: list[str]) -> None:
    """Raise ValueError unless ``finders`` are known ones, each given once."""
    unknown = sorted(set(finders) - set(FINDERS))
    if unknown or not finders or len(set(finders)) < len(finders):
        raise ValueError(f"finding.finders: {', '.join(finders) or 'none'} (unknown: {unknown}); give each once, "
                         f"among {', '.join(FINDERS)}")


class Rankers:
    """The finders of a size, over one bank at a time (``rankings``)."""

    def __init__(self, ctx: EvalContext, size: Size):
        check_finders(size.finders)
        self.ctx, self.size = ctx, size
        want = set(size.finders)
        self.embedder = self.encoder = self.reranker = None
        if "rerank" in want:
            from longmem.model.reranker import Reranker

            self.reranker = Reranker.load(size.reranker or None)
        if want & {"embed", "trained", "fused"}:
            from longmem.model.embedder import Embedder

            self.embedder = Embedder.load()
        if want & {"trained", "fused"}:
            from longmem.model.question_encoder import QuestionEncoder

            self.encoder = QuestionEncoder.load(size.encoder or None, self.embedder)

    def rankings(self, bank, questions: list[str]) -> list[dict[str, list[int]]]:
        """Per question, finder -> passage ids best first (``DEPTH`` at most)."""
        from longmem.tasks.reading import PassageFinder, Reading, fuse

        want = set(self.size.finders)
        memory = bank.load_memory(self.ctx.model) if want & {"app", "memory", "fused", "rerank"} else None
        finder = PassageFinder(bank, self.ctx.model, memory) if memory is not None else None
        ids = vectors = None
        if self.embedder is not None:
            texts = bank.passage_texts()
            ids = np.array([p for p, _ in texts])
            vectors = bank_embeddings(bank, self.embedder, [t for _, t in texts])  # (n, d)
        stock = self.embedder.encode(questions) if "embed" in want else None
        trained = self.encoder.encode(questions) if self.encoder is not None else None
        out = []
        for i, q in enumerate(questions):
            r: dict[str, list[int]] = {}
            if want & {"app", "rerank"}:
                found = finder.find(q, Reading(passages=DEPTH, depth=DEPTH))
                r["app"] = [f.passage.id for f in found]
                if self.reranker is not None:
                    pool = found[: self.size.rerank_depth]
                    scores = self.reranker.score(q, [f.passage.text for f in pool])
                    best = [pool[j].passage.id for j in np.argsort(-scores, kind="stable")]
                    r["rerank"] = best + r["app"][len(pool):]
            if "bm25" in want:
                r["bm25"] = [p for p, _ in bank.search_passages(q, DEPTH)]
            if "memory" in want:
                r["memory"] = [f.passage.id for f in finder.rank(q, "memory", DEPTH)]
            if stock is not None:
                r["embed"] = ids[np.argsort(-(vectors @ stock[i]), kind="stable")[:DEPTH]].tolist()
            if trained is not None:
                dense = ids[np.argsort(-(vectors @ trained[i]), kind="stable")[:DEPTH]].tolist()
                if "trained" in want:
                    r["trained"] = dense
                if "fused" in want:
                    app = r.get("app") or [f.passage.id for f in finder.find(q, Reading(passages=DEPTH, depth=DEPTH))]
                    r["fused"] = [p for p, _ in fuse({"app": app, "trained": dense})][:DEPTH]
            out.append(r)
        return out


def run(ctx: EvalContext) -> SuiteResult:
    size: Size = ctx.size("finding", QUICK, FULL)
    if size.questions < 0 or size.max_tokens < 0:
        raise ValueError("finding.questions and finding.max_tokens must be >= 0 (0: all, whole books)")
    if not 1 <= size.rerank_depth <= DEPTH:
        raise ValueError(f"finding.rerank_depth must be in 1..{DEPTH}, got {size.rerank_depth}")
    if not size.sets or len(set(size.sets)) < len(size.sets):
        raise ValueError(f"finding.sets: give each set once, at least one (got {size.sets})")
    check_finders(size.finders)
    try:
        paths = {name: set_path(ctx, name) for name in size.sets}
    except ValueError as e:
        raise ValueError(str(e).replace("natural.sets", "finding.sets", 1)) from None
    rankers = Rankers(ctx, size)
    units = ctx.task_log("finding", size, selects=("sets",))  # a unit: one set's questions about one book
    done: dict[str, dict] = {}
    for name, path in paths.items():
        questions = [q for q in read_questions(path)[: size.questions or None] if q.answers]
        for book in dict.fromkeys(q.book for q in questions):
            key = f"{name}/{book}"
            done[key] = units.get(key)
            if done[key] is None:
                done[key] = _book(ctx, size, book, [q for q in questions if q.book == book], rankers)
                units.put(key, done[key])
    if not any(u["questions"] for u in done.values()):
        raise ValueError("finding: no answerable question's evidence lies within the books as cut")
    return _result(ctx, size, done, units.commits())


def _book(ctx: EvalContext, size: Size, book: str, questions: list, rankers: Rankers) -> dict:
    """Each finder's rank of the first gold passage for ``book``'s questions: {"questions", "ranks": finder ->
    [rank or 0], "seconds": finder -> seconds of ranking}."""
    t0 = time.perf_counter()
    text = book_text(ctx, book, size.max_tokens)
    out = {"questions": [], "ranks": {f: [] for f in size.finders}}
    with text_bank(ctx, "natural-banks", Path(book).stem, text, Path(book).stem) as bank:
        doc = bank.documents()[0]
        stored = bank.document_text(doc.id)
        asked = [(q, gold_passages(bank, doc.id, stored, q)) for q in questions]
        cut = [q.question for q, g in asked if g is None]
        if cut and not size.max_tokens:
            raise ValueError(f"{book}: the evidence of {cut[0]!r} is not in the book")
        asked = [(q, g) for q, g in asked if g is not None]
        t1 = time.perf_counter()
        rankings = rankers.rankings(bank, [q.question for q, _ in asked])
        for (q, gold), r in zip(asked, rankings):
            out["questions"].append(q.question)
            for f in size.finders:
                out["ranks"][f].append(first_gold(r[f], set(gold)))
    out["seconds"] = time.perf_counter() - t0
    out["ranking_seconds"] = time.perf_counter() - t1
    ctx.log(f"finding, {book}: {len(out['questions'])} questions, "
            + ", ".join(f"{f} {sum(0 < x <= 4 for x in out['ranks'][f])} in 4" for f in size.finders))
    return out


def recall(ranks: list[int], k: int) -> dict:
    """Recall at ``k`` of first-gold ranks: {"hits", "n", "recall", "low", "high"} (fractions)."""
    hits = sum(0 < r <= k for r in ranks)
    low, high = wilson(hits, len(ranks))
    return {"hits": hits, "n": len(ranks), "recall": hits / len(ranks) if ranks else float("nan"), "low": low,
            "high": high}


def _result(ctx: EvalContext, size: Size, done: dict, commits: list[str]) -> SuiteResult:
    names = list(dict.fromkeys(key.split("/")[0] for key in done))
    groups = {n: [k for k in done if k.split("/")[0] == n] for n in names}
    if len(names) > 1:
        groups["all"] = list(done)

    def ranks(f: str, keys: list[str]) -> list[int]:
        return [r for k in keys for r in done[k]["ranks"][f]]

    results = {g: {f: {str(k): recall(ranks(f, keys), k) for k in KS} for f in size.finders}
               for g, keys in groups.items()}
    tables = []
    for g, keys in groups.items():
        n = len(ranks(size.finders[0], keys))
        rows = [[f] + [f"{100 * c['recall']:.0f}% ({100 * c['low']:.0f}-{100 * c['high']:.0f})"
                       for c in (results[g][f][str(k)] for k in KS)] for f in size.finders]
        if "app" in size.finders:
            app = ranks("app", keys)
            for row, f in zip(rows, size.finders):
                mine = ranks(f, keys)
                only, lost = (sum(0 < a <= 4 and not 0 < b <= 4 for a, b in zip(x, y)) for x, y in
                              ((mine, app), (app, mine)))
                row.append("" if f == "app" else f"{only} vs {lost} (p = {sign_test(only, lost):.2f})")
        tables.append(f"**{g}** ({n} questions)\n\n" + table(
            ["finder", *[f"in {k}" for k in KS], *(["at 4: only it vs only app"] if "app" in size.finders else [])],
            rows))
    notes = [f"Question sets {', '.join(names)} (answerable questions), each book whole in a bank"
             + (f" (cut to its first {size.max_tokens:,} tokens)" if size.max_tokens else "")
             + f". A cell: % of questions whose first gold passage (one overlapping the evidence) a finder ranks "
             f"within its first k of {DEPTH}, with a 95% Wilson interval. The last column: at k = 4 (the passages the "
             "app reads), questions only that finder finds against those only the app's finder finds, with a "
             "two-sided sign test.",
             f"Ranking took {sum(u['ranking_seconds'] for u in done.values()):.1f} s for "
             f"{sum(len(u['questions']) for u in done.values())} questions, all finders together (a bank's passage "
             "vectors are made in its first run and kept beside it: later runs only rank).",
             f"Units run at {', '.join(commits)}."]
    return SuiteResult("finding", "Finding (beyond the paper): where each finder ranks the gold passage",
                       tables, {"results": results, "ranks": {k: u["ranks"] for k, u in done.items()},
                                "questions": {k: u["questions"] for k, u in done.items()}},
                       asdict(size), [_plot(ctx, results, size.finders)], notes,
                       sum(u["seconds"] for u in done.values()))


def _plot(ctx: EvalContext, results: dict, finders: list[str]) -> str:
    """Recall at k per finder, one panel per set (and all together)."""
    groups = list(results)
    fig = figure(3.6 * len(groups), 3.4)
    axes = [fig.add_subplot(1, len(groups), i + 1) for i in range(len(groups))]
    for ax, g in zip(axes, groups):
        for f in finders:
            cells = [results[g][f][str(k)] for k in KS]
            y = [100 * c["recall"] for c in cells]
            err = [[100 * (c["recall"] - c["low"]) for c in cells], [100 * (c["high"] - c["recall"]) for c in cells]]
            ax.errorbar(KS, y, yerr=err, marker="o", capsize=3, label=f)
        ax.set_xscale("log", base=2)
        ax.set_xticks(KS, [str(k) for k in KS])
        ax.set_ylim(0, 100)
        ax.set_title(g)
        ax.set_xlabel("passages read (k)")
        ax.set_ylabel("gold passage within k (%)")
    legend_below(axes[0], ncol=min(3, len(finders)), gap=0.2)
    fig.tight_layout()
    path = Path(ctx.out_dir) / "finding.png"
    fig.savefig(path, bbox_inches="tight")
    return path.name
