"""Suite 8, questions about a long text (beyond the paper): a SQuAD dev paragraph spliced into held-out book text,
D tokens before its question (D = 4k ... 1M), answered by every entrant on the same items.

Haystack. The first D tokens of the held-out books (the *filler*, ``distance.filler``; the same for every item) with
the item's paragraph in front, so the question comes D tokens after it. The filler is ingested once per D into a bank
under the output folder (kept and reused by later runs) and its memory loaded once. An item adds its paragraph as
one more document, inside a savepoint of the bank's SQLite, and to the loaded memory; both are rolled back after the
item. Segments are encoded independently, so this is exactly the bank a user would have after ingesting the text.
Each block of ``block`` questions at one distance is a recorded work unit (``--resume``), so a run of hours can stop
and go on; the filler's bank, memory and embeddings are loaded once per distance for the blocks still to run. The
``blocks`` setting picks which blocks a run makes, so that processes (or machines) can split a distance between them
and put their units together (``chosen_blocks``).

Entrants and scores: ``longmem.eval.answering`` (LongMem reading nothing, reading each finder's passages; BM25-RAG and
embedding RAG with the same backbone and window; the 8k backbone on the haystack's tail; the oracles reading the
item's paragraph alone). Per finder, also the share of questions whose gold paragraph was among the passages read.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from longmem.eval.answering import (
    LABELS,
    QUICK_NEW_TOKENS,
    Asked,
    Entrants,
    Haystack,
    ReadingSize,
    entrants_for,
    finders,
    indexed_haystack,
    label,
    scored,
    summary,
    text_bank,
    versus_notes,
)
from longmem.eval.core import EvalContext, SuiteResult, Timer, figure, legend_below, table
from longmem.eval.datasets.squad import QA, read_squad
from longmem.eval.recall import borrowed_note, distance_label, filler
from longmem.ingest.pipeline import cut_segments, store_segment
from longmem.ingest.readers import Block
from longmem.memory.memory import Memory
from longmem.storage.bank import Bank
from longmem.storage.passages import ChunkPlaces, Passage
from longmem.tasks.reading import Found
from longmem.text.passages import PassageCutter


@dataclass
class SplicedSize(ReadingSize):
    """The size fields of the suites that splice their items into filler D tokens before the question (``bookqa``,
    ``facts``): the distances and the recorded blocks, beside how every entrant reads (``ReadingSize``)."""

    distances: list[int] = field(default_factory=lambda: [4096, 16384, 65536, 262144, 1048576])  # D, in tokens
    block: int = 10  # items per recorded work unit (--resume goes on from the last finished block)
    blocks: list[int] = field(default_factory=list)  # which blocks this run makes and reports, numbered from 0
    #                   (empty: all); runs that split them between processes make one record (``chosen_blocks``)


@dataclass
class Size(SplicedSize):
    """The suite's items (and where and how they are asked: ``SplicedSize``)."""

    questions: int = 100  # SQuAD dev questions, one per paragraph, the same at every distance


QUICK = Size(distances=[4096], questions=1, new_tokens=QUICK_NEW_TOKENS)  # CI size: one question, all ten entrants
FULL = Size()


def items(ctx: EvalContext, n: int) -> list[QA]:
    """``n`` SQuAD dev questions drawn with the run's seed, one per paragraph."""
    qas = read_squad(ctx.data_dir / "squad" / "dev-v1.1.json")
    first = {}
    for qa in qas:
        first.setdefault(qa.passage, qa)
    return random.Random(ctx.seed).sample(sorted(first.values(), key=lambda q: q.id), n)


def filler_bank(ctx: EvalContext, tokens: np.ndarray) -> Bank:
    """The bank of the filler text (ingested once; a later run with the same text and backbone reuses it)."""
    return text_bank(ctx, "bookqa-banks", f"filler-{len(tokens)}", ctx.tokenizer.decode(tokens.tolist()), "filler")


@contextlib.contextmanager
def spliced(bank: Bank, model, memory: Memory, qa: QA):
    """The bank and its loaded memory with ``qa``'s paragraph added as one more document, for one item: yields the
    document id and the chunk places of the grown memory; afterwards both are as they were."""
    tok, info = model.backbone.tokenizer, bank.info_cached
    before = len(memory)
    with bank.provisional():
        try:
            cutter, ref = PassageCutter(), {"title": qa.title, "source": qa.id, "kind": "text", "options": {},
                                            "sha256": hashlib.sha256(qa.passage.encode()).hexdigest(), "meta": {}}
            block = Block(qa.passage, 0, len(qa.passage.encode()))
            for seq, seg in enumerate(cut_segments(tok, [block], info.segment_len, info.chunk_size)):
                ref, k, v = store_segment(bank, model, ref, seq, seg, cutter)
                n = k.shape[1]
                memory.add(k[None], v[None], tokens=seg.ids[None, :n], starts=_starts(n))
            bank.finish_document(ref, cutter.finish())
            yield ref, bank.chunk_places(appended=ref)
        finally:
            memory.truncate(before)


def _starts(n: int) -> torch.Tensor:
    starts = torch.zeros(1, n, dtype=torch.bool)
    starts[:, :1] = True  # the segment was encoded from position 0: its first token is an attention sink
    return starts


def gold_found(qa: QA, doc_id: int) -> Found:
    ref = Passage(id=-1, document_id=doc_id, document=qa.title, chapter=None, char_start=0,
                     char_end=len(qa.passage), document_chars=len(qa.passage), text=qa.passage)
    return Found(ref, 0.0)


def run(ctx: EvalContext) -> SuiteResult:
    size: Size = ctx.size("bookqa", QUICK, FULL)
    timer = Timer()
    chosen_blocks("bookqa", size, size.questions)  # a block number the size does not have fails before any work
    entrants = entrants_for(ctx, size, "bookqa")
    qas = items(ctx, size.questions)
    stream, borrowed = filler(ctx, max(size.distances))
    results, gold_read, seconds, commits = answer_at_distances(ctx, size, "bookqa", qas, stream, entrants, timer)
    return _result(ctx, size, chosen_items("bookqa", size, qas), results, gold_read, borrowed, seconds, commits)


def chosen_blocks(suite: str, size: SplicedSize, n: int) -> list[int]:
    """Where the blocks of ``size.block`` items (of ``n``) that this run makes and reports start: those numbered in
    ``size.blocks``, or all. A block is a work unit under the same key whichever run makes it, and the choice is not
    part of the units' signature, so runs that split the blocks between them (each in its own ``--out``, the filler
    banks copied across) make one record: concatenate their ``<suite>.tasks.jsonl`` and ``--resume`` reports it
    whole. ValueError for a block size under 1 or a block number that ``n`` items do not have."""
    if size.block < 1:
        raise ValueError(f"{suite}.block must be >= 1, got {size.block}")
    starts = list(range(0, n, size.block))
    wrong = sorted(set(size.blocks) - set(range(len(starts))))
    if wrong:
        raise ValueError(f"{suite}.blocks: no block {wrong[0]} ({n} items in blocks of {size.block}: blocks "
                         f"0-{len(starts) - 1})")
    return [b for i, b in enumerate(starts) if not size.blocks or i in size.blocks]


def chosen_items(suite: str, size: SplicedSize, qas: list[QA]) -> list[QA]:
    """The items of the blocks this run makes and reports (``chosen_blocks``), in order."""
    return [qa for b in chosen_blocks(suite, size, len(qas)) for qa in qas[b:b + size.block]]


def answer_at_distances(ctx: EvalContext, size, suite: str, qas: list[QA], stream: np.ndarray, entrants: Entrants,
                        timer: Timer) -> tuple[dict, dict, float, list[str]]:
    """Every entrant of ``size.entrants`` answering each of ``qas`` (those of the chosen blocks: ``chosen_blocks``)
    with its passage spliced ``d`` tokens of ``stream`` before it, for each ``d`` of ``size.distances``; blocks of
    ``size.block`` questions at one distance are ``suite``'s work units (``--resume`` reuses them). Returns (entrant
    -> distance -> ``summary``, finder -> distance -> share of questions whose gold passage was read, seconds of work
    in all, where the units were made)."""
    chosen = [(b, qas[b:b + size.block]) for b in chosen_blocks(suite, size, len(qas))]
    units = ctx.task_log(suite, size, selects=("distances", "blocks"))  # a unit: a block of questions at one distance
    results: dict = {k: {} for k in size.entrants}
    gold_read: dict = {f: {} for f in finders(size.entrants, size.finder)}
    seconds = 0.0  # of every distance, those reused from an earlier run included
    for d in size.distances:
        blocks = [(f"{d}/{b}", block) for b, block in chosen]
        todo = [(key, block) for key, block in blocks if units.get(key) is None]
        if todo:
            _at_distance(ctx, size, suite, d, todo, stream, entrants, timer, units.put)
        done = [units.get(key) for key, _ in blocks]
        seconds += sum(u["seconds"] for u in done)
        for k in size.entrants:
            results[k][str(d)] = summary([r for u in done for r in u["scores"][k]])
        for f in gold_read:
            r = [x for u in done for x in u["reads"][f]]
            gold_read[f][str(d)] = float(np.mean(r)) if r else float("nan")
    return results, gold_read, seconds, units.commits()


def _at_distance(ctx: EvalContext, size, suite: str, d: int, blocks: list[tuple[str, list[QA]]], stream: np.ndarray,
                 entrants: Entrants, timer: Timer, put) -> None:
    """Every entrant's answer to each block's questions with their paragraph ``d`` tokens before them; each block is
    recorded by ``put(key, unit)`` as it finishes, unit = {"scores": entrant -> per-question scores, "reads": finder ->
    per-question whether the gold paragraph was read, "seconds"}. The filler's bank, memory and embedding index are
    loaded once for all the blocks."""
    model, want = ctx.model, set(size.entrants)
    n = sum(len(block) for _, block in blocks)
    with filler_bank(ctx, stream[:d]) as bank:
        hay = indexed_haystack(bank, bank.load_memory(model), stream[:d], entrants.embedder)
        i = 0
        for key, block in blocks:
            t0 = time.perf_counter()
            scores: dict = {k: [] for k in size.entrants}
            reads: dict = {f: [] for f in finders(size.entrants, size.finder)}
            for qa in block:
                i += 1
                with spliced(bank, model, hay.memory, qa) as (doc_id, places):
                    got = entrants.answers(want, _asked(bank, qa, doc_id), _with_paragraph(ctx, hay, qa, places), reads)
                for k in size.entrants:
                    scores[k].append({"id": qa.id, **scored(got[k], qa.answers)})
                fused = f"fused read the gold paragraph: {reads['fused'][-1]}; " if "fused" in reads else ""
                ctx.log(f"{suite} at {d:,} tokens, question {i}/{n} to run: {fused}answered: "
                        + ", ".join(f"{k} {scores[k][-1]['contains']:.0f}" for k in size.entrants)
                        + f" ({timer.seconds / 60:.1f} min)")
            put(key, {"scores": scores, "reads": reads, "seconds": time.perf_counter() - t0})


def _asked(bank: Bank, qa: QA, doc_id: int) -> Asked:
    """The item as the entrants meet it: the gold is the spliced paragraph's document."""
    own = bank.passage_texts(doc_id)
    return Asked(qa.question, qa.answers, [gold_found(qa, doc_id)], lambda f: f.passage.document_id == doc_id, own)


def _with_paragraph(ctx: EvalContext, hay: Haystack, qa: QA, places: ChunkPlaces) -> Haystack:
    """The filler's haystack with the item's paragraph in front (and its chunks in ``places``)."""
    paragraph = np.asarray(ctx.tokenizer(qa.passage, add_special_tokens=False).input_ids)
    return Haystack(hay.bank, hay.memory, np.concatenate([paragraph, hay.tokens]), places, hay.index, hay.indexed)


def _result(ctx, size, qas, results, gold_read, borrowed, seconds: float, commits: list[str]) -> SuiteResult:
    ds = [str(d) for d in size.distances]
    header = (["model"] + [f"{distance_label(int(d))}: answered / EM / F1" for d in ds] + ["average answered"])
    rows = []
    for k in results:
        r, name = results[k], label(k, size.reader)
        cells = [f"{r[d]['contains']:.0f} ± {r[d]['contains_ci95']:.0f} / {r[d]['em']:.0f} / {r[d]['f1']:.1f}"
                 for d in ds]
        rows.append([name, *cells, f"{np.mean([r[d]['contains'] for d in ds]):.1f}"])
    reads = reads_table(gold_read, ds)
    avg = {k: float(np.mean([results[k][d]["contains"] for d in ds])) for k in results}
    notes = [f"{len(qas)} SQuAD dev questions (one per paragraph) at each distance. Answered: % of answers that "
             "contain a gold answer (± a 95% interval); then SQuAD EM and F1, in %. The gold passage is the item's "
             "paragraph. The second table: the share of questions whose gold paragraph was among the passages read, "
             "per finder.", *versus_notes(avg)]
    notes += run_notes("bookqa", results, borrowed, commits, seconds)
    plot = plot_distances(ctx, size.distances, results, "bookqa.png", "tokens between the paragraph and the question",
                          "answers containing a gold answer, %", size.reader)
    models = {k: label(k, size.reader) for k in results}
    return SuiteResult("bookqa", "Questions about a long text (beyond the paper): a SQuAD paragraph D tokens before "
                       "its question", [table(header, rows), reads],
                       {"results": results, "gold_read": gold_read, "models": models,
                        "questions": [q.id for q in qas], "borrowed_train_tokens": borrowed},
                       asdict(size), [plot], notes, seconds)


def reads_table(gold_read: dict, ds: list[str]) -> str:
    """Per finder, the share of items whose gold passage was among the passages read, by distance."""
    return table(["finder"] + [distance_label(int(d)) for d in ds],
                 [[f] + [f"{100 * gold_read[f][d]:.0f}%" for d in ds] for f in gold_read])


def run_notes(suite: str, results: dict, borrowed: int, commits: list[str], seconds: float) -> list[str]:
    """The notes that say how a distance suite ran: which entrants (when not all), borrowed filler, where and how
    long."""
    notes = [f"Entrants run: {', '.join(results)} ({suite}.entrants)."] if set(results) != set(LABELS) else []
    if borrowed:
        notes.append(borrowed_note(borrowed))
    return notes + [f"Distances run at {', '.join(commits)}; {seconds / 60:.1f} min of work in all."]


def plot_distances(ctx: EvalContext, distances: list[int], results: dict, name: str, xlabel: str, ylabel: str,
                   reader: str = "") -> str:
    """Each entrant's headline score by distance (the baselines dashed), saved as ``name`` in the output folder;
    ``reader``: the run's other reader, as the entrants' labels name it."""
    fig = figure(6.4, 4.2)
    ax = fig.add_subplot()
    for k in results:
        ax.plot(distances, [results[k][str(d)]["contains"] for d in distances], marker="o", label=label(k, reader),
                ls="--" if k.startswith(("oracle", "rag", "backbone")) else "-")
    ax.set_xscale("log", base=2)
    ax.set_xticks(distances, [distance_label(d) for d in distances])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    legend_below(ax, ncol=2, gap=0.16)
    fig.tight_layout()
    path = Path(ctx.out_dir) / name
    fig.savefig(path, bbox_inches="tight")
    return path.name
