"""``python -m training`` / ``longmem train``: adaptation training on the shared books (plus synthetic recall).

    python -m training --out runs/smol --steps 2000 --batch-size 2
    python -m training --out runs/smol --resume            # continue (bit for bit) after Ctrl-C or a crash
    python -m training --out runs/read --reading-items runs/reading-items.jsonl  # questions as the app reads them
    torchrun --nproc_per_node 2 -m training --out runs/ddp # data parallel; --batch-size is per process
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import fields
from pathlib import Path

from longmem.model.cpu import setup_cpu
from longmem.util.data import add_data_flag

from .reading import UNREAD
from .train import TrainConfig, Trainer

HELP = {
    "out": "run directory: checkpoint/, metrics.jsonl, loss.png",
    "model": "'longmem' (train the SideNet) or 'memtrm' (train the MemTRM baseline: a memory layer inside the "
             "frozen backbone, same data and loop)",
    "backbone": "'default' (embedded SmolLM2-135M-Instruct), a local .gguf file or Hugging Face model dir",
    "init": "start from this SideNet checkpoint directory instead of the untrained SideNet",
    "train_scope": "'compact' (memory layer + LoRA updates + scales: small checkpoints) or 'full' (every weight)",
    "lora_rank": "rank of the compact mode's low-rank updates",
    "cached_layer": "backbone layer (0-based) whose keys/values go into memory; default: the one the memory layer's "
                    "input comes from (python -m training.studies.probe ranks every layer)",
    "batch_size": "rows per process (each row a document stream with its own memory)",
    "segment_len": "tokens per row per step (the local context)",
    "memory_tokens": "memory bank size M per row, in tokens",
    "topk": "memory tokens K each query attends to, topk/chunk_size chunks per head (default: the --init checkpoint's, "
            "else 64)",
    "steps": "optimizer steps in all (the LR schedule spans them)",
    "lr": "peak learning rate (paper: 2e-4)",
    "end_lr": "learning rate reached at the last step",
    "lr_power": "polynomial decay power (1 = linear)",
    "warmup_steps": "linear warm-up steps (paper: 0)",
    "weight_decay": "AdamW decoupled weight decay (paper: 0.01)",
    "grad_clip": "gradient norm clipping (paper: 2.0)",
    "answer_weight": "loss weight of the recall documents' answer tokens, the only tokens that need memory "
                     "(1 = the plain LM loss)",
    "kl_weight": "weight of KL(backbone || model) on the tokens that are not recall answers: keeps the SideNet's "
                 "predictions (and answering) close to the backbone's where memory is not what is taught (0 = off)",
    "kl_scope": "where the KL term applies: 'all' (every token but recall answers) or 'empty' (only segments read "
                "with an empty memory, a document's first: the SideNet alone stays the backbone, memory is left free)",
    "scale_lr": "LR multiplier, without weight decay, for the ReZero branch scales and the memory gate (1 = none)",
    "amp": "autocast: auto (what --dtype auto would pick: bf16 on GPUs and CPUs with native bf16), bfloat16, "
           "float16, none",
    "seed": "data order seed",
    "save_every": "steps between checkpoints (one is also written at the end and on Ctrl-C/SIGTERM)",
    "eval_every": "steps between held-out evaluations (0 = never)",
    "eval_segments": "held-out segments scored per book at each evaluation",
    "device": "auto (the process's GPU when there is one), cpu, cuda, cuda:N",
    "max_doc_segments": "cut longer documents into parts of this many segments, each with a fresh memory (0 = never)",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m training", description="LongMem memory-augmented adaptation training")
    for f in fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
        p.add_argument(flag, type=kind, default=f.default, help=f"{HELP[f.name]} (default: {f.default})")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    add_data_flag(p)
    p.add_argument("--max-books", type=int, default=None, help="train on the first N training books only")
    p.add_argument("--eval-books", type=int, default=2, help="held-out (test-split) books used for evaluation")
    p.add_argument("--recall-docs", type=int, default=0,
                   help="synthetic long-range recall documents mixed into training (a fact stated early, asked "
                        "about at the end)")
    p.add_argument("--recall-distance", type=int, default=2048, help="tokens between a recall fact and its question")
    p.add_argument("--recall-facts", type=int, default=1,
                   help="facts per recall document, each asked about at least --recall-distance tokens later, "
                        "the questions spread over the document (1 = one fact, asked about at its end)")
    p.add_argument("--quote-docs", type=int, default=0,
                   help="synthetic quote documents mixed into training: book text whose passages are quoted again "
                        "--quote-distance tokens later, to be copied from memory (plain text to the loss)")
    p.add_argument("--quotes", type=int, default=8, help="passages quoted per quote document")
    p.add_argument("--quote-len", type=int, default=64, help="tokens per quoted passage")
    p.add_argument("--quote-distance", type=int, default=1024,
                   help="tokens between a passage and its quote (>= the segment length puts it in memory)")
    p.add_argument("--reading-items", type=Path, default=None,
                   help="reading items (JSONL of python -m training.reading): questions about training books in the "
                        "app's reading prompt and their answers, mixed into training (training/reading.py)")
    p.add_argument("--reading-context", type=int, default=1,
                   help="segments of a reading item's book read into memory before its prompt")
    p.add_argument("--reading-unread", choices=UNREAD, default="answer",
                   help="the answer taught where a reading item's question was written from a passage not among "
                        "those read: the item's own answer, or the app's 'The book does not say.'")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: all cores)")
    return p.parse_args(argv)


def whole_segments(tokens: int, segment_len: int) -> int:
    """``tokens`` rounded up to whole segments: the batchfier drops a document's last partial segment."""
    return -(-tokens // segment_len) * segment_len


def build_data(args, tokenizer, segment_len: int, backbone: str | None = None):
    """The training and held-out documents the flags name; ``backbone``: the model's fingerprint, which reading
    items must have been made with."""
    from longmem.eval.datasets.recall import (
        multi_recall_documents,
        quote_documents,
        recall_as_documents,
        recall_documents,
    )
    from longmem.util.data import cache_root

    from .data import book_split, tokenize_files

    train_files, test_files = book_split(args.data)
    by_name = {p.name: p for p in train_files}  # every training book, whatever --max-books keeps
    if args.max_books:
        train_files = train_files[: args.max_books]
    cache = cache_root() / "tokens"
    train = tokenize_files(train_files, tokenizer, cache)
    held_out = tokenize_files(test_files[: args.eval_books], tokenizer, cache) if args.eval_books else []
    fillers = [d.ids for d in train]
    if args.recall_docs and args.recall_facts > 1:
        extra = 48 * args.recall_facts  # room for the facts, questions and answers, in tokens
        total = whole_segments(2 * args.recall_distance + extra, segment_len)
        train += multi_recall_documents(tokenizer, fillers, args.recall_docs, args.recall_facts, args.recall_distance,
                                        total, seed=args.seed)
    elif args.recall_docs:
        total = whole_segments(args.recall_distance + 256, segment_len)
        items = recall_documents(tokenizer, fillers, args.recall_docs, args.recall_distance, total, seed=args.seed,
                                 names="train")
        train += recall_as_documents(items)
    if args.quote_docs:
        room = 2 * args.quote_distance + args.quotes * args.quote_len  # passages, their distance, their quotes
        train += quote_documents(tokenizer, fillers, args.quote_docs, args.quotes, args.quote_len,
                                 args.quote_distance, whole_segments(room, segment_len), seed=args.seed + 1)
    if args.reading_items:
        from longmem.tasks.answer import NOT_SAID

        from .reading import read_items, reading_documents

        if args.reading_context < 0:
            raise SystemExit(f"--reading-context must be >= 0, got {args.reading_context}")
        try:
            items = read_items(args.reading_items, backbone)
        except ValueError as e:
            raise SystemExit(str(e)) from None
        named = sorted({i.book for i in items})
        if unknown := [b for b in named if b not in by_name]:
            raise SystemExit(f"{args.reading_items}: items about books outside the training split: {unknown}")
        books = {d.name: d for d in tokenize_files([by_name[b] for b in named], tokenizer, cache)}
        unread = None
        if args.reading_unread == "not-said":  # the app's own words, then the end of the turn
            unread = tokenizer(NOT_SAID.split(".")[0] + ".", add_special_tokens=False).input_ids
            unread += [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        train += reading_documents(items, books, segment_len, args.reading_context, unread)
    return train, held_out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    setup_cpu(args.threads)
    cfg = TrainConfig(**{f.name: getattr(args, f.name) for f in fields(TrainConfig)})
    trainer = Trainer(cfg, documents=[], resume=args.resume, log=lambda m: print(m, file=sys.stderr),
                      defer_data=True)
    backbone = trainer.model.backbone
    train, held_out = build_data(args, backbone.tokenizer, trainer.cfg.segment_len,
                                 backbone.fingerprint() if args.reading_items else None)
    trainer.set_data(train, held_out)
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        n_tok = sum(len(d.ids) for d in train)
        print(f"training on {len(train)} documents ({n_tok:,} tokens), {trainer.data.steps_per_epoch} steps per "
              f"epoch; held out: {[d.name for d in held_out]}", file=sys.stderr)
    trainer.fit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
