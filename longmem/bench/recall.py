"""How much an inverted-file (IVF) search of a bank's chunk keys finds of what the exact search finds, on the queries
real questions make: the measurement behind the library's choice of exact search (issue 71).

    python -m longmem.bench.recall --work runs/library --bank library-1000000      # after `longmem.bench.library`
    python -m longmem.bench.recall --work runs/library --bank library-10000000 --questions 4

The bank's memory is restored (``Bank.load_memory``) and ``--questions`` questions about its books are asked as the
app's chat asks them (``tasks.answer``), every query that searches memory kept: (Hq, T, d) per call, the question's
tokens and then the answer's. Then, per KV head, the chunk keys are clustered (faiss k-means, ``--lists`` lists) and
each query's best ``n_chunks`` chunks are found twice: exactly (every chunk scored), and among the chunks of the
``--probes`` lists whose centroids score highest for it (an IVF search; its own scores are exact). Sink chunks are
left out of both, as the app's search leaves them out (``MAX_SINKS``). Reported: the share of the IVF search's
chunks that score at least the exact search's k-th best (recall; a chunk tied with one the exact search kept counts,
as the library benchmark's copies of a book have the same keys), the mean over queries and the worst query, and the
share of chunks it scores.

Prints one JSON object (stdout) and a markdown table.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import faiss
import numpy as np
import torch

from longmem.bench.inference import log, machine_facts, report
from longmem.bench.library import QUESTION_SET, library_books, questions_for, watch_searches
from longmem.memory.search import chunk_keys
from longmem.model.cpu import add_runtime_flags, setup_cpu
from longmem.util.data import data_dir

TRAIN_PER_LIST = 64  # keys sampled per list to train the k-means


def asked_queries(bank, model, questions: list[str]) -> tuple[object, list[tuple[torch.Tensor, int]]]:
    """The bank's restored memory and every (queries (Hq, T, d) float32, n_chunks) its searches got while
    ``questions`` were answered."""
    from longmem.tasks.answer import ANSWER_SAMPLING, answer
    from longmem.tasks.chat import Chat
    from longmem.tasks.reading import PassageFinder, Reading

    memory = bank.load_memory(model)
    caught: list[tuple[torch.Tensor, int]] = []
    watch_searches(memory, lambda queries, n_chunks, _: caught.append((queries[0].detach().float().clone(), n_chunks)))
    finder = PassageFinder(bank, model, memory)
    for q in questions:
        reply = answer(Chat(model, memory, ANSWER_SAMPLING), finder, q, Reading())
        list(reply)
        log(f"{q!r}: {len(caught)} searches so far")
    return memory, caught


def head_recall(keys: torch.Tensor, sinks: torch.Tensor, queries: torch.Tensor, n_chunks: int, lists: int,
                probes: list[int]) -> dict[int, dict]:
    """keys (n, d) float32 of one KV head, ``sinks`` their sink positions (left out), queries (r, d): per probe
    count, the recall of each query row (r,) and the share of chunks scored."""
    n, d = keys.shape
    km = faiss.Kmeans(d, lists, niter=10, seed=0)
    sample = np.random.default_rng(0).choice(n, min(n, TRAIN_PER_LIST * lists), replace=False)
    km.train(np.ascontiguousarray(keys[np.sort(sample)].numpy()))
    assign = torch.from_numpy(km.index.search(np.ascontiguousarray(keys.numpy()), 1)[1][:, 0])  # (n,)
    sizes = torch.bincount(assign, minlength=lists).float()
    out = {p: {"recall": [], "scored": []} for p in probes}
    for s in range(0, queries.shape[0], 64):
        q = queries[s:s + 64]
        scores = (q @ keys.T).index_fill_(1, sinks, float("-inf"))  # (b, n)
        least = torch.topk(scores, n_chunks, dim=1).values[:, -1:]  # (b, 1): the exact search's k-th best score
        by_list = q @ torch.from_numpy(km.centroids).T  # (b, lists)
        for p in probes:
            probed = torch.zeros(q.shape[0], lists, dtype=torch.bool)
            probed.scatter_(1, torch.topk(by_list, p, dim=1).indices, True)
            found = torch.topk(scores.masked_fill(~probed[:, assign], float("-inf")), n_chunks, dim=1).values
            out[p]["recall"] += (found >= least).float().mean(1).tolist()  # ties count: a copy's key is as good
            out[p]["scored"] += ((probed.float() @ sizes) / n).tolist()
    return out


def measure(args) -> dict:
    from longmem.model.longmem import LongMemConfig, LongMemModel
    from longmem.storage import BankDirectory

    model = LongMemModel.from_config(LongMemConfig(backbone=args.backbone, dtype=args.dtype)).eval()
    bank = BankDirectory(Path(args.work) / "banks").open(args.bank)
    questions = questions_for(args.set, library_books(args.set, args.books), args.questions)
    with torch.inference_mode():
        memory, caught = asked_queries(bank, model, questions)
    row = memory.rows[0]
    n = row.n
    lists = args.lists or int(np.clip(2 * np.sqrt(n), 64, 4096))
    probes = sorted({max(1, lists * k // 256) for k in (4, 16, 64, 128)} | set(args.probes or []))
    sinks, group = row.sink_positions(), caught[0][0].shape[0] // row.hkv
    keys = [torch.from_numpy(chunk_keys(row.k[j:j + 1, :n])[0]) for j in range(row.hkv)]  # float32 (n, d) a head
    per: dict[int, dict] = {p: {"recall": [], "scored": []} for p in probes}
    t0 = time.perf_counter()
    for j in range(row.hkv):
        queries = torch.cat([q[j * group:(j + 1) * group].reshape(-1, row.d) for q, _ in caught])
        for p, got in head_recall(keys[j], sinks, queries, caught[0][1], lists, probes).items():
            per[p]["recall"] += got["recall"]
            per[p]["scored"] += got["scored"]
        log(f"KV head {j}: {queries.shape[0]:,} query rows measured")
    bank.close()
    return {"bank": args.bank, "chunks": n, "sink_chunks": int(sinks.numel()), "questions": len(questions),
            "searches": len(caught), "query_rows": len(per[probes[0]]["recall"]), "n_chunks": caught[0][1],
            "lists": lists, "measure_s": time.perf_counter() - t0,
            "probes": [{"probes": p, "share_scored": float(np.mean(v["scored"])),
                        "recall_mean": float(np.mean(v["recall"])), "recall_worst": float(np.min(v["recall"])),
                        "rows_below_99": float(np.mean(np.array(v["recall"]) < 0.99))} for p, v in per.items()]}


def markdown(r: dict) -> str:
    lines = [f"IVF recall against exact search: {r['bank']} ({r['chunks']:,} chunks per KV head, {r['lists']:,} "
             f"lists), {r['query_rows']:,} query rows of {r['questions']} questions ({r['searches']} searches), "
             f"best {r['n_chunks']} chunks, sink chunks left out; {r['machine']['cpu']}", "",
             "| lists probed | chunks scored | recall (mean) | worst query | queries under 99% |",
             "|---:|---:|---:|---:|---:|"]
    lines += [f"| {p['probes']:,} | {100 * p['share_scored']:.1f}% | {100 * p['recall_mean']:.2f}% | "
              f"{100 * p['recall_worst']:.1f}% | {100 * p['rows_below_99']:.1f}% |" for p in r["probes"]]
    return "\n".join(lines)


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m longmem.bench.recall", description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True, help="the library benchmark's folder (its banks/ are read)")
    p.add_argument("--bank", required=True, help="the bank to measure, e.g. library-1000000")
    p.add_argument("--set", type=Path, default=None, help="the question set whose questions are asked (default: "
                                                          f"the shared data's {QUESTION_SET}, as the library's)")
    p.add_argument("--books", type=int, default=2, help="books of that set asked about (the library's)")
    p.add_argument("--questions", type=int, default=8, help="questions asked")
    p.add_argument("--lists", type=int, default=None, help="k-means lists per KV head (default ~2 sqrt(chunks))")
    p.add_argument("--probes", type=int, nargs="*", default=None, help="more probe counts to measure")
    p.add_argument("--backbone", default="default",
                   help="'default' (SmolLM2-135M-Instruct), a .gguf file or an HF model dir (the bank's)")
    p.add_argument("--out", default=None, help="also write the JSON results to this path")
    add_runtime_flags(p)
    args = p.parse_args(argv)
    args.set = args.set or data_dir() / QUESTION_SET
    if args.questions < 1:
        p.error("--questions must be >= 1")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    args.threads = args.threads or os.cpu_count() or 1
    setup_cpu(args.threads)
    t0 = time.perf_counter()
    results = measure(args)
    results.update(machine=machine_facts(args.dtype, args.threads), wall_s=time.perf_counter() - t0)
    report(results, markdown(results), args.out)
    return results


if __name__ == "__main__":
    main()
