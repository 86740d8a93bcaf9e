"""Held-out evaluation of a trained SideNet, side by side with the backbone, in one run (JSON + markdown table).

    python -m training.evaluate --checkpoint runs/smol/checkpoint            # 8 held-out books, recall at 8k
    python -m training.evaluate --untrained --books 2 --tokens 8192 --recall 10   # the untrained SideNet

Two measurements, each on the test split of the shared books (never trained on):

- **perplexity** of the first ``--tokens`` tokens of every held-out book: LongMem with a ``segment_len`` (1k) local
  window plus memory of everything before, LongMem with its memory left empty (what the trained SideNet gains
  without memory, e.g. from adapting to books), the backbone with the same 1k window, and the backbone attending
  to ``--long-context`` (8k) tokens at once;
- **long-range recall**: synthetic items (``longmem.eval.datasets.recall``) in held-out book text, each stating a fact
  (a number or a name) once and asking about it at least ``--distance`` tokens later. Everything before the question's
  local window goes into memory; an item counts as recalled when every answer token is the model's top prediction.
  The mean negative log-likelihood of the answer tokens is reported too: it moves long before exact matches do.
  For scale, the backbone also answers items of the same kind whose fact lies inside its 1k window (what reading
  the fact can give at best, for this backbone).

``--tokens 0`` skips perplexity (a quick recall check). ``--sweep 4:256,2:256,4:1024`` measures instead LongMem's
recall under several retrieval settings (chunk size : K memory tokens per query), each item's memory built once.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import torch

from longmem.eval.datasets.recall import RecallItem, recall_documents
from longmem.eval.measures import answer_match, perplexity, question_window, recall_record, recalled
from longmem.memory.memory import MAX_SINKS
from longmem.memory.view import MemoryView
from longmem.model.baselines import BackboneLM
from longmem.model.cpu import add_runtime_flags, setup_cpu
from longmem.model.longmem import LongMemConfig, LongMemModel
from longmem.util.data import add_data_flag
from longmem.util.report import print_report

from .data import Document, book_split, tokenize_files


@torch.no_grad()
def recall_sweep(model: LongMemModel, items: list[RecallItem], settings: list[tuple[int, int]], log=print) -> dict:
    """LongMem's recall of ``items`` under several retrieval settings (chunk size, K memory tokens per query): each
    item's memory is built once at the model's chunk size, then re-chunked for each setting (the same keys and
    values, re-pooled chunk keys) and searched for K / chunk size chunks per head. Nothing about the model
    changes; the settings are what ``Memory.rechunk`` and ``MemoryView`` give any caller."""
    for chunk_size, k in settings:
        if chunk_size < 1 or model.chunk_size % chunk_size or k < chunk_size or k % chunk_size:
            raise ValueError(f"setting {chunk_size}:{k}: the chunk size must divide the model's "
                             f"({model.chunk_size}) and K be a multiple of it")
    res: dict = {f"{chunk_size}:{k}": [] for chunk_size, k in settings}
    for i, item in enumerate(items):
        window, n_ans, memory = question_window(model, item, use_memory=True)
        for chunk_size, k in settings:
            view = MemoryView(memory.rechunk(chunk_size), k // chunk_size)
            res[f"{chunk_size}:{k}"].append(answer_match(model, window, n_ans, view))
        log(f"item {i + 1}/{len(items)} ({item.kind}): " + ", ".join(f"{key} {r[-1][0]}" for key, r in res.items()))
    return {key: recall_record(r, items) for key, r in res.items()}


def sweep_markdown(sweep: dict) -> str:
    lines = ["| chunk size | K (memory tokens per query) | chunks per head | recalled | answer NLL per token |",
             "|---:|---:|---:|---:|---:|"]
    for key, rec in sweep.items():
        chunk_size, k = (int(x) for x in key.split(":"))
        n = sum(rec["recalled"])
        lines.append(f"| {chunk_size} | {k} | {k // chunk_size} | {n}/{rec['items']}{_by_kind(rec)} | "
                     f"{rec['answer_nll']:.3f} |")
    return "\n".join(lines)


def evaluate(model: LongMemModel, books: list[Document], items: list[RecallItem], long_context: int,
             log=print, in_window: list[RecallItem] = ()) -> dict:
    """Perplexity of ``books`` and recall of ``items`` for LongMem and the baselines; ``in_window`` items (fact and
    question inside one local window) are answered by the backbone alone, as a reference."""
    bb = model.backbone
    lms = {"longmem": model, "longmem_no_memory": model, "backbone_local": BackboneLM(bb, model.segment_len),
           "backbone_long": BackboneLM(bb, min(long_context, bb.spec.max_positions))}
    out: dict = {"perplexity": {}, "recall": {}}
    for name, lm in lms.items() if books else ():
        t0, nll, count, per_book = time.perf_counter(), 0.0, 0, {}
        for doc in books:
            n, c = perplexity(lm, doc.ids, use_memory=name != "longmem_no_memory")
            nll, count = nll + n, count + c
            per_book[doc.name] = math.exp(n / c)
        out["perplexity"][name] = {"ppl": math.exp(nll / count) if count else float("nan"), "tokens": count,
                                   "per_book": per_book, "s": time.perf_counter() - t0}
        log(f"perplexity {name}: {out['perplexity'][name]['ppl']:.3f} ({count:,} tokens)")
    runs = [(name, lms[name], items) for name in ("longmem", "longmem_no_memory", "backbone_local")]
    for name, lm, its in runs + ([("backbone_in_window", lms["backbone_local"], in_window)] if in_window else []):
        res = [recalled(lm, it, use_memory=name != "longmem_no_memory") for it in its]
        rec = out["recall"][name] = recall_record(res, its)
        kinds = ", ".join(f"{k} {v['accuracy']:.2f}" for k, v in rec["by_kind"].items())
        log(f"recall {name}: {rec['accuracy']:.3f} of {len(res)} ({kinds}), answer NLL {rec['answer_nll']:.3f} "
            "per token")
    p = out["perplexity"]
    if p:
        out["ppl_ratio_vs_local"] = p["longmem"]["ppl"] / p["backbone_local"]["ppl"]
        out["ppl_ratio_vs_long"] = p["longmem"]["ppl"] / p["backbone_long"]["ppl"]
    return out


def _by_kind(rec: dict) -> str:
    """' (numbers 60%, names 40%)' from a recall summary's ``by_kind`` (absent in older JSON)."""
    kinds = [f"{kind}s {100 * v['accuracy']:.0f}%" for kind, v in rec.get("by_kind", {}).items()]
    return f" ({', '.join(kinds)})" if kinds else ""


def markdown(r: dict, long_context: int, distance: int) -> str:
    p, rc = r["perplexity"], r["recall"]
    ppl = lambda name: p[name]["ppl"] if name in p else None  # noqa: E731 (absent with --tokens 0 or older JSON)
    rows = [("LongMem (1k local + memory)", ppl("longmem"), rc["longmem"]),
            ("LongMem without memory (1k local; the SideNet alone)", ppl("longmem_no_memory"),
             rc.get("longmem_no_memory")),
            ("backbone, 1k local context", ppl("backbone_local"), rc["backbone_local"]),
            (f"backbone, {long_context // 1024}k context", ppl("backbone_long"), None)]
    lines = [f"| model | held-out perplexity | recall at >= {distance:,} tokens | answer NLL per token |",
             "|---|---:|---:|---:|"]
    for name, value, rec in rows:
        acc = "" if rec is None else f"{100 * rec['accuracy']:.0f}%" + _by_kind(rec)
        nll = "" if rec is None or "answer_nll" not in rec else f"{rec['answer_nll']:.3f}"
        lines.append(f"| {name} | {'' if value is None else f'{value:.3f}'} | {acc} | {nll} |")
    if "backbone_in_window" in rc:
        rec = rc["backbone_in_window"]
        lines.append(f"| backbone, fact inside its 1k window (reference) | | {100 * rec['accuracy']:.0f}%"
                     f"{_by_kind(rec)} | {rec['answer_nll']:.3f} |")
    if "ppl_ratio_vs_local" in r:
        lines += ["", f"LongMem / backbone-1k perplexity: {r['ppl_ratio_vs_local']:.4f}; "
                      f"LongMem / backbone-{long_context // 1024}k: {r['ppl_ratio_vs_long']:.4f}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="python -m training.evaluate", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", default=None, help="SideNet checkpoint directory to evaluate")
    p.add_argument("--untrained", action="store_true", help="evaluate the untrained SideNet (default config)")
    add_data_flag(p)
    p.add_argument("--books", type=int, default=8, help="held-out books to score (test split)")
    p.add_argument("--tokens", type=int, default=16384,
                   help="tokens scored per book (from its start); 0 = no perplexity, recall only")
    p.add_argument("--long-context", type=int, default=8192, help="context of the long backbone baseline")
    p.add_argument("--recall", type=int, default=40, help="recall items")
    p.add_argument("--distance", type=int, default=8192, help="minimum tokens between a fact and its question")
    p.add_argument("--seed", type=int, default=1234, help="recall items seed")
    p.add_argument("--max-sinks", type=int, default=MAX_SINKS,
                   help="segment-start (attention sink) chunks a memory search may return (-1 = no limit)")
    p.add_argument("--topk", type=int, default=None,
                   help="memory tokens each query attends to, K (default: the checkpoint's)")
    p.add_argument("--sweep", default=None, metavar="CSZ:K,...",
                   help="instead: LongMem's recall under each retrieval setting, chunk size:K (e.g. 4:256,2:256,"
                        "4:1024; the chunk size must divide the checkpoint's), memory built once per item")
    add_runtime_flags(p)
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    setup_cpu(args.threads)
    if (args.checkpoint is None) == (not args.untrained):
        p.error("give --checkpoint DIR or --untrained")
    runtime = {"max_sinks": None if args.max_sinks < 0 else args.max_sinks, "dtype": args.dtype}
    if args.topk is not None:
        runtime["topk"] = args.topk
    model = (LongMemModel.load(args.checkpoint, runtime=runtime) if args.checkpoint
             else LongMemModel.from_config(LongMemConfig(**runtime), pretrained=False))
    model.eval()
    tok = model.backbone.tokenizer
    from longmem.util.data import cache_root

    _, test_files = book_split(args.data)
    books = tokenize_files(test_files[: args.books], tok, cache_root() / "tokens")
    scored = [Document(d.name, d.ids[: args.tokens]) for d in books] if args.tokens > 0 else []
    fillers, L = [d.ids for d in books], model.segment_len
    items = recall_documents(tok, fillers, args.recall, args.distance, args.distance + L, seed=args.seed)
    log = lambda m: print(f"[eval {time.strftime('%H:%M:%S')}] {m}", file=sys.stderr, flush=True)  # noqa: E731
    if args.sweep:
        try:
            settings = [tuple(int(x) for x in s.split(":")) for s in args.sweep.split(",")]
            if any(len(s) != 2 for s in settings):
                raise ValueError
        except ValueError:
            p.error(f"--sweep {args.sweep!r}: give chunk size:K pairs, e.g. 4:256,2:256")
        result = {"sweep": recall_sweep(model, items, settings, log), "args": vars(args),
                  "provenance": model.provenance}
        return print_report(result, sweep_markdown(result["sweep"]), args.out)
    in_window = recall_documents(tok, fillers, args.recall, L // 2, L, seed=args.seed)  # fact inside the window
    result = evaluate(model, scored, items, args.long_context, log, in_window=in_window)
    result["args"] = vars(args)
    result["provenance"] = model.provenance
    return print_report(result, markdown(result, args.long_context, args.distance), args.out)


if __name__ == "__main__":
    main()
