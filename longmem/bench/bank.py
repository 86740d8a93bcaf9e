"""Persistent banks on the default backbone: ingestion speed end to end, and reopening a 1M-token bank.

    python -m longmem.bench.bank                 # full run (about 5 minutes on 2 cores)
    python -m longmem.bench.bank --quick         # small sizes, to see that everything runs (about 2 minutes)
    python -m longmem.bench.bank --out bank.json # also write the JSON

Scenarios, each in a fresh Python process (``--scenario NAME``):

- ``ingest``: the same text (a prefix of a held-out book) is memorized bare (``SegmentLM.memorize`` on token ids, the
  core benchmark's throughput) and ingested end to end (``ingest``: reading the file, tokenising, backbone, SQLite
  commits per segment, passages and their FTS5 rows, faiss index files) into a fresh bank, ``--reps`` rounds of both
  (alternating which goes first); medians reported. The passages' share is measured by cutting and indexing them
  again (``Bank.rebuild_passages``): ingesting without them would take the ingest time less that.
- ``build``: a bank of ``--bank-tokens`` (1M) tokens made by committing the ingested bank's real segments again,
  as further documents, through the same write path (``Bank.add_segment``) -- ingesting 1M tokens from scratch
  would take far longer (the ingestion rate is in ``docs/benchmarks.md``) and gives the same bytes per token --
  then its passages cut and indexed.
- ``reopen``: open that bank and restore its memory into RAM (``Bank.load_memory``), in a process that never loads
  the model. Timed with the file cache warm and, where this process may drop the OS page cache (root on Linux),
  cold. Peak RSS is measured from just before the open (the imports of torch and faiss are not the bank's). Then
  BM25 passage searches (FTS5) for a few questions, timed (median).
- ``answer``: the chat on that bank as the app answers, with the model (the shipped SideNet, reading at the chat's
  K while passages are read, ``--reading-topk``): load the bank's
  memory, then for each question find the passages to read (BM25, the chat's default finder; and, timed apart, the
  memory finder: one pass of the model over the question with the whole memory attached) and answer through the
  app's own function (``tasks.answer``), timing when the passages read are known and cited (the Chat tab shows them
  then, before the answer: ``shown_s``), the first piece the reader sees (an answer checked against what it
  read is shown whole, so that is the whole answer) and the whole answer. The first question is reported apart
  (cold: first use of every path); the median is over the others. ``--reader NAME`` (``model.readers``): another
  model reads the passages, memory off, as the chat does with it; then also the reader's RSS (the process's growth
  from loading it to the end of its answers, against its weights), its prefill rate over the reading prompts (one
  forward of each, no cache) and its decoding rate (greedy, no stop, after the prompt) are reported: the excerpts'
  prefill is bound by compute, decoding by memory bandwidth (every weight read once a token).

The parent prints one JSON object (stdout) and a markdown table; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from longmem.bench.inference import (
    child_json,
    cpu_times,
    default_text,
    finish_shared_args,
    log,
    machine_facts,
    report,
    reset_peak_rss,
    status_mb,
    target,
)
from longmem.bench.limits import attention_rate, ceiling, ingest_flops, matmul_rate, share
from longmem.model.cpu import add_runtime_flags, setup_cpu
from longmem.model.device import DeviceError, add_device_flag, resolve_device
from longmem.tasks.reading import READING_TOPK, SEARCH_EXCERPTS
from longmem.util.files import write_file_atomic

TARGETS = {"ingest_share": 0.8, "ingest_vs_memorize": 0.9, "reopen_s": 3.0, "reopen_peak_vs_kv": 1.5,
           "with_passages_vs_without": 0.9, "passage_search_ms": 200.0, "first_token_s": 3.0}
READER_TARGETS = {"first_token_s": 10.0, "shown_s": 1.0, "decode_tok_s": 8.0,  # another reader (a 1.5B; issue 92:
                  "rss_vs_weights": 1.3}  # its four windows shown <= 1 s after the question, its first piece <= 10 s
DECODE_TOKENS = 32  # tokens decoded to time a reader's decoding
QUESTIONS = ["Who is the narrator of this story?", "What is the name of Daisy's husband?", "Where does Gatsby live?",
             "What did the green light at the end of the dock mean?", "Who was driving the car that killed Myrtle?",
             "How did Nick know Tom Buchanan from college?", "What colour was the big car?", "When is the party?"]


# ----------------------------------------------------------------------------------------------------------------
# Scenarios


def _model(args):
    from longmem.model.longmem import LongMemConfig, LongMemModel

    return LongMemModel.from_config(LongMemConfig(backbone=args.backbone, dtype=args.dtype),
                                    device=resolve_device(args.device)).eval()


def _backbone_facts(model) -> dict:
    """What the benchmark ran on: the backbone's name and size, and what one token costs in memory."""
    bb, spec = model.backbone, model.backbone.spec
    return {"name": bb.name, "params": sum(p.numel() for p in bb.model.parameters()), "layers": spec.n_layers,
            "kv_heads": spec.n_kv_heads, "head_dim": spec.head_dim, "cached_layer": model.cached_layer,
            "kv_bytes_per_token": 2 * spec.n_kv_heads * spec.head_dim * 2}  # K and V, bfloat16


def scenario_ingest(args) -> dict:
    from longmem.ingest.pipeline import ingest
    from longmem.storage import BankDirectory

    model = _model(args)
    tok = model.backbone.tokenizer
    text = Path(args.text).read_text(encoding="utf-8", errors="replace")
    ids = tok(text[: 8 * args.ingest_tokens], add_special_tokens=False).input_ids[: args.ingest_tokens]
    piece = tok.decode(ids)  # the text of exactly those tokens (re-tokenised by ingest, within a few tokens)
    src = Path(args.work) / "book.txt"
    src.write_text(piece, encoding="utf-8")
    ids = torch.tensor(ids)
    directory = BankDirectory(Path(args.work) / "banks")
    log(f"warm-up: one segment through memorize and ingest; then {args.reps} x memorize / ingest of "
        f"{len(ids):,} tokens")
    model.memorize(ids[:1024], model.new_memory(capacity=None))
    memo, ing, ing_tokens = [], [], 0
    def run_memorize() -> None:
        t0 = time.perf_counter()
        model.memorize(ids, model.new_memory(capacity=None))
        memo.append(time.perf_counter() - t0)

    def run_ingest(r: int):
        name = f"src{r}"
        with contextlib.suppress(Exception):
            directory.delete(name)
        with directory.create(name, model) as bank:
            return ingest(bank, model, src if r > 0 else _head(src, Path(args.work) / "head.txt"),
                          compile=args.compile)

    run_ingest(0)  # warm-up (first SQLite/faiss use)
    for r in range(1, args.reps + 1):  # alternate which goes first: a slow spell of the VM hits both alike
        if r % 2:
            run_memorize()
            res = run_ingest(r)
        else:
            res = run_ingest(r)
            run_memorize()
        ing.append(res.seconds)
        ing_tokens = res.tokens
        log(f"round {r}: memorize {len(ids) / memo[-1]:.0f} tok/s, ingest {res.tokens_per_s:.0f} tok/s")
    memo_s, ing_s = statistics.median(memo), statistics.median(ing)
    flops, rate = ingest_flops(model), matmul_rate(model)  # what the machine could do on these shapes
    attention = attention_rate(model)  # ... and its attention kernel, which bounds the share (``limits.ceiling``)
    log(f"matmul rate on the model's shapes: {rate.gflops:.0f} GFLOP/s, attention kernel {attention.gflops:.0f} "
        f"GFLOP/s; {flops.per_token / 1e9:.3f} GFLOP a token")
    with directory.open(f"src{args.reps}") as bank:
        stats = bank.stats()
        t0 = time.perf_counter()  # the passages' share of ingesting: cutting them and their FTS rows, done again
        n_passages = bank.rebuild_passages()
        passages_s = time.perf_counter() - t0
    return {"tokens": len(ids), "memorize_s": memo_s, "memorize_tok_s": len(ids) / memo_s,
            "ingest_tokens": ing_tokens, "ingest_s": ing_s, "ingest_tok_s": ing_tokens / ing_s,
            "ratio": (ing_tokens / ing_s) / (len(ids) / memo_s), "bank": f"src{args.reps}",
            "passages": n_passages, "passages_s": passages_s,
            "with_passages_vs_without": max(0.0, ing_s - passages_s) / ing_s,
            "backbone": _backbone_facts(model),
            "disk_bytes": stats["disk_bytes"], "kv_bytes": stats["kv_bytes"],
            "compile": args.compile, "flops": flops.to_dict(), "matmul": rate.to_dict(),
            "attention": attention.to_dict(),
            "ceiling": ceiling(flops, rate, attention),
            "memorize_share": share(len(ids) / memo_s, flops, rate),
            "ingest_share": share(ing_tokens / ing_s, flops, rate),
            "all_memorize_tok_s": [len(ids) / s for s in memo],
            "all_ingest_tok_s": [ing_tokens / s for s in ing]}


def _head(src: Path, dst: Path) -> Path:
    dst.write_text(src.read_text(encoding="utf-8")[:4000], encoding="utf-8")
    return dst


def scenario_build(args) -> dict:
    from longmem.storage import BankDirectory

    model = _model(args)
    directory = BankDirectory(Path(args.work) / "banks")
    with contextlib.suppress(Exception):
        directory.delete("big")
    big = directory.create("big", model)
    t0 = time.perf_counter()
    with directory.open(args.source_bank) as src:
        rows = [(nt, tok, text, chars, *src.segment_kv(sid)) for sid, nt, tok, text, chars in src.db.execute(
            "SELECT id, n_tokens, tokens, text, chunk_chars FROM segments ORDER BY id").fetchall()]
    total, copy = 0, 0
    with big.writing():
        while total < args.bank_tokens:
            copy += 1
            ref: dict | int = {"title": f"copy {copy}", "source": "book.txt", "kind": "text",
                               "sha256": f"bench-copy-{copy}", "options": {}, "meta": {}}
            for seq, (nt, tok, text, chars, k, v) in enumerate(rows):
                ref = big.add_segment(ref, seq, torch.frombuffer(bytearray(tok), dtype=torch.int32), text,
                                      torch.frombuffer(bytearray(chars), dtype=torch.int32).numpy(), k, v, (0, 0))
                total += nt
                if total >= args.bank_tokens:
                    break
            big.finish_document(ref)
        log(f"committed {total:,} tokens as {copy} documents; writing the index files")
        big.sync_index()
    seconds = time.perf_counter() - t0
    t1 = time.perf_counter()
    n_passages = big.rebuild_passages()  # the copies were committed without them: cut and index them all at once
    passages_s = time.perf_counter() - t1
    stats = big.stats()
    big.close()  # checkpoints the write-ahead log into bank.db: the bank's size at rest
    stats["disk_bytes"] = sum(f.stat().st_size for f in big.path.iterdir() if f.is_file())
    return {"tokens": total, "documents": copy, "s": seconds, "passages": n_passages, "passages_s": passages_s,
            **stats}


def scenario_reopen(args) -> dict:
    from longmem.storage import BankDirectory

    directory = BankDirectory(Path(args.work) / "banks")
    path = directory.path("big")
    cold = False
    if args.cold:
        os.sync()
        try:
            Path("/proc/sys/vm/drop_caches").write_text("3")
            cold = True
        except OSError:
            pass
    rss0 = status_mb("VmRSS")
    reset_peak_rss()
    t0 = time.perf_counter()
    with directory.open("big") as bank:
        memory = bank.load_memory()
        seconds = time.perf_counter() - t0
        peak = status_mb("VmHWM")
        stats = bank.stats()
        spec_q = torch.randn(1, bank.info.n_kv_heads, 16, bank.info.head_dim)
        t1 = time.perf_counter()
        found = memory.search(spec_q, n_chunks=16)
        search_s = time.perf_counter() - t1
        bank.search_passages(QUESTIONS[0], 50)  # the first query reads the index pages in
        searches = []
        for q in QUESTIONS:
            t2 = time.perf_counter()
            bank.search_passages(q, 50)
            searches.append(1000 * (time.perf_counter() - t2))
    index_bytes = sum(f.stat().st_size for f in path.glob("keys-*.faiss"))
    return {"cold_cache": cold, "s": seconds, "tokens": len(memory), "rss_before_mb": rss0, "peak_rss_mb": peak,
            "peak_increment_mb": peak - rss0, "kv_mb": stats["kv_bytes"] / 2**20,
            "peak_increment_vs_kv": (peak - rss0) / (stats["kv_bytes"] / 2**20),
            "index_mb": index_bytes / 2**20, "disk_mb": stats["disk_bytes"] / 2**20,
            "passage_search_ms": statistics.median(searches), "passage_search_all_ms": searches,
            "search_16_queries_s": search_s, "found_all": bool(found.mask.all())}


def _reader_rates(lm, prompts: list) -> dict:
    """A reader's prefill rate (tokens of the reading prompts ``prompts``, (1, T) each, over one forward each, no
    cache) and decoding rate (``DECODE_TOKENS`` greedy tokens after the last prompt, none a stop), tok/s."""
    from longmem.model.lm import Sampling

    t0, n = time.perf_counter(), 0
    for ids in prompts:
        lm.step(ids, None)
        n += ids.shape[1]
    prefill_s = time.perf_counter() - t0
    stamps = []
    for _ in lm.generate(prompts[-1], None, Sampling(max_new_tokens=DECODE_TOKENS, temperature=0.0)):
        stamps.append(time.perf_counter())
    decode = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else float("nan")
    return {"prefill_tok_s": n / prefill_s, "prefill_tokens": n, "decode_tok_s": decode, "decoded": len(stamps)}


def scenario_answer(args) -> dict:
    from longmem.storage import BankDirectory
    from longmem.tasks.answer import ANSWER_SAMPLING, answer
    from longmem.tasks.chat import Chat
    from longmem.tasks.reading import PassageFinder, Reading, prompt_for
    from longmem.tasks.setup import reading_setup

    model = _model(args)
    facts = {}
    with BankDirectory(Path(args.work) / "banks").open("big") as bank:
        t0 = time.perf_counter()
        memory = bank.load_memory(model)
        load_s = time.perf_counter() - t0
        rss0 = status_mb("VmRSS")  # the model and the bank's memory: what the process holds without the reader
        # as the app's chat reads, unless told; another reader with its own window and settings (``tasks.setup``)
        setup = reading_setup(model, args.reader or model.config.backbone, Reading(
            topk=args.reading_topk or None, search_excerpts=args.search_excerpts == "yes"))
        reader, reading = setup.lm, setup.reading
        if not setup.own:
            params = list(reader.backbone.model.parameters())
            facts = {"reader": setup.label, "reader_params": sum(p.numel() for p in params),
                     "reader_window": reader.segment_len,
                     "reader_weights_mb": sum(p.numel() * p.element_size() for p in params) / 2**20}
        if args.approx_from:  # the IVF copies are built at the first search: the first question pays for them
            memory.approximate(args.approx_from, args.probes)
        finder = PassageFinder(bank, model, memory)
        rows, prompts = [], []
        for q in QUESTIONS[: args.questions]:
            chat = Chat(reader, memory if reader is model else None, setup.decoding(ANSWER_SAMPLING))
            t1 = time.perf_counter()
            reply = answer(chat, finder, q, reading, reader=setup.label)
            shown = time.perf_counter() - t1  # found, fitted and cited: what the Chat tab shows before the answer
            next(iter(reply))  # the first piece the reader sees (an answer that is checked: the whole answer)
            t3 = time.perf_counter()
            list(reply)
            done = time.perf_counter()
            finder.find(q, reading)  # timed alone, once more: what finding costs (warm)
            t3b = time.perf_counter()
            find_ms = 1000 * (t3b - done)
            finder.find(q, Reading(finder="memory"))
            t4 = time.perf_counter()
            prompts.append(chat.prompt_ids(q, prompt_for(q, reply.found, reading), history=False))
            rows.append({"question": q, "find_ms": find_ms, "shown_s": shown, "first_token_s": t3 - t1,
                         "answer_s": done - t1, "said": reply.said, "memory_find_s": t4 - t3b,
                         "prompt_tokens": int(prompts[-1].shape[1])})
            log(f"{q!r}: passages shown {shown:.2f} s, first answer piece {t3 - t1:.2f} s (find "
                f"{find_ms:.0f} ms), whole answer "
                f"{done - t1:.2f} s, memory finder {t4 - t3b:.2f} s")
    if not setup.own and prompts:
        with torch.inference_mode():
            facts |= _reader_rates(reader, [p.to(reader.backbone.device) for p in prompts])
        grown = status_mb("VmRSS") - rss0  # after every answer: its weights read (mapped or not), its caches
        facts |= {"reader_rss_mb": grown, "reader_rss_vs_weights": grown / facts["reader_weights_mb"]}
        log(f"{facts['reader']}: prefill {facts['prefill_tok_s']:.0f} tok/s, decoding {facts['decode_tok_s']:.1f} "
            f"tok/s, RSS +{facts['reader_rss_mb']:.0f} MiB for {facts['reader_weights_mb']:.0f} MiB of weights")
    warm = rows[1:] or rows
    chunks = reading.chunks(memory, ["read"], model.config.topk)
    return {"tokens": len(memory), "topk": (chunks or model.config.topk // memory.chunk_size) * memory.chunk_size,
            "model_topk": model.config.topk,
            "search": f"approximate from {args.approx_from:,} chunks, probes {args.probes or 'default'}"
            if args.approx_from else "exact",
            "searching": "every prompt token" if reading.search_excerpts else "the question",
            "finder": "BM25 windows of the raw text" if reading.finder == "windows" else f"{reading.finder} passages",
            "load_memory_s": load_s, "cold": rows[0], **facts,
            **{k: statistics.median(r[k] for r in warm) for k in ("find_ms", "shown_s", "first_token_s", "answer_s",
                                                                   "memory_find_s", "prompt_tokens")},
            "first_token_max_s": max(r["first_token_s"] for r in warm), "questions": rows}


SCENARIOS = {"ingest": scenario_ingest, "build": scenario_build, "reopen": scenario_reopen, "answer": scenario_answer}


# ----------------------------------------------------------------------------------------------------------------
# The parent


def spawn(name: str, args, **extra) -> dict:
    argv = [sys.executable, "-m", "longmem.bench.bank", "--scenario", name, "--work", args.work,
            "--backbone", args.backbone, "--dtype", args.dtype, "--device", args.device, "--text", args.text,
            "--threads", str(args.threads),
            "--ingest-tokens", str(args.ingest_tokens), "--bank-tokens", str(args.bank_tokens),
            "--reps", str(args.reps)] + (["--compile"] if args.compile else [])
    for k, v in extra.items():
        argv += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
    return child_json(argv, f"scenario {name!r}")


def answer_targets(answer: dict) -> dict:
    """The answer scenario's targets: the first answer piece (3 s with the bank's model, 10 s with another reader),
    and for another reader the passages shown (1 s), its decoding rate and its RSS against its weights."""
    if "reader" not in answer:
        return {"first_token_s": target(answer["first_token_s"], TARGETS["first_token_s"], False,
                                        tokens=answer["tokens"])}
    return {"reader_first_token_s": target(answer["first_token_s"], READER_TARGETS["first_token_s"], False,
                                           tokens=answer["tokens"]),
            "reader_shown_s": target(answer["shown_s"], READER_TARGETS["shown_s"], False, tokens=answer["tokens"]),
            "reader_decode_tok_s": target(answer["decode_tok_s"], READER_TARGETS["decode_tok_s"], True),
            "reader_rss_vs_weights": target(answer["reader_rss_vs_weights"], READER_TARGETS["rss_vs_weights"], False)}


def answer_rows(a: dict, goal) -> list[tuple[str, str, str, str]]:
    """The answer scenario's rows of the table (``goal(key)``: a target's cells)."""
    n = len(a["questions"]) - 1
    if "reader" in a:
        how = f"{a['reader']} reading, memory off"
        first = goal("reader_first_token_s")
    else:
        how = f"K = {a['topk']}, {a['search']} search, {a.get('searching', 'every prompt token')} searches memory"
        first = goal("first_token_s")
    rows = [("answer: load the bank's memory with the model, s", f"{a['load_memory_s']:.1f}", "", ""),
            (f"answer: first answer piece with reading ({a.get('finder', 'BM25 passages')}, "
             f"{a['prompt_tokens']:.0f}-token prompt, {how}), "
             f"s, median of {n} (max {a['first_token_max_s']:.2f}; first question {a['cold']['first_token_s']:.2f})",
             f"{a['first_token_s']:.2f}", *first),
            ("answer: the memory finder (the question through the model, memory attached), s",
             f"{a['memory_find_s']:.2f}", "", "")]
    if "reader" in a:
        rows += [(f"answer: the passages read shown (found, fitted, cited), s, median of {n} (first question "
                  f"{a['cold']['shown_s']:.2f})", f"{a['shown_s']:.2f}", *goal("reader_shown_s")),
                 (f"answer: {a['reader']}'s prefill of the reading prompts ({a['prefill_tokens']:,} tokens), tok/s",
                  f"{a['prefill_tok_s']:.0f}", "", ""),
                 (f"answer: {a['reader']}'s decoding ({a['decoded']} greedy tokens), tok/s", f"{a['decode_tok_s']:.1f}",
                  *goal("reader_decode_tok_s")),
                 (f"answer: RSS growth when {a['reader']} loads / its weights ({a['reader_weights_mb']:,.0f} MiB)",
                  f"{a['reader_rss_vs_weights']:.2f}", *goal("reader_rss_vs_weights"))]
    return rows


def markdown(r: dict) -> str:
    ing, build, t = r["ingest"], r["build"], r["targets"]
    warm, cold = r["reopen_warm"], r.get("reopen_cold")

    def goal(key: str) -> tuple[str, str]:
        return f"{t[key]['op']} {t[key]['target']:g}", "yes" if t[key]["met"] else "**no**"

    per_m = build["disk_bytes"] / build["tokens"] * 1e6 / 2**20
    compiled = ", compiled layers" if ing.get("compile") else ""
    rows = [
        (f"bare memorize, {ing['tokens']:,} tokens, tok/s", f"{ing['memorize_tok_s']:.0f}", "", ""),
        (f"ingest end to end (file, tokenise, backbone, SQLite, faiss){compiled}, tok/s", f"{ing['ingest_tok_s']:.0f}",
         "", ""),
        ("ingest / bare memorize", f"{ing['ratio']:.3f}", *goal("ingest_vs_memorize")),
        (f"matmul rate on the model's shapes ({ing['matmul']['rows']:,} rows, {ing['matmul']['dtype']}, "
         f"{ing['matmul']['threads']} threads), GFLOP/s: best block (over all blocks)",
         f"{ing['matmul']['gflops']:.0f} ({ing['matmul']['mean_gflops']:.0f})", "", ""),
        (f"ingestion work, GFLOP a token ({ing['flops']['layers']} layers; attention over {ing['flops']['segment_len']}"
         f"-token segments {100 * ing['flops']['attention'] / ing['flops']['per_token']:.0f}% of it)",
         f"{ing['flops']['per_token'] / 1e9:.3f}", "", ""),
        ("bare memorize as a share of the matmul rate", f"{ing['memorize_share']:.2f}", "", ""),
        ("ingest end to end as a share of the matmul rate", f"{ing['ingest_share']:.2f}", *goal("ingest_share")),
        (f"ceiling of that share with torch's kernels (matmuls at the rate above, attention at its kernel's "
         f"{ing['attention']['gflops']:.0f} GFLOP/s, nothing else)", f"{ing['ceiling']:.2f}", "", ""),
        (f"ingest throughput with passages and their FTS index / without (their share, {ing['passages']:,} "
         f"passages cut and indexed again in {ing['passages_s']:.2f} s)", f"{ing['with_passages_vs_without']:.3f}",
         *goal("with_passages_vs_without")),
        (f"build the {build['tokens']:,}-token bank (re-committing real segments), s", f"{build['s']:.0f}", "", ""),
        ("disk per 1M tokens (SQLite + index files), MiB", f"{per_m:.0f}", "", ""),
        (f"cut and index the {build['tokens']:,}-token bank's {build['passages']:,} passages, s",
         f"{build['passages_s']:.1f}", "", ""),
        (f"BM25 passage search in the {warm['tokens']:,}-token bank, ms (median of {len(QUESTIONS)} questions)",
         f"{warm['passage_search_ms']:.1f}", *goal("passage_search_ms")),
        (f"reopen {warm['tokens']:,} tokens, warm file cache, s (median of {r['reopen_reps']})", f"{warm['s']:.2f}",
         *goal("reopen_s")),
    ]
    if cold is not None:
        rows.append(("reopen, cold file cache (OS page cache dropped), s", f"{cold['s']:.2f}", "", ""))
    a = r.get("answer")
    if a is not None:
        rows += answer_rows(a, goal)
    rows += [(f"reopen peak RSS increment, MiB (K/V {warm['kv_mb']:.0f} MiB, index {warm['index_mb']:.0f} MiB)",
              f"{warm['peak_increment_mb']:.0f}", "", ""),
             ("reopen peak RSS increment / K/V size", f"{warm['peak_increment_vs_kv']:.2f}",
              *goal("reopen_peak_vs_kv"))]
    m, b = r["machine"], ing.get("backbone", {})
    about = (f"{b['name']} ({b['params'] / 1e6:.0f}M parameters, {b['kv_heads']} K/V heads of {b['head_dim']}: "
             f"{b['kv_bytes_per_token']} bytes of K/V a token), " if b else "")
    lines = [f"Persistent banks: {about}{m['dtype']} model, K/V stored as {r['kv_dtype']}, {m['threads']} threads, "
             f"{m['cpu']}", "", "| measurement | value | target | met |", "|---|---:|---|---|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m longmem.bench.bank", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small sizes (4k tokens ingested, a 64k-token bank, 1 rep)")
    p.add_argument("--out", default=None, help="also write the JSON results to this path")
    p.add_argument("--backbone", default="default",
                   help="'default' (SmolLM2-135M-Instruct), a .gguf file or an HF model dir")
    add_runtime_flags(p)
    add_device_flag(p)
    p.add_argument("--text", default=default_text(), help="UTF-8 text to ingest (a prefix of it)")
    p.add_argument("--ingest-tokens", type=int, default=None, help="tokens ingested (default 16384; quick 4096)")
    p.add_argument("--bank-tokens", type=int, default=None, help="size of the reopened bank (default 1,000,000; "
                                                                 "quick 65,536)")
    p.add_argument("--reps", type=int, default=None, help="memorize/ingest rounds, alternating which runs first "
                                                          "(default 4; quick 1)")
    p.add_argument("--compile", action="store_true",
                   help="ingest through torch.compile'd layers (`longmem bank ingest --compile`; memorize stays eager)")
    p.add_argument("--reopen-reps", type=int, default=3, help="reopen processes, warm cache (median reported)")
    p.add_argument("--work", default=None, help="directory for the benchmark's banks (default: a temp dir, removed)")
    p.add_argument("--questions", type=int, default=len(QUESTIONS),
                   help=f"questions the answer scenario asks (at most {len(QUESTIONS)}; the first is cold; 0: none)")
    p.add_argument("--reading-topk", type=int, default=READING_TOPK, metavar="K",
                   help=f"answer scenario: memory tokens per query while passages are read (default {READING_TOPK}, "
                        "the chat's; 0: the model's own K)")
    p.add_argument("--search-excerpts", choices=("yes", "no"), default="yes" if SEARCH_EXCERPTS else "no",
                   help="answer scenario: whether the excerpts' tokens search memory too (default: the chat's)")
    p.add_argument("--reader", default="", metavar="MODEL",
                   help="answer scenario: another model reads the passages, memory off, as `longmem chat --reader` "
                        "(a name or path; default: the bank's own model); its RSS, prefill and decoding rates too")
    p.add_argument("--approx-from", type=int, default=0, metavar="CHUNKS",
                   help="answer scenario: search memory approximately (IVF) once it holds this many chunks (0: exact)")
    p.add_argument("--probes", type=int, default=None, help="IVF lists each query compares (default: a sixteenth)")
    p.add_argument("--scenario", default=None, choices=list(SCENARIOS),
                   help="run one scenario alone, in this process: 'ingest', or 'reopen' / 'answer' on the bank 'big' "
                        "that a whole run with the same --work built ('build' is a whole run's step)")
    p.add_argument("--source-bank", default=None, help="internal: the ingested bank to build from")
    p.add_argument("--cold", action="store_true", help="internal: drop the OS page cache before reopening")
    args = p.parse_args(argv)
    if args.scenario is not None and args.work is None:
        p.error("--scenario needs --work (the folder of the benchmark's banks)")
    args.ingest_tokens = args.ingest_tokens or (4096 if args.quick else 16384)
    args.bank_tokens = args.bank_tokens or (65536 if args.quick else 1_000_000)
    args.reps = args.reps or (1 if args.quick else 4)
    return finish_shared_args(p, args)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    try:
        args.device = resolve_device(args.device)  # checked once, here, before any scenario starts
    except DeviceError as e:
        raise SystemExit(f"error: {e}") from None
    setup_cpu(args.threads)
    if args.scenario is not None:
        Path(args.work).mkdir(parents=True, exist_ok=True)
        from longmem.storage import UnknownBank

        steal0, total0 = cpu_times()
        try:
            out = SCENARIOS[args.scenario](args)
        except UnknownBank as e:  # 'reopen' or 'answer' alone, before a whole run built the bank
            raise SystemExit(f"error: {e}; a whole run with this --work builds it") from None
        steal1, total1 = cpu_times()
        out["cpu_steal_pct"] = 100 * (steal1 - steal0) / max(1, total1 - total0)
        line = json.dumps(out)
        print(line)  # the parent reads this last line (``spawn``)
        if args.out:  # a scenario run on its own (``--scenario answer``) keeps its JSON where told, as a whole run does
            write_file_atomic(args.out, (line + "\n").encode())
        return out

    t0 = time.perf_counter()
    own_work = args.work is None
    args.work = args.work or tempfile.mkdtemp(prefix="longmem-bench-bank-")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    try:
        log("scenario 1/4: ingest vs bare memorize (fresh process)")
        ingest = spawn("ingest", args)
        log(f"scenario 2/4: build a {args.bank_tokens:,}-token bank (fresh process)")
        build = spawn("build", args, source_bank=ingest["bank"])
        log(f"scenario 3/4: reopen it, {args.reopen_reps} warm + 1 cold (fresh processes)")
        warm_runs = [spawn("reopen", args) for _ in range(args.reopen_reps)]
        cold = spawn("reopen", args, cold=True)
        warm = sorted(warm_runs, key=lambda w: w["s"])[len(warm_runs) // 2]
        warm = {**warm, "peak_increment_mb": max(w["peak_increment_mb"] for w in warm_runs),
                "peak_increment_vs_kv": max(w["peak_increment_vs_kv"] for w in warm_runs)}
        log(f"scenario 4/4: ask it {args.questions} questions with the model (fresh process)")
        search = {"approx_from": args.approx_from, "reading_topk": args.reading_topk,
                  "search_excerpts": args.search_excerpts, **({"probes": args.probes} if args.probes else {}),
                  **({"reader": args.reader} if args.reader else {})}
        answer = spawn("answer", args, questions=args.questions, **search) if args.questions > 0 else None
    finally:
        if own_work:
            shutil.rmtree(args.work, ignore_errors=True)
    targets = {"ingest_share": target(ingest["ingest_share"], TARGETS["ingest_share"], True),
               "ingest_vs_memorize": target(ingest["ratio"], TARGETS["ingest_vs_memorize"], True),
               "reopen_s": target(warm["s"], TARGETS["reopen_s"], False, tokens=warm["tokens"]),
               "reopen_peak_vs_kv": target(warm["peak_increment_vs_kv"], TARGETS["reopen_peak_vs_kv"], False),
               "with_passages_vs_without": target(ingest["with_passages_vs_without"],
                                                  TARGETS["with_passages_vs_without"], True),
               "passage_search_ms": target(warm["passage_search_ms"], TARGETS["passage_search_ms"], False,
                                           tokens=warm["tokens"])}
    if answer is not None:
        targets |= answer_targets(answer)
    results = {"machine": machine_facts(args.dtype, args.threads), "backbone": ingest.get("backbone"),
               "quick": args.quick, "kv_dtype": "bfloat16",
               "ingest": ingest, "build": build, "reopen_warm": warm, "answer": answer, "reopen_all_warm": warm_runs,
               "reopen_cold": cold if cold["cold_cache"] else None, "reopen_reps": args.reopen_reps,
               "disk_mb_per_1m_tokens": build["disk_bytes"] / build["tokens"] * 1e6 / 2**20,
               "targets": targets, "all_targets_met": all(t["met"] for t in targets.values()),
               "wall_s": time.perf_counter() - t0}
    report(results, markdown(results), args.out)
    return results


if __name__ == "__main__":
    main()
