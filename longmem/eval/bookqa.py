"""Suite 8, questions about a long text (beyond the paper): a SQuAD dev paragraph spliced into held-out book text,
D tokens before its question (D = 4k ... 1M), answered by every entrant on the same items.

Haystack. The first D tokens of the held-out books (the *filler*, ``distance.filler``; the same for every item) with
the item's paragraph in front, so the question comes D tokens after it. The filler is ingested once per D into a bank
under the output folder (kept and reused by later runs) and its memory loaded once. An item adds its paragraph as
one more document, inside a savepoint of the bank's SQLite, and to the loaded memory; both are rolled back after the
item. Segments are encoded independently, so this is exactly the bank a user would have after ingesting the text.
Each block of ``block`` questions at one distance is a recorded work unit (``--resume``), so a run of hours can stop
and go on; the filler's bank, memory and embeddings are loaded once per distance for the blocks still to run.

Entrants, each answering greedily in the chat template, up to ``new_tokens`` tokens, with up to ``passages``
passages read (what fits the window after the question and the answer):

- ``longmem``: LongMem with the haystack in memory, reading nothing (the paper's memory fusion alone);
- ``longmem_memory``, ``longmem_lexical``, ``longmem_fused``: LongMem reading the passages that finder found
  (``longmem.tasks.reading``), memory attached;
- ``rag_bm25``: the backbone (same window, no memory) reading the best BM25 passages;
- ``rag_embed``: the backbone reading the passages closest to the question under all-MiniLM-L6-v2
  (``longmem.model.embedder``), what a document-chat app would use;
- ``backbone_full``: the backbone reading the last tokens of the haystack that fit its native context (8k), then
  the question (the paragraph is in view only when D is short);
- ``oracle`` and ``oracle_backbone``: LongMem and the backbone reading the gold paragraph alone: what reading can
  give at best with each model. The targets compare LongMem to its own oracle.

Scores. A chat model answers in sentences ("The V&A co-owns Canova's The Three Graces."), so the headline is the
rule of the project's ``bookqa/natural-dev.jsonl``: an answer counts when it contains a gold answer (both under
SQuAD's normalisation). SQuAD EM and F1 of the same answer are reported beside it (EM is near 0 for every entrant
for that reason). The answer is the whole generation (``new_tokens`` at most), lines joined. Per finder, also the
share of questions whose gold paragraph was among the passages read.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from longmem.eval.core import EvalContext, SuiteResult, Timer, figure, legend_below, mean_std, table
from longmem.eval.datasets.squad import QA, exact_match, f1, normalize_answer, read_squad
from longmem.eval.recall import borrowed_note, distance_label, filler
from longmem.ingest.pipeline import cut_segments, ingest, store_segment
from longmem.ingest.readers import Block
from longmem.memory.memory import Memory
from longmem.model.baselines import BackboneLM
from longmem.model.lm import Sampling
from longmem.storage import BankDirectory
from longmem.storage.bank import Bank
from longmem.storage.passages import ChunkPlaces, PassageRef
from longmem.tasks.chat import Chat
from longmem.tasks.reading import Found, PassageFinder, Reading, find_for_chat, fit, reading_prompt
from longmem.text.passages import PassageCutter
from longmem.util.files import write_file_atomic

FINDER_ENTRANTS = {"longmem_memory": "memory", "longmem_lexical": "lexical", "longmem_fused": "fused"}
LABELS = {
    "longmem": "LongMem, memory fusion alone (reads nothing)",
    "longmem_memory": "LongMem reading what its memory retrieval finds",
    "longmem_lexical": "LongMem reading what BM25 finds",
    "longmem_fused": "LongMem reading both, fused (the app's default)",
    "rag_bm25": "BM25-RAG: the backbone reading what BM25 finds",
    "rag_embed": "embedding RAG: the backbone reading what all-MiniLM-L6-v2 finds",
    "backbone_full": "the backbone, native context (8k) of the haystack",
    "oracle": "oracle: LongMem reading the gold paragraph",
    "oracle_backbone": "oracle: the backbone reading the gold paragraph",
}
TEXT_PROMPT = "Answer the question from this text.\n\n{text}\n\nQuestion: {question}"


@dataclass
class Size:
    distances: list[int] = field(default_factory=lambda: [4096, 16384, 65536, 262144, 1048576])  # D, in tokens
    questions: int = 100  # SQuAD dev questions, one per paragraph, the same at every distance
    passages: int = 4  # passages an answer reads at most
    budget: int = 640  # tokens of passages an answer reads at most (what fits the window is the other bound)
    new_tokens: int = 24  # tokens generated per answer at most
    entrants: list[str] = field(default_factory=lambda: list(LABELS))  # which entrants answer (default: all)
    block: int = 10  # questions per recorded work unit (--resume goes on from the last finished block)


QUICK = Size(distances=[4096], questions=2)
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
    tok, model = ctx.tokenizer, ctx.model
    text = tok.decode(tokens.tolist())
    digest = hashlib.sha256(text.encode() + model.backbone.fingerprint().encode()).hexdigest()[:12]
    root = ctx.out_dir / "bookqa-banks"
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"filler-{len(tokens)}-{digest}.txt"
    if not path.exists():
        path.write_text(text, encoding="utf-8")
    directory = BankDirectory(root)
    name = path.stem
    bank = directory.open(name) if directory.exists(name) else directory.create(name, model)
    res = ingest(bank, model, path, title="filler")
    ctx.log(f"bookqa filler of {len(tokens):,} tokens: {res.action} ({res.tokens:,} tokens, {res.seconds:.0f} s)")
    return bank


def filler_embeddings(bank: Bank, embedder, texts: list[str]) -> np.ndarray:
    """The embeddings of the filler's passage ``texts`` (n, dim), kept beside its bank and reused while the texts
    are the same (embedding a 1M-token filler takes ~12 minutes on a 2-core CPU)."""
    path = bank.path.parent / f"{bank.name}.embeddings.npz"
    made_by = f"{embedder.model.config.name_or_path}|{embedder.max_length}"
    digest = hashlib.sha256("\x00".join([made_by, *texts]).encode()).hexdigest()
    if path.exists():
        with np.load(path) as kept:
            if str(kept["digest"]) == digest and kept["vectors"].shape == (len(texts), embedder.dim):
                return kept["vectors"]
    vectors = embedder.encode(texts)
    buf = io.BytesIO()
    np.savez(buf, vectors=vectors, digest=np.array(digest))
    write_file_atomic(path, buf.getvalue())
    return vectors


@contextlib.contextmanager
def spliced(bank: Bank, model, memory: Memory, qa: QA):
    """The bank and its loaded memory with ``qa``'s paragraph added as one more document, for one item: yields the
    document id and the chunk places of the grown memory; afterwards both are as they were."""
    tok, info = model.backbone.tokenizer, bank.info_cached
    before = len(memory)
    with bank.writing():
        bank.db.execute("SAVEPOINT bookqa_item")
        try:
            cutter, ref = PassageCutter(), {"title": qa.title, "source": qa.id, "kind": "text", "options": {},
                                            "sha256": hashlib.sha256(qa.passage.encode()).hexdigest(), "meta": {}}
            block = Block(qa.passage, 0, len(qa.passage.encode()))
            for seq, seg in enumerate(cut_segments(tok, [block], info.segment_len, info.chunk_size)):
                ref, k, v = store_segment(bank, model, ref, seq, seg, cutter)
                n = k.shape[1]
                memory.add(k[None], v[None], tokens=seg.ids[None, :n], starts=_starts(n))
            bank.finish_document(ref, cutter.finish())
            segs = bank.db.execute("SELECT id, n_chunks FROM segments WHERE document_id = ? ORDER BY seq",
                                   [ref]).fetchall()
            lay = bank.layout
            places = ChunkPlaces(bank.db, np.append(lay.segment_ids, [s for s, _ in segs]),
                                 np.append(lay.first_chunk, lay.first_chunk[-1] + np.cumsum([c for _, c in segs])))
            yield ref, places
        finally:
            bank.db.execute("ROLLBACK TO SAVEPOINT bookqa_item")
            bank.db.execute("RELEASE SAVEPOINT bookqa_item")
            memory.truncate(before)


def _starts(n: int) -> torch.Tensor:
    starts = torch.zeros(1, n, dtype=torch.bool)
    starts[:, :1] = True  # the segment was encoded from position 0: its first token is an attention sink
    return starts


def answer(lm, memory, question: str, reading: str | None, size: Size) -> str:
    """The entrant's greedy answer to ``question`` (reading ``reading`` in its place), its lines joined."""
    tok = lm.backbone.tokenizer
    stop = (tok.eos_token_id,) if tok.eos_token_id is not None else ()
    chat = Chat(lm, memory, Sampling(max_new_tokens=size.new_tokens, temperature=0, stop_ids=stop))
    return " ".join("".join(chat.ask(question, reading)).split())


def contains(answer: str, golds) -> float:
    """1.0 when the normalised answer contains a normalised gold answer as whole words, else 0.0."""
    text = f" {normalize_answer(answer)} "
    return float(any(f" {g} " in text for g in map(normalize_answer, golds) if g))


def window_text(lm, question: str, haystack: np.ndarray, size: Size) -> str:
    """The backbone's full-context prompt: the haystack's last tokens that fit with the question and the answer."""
    tok = lm.backbone.tokenizer
    chat = Chat(lm, None, Sampling(max_new_tokens=size.new_tokens))
    room = lm.segment_len - size.new_tokens - chat.prompt_ids(TEXT_PROMPT.format(text="", question=question),
                                                              history=False).shape[1] - 8
    return TEXT_PROMPT.format(text=tok.decode(haystack[-room:].tolist()), question=question)


def gold_found(qa: QA, doc_id: int) -> Found:
    ref = PassageRef(id=-1, document_id=doc_id, document=qa.title, chapter=None, char_start=0,
                     char_end=len(qa.passage), document_chars=len(qa.passage), text=qa.passage)
    return Found(ref, 0.0)


def run(ctx: EvalContext) -> SuiteResult:
    from longmem.model.embedder import Embedder

    size: Size = ctx.size("bookqa", QUICK, FULL)
    unknown = sorted(set(size.entrants) - set(LABELS))
    if unknown or not size.entrants or len(set(size.entrants)) < len(size.entrants):
        raise ValueError(f"bookqa.entrants: {', '.join(size.entrants) or 'none'} (unknown: {unknown}); give each "
                         f"once, among {', '.join(LABELS)}")
    if size.block < 1:
        raise ValueError(f"bookqa.block must be >= 1, got {size.block}")
    timer = Timer()
    model, bb = ctx.model, ctx.model.backbone
    backbone = BackboneLM(bb, model.segment_len)
    full = BackboneLM(bb, bb.spec.max_positions)
    qas = items(ctx, size.questions)
    stream, borrowed = filler(ctx, max(size.distances))
    embedder = Embedder.load() if "rag_embed" in size.entrants else None
    units = ctx.task_log("bookqa", size, selects=("distances",))  # a unit: a block of questions at one distance
    results: dict = {k: {} for k in size.entrants}
    gold_read: dict = {f: {} for f in finders(size.entrants)}
    seconds = 0.0  # of every distance, those reused from an earlier run included
    for d in size.distances:
        blocks = [(f"{d}/{b}", qas[b:b + size.block]) for b in range(0, len(qas), size.block)]
        todo = [(key, block) for key, block in blocks if units.get(key) is None]
        if todo:
            _at_distance(ctx, size, d, todo, stream, embedder, backbone, full, timer, units.put)
        done = [units.get(key) for key, _ in blocks]
        seconds += sum(u["seconds"] for u in done)
        for k in size.entrants:
            results[k][str(d)] = _summary([r for u in done for r in u["scores"][k]])
        for f in gold_read:
            r = [x for u in done for x in u["reads"][f]]
            gold_read[f][str(d)] = float(np.mean(r)) if r else float("nan")
    return _result(ctx, size, qas, results, gold_read, borrowed, seconds, units.commits())


def finders(entrants: list[str]) -> list[str]:
    """The finders whose gold-paragraph reads ``entrants`` record: one per reading LongMem entrant, and the
    embedder's for embedding RAG (BM25-RAG reads what the lexical finder found)."""
    out = [f for k, f in FINDER_ENTRANTS.items() if k in entrants]
    if "rag_bm25" in entrants and "lexical" not in out:
        out.append("lexical")
    return out + ["embed"] * ("rag_embed" in entrants)


def _at_distance(ctx: EvalContext, size: Size, d: int, blocks: list[tuple[str, list[QA]]], stream: np.ndarray,
                 embedder, backbone, full, timer: Timer, put) -> None:
    """Every entrant's answer to each block's questions with their paragraph ``d`` tokens before them; each block is
    recorded by ``put(key, unit)`` as it finishes, unit = {"scores": entrant -> per-question scores, "reads": finder ->
    per-question whether the gold paragraph was read, "seconds"}. The filler's bank, memory and embedding index are
    loaded once for all the blocks."""
    from longmem.model.embedder import EmbeddingIndex

    model, want = ctx.model, set(size.entrants)
    n = sum(len(block) for _, block in blocks)
    with filler_bank(ctx, stream[:d]) as bank:
        memory = bank.load_memory(model)
        filler_passages = bank.db.execute("SELECT id, text FROM passages ORDER BY id").fetchall()
        index = None
        if "rag_embed" in want:
            index = EmbeddingIndex(embedder)
            index.add_vectors(filler_embeddings(bank, embedder, [t for _, t in filler_passages]))
        i = 0
        for key, block in blocks:
            t0 = time.perf_counter()
            scores: dict = {k: [] for k in size.entrants}
            reads: dict = {f: [] for f in finders(size.entrants)}
            for qa in block:
                i += 1
                with spliced(bank, model, memory, qa) as (doc_id, places):
                    got = _answers(ctx, size, want, qa, doc_id, places, bank, memory, index, filler_passages,
                                   embedder, backbone, full, stream[:d], reads)
                for k in size.entrants:
                    scores[k].append({"id": qa.id, "answer": got[k], "contains": contains(got[k], qa.answers),
                                      "em": exact_match(got[k], qa.answers), "f1": f1(got[k], qa.answers)})
                fused = f"fused read the gold paragraph: {reads['fused'][-1]}; " if "fused" in reads else ""
                ctx.log(f"bookqa at {d:,} tokens, question {i}/{n} to run: {fused}answered: "
                        + ", ".join(f"{k} {scores[k][-1]['contains']:.0f}" for k in size.entrants)
                        + f" ({timer.seconds / 60:.1f} min)")
            put(key, {"scores": scores, "reads": reads, "seconds": time.perf_counter() - t0})


def _answers(ctx: EvalContext, size: Size, want: set[str], qa: QA, doc_id: int, places, bank: Bank, memory: Memory,
             index, filler_passages: list, embedder, backbone, full, filler_tokens: np.ndarray,
             reads: dict) -> dict[str, str]:
    """The wanted entrants' answers to one spliced item (entrant -> answer); appends to ``reads`` whether each
    finder read the gold paragraph."""
    model = ctx.model
    finder = PassageFinder(bank, model, memory, places)
    chat = Chat(model, memory, Sampling(max_new_tokens=size.new_tokens))
    got = {}
    if "longmem" in want:
        got["longmem"] = answer(model, memory, qa.question, None, size)
    for key, how in FINDER_ENTRANTS.items():
        if how not in reads:
            continue
        found = find_for_chat(finder, chat, qa.question, Reading(finder=how, passages=size.passages,
                                                                 budget=size.budget))
        reads[how].append(any(f.passage.document_id == doc_id for f in found))
        if key in want:
            got[key] = answer(model, memory, qa.question, reading_prompt(qa.question, found), size)
        if how == "lexical" and "rag_bm25" in want:
            got["rag_bm25"] = answer(backbone, None, qa.question, reading_prompt(qa.question, found), size)
    if "rag_embed" in want:
        found = _embedded(bank, index, filler_passages, embedder, qa, doc_id, chat, size)
        reads["embed"].append(any(f.passage.document_id == doc_id for f in found))
        got["rag_embed"] = answer(backbone, None, qa.question, reading_prompt(qa.question, found), size)
    if "backbone_full" in want:
        paragraph = np.asarray(ctx.tokenizer(qa.passage, add_special_tokens=False).input_ids)
        haystack = np.concatenate([paragraph, filler_tokens])
        got["backbone_full"] = answer(full, None, qa.question, window_text(full, qa.question, haystack, size), size)
    gold = reading_prompt(qa.question, [gold_found(qa, doc_id)])
    if "oracle" in want:
        got["oracle"] = answer(model, memory, qa.question, gold, size)
    if "oracle_backbone" in want:
        got["oracle_backbone"] = answer(backbone, None, qa.question, gold, size)
    return got


def _embedded(bank: Bank, index, filler_passages: list, embedder, qa: QA, doc_id: int, chat: Chat,
              size: Size) -> list[Found]:
    """The passages closest to the question under the embedder: the filler's (indexed once) and the item's."""
    item = bank.db.execute("SELECT id, text FROM passages WHERE document_id = ? ORDER BY id", [doc_id]).fetchall()
    query = embedder.encode([qa.question])[0]
    ranked = [(filler_passages[i][0], s) for i, s in index.search(qa.question, size.passages)]
    if item:
        ranked += [(pid, float(e @ query)) for (pid, _), e in zip(item, embedder.encode([t for _, t in item]))]
    ranked = sorted(ranked, key=lambda x: -x[1])[: size.passages]
    refs = {r.id: r for r in bank.passages([p for p, _ in ranked])}
    found = [Found(refs[p], s, {"embed": i}) for i, (p, s) in enumerate(ranked, 1) if p in refs]
    budget = min(size.budget, chat.model.segment_len - size.new_tokens
                 - chat.prompt_ids(qa.question, history=False).shape[1] - 16)
    return fit(found, chat.model.backbone.tokenizer, budget)


def _summary(rows: list[dict]) -> dict:
    """Percentages of the items' scores, with a 95% interval (normal approximation) for the headline."""
    out = {m: 100 * float(np.mean([r[m] for r in rows])) for m in ("contains", "em", "f1")}
    out["contains_ci95"] = 196 * mean_std([r["contains"] for r in rows])[1] / max(1, len(rows)) ** 0.5
    return {**out, "items": rows}


def _result(ctx, size, qas, results, gold_read, borrowed, seconds: float, commits: list[str]) -> SuiteResult:
    ds = [str(d) for d in size.distances]
    header = (["model"] + [f"{distance_label(int(d))}: answered / EM / F1" for d in ds] + ["average answered"])
    rows = []
    for k in results:
        r, label = results[k], LABELS[k]
        cells = [f"{r[d]['contains']:.0f} ± {r[d]['contains_ci95']:.0f} / {r[d]['em']:.0f} / {r[d]['f1']:.1f}"
                 for d in ds]
        rows.append([label, *cells, f"{np.mean([r[d]['contains'] for d in ds]):.1f}"])
    reads = table(["finder"] + [distance_label(int(d)) for d in ds],
                  [[f] + [f"{100 * gold_read[f][d]:.0f}%" for d in ds] for f in gold_read])
    avg = {k: float(np.mean([results[k][d]["contains"] for d in ds])) for k in results}
    notes = [f"{len(qas)} SQuAD dev questions (one per paragraph) at each distance. Answered: % of answers that "
             "contain a gold answer (± a 95% interval); then SQuAD EM and F1, in %. The second table: the share of "
             "questions whose gold paragraph was among the passages read, per finder."]
    if {"longmem_fused", "oracle"} <= avg.keys():
        oracle = avg["oracle"]
        notes.append(f"LongMem reading (fused) answers {avg['longmem_fused']:.1f}% on average, "
                     f"{100 * avg['longmem_fused'] / oracle:.0f}% of its oracle's {oracle:.1f}% (target: >= 90%)"
                     if oracle > 0 else "LongMem's oracle answers none: the ratio to it is undefined at this size.")
    if {"longmem_fused", "rag_bm25", "rag_embed"} <= avg.keys():
        notes.append(f"Against the RAG baselines on the average: LongMem fused {avg['longmem_fused']:.1f}%, BM25-RAG "
                     f"{avg['rag_bm25']:.1f}%, embedding RAG {avg['rag_embed']:.1f}%.")
    if set(results) != set(LABELS):
        notes.append(f"Entrants run: {', '.join(results)} (bookqa.entrants).")
    if borrowed:
        notes.append(borrowed_note(borrowed))
    notes.append(f"Distances run at {', '.join(commits)}; {seconds / 60:.1f} min of work in all.")
    plot = _plot(ctx, size.distances, results)
    return SuiteResult("bookqa", "Questions about a long text (beyond the paper): a SQuAD paragraph D tokens before "
                       "its question", [table(header, rows), reads],
                       {"results": results, "gold_read": gold_read, "models": {k: LABELS[k] for k in results},
                        "questions": [q.id for q in qas], "borrowed_train_tokens": borrowed},
                       asdict(size), [plot], notes, seconds)


def _plot(ctx: EvalContext, distances: list[int], results: dict) -> str:
    fig = figure(6.4, 4.2)
    ax = fig.add_subplot()
    for k in results:
        label = LABELS[k]
        ax.plot(distances, [results[k][str(d)]["contains"] for d in distances], marker="o", label=label,
                ls="--" if k.startswith(("oracle", "rag", "backbone")) else "-")
    ax.set_xscale("log", base=2)
    ax.set_xticks(distances, [distance_label(d) for d in distances])
    ax.set_xlabel("tokens between the paragraph and the question")
    ax.set_ylabel("answers containing a gold answer, %")
    legend_below(ax, ncol=2, gap=0.16)
    fig.tight_layout()
    path = Path(ctx.out_dir) / "bookqa.png"
    fig.savefig(path, bbox_inches="tight")
    return path.name
