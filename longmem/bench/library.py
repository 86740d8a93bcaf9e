"""A library in one bank: opening it, its share of the process's memory and answering from it, at 1M and 10M tokens.

    python -m longmem.bench.library --work runs/library          # builds the banks once (kept), then measures both
    python -m longmem.bench.library --work runs/library --quick  # 128k and 512k tokens, 4 questions: to see it run
    python -m longmem.bench.library --work runs/library --set longmem/eval/data/natural-tune.jsonl \
        --source-banks runs/find/natural-banks               # the books `longmem eval finding` ingested, reused

Build (once per ``--work``; a later run reuses a bank that is already the size asked for). The library's books are
those a question set asks about (``--set``, default the shared data's ``natural-dev``; ``--books`` of them). Each is
ingested for real into a bank of its own (or taken from ``--source-banks``, a folder of banks holding one such book
each), then the library banks are made by committing those books' segments again, book after book and round after
round ("<title> (copy n)"), through the bank's own write path (``Bank.add_segment``) until each holds its
``--tokens``: the bytes per token of a real library, in minutes where ingesting a hundred books would take a day on
two cores. Their passages are then cut and indexed and their index files written.

Measure (a fresh process per bank, the model loaded first, so that the bank's share is the process's growth after
it): the bank opened and its memory restored (``Bank.load_memory``), timed, with the RSS growth; then ``--questions``
questions about the library's books asked as the app's chat asks them (``tasks.answer``: BM25 passages, the memory
attached while the model reads), timing the first answer piece the reader sees and the time spent in memory searches
(every ``Memory.search``/``select`` call of the answer: the tokens that search memory at layer *m*), and the RSS growth
after them, split into anonymous memory and file-backed pages (the mapped keys and values a search read). The first
question is reported apart (cold); medians are over the others.

The parent prints one JSON object (stdout) and a markdown table, each size's figures side by side with their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from longmem.bench.inference import child_json, cpu_times, log, machine_facts, report, status_mb, target
from longmem.model.cpu import add_runtime_flags, setup_cpu
from longmem.model.device import DeviceError, add_device_flag, resolve_device
from longmem.util.data import data_dir

TARGETS = {"open_s": 5.0, "bank_rss_mb": 1536.0, "memory_search_ms": 50.0, "first_token_s": 3.0}
QUESTION_SET = "bookqa/natural-dev.jsonl"  # in the shared data: the library's books and the questions asked of it


# ----------------------------------------------------------------------------------------------------------------
# Building


def _model(args):
    from longmem.model.longmem import LongMemConfig, LongMemModel

    return LongMemModel.from_config(LongMemConfig(backbone=args.backbone, dtype=args.dtype),
                                    device=resolve_device(args.device)).eval()


def read_set(path: Path) -> list[dict]:
    """The answerable questions of a question set in natural's format (JSON lines with ``book``, ``question`` and
    ``answers``), in file order."""
    out = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            q = json.loads(line)
            if q["answers"]:
                out.append({"book": str(q["book"]), "question": str(q["question"])})
        except (ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"error: {path}, line {n}: not a question of natural's format ({e})") from None
    return out


def library_books(path: Path, n: int) -> list[str]:
    """The first ``n`` books the question set ``path`` asks about (file names in the shared data's ``books/``)."""
    books = list(dict.fromkeys(q["book"] for q in read_set(path)))
    if n > len(books):
        raise SystemExit(f"error: --books {n}: {path} asks about {len(books)} books")
    return books[:n]


def source_bank(args, directory, book: str, model):
    """A bank holding ``book`` alone, whole: one of ``--source-banks`` whose name starts with the book's stem, else
    ``src-<stem>`` under the work folder, ingested now if it is not yet complete."""
    from longmem.ingest.pipeline import ingest
    from longmem.storage import BankDirectory

    stem = Path(book).stem
    if args.source_banks:
        given = BankDirectory(Path(args.source_banks))
        for name in given.names():
            if name.startswith(stem):
                bank = given.open(name)
                docs = bank.documents()
                if len(docs) == 1 and docs[0].status == "complete":
                    bank.check(model)  # its keys were made by this model's backbone and layer
                    return bank
                bank.close()
    bank = directory.open(f"src-{stem}") if directory.exists(f"src-{stem}") else directory.create(f"src-{stem}", model)
    t0 = time.perf_counter()
    res = ingest(bank, model, data_dir() / "books" / book, title=stem)
    log(f"{book}: {res.action} ({res.tokens:,} tokens, {time.perf_counter() - t0:.0f} s)")
    return bank


def build(directory, name: str, tokens: int, sources: list, model) -> dict:
    """Bank ``name`` (for ``model``) of at least ``tokens`` tokens made from the ``sources`` banks' segments (reused
    when it already is); returns its facts."""
    if directory.exists(name):
        with directory.open(name) as bank:
            stats = bank.stats()
            if stats["tokens"] >= tokens and all(d.status == "complete" for d in bank.documents()):
                log(f"{name}: reused ({stats['tokens']:,} tokens)")
                return {"tokens": stats["tokens"], "documents": stats["documents"], "built_s": None}
        directory.delete(name)
    t0 = time.perf_counter()
    bank = directory.create(name, model, kv_dtype=sources[0].info.kv_dtype)
    total, round_ = 0, 0
    with bank.writing():
        while total < tokens:
            for src in sources:
                doc = src.documents()[0]
                bank.copy_document(src, doc.id, title=doc.title if round_ == 0 else f"{doc.title} (copy {round_})",
                                   sha256=f"library-{doc.title}-{round_}", passages=False)
                total += doc.n_tokens
                log(f"{name}: {total:,} tokens committed")
                if total >= tokens:
                    break
            round_ += 1
        bank.sync_index()
    passages = bank.rebuild_passages()
    stats = bank.stats()
    bank.close()
    seconds = time.perf_counter() - t0
    log(f"{name}: built, {total:,} tokens as {stats['documents']} documents, {passages:,} passages, {seconds:.0f} s")
    return {"tokens": stats["tokens"], "documents": stats["documents"], "built_s": seconds}


# ----------------------------------------------------------------------------------------------------------------
# Measuring (a child process per bank)


def watch_searches(memory, seen) -> None:
    """Call ``seen(queries, n_chunks, seconds)`` after every ``search``/``select`` call on ``memory`` (wrapped on
    the instance): what each searched with and how long it took."""
    for name in ("search", "select"):
        method = getattr(memory, name)

        def watched(queries, n_chunks, _method=method):
            t0 = time.perf_counter()
            try:
                return _method(queries, n_chunks)
            finally:
                seen(queries, n_chunks, time.perf_counter() - t0)
        setattr(memory, name, watched)


def questions_for(path: Path, books: list[str], n: int) -> list[str]:
    """``n`` answerable questions of the set ``path`` about ``books``, taking the books in turn."""
    asked = read_set(path)
    per = [[q["question"] for q in asked if q["book"] == b] for b in books]
    out = []
    for i in range(max(map(len, per))):
        out += [p[i] for p in per if i < len(p)]
    return out[:n]


def scenario_measure(args) -> dict:
    from longmem.storage import BankDirectory
    from longmem.tasks.answer import ANSWER_SAMPLING, answer
    from longmem.tasks.chat import Chat
    from longmem.tasks.reading import PassageFinder, Reading

    model = _model(args)
    with torch.inference_mode():  # the model's first use: its own allocations are not the bank's
        model.backbone.forward(torch.tensor([[1, 2, 3]]))
    rss0, anon0, file0 = status_mb("VmRSS"), status_mb("RssAnon"), status_mb("RssFile")
    t0 = time.perf_counter()
    bank = BankDirectory(Path(args.work) / "banks").open(args.bank)
    memory = bank.load_memory(model, mapped={"auto": None, "mapped": True, "ram": False}[args.kv])
    open_s = time.perf_counter() - t0
    rss_open = status_mb("VmRSS")
    log(f"{args.bank}: opened in {open_s:.2f} s, {len(memory):,} tokens, RSS +{rss_open - rss0:.0f} MiB")
    if args.approx_from:
        memory.approximate(args.approx_from, args.probes)
    spent: list[float] = []  # seconds of each memory search of the question being answered
    tokens: list[int] = []  # the query tokens of each (a search scores every token's query heads)
    watch_searches(memory, lambda queries, n_chunks, seconds: (spent.append(seconds), tokens.append(queries.shape[2])))
    finder = PassageFinder(bank, model, memory)
    rows = []
    for q in questions_for(args.set, library_books(args.set, args.books), args.questions):
        chat = Chat(model, memory, ANSWER_SAMPLING)
        spent.clear()
        tokens.clear()
        t1 = time.perf_counter()
        reply = answer(chat, finder, q, Reading())
        next(iter(reply))
        t2 = time.perf_counter()
        list(reply)
        t3 = time.perf_counter()
        rows.append({"question": q, "first_token_s": t2 - t1, "answer_s": t3 - t1,
                     "memory_search_ms": 1000 * sum(spent), "searches": len(spent), "search_tokens": list(tokens)})
        log(f"{q!r}: first answer piece {t2 - t1:.2f} s, memory searches {1000 * sum(spent):.0f} ms "
            f"({len(spent)} calls)")
    rss_asked = status_mb("VmRSS")
    anon, file_backed = status_mb("RssAnon"), status_mb("RssFile")  # the mapped K/V pages read are file-backed
    stats = bank.stats()
    bank.close()
    warm = rows[1:] or rows
    return {"bank": args.bank, "tokens": len(memory), "documents": stats["documents"],
            "mapped": not memory.rows[0].k.is_contiguous(), "kv_mb": stats["kv_bytes"] / 2**20,
            "disk_mb": stats["disk_bytes"] / 2**20, "open_s": open_s, "rss_model_mb": rss0,
            "bank_rss_open_mb": rss_open - rss0, "bank_rss_asked_mb": rss_asked - rss0,
            "bank_anon_asked_mb": anon - anon0, "bank_file_asked_mb": file_backed - file0,
            "peak_rss_mb": status_mb("VmHWM"), "cold": rows[0] if rows else None,
            **({k: statistics.median(r[k] for r in warm) for k in ("first_token_s", "answer_s", "memory_search_ms")}
               if rows else {}), "questions": rows,
            "search": f"approximate from {args.approx_from:,} chunks" if args.approx_from else "exact"}


# ----------------------------------------------------------------------------------------------------------------
# The parent


def spawn(args, bank: str) -> dict:
    argv = [sys.executable, "-m", "longmem.bench.library", "--scenario", "measure", "--bank", bank,
            "--work", args.work, "--backbone", args.backbone, "--dtype", args.dtype, "--device", args.device,
            "--threads", str(args.threads), "--books", str(args.books), "--questions", str(args.questions),
            "--set", str(args.set),
            "--approx-from", str(args.approx_from), "--kv", args.kv]
    argv += ["--probes", str(args.probes)] if args.probes else []
    return child_json(argv, f"measuring {bank!r}")


def markdown(r: dict) -> str:
    small, big = r["sizes"]
    t = r["targets"]

    def goal(key: str) -> tuple[str, str]:
        return f"{t[key]['op']} {t[key]['target']:g}", "yes" if t[key]["met"] else "**no**"

    def row(label: str, key: str, fmt: str, target_key: str | None = None):
        a, b = small.get(key), big.get(key)
        ratio = f"{b / a:.2f}" if a and b is not None else ""
        return (label, format(a, fmt) if a is not None else "", format(b, fmt) if b is not None else "", ratio,
                *(goal(target_key) if target_key else ("", "")))

    n = len(big["questions"]) - 1
    rows = [
        row("tokens in the bank", "tokens", ","), row("documents (books and their copies)", "documents", ","),
        row("keys and values on disk, MiB", "kv_mb", ".0f"), row("bank on disk, MiB", "disk_mb", ".0f"),
        row("open and restore the memory (`load_memory`), s", "open_s", ".2f", "open_s"),
        row("the bank's RSS after opening, MiB", "bank_rss_open_mb", ".0f"),
        row(f"the bank's RSS after {n + 1} questions, MiB", "bank_rss_asked_mb", ".0f", "bank_rss_mb"),
        row("... of it anonymous (indexes, search copies, what the chat added), MiB", "bank_anon_asked_mb", ".0f"),
        row("... of it file-backed (the mapped keys/values read: clean pages the OS may reclaim), MiB",
            "bank_file_asked_mb", ".0f"),
        row(f"memory searches per question, ms (median of {n})", "memory_search_ms", ".0f", "memory_search_ms"),
        row(f"first answer piece, s (median of {n})", "first_token_s", ".2f", "first_token_s"),
    ]
    m = r["machine"]
    lines = [f"A library in one bank: {r['backbone']}, {m['dtype']} model, {m['threads']} threads, {m['cpu']}; "
             f"memory search {big['search']}; keys/values {'mapped' if big['mapped'] else 'in RAM'} at the larger "
             "size", "", f"| measurement | {small['tokens']:,} tokens | {big['tokens']:,} tokens | ratio | target "
             "(larger) | met |", "|---|---:|---:|---:|---|---|"]
    return "\n".join(lines + ["| " + " | ".join(x) + " |" for x in rows])


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m longmem.bench.library", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="128k- and 512k-token banks, 4 questions")
    p.add_argument("--out", default=None, help="also write the JSON results to this path")
    p.add_argument("--work", default=None, help="folder of the benchmark's banks, kept for later runs (default: a "
                                                "temporary folder, removed)")
    p.add_argument("--tokens", default=None, help="the two banks' sizes, comma-separated (default 1000000,10000000)")
    p.add_argument("--set", type=Path, default=None, help="the question set (JSON lines in natural's format) whose "
                                                          f"books make the library (default: the shared data's "
                                                          f"{QUESTION_SET})")
    p.add_argument("--books", type=int, default=2, help="books of that set in the library")
    p.add_argument("--source-banks", default=None, help="a folder of banks holding one of those books each, whole "
                                                        "(e.g. `longmem eval finding`'s natural-banks), to reuse")
    p.add_argument("--questions", type=int, default=None, help="questions asked of each bank (default 20; quick 4)")
    p.add_argument("--approx-from", type=int, default=0, metavar="CHUNKS",
                   help="search memory approximately (IVF) once it holds this many chunks (0: exact)")
    p.add_argument("--probes", type=int, default=None, help="IVF lists each query compares (default: a sixteenth)")
    p.add_argument("--kv", choices=("auto", "mapped", "ram"), default="auto",
                   help="keys and values mapped from the bank's files or copied into RAM (auto: as the app, mapped "
                        "from 256k tokens on)")
    p.add_argument("--backbone", default="default",
                   help="'default' (SmolLM2-135M-Instruct), a .gguf file or an HF model dir")
    add_runtime_flags(p)
    add_device_flag(p)
    p.add_argument("--scenario", default=None, choices=["measure"], help="internal: measure one bank (--bank)")
    p.add_argument("--bank", default=None, help="internal: the bank to measure")
    args = p.parse_args(argv)
    sizes = args.tokens or ("131072,524288" if args.quick else "1000000,10000000")
    try:
        args.sizes = [int(x) for x in sizes.split(",")]
    except ValueError:
        p.error(f"--tokens: comma-separated whole numbers, got {sizes!r}")
    if len(args.sizes) != 2 or not 0 < args.sizes[0] < args.sizes[1]:
        p.error(f"--tokens: two sizes, the smaller first, got {sizes!r}")
    args.questions = args.questions if args.questions is not None else (4 if args.quick else 20)
    if args.questions < 1:
        p.error("--questions must be >= 1")
    if args.scenario and not (args.work and args.bank):
        p.error("--scenario measure needs --work and --bank")
    args.set = args.set or data_dir() / QUESTION_SET
    if not args.set.is_file():
        p.error(f"--set: no question set at {args.set}")
    args.threads = args.threads or os.cpu_count() or 1
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    try:
        args.device = resolve_device(args.device)
    except DeviceError as e:
        raise SystemExit(f"error: {e}") from None
    setup_cpu(args.threads)
    if args.scenario == "measure":
        steal0, total0 = cpu_times()
        out = scenario_measure(args)
        steal1, total1 = cpu_times()
        out["cpu_steal_pct"] = 100 * (steal1 - steal0) / max(1, total1 - total0)
        print(json.dumps(out))
        return out
    from longmem.storage import BankDirectory

    t0 = time.perf_counter()
    own_work = args.work is None
    args.work = args.work or tempfile.mkdtemp(prefix="longmem-bench-library-")
    directory = BankDirectory(Path(args.work) / "banks")
    try:
        books = library_books(args.set, args.books)
        model = _model(args)  # to ingest the books no source bank holds, and to shape the library's banks
        backbone = model.backbone.name
        sources = [source_bank(args, directory, book, model) for book in books]
        built = [build(directory, f"library-{n}", n, sources, model) for n in args.sizes]
        for s in sources:
            s.close()
        del model
        sizes = []
        for n, facts in zip(args.sizes, built):
            log(f"measuring library-{n} (fresh process)")
            sizes.append({**spawn(args, f"library-{n}"), "built_s": facts["built_s"]})
    finally:
        if own_work:
            shutil.rmtree(args.work, ignore_errors=True)
    big = sizes[1]
    targets = {"open_s": target(big["open_s"], TARGETS["open_s"], False, tokens=big["tokens"]),
               "bank_rss_mb": target(big["bank_rss_asked_mb"], TARGETS["bank_rss_mb"], False, tokens=big["tokens"]),
               "memory_search_ms": target(big["memory_search_ms"], TARGETS["memory_search_ms"], False,
                                          tokens=big["tokens"]),
               "first_token_s": target(big["first_token_s"], TARGETS["first_token_s"], False, tokens=big["tokens"])}
    results = {"machine": machine_facts(args.dtype, args.threads), "backbone": backbone, "books": books,
               "sizes": sizes, "targets": targets, "all_targets_met": all(x["met"] for x in targets.values()),
               "wall_s": time.perf_counter() - t0}
    report(results, markdown(results), args.out)
    return results


if __name__ == "__main__":
    main()
