"""How quickly the app answers, on the default backbone: start-up time and first answer token on a big bank.

    python -m app.bench                      # both scenarios (a 100k-token bank is built once, ~4 min on 2 cores)
    python -m app.bench --scenario startup   # only `python app.py` -> usable page
    python -m app.bench --scenario upload --reps 1   # a dropped 48k-token book -> its first answer piece
    python -m app.bench --out app.json       # also write the JSON

Scenarios:

- ``startup``: runs ``python app.py --no-browser`` (what ``make run`` ends with) in a fresh process and times how
  long until the page and its API configuration are served, ``--reps`` times; the model's safetensors cache is warm
  (the first run ever converts the GGUF once, ~1 min, and is not what a user waits for afterwards).
- ``upload``: what a new user waits for in the Chat tab: a book dropped (``Workspace.add_book``, as the drop box
  calls it: a bank of its own named after the book), read into memory, then the first streamed piece of the answer
  to a question about it; ``--book`` (default: A Lost Lady, ~48k tokens, from the shared data), a fresh banks
  directory each run, ``--reps`` runs.
- ``first-token``: a bank of ``--bank-tokens`` tokens (a held-out book, ingested for real and kept in
  ``--banks-dir`` for the next run), then ``Workspace.chat`` questions, timing the first streamed piece of each
  answer: the first question includes loading the bank's memory into RAM (cold), the others do not (warm).

Prints one JSON object and a markdown table (progress on stderr), like the library's benchmarks.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from longmem.bench.inference import default_text, log, machine_facts, report

ROOT = Path(__file__).resolve().parents[1]
QUESTIONS = ["Who is the narrator of this story?", "Where does Gatsby live?", "What happens at the party?",
             "Describe Daisy in one sentence.", "What colour is the light at the end of the dock?"]
TARGETS = {"first_token_warm_s": 2.0}


def scenario_startup(args) -> dict:
    times = []
    for i in range(args.reps):
        port = 7900 + i
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--no-browser", "--port", str(port),
                                     "--banks-dir", tmp], cwd=ROOT, stdout=subprocess.DEVNULL,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                while True:
                    if proc.poll() is not None:
                        raise RuntimeError(f"python app.py exited with {proc.returncode} before serving the page")
                    try:
                        for path in ("/", "/config"):
                            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                                r.read()
                        break
                    except OSError:
                        time.sleep(0.1)
                times.append(time.perf_counter() - t0)
                log(f"startup {i + 1}/{args.reps}: {times[-1]:.1f} s")
            finally:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(30)
    return {"startup_s": statistics.median(times), "startup_runs_s": times}


def _model(args):
    """The app's model (the embedded default with its shipped SideNet) in ``args.dtype`` and threads."""
    from longmem.model.cpu import setup_cpu
    from longmem.model.longmem import LongMemConfig, LongMemModel

    setup_cpu(args.threads)
    return LongMemModel.from_config(LongMemConfig(dtype=args.dtype)).eval()


def scenario_upload(args) -> dict:
    from longmem.service import Settings, Workspace
    from longmem.storage import BankDirectory

    model = _model(args)
    runs = []
    for i in range(args.reps):
        with tempfile.TemporaryDirectory() as tmp:
            ws = Workspace(model, BankDirectory(Path(tmp) / "banks"))
            try:
                t0 = time.perf_counter()
                name, job = ws.add_book(args.book, title=Path(args.book).name)
                state = ws.jobs.wait(job)
                if state.status != "done":
                    raise RuntimeError(f"ingestion {state.status}: {state.message}")
                read_s = time.perf_counter() - t0
                reply = ws.chat(name, args.question, Settings())
                first = None
                for _ in reply:
                    first = first or time.perf_counter() - t0
                total = time.perf_counter() - t0
                runs.append({"bank": name, "tokens": state.tokens_done, "ingest_s": read_s,
                             "upload_to_first_piece_s": first if first is not None else total,
                             "upload_to_answer_s": total})
                log(f"upload {i + 1}/{args.reps}: {state.tokens_done:,} tokens read in {read_s:.1f} s, first answer "
                    f"piece at {runs[-1]['upload_to_first_piece_s']:.1f} s, whole answer at {total:.1f} s")
            finally:
                ws.close()
    key = lambda k: statistics.median(r[k] for r in runs)  # noqa: E731
    return {"book": Path(args.book).name, "question": args.question, "tokens": runs[0]["tokens"],
            "bank": runs[0]["bank"], "ingest_s": key("ingest_s"),
            "upload_to_first_piece_s": key("upload_to_first_piece_s"), "upload_to_answer_s": key("upload_to_answer_s"),
            "runs": runs}


def scenario_first_token(args) -> dict:
    from longmem.service import Settings, Workspace
    from longmem.storage import BankDirectory

    model = _model(args)
    ws = Workspace(model, BankDirectory(args.banks_dir))
    name = f"bench-{args.bank_tokens // 1000}k"
    if not ws.directory.exists(name) or _bank_tokens(ws, name) < args.bank_tokens * 0.95:
        if ws.directory.exists(name):
            ws.delete_bank(name)
        text = _prefix(Path(args.text), args.bank_tokens, model.backbone.tokenizer)
        with tempfile.TemporaryDirectory() as tmp:
            book = Path(tmp) / "book.txt"
            book.write_text(text)
            log(f"ingesting {args.bank_tokens:,} tokens into bank {name} (kept in {ws.directory.root})")
            t0 = time.perf_counter()
            state = ws.jobs.wait(ws.ingest(name, [book], create=True))
            if state.status != "done":
                raise RuntimeError(f"ingestion {state.status}: {state.message}")
            log(f"ingested in {time.perf_counter() - t0:.0f} s")
    tokens = _bank_tokens(ws, name)
    settings = Settings(max_new_tokens=args.new_tokens, temperature=0.0)
    first, total, pieces = [], [], []
    for i in range(args.questions):
        ws.clear_chat(name)  # every question starts a fresh conversation: same prompt length each time
        if i > 0:
            ws.run_locked(lambda: ws.loaded_memory(name))  # warm: the memory is already in RAM
        t0 = time.perf_counter()
        reply = ws.chat(name, QUESTIONS[i % len(QUESTIONS)], settings)
        got = None
        for _ in reply:
            got = got or time.perf_counter() - t0
        total.append(time.perf_counter() - t0)
        first.append(got if got is not None else total[-1])
        pieces.append(len(reply.pieces))
        log(f"question {i + 1}: first piece after {first[-1]:.2f} s, {pieces[-1]} pieces in {total[-1]:.1f} s")
    warm = first[1:] or first
    return {"bank_tokens": tokens, "first_token_cold_s": first[0], "first_token_warm_s": statistics.median(warm),
            "first_token_warm_max_s": max(warm), "answer_s": statistics.median(total),
            "answer_pieces": statistics.median(pieces), "new_tokens": args.new_tokens}


def _bank_tokens(ws, name: str) -> int:
    return next((b.tokens for b in ws.banks() if b.name == name), 0)


def _prefix(path: Path, n_tokens: int, tokenizer) -> str:
    """The first ``n_tokens`` tokens of a text file (repeated if it is shorter)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    ids = tokenizer(text, add_special_tokens=False).input_ids
    while len(ids) < n_tokens:
        ids = ids + ids
    return tokenizer.decode(ids[:n_tokens])


def main(argv: list[str] | None = None) -> None:
    from longmem.model.cpu import add_runtime_flags
    from longmem.util.data import data_dir

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--scenario", choices=["all", "startup", "upload", "first-token"], default="all",
                   help="what to measure")
    p.add_argument("--reps", type=int, default=3, help="start-up and upload runs (median reported)")
    p.add_argument("--book", default=str(data_dir() / "books" / "pg65636.txt"),
                   help="the book dropped in the upload scenario (default: A Lost Lady)")
    p.add_argument("--question", default="Who is Mrs. Forrester?", help="the question asked about it")
    p.add_argument("--bank-tokens", type=int, default=100_000, help="size of the bank the chat reads")
    p.add_argument("--questions", type=int, default=6, help="questions asked (the first one is cold)")
    p.add_argument("--new-tokens", type=int, default=32, help="tokens per answer")
    p.add_argument("--text", default=default_text(), help="text the bank is made of (default: The Great Gatsby)")
    p.add_argument("--banks-dir", default=str(Path(tempfile.gettempdir()) / "longmem-bench-banks"),
                   help="where the benchmark bank is kept between runs")
    add_runtime_flags(p)
    p.add_argument("--out", default=None, help="also write the JSON here")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    results: dict = {"machine": machine_facts(args.dtype, args.threads or os.cpu_count()), "targets": TARGETS}
    if args.scenario in ("all", "startup"):
        results["startup"] = scenario_startup(args)
    if args.scenario in ("all", "upload"):
        results["upload"] = scenario_upload(args)
    if args.scenario in ("all", "first-token"):
        results["first_token"] = scenario_first_token(args)
    results["wall_s"] = time.perf_counter() - t0
    rows = ["| measure | value | target |", "|---|---:|---:|"]
    if "startup" in results:
        rows.append(f"| `python app.py` to usable page (median of {args.reps}) | {results['startup']['startup_s']:.1f}"
                    " s | |")
    if "upload" in results:
        u = results["upload"]
        rows += [f"| {u['book']} ({u['tokens']:,} tokens) dropped -> read into memory (median of {args.reps}) | "
                 f"{u['ingest_s']:.1f} s | |",
                 f"| ... -> first piece of the first answer | {u['upload_to_first_piece_s']:.1f} s | |",
                 f"| ... -> whole first answer | {u['upload_to_answer_s']:.1f} s | |"]
    if "first_token" in results:
        f = results["first_token"]
        rows += [f"| first answer token, {f['bank_tokens']:,}-token bank, cold (loads the memory) | "
                 f"{f['first_token_cold_s']:.2f} s | |",
                 f"| first answer token, warm (median / max) | {f['first_token_warm_s']:.2f} / "
                 f"{f['first_token_warm_max_s']:.2f} s | <= {TARGETS['first_token_warm_s']:.0f} s |",
                 f"| whole answer of {f['new_tokens']} tokens (median) | {f['answer_s']:.1f} s | |"]
    report(results, "\n".join(rows), args.out)


if __name__ == "__main__":
    main()
